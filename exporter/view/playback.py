"""``top --replay``'s screens: a flight record's frames (``analysis/replay.py`` reads them, each
a poll's ``Published`` state) shown from ``start`` to ``end`` through the live view of ``top``.

``run_replay`` shows the record from ``start`` to ``end``: each screen moves the record's clock
by ``refresh * speed`` seconds (at least one poll) and waits ``refresh`` seconds (``speed`` 0:
no waiting); every poll passed is looked at for trouble (``Screen.trouble``), and the flight
recorder's events (``vllm_sidecar_flight_events_total`` rising) are flagged too, each with its
record time, so a fast replay misses nothing. (An event is opened from the state published at
one poll and counted in the next poll's state, as a scrape sees it: it is flagged one poll
after the recorder's own ``time`` in ``/debug/flight/events``.) ``once`` prints only the screen at ``end``, with
everything flagged from ``start`` on.
"""

from __future__ import annotations

import datetime as dt
import statistics
import threading
from typing import Dict, List, Optional, Protocol, TextIO

from ..runtime.state import Published
from .console import Screen


class Frame(Protocol):
    """One poll of a record (``analysis.replay.Frame``)."""

    t: float  # the poll's time, unix seconds
    pub: Published
    events: Dict[str, float]  # vllm_sidecar_flight_events_total by kind


def _utc(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%H:%M:%S")


def poll_seconds(frames: Dict[str, List[Frame]]) -> float:
    gaps = [b.t - a.t for fr in frames.values() for a, b in zip(fr, fr[1:])]
    return float(statistics.median(gaps)) if gaps else 1.0


class _PodState:
    """One pod's place in the replay: the frames passed, what was flagged and when."""

    def __init__(self, frames: List[Frame], t0: float) -> None:
        self.frames = frames
        self.t0 = t0
        self.i = 0  # frames[:i] are passed
        self.view = Screen(None, False)
        self.events: Dict[str, float] = {}

    def advance(self, pos: float) -> Optional[Frame]:
        while self.i < len(self.frames) and self.frames[self.i].t <= pos:
            f = self.frames[self.i]
            self.view.trouble(f.pub, f.t - self.t0)
            for kind, n in f.events.items():
                if n > self.events.get(kind, n if self.i == 0 else 0.0):
                    self.view.note(f"flight event {kind}", f.t - self.t0)
                self.events[kind] = n
            self.i += 1
        return self.frames[self.i - 1] if self.i else None

    def flagged(self) -> str:
        if not self.view.first_seen:
            return "  flagged     nothing so far"
        items = sorted(self.view.first_seen.items(), key=lambda x: x[1])
        return "  flagged     " + "   ".join(f"{what} (first at {_utc(self.t0 + t)}, +{t:.0f}s)" for what, t in items)


def run_replay(frames: Dict[str, List[Frame]], out: TextIO, tty: bool, speed: float = 10.0, refresh: float = 1.0,
               once: bool = False, start: Optional[float] = None, end: Optional[float] = None,
               source: str = "record", stop: Optional[threading.Event] = None) -> int:
    """Replay ``frames`` (``load_record``'s) from ``start`` to ``end`` (unix seconds; the record's
    own ends when None). Returns the number of screens shown."""
    stop = stop or threading.Event()
    first = min(f[0].t for f in frames.values())
    last = max(f[-1].t for f in frames.values())
    start = first if start is None else max(start, first)
    end = last if end is None else min(end, last)
    poll = poll_seconds(frames)
    step = max(poll, refresh * speed) if speed > 0 else max(poll, refresh)
    wait = step / speed if speed > 0 else 0.0
    pods = {pod: _PodState(fr, first) for pod, fr in sorted(frames.items())}
    for p in pods.values():  # the polls before ``start`` are history: not flagged, but known
        p.advance(start - 1e-9)
        p.view.first_seen.clear()
    shower = Screen(out, tty and not once)
    pos = end if once else start
    shown = 0
    while True:
        pos = min(pos, end)
        head = [f"vllm-sidecar-exporter top · replay of {source} ({len(pods)} pod(s), one poll every {poll:g}s)",
                f"record {dt.datetime.fromtimestamp(pos, dt.timezone.utc).strftime('%Y-%m-%d %H:%M:%S')} UTC"
                f"   +{pos - first:.0f}s of {last - first:.0f}s"
                + ("" if once else f"   speed {speed:g}x" if speed > 0 else "   as fast as it prints")
                + ("" if once or not tty else "   (Ctrl-C to stop)")]
        body: List[str] = []
        for pod, p in pods.items():
            f = p.advance(pos)
            body.append(f"  pod         {pod}" + (f"   poll at {_utc(f.t)}" if f else ""))
            if f is None:
                body.append("  (no poll yet)")
            else:
                body.append(p.view.render(f.pub))
            body.append(p.flagged())
        shower.show("\n".join(head + body))
        shown += 1
        if once or pos >= end or (wait and stop.wait(wait)) or stop.is_set():
            break
        pos += step
    return shown
