"""The ``/metrics`` bodies: one encoding per published state and format, gzip-compressed in
the same step on the worker pool, shared by every scrape of that state (the module doc of
``server.py`` says when a body is reused, re-encoded or waited for)."""

from __future__ import annotations

import asyncio
import gzip
from typing import Callable, Dict, Iterable, Optional, Tuple

from prometheus_client.core import Metric
from prometheus_client.exposition import choose_encoder

from ..collectors import build_families
from ..state import Published
from .pool import Pool

BODY_MAX_AGE = 1.0  # seconds a body is reused while the published state does not change
STALE_MAX = 5.0  # seconds a body may still be served while the same state is encoded again
SLOW_ENCODING = 1.0  # an encoding running longer: bodies are not built fast enough, max_requests applies


class Entry:
    """One encoding of one published state in one format: (plain, gzipped) once done."""

    __slots__ = ("pub", "t", "fut")

    def __init__(self, pub: Published, t: float, fut: asyncio.Future) -> None:
        self.pub, self.t, self.fut = pub, t, fut


class Slot:
    """The bodies of one format: the latest done encoding and the one under way."""

    __slots__ = ("ready", "pending")

    def __init__(self) -> None:
        self.ready: Optional[Entry] = None
        self.pending: Optional[Entry] = None


class Families:
    """What one /metrics body shows: the published state, the process, the listener."""

    def __init__(self, pub: Published, *others) -> None:
        self.pub, self.others = pub, others

    def collect(self) -> Iterable[Metric]:
        yield from build_families(self.pub)
        for o in self.others:
            yield from o.collect()


class Bodies:
    """The bodies of every format, encoded by ``encode(encoder, pub)`` on the worker pool (the
    server's hook, which tests override to hold scrapes)."""

    def __init__(self, state: Callable[[], Published], clock: Callable[[], float],
                 encode: Callable[[Callable, Published], bytes]) -> None:
        self.state, self.clock, self.encode = state, clock, encode
        self._slots: Dict[str, Slot] = {}
        self._encoders: Dict[str, Tuple[Callable, str]] = {}
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._workers: Optional[Pool] = None

    def start(self, loop: asyncio.AbstractEventLoop, workers: Pool) -> None:
        self._loop, self._workers = loop, workers

    def pick(self, accept: str) -> Tuple[Entry, str]:
        """The body to answer with now, and its content type: the encoding of the state the
        latest completed poll published, never of an older one.

        A body of the current state whose encoding started less than BODY_MAX_AGE ago is served
        as it is. An older body of the current state is encoded again (so that the ``process_*``
        series stay fresh between slow polls), and while that runs the body at hand is served if
        it is under STALE_MAX old: it shows the same poll. A body of a previous state is never
        served: once a poll has published, scrapes wait for the encoding of its state (shared,
        one per state and format; milliseconds, seconds on a starved CPU)."""
        chosen = self._encoders.get(accept)
        if chosen is None:
            chosen = choose_encoder(accept)
            if len(self._encoders) < 64:
                self._encoders[accept] = chosen
        encoder, ctype = chosen
        pub = self.state()
        now = self.clock()
        slot = self._slots.get(ctype)
        if slot is None:
            slot = self._slots[ctype] = Slot()
        ready = slot.ready
        if ready is not None and ready.pub is pub:
            if now - ready.t < BODY_MAX_AGE:
                return ready, ctype
            if slot.pending is None:
                self._start_encoding(slot, encoder, pub, now)
            if now - ready.t < STALE_MAX:
                return ready, ctype
        elif slot.pending is None or slot.pending.pub is not pub:
            self._start_encoding(slot, encoder, pub, now)
        return slot.pending, ctype  # type: ignore[return-value]

    def _start_encoding(self, slot: Slot, encoder: Callable, pub: Published, now: float) -> None:
        e = Entry(pub, now, self._workers.submit(self._loop, self._encode_both, encoder, pub))  # type: ignore[union-attr, arg-type]
        slot.pending = e

        def done(fut: asyncio.Future) -> None:
            if slot.pending is e:
                slot.pending = None
            if fut.cancelled():
                return
            if fut.exception() is None and (slot.ready is None or slot.ready.t <= e.t):
                slot.ready = e  # (a failure reaches the scrapes waiting for it, which answer 500)

        e.fut.add_done_callback(done)

    def _encode_both(self, encoder: Callable, pub: Published) -> Tuple[bytes, bytes]:
        plain = self.encode(encoder, pub)
        return plain, gzip.compress(plain, 5)
