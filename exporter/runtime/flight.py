"""The flight recorder: every poll of the last N minutes, compressed in memory, pinned around
incidents, served as OpenMetrics text with a timestamp on every sample.

What one poll records (``Recorder.record``):

- the vLLM inputs as read: every series of the page the sidecar routes (``inputs.route``), per
  model and engine, counters as read, under vLLM's own ``vllm:`` names (histogram buckets,
  ``_sum``, ``_count``, ``_created``; ``process_start_time_seconds``; the LoRA info series);
- the sidecar's own series, with the values a scrape of ``/metrics`` shows for the same
  published state: the derived series per model (summaries as quantiles plus ``_sum`` and
  ``_count``), the pod-wide ones, the self-health ones (targets up, read errors, restarts…);
- the GPU readings (the same names as ``/metrics``).

How it is stored (the choice is measured in docs/performance.md, "Flight recorder"): polls are
grouped in blocks of at most ``block_polls`` polls (or ``block_seconds``); a block has one
schema (the tuple of series it holds: a poll whose series differ closes the block) and one
timestamp per poll, so a poll costs one tuple of values appended to a list. When a block closes
its values are laid out column by column (one series after another) in an ``array('d')``, the
8 bytes of every double are shuffled into 8 planes (as blosc's shuffle filter does: exponents
and high mantissa bytes of one series sit together) and the whole is compressed with zlib.
Delta-of-delta timestamps and XOR floats (Gorilla, Prometheus' chunks) need bit packing per
sample, which in pure Python costs more than the whole poll.

Memory: ``max_bytes`` is a hard cap on what the recorder holds (compressed blocks, their
timestamps, schemas, the open block, pinned blocks included), estimated from the sizes of what it
keeps (the open block is closed early when it reaches an eighth of the cap). Over the cap the
oldest block that no event pins and that is older than ``event_before`` is dropped first (the
recent past stays, for the event that may open next); when none is left the oldest event is
forgotten (its blocks unpinned); last, the oldest block. Blocks older than ``minutes`` are
dropped unless an event pins them.

Events (``EVENT_KINDS``): when the sidecar's own signals turn bad (KV pressure level 3, an engine
stalled, vLLM unreachable, vLLM restarted, a GPU XID) an event is opened at that poll; it pins
the blocks from ``event_before`` seconds before it to ``event_after`` seconds after. At most
``max_events`` are kept (the oldest forgotten first). An event of the same kind and subject is
not opened again while the previous one's window is still open. Counted per kind
(``vllm_sidecar_flight_events_total{kind}``).

Everything here takes its time from the caller (the poll's clock): no wall clock is read, so a
test drives a simulated day in a second.
"""

from __future__ import annotations

import math
import pickle
import re
import sys
import zlib
from array import array
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from .collectors.base import PREFIX
from .collectors.gpu import GPU_COUNTERS, GPU_GAUGES
from .collectors.vllm import DERIVED, POD_DERIVED, RESOLUTION
from .flight_encode import PackedBlock, openmetrics, pack, series_text  # noqa: F401 - openmetrics, series_text: re-exported
from .gpu import THROTTLE_REASONS
from .inputs import HISTOGRAM

EVENT_KINDS = ("kv_thrashing", "engine_stalled", "vllm_unreachable", "vllm_restarted", "gpu_xid")

Labels = Tuple[Tuple[str, str], ...]
Key = Tuple[str, Labels]  # (sample name, labels)

# The derived series, grouped once by how they are read
_PLAIN = tuple((PREFIX + n, s.read) for n, s in DERIVED.items() if not s.summary and not s.extra)
_EXTRA = tuple((PREFIX + n, s.read, s.extra[0], s.extra[0] < "model_name") for n, s in DERIVED.items() if s.extra)
_SUMMARY = tuple((PREFIX + n, s.read) for n, s in DERIVED.items() if s.summary)
_POD = tuple((PREFIX + n, p.read, p.labels or p.label) for n, p in POD_DERIVED.items())
_RES = PREFIX + RESOLUTION[0]
_GPU = tuple((attr, PREFIX + name) for attr, name, _ in GPU_GAUGES) + tuple(
    (attr, PREFIX + name + "_total") for attr, name, _ in GPU_COUNTERS)
_Q = {}  # quantile -> its label text, as the collector writes it (repr)

_SUFFIX = {"bucket": "_bucket", "sum": "_sum", "count": "_count", "created": "_created"}
_NONE_L: Labels = ()


def _qtext(q: float) -> str:
    t = _Q.get(q)
    if t is None:
        t = _Q[q] = repr(q)
    return t


def route_key(r) -> Optional[Key]:
    """The series (vLLM's own name and labels) of one routed row of a page."""
    role = getattr(r, "role", None)
    if role == "start":
        return "process_start_time_seconds", ()
    if role in ("http", "http_created"):
        return r.name, r.labels
    if role == "lora":
        return "vllm:lora_requests_info", (("max_lora", r.max_lora), ("running_lora_adapters", ",".join(r.running)),
                                           ("waiting_lora_adapters", ",".join(r.waiting)))
    inp = r.input
    name = inp.names[r.prio]
    if inp.kind == HISTOGRAM:
        name += _SUFFIX[role]
    elif role == "created":
        name = name[: -len("_total")] + "_created" if name.endswith("_total") else name + "_created"
    labels = []
    if r.engine:
        labels.append(("engine", r.engine))
    if r.extra and inp.extra_label:
        labels.append((inp.extra_label, r.extra))
    if role == "bucket":
        labels.append(("le", _le_text(r.le)))
    labels.append(("model_name", r.model))
    return name, tuple(sorted(labels))


def _le_text(le: float) -> str:
    if math.isinf(le):
        return "+Inf"
    return repr(float(le))


def _pod_rows(sig, ka, va) -> None:
    """The derived series without model_name (``POD_DERIVED``) of one state, appended."""
    for name, read, label in _POD:
        v = read(sig)
        if v is None:
            continue
        if isinstance(label, tuple):  # several labels: the keys are tuples of their values
            for k, x in v.items():
                ka((name, tuple(sorted(zip(label, k)))))
                va(float(x))
        elif label:
            for k, x in v.items():
                ka((name, ((label, k),)))
                va(float(x))
        else:
            ka((name, _NONE_L))
            va(float(v))


def published_rows(pub) -> Tuple[Tuple[Key, ...], List[float]]:
    """The sidecar's own series of one published state: (keys, values), the values a scrape of
    /metrics shows for it (``collectors``). Written for speed: one poll's worth in tens of µs."""
    keys: List[Key] = []
    vals: List[float] = []
    ka = keys.append
    va = vals.append
    sig = pub.signals
    _pod_rows(sig, ka, va)
    for m in sig.models:
        lab = (("model_name", m.model),)
        for name, read in _PLAIN:
            v = read(m)
            if v is not None:
                ka((name, lab))
                va(float(v))
        for name, read, extra, before in _EXTRA:
            v = read(m)
            if v:
                for k, x in v.items():
                    ka((name, ((extra, k), lab[0]) if before else (lab[0], (extra, k))))
                    va(x)
        for name, read in _SUMMARY:
            d = read(m)
            if d is None:
                continue
            bounded = d.bounded
            for q, x in d.quantiles:
                qt = _qtext(q)
                ka((name, (lab[0], ("quantile", qt))))
                va(x)
                ka((_RES, (("for_quantile", qt), ("metric", name), lab[0])))
                va(1.0 if q in bounded else 0.0)
            ka((name + "_sum", lab))
            va(d.sum)
            ka((name + "_count", lab))
            va(d.count)
    ka((PREFIX + "build_info", (("version", pub.version),)))
    va(1.0)
    secs_of = dict(pub.poll_seconds)
    for target, ok in pub.up:
        ka((PREFIX + "target_up", (("target", target),)))
        va(1.0 if ok else 0.0)
        name = pub.collector_name(target)
        ka((PREFIX + "collector_success", (("collector", name),)))
        va(1.0 if ok else 0.0)
        secs = secs_of.get(target)
        if secs is not None:
            ka((PREFIX + "collector_duration_seconds", (("collector", name),)))
            va(secs)
    for target, ts in pub.last_success:
        ka((PREFIX + "last_success_timestamp_seconds", (("target", target),)))
        va(ts)
    for (target, reason), n in pub.errors_total:
        ka((PREFIX + "poll_errors_total", (("reason", reason), ("target", target))))
        va(n)
    for metric, missing in pub.input_missing:
        ka((PREFIX + "input_missing", (("metric", metric),)))
        va(1.0 if missing else 0.0)
    n_missing = pub.inputs_missing_count()
    if n_missing is not None:
        ka((PREFIX + "inputs_missing", _NONE_L))
        va(float(n_missing))
    for reason, n in pub.malformed_by_reason:
        ka((PREFIX + "parse_malformed_lines_total", (("reason", reason),)))
        va(n)
    for key, metric in pub.input_resolved:
        ka((PREFIX + "input_resolved", (("input", key), ("metric", metric))))
        va(1.0)
    for reason, n in pub.dropped_by_reason:
        ka((PREFIX + "input_dropped_samples_total", (("reason", reason),)))
        va(n)
    for reason, n in pub.capped_now:
        ka((PREFIX + "input_over_cap", (("reason", reason),)))
        va(n)
    for kind, n in pub.flight_events_total:
        ka((PREFIX + "flight_events_total", (("kind", kind),)))
        va(n)
    if pub.page_bytes:
        ka((PREFIX + "vllm_page_bytes", _NONE_L))
        va(pub.page_bytes)
    ka((PREFIX + "vllm_restarts_total", _NONE_L))
    va(pub.vllm_restarts_total)
    if pub.vllm_multiple_processes is not None:
        ka((PREFIX + "vllm_multiple_processes", _NONE_L))
        va(1.0 if pub.vllm_multiple_processes else 0.0)
    for target, secs in pub.poll_seconds:
        ka((PREFIX + "poll_duration_seconds", (("target", target),)))
        va(secs)
    gpu = pub.gpu
    if gpu is not None:
        for g in gpu.gpus:
            gl = (("gpu", str(g.index)), ("uuid", g.uuid))
            for attr, name in _GPU:
                v = getattr(g, attr)
                if v is not None:
                    ka((name, gl))
                    va(float(v))
        drv = gpu.driver_version
        for g in gpu.gpus:
            gl = (("gpu", str(g.index)), ("uuid", g.uuid))
            ka((PREFIX + "gpu_info", (*gl, ("name", g.name), ("driver_version", drv))))
            va(1.0)
            if g.ecc_corrected_total is not None:
                ka((PREFIX + "gpu_ecc_errors_total", (*gl, ("type", "corrected"))))
                va(g.ecc_corrected_total)
            if g.ecc_uncorrected_total is not None:
                ka((PREFIX + "gpu_ecc_errors_total", (*gl, ("type", "uncorrected"))))
                va(g.ecc_uncorrected_total)
            if g.throttle_reasons is not None:
                for bit, reason in THROTTLE_REASONS:
                    ka((PREFIX + "gpu_clock_throttle_active", (*gl, ("reason", reason))))
                    va(1.0 if g.throttle_reasons & bit else 0.0)
                ka((PREFIX + "gpu_thermal_throttle_active", gl))
                va(1.0 if g.thermal_throttled else 0.0)
        for (index, uuid, code), n in sorted(gpu.xid_totals.items()):
            ka((PREFIX + "gpu_xid_errors_total", (("gpu", str(index)), ("uuid", uuid), ("xid", str(code)))))
            va(float(n))
    return tuple(keys), vals


# -- blocks ------------------------------------------------------------------------------------

_BLOCK_OVERHEAD = 400  # bytes: the Block object, its arrays' headers, list slots
_KEY_BYTES = 160  # an estimate per series of a schema: its tuple, label tuples, strings shared


def _shuffle(raw: bytes) -> bytes:
    return b"".join(raw[i::8] for i in range(8))


class Schema:
    """The series a block holds, in order; shared by every block with the same series."""

    __slots__ = ("keys", "nbytes", "users", "_packed")

    def __init__(self, keys: Tuple[Key, ...]) -> None:
        self.keys = keys
        self.nbytes = 64 + _KEY_BYTES * len(keys)
        self.users = 0
        self._packed: Optional[bytes] = None

    @property
    def packed(self) -> bytes:
        """The keys pickled, for the encoder child: made once per schema (not counted in the cap:
        a few KB per schema, made only when a record is downloaded)."""
        p = self._packed
        if p is None:
            p = self._packed = pickle.dumps(self.keys, protocol=pickle.HIGHEST_PROTOCOL)
        return p


class Block(PackedBlock):
    """Closed polls: one schema, a timestamp per poll, the values compressed column by column
    (what the encoder's child reads, ``flight_encode.PackedBlock``), with what the ring needs to
    keep its memory cap and its pins."""

    __slots__ = ("nbytes", "pins")

    def __init__(self, schema: Schema, times: array, data: bytes) -> None:
        super().__init__(schema, times, data)
        self.nbytes = _BLOCK_OVERHEAD + len(data) + 8 * len(times)
        self.pins = 0


def compress_rows(rows: Sequence[Sequence[float]], width: int, level: int = 6) -> bytes:
    """Row-major values (one row per poll) -> column-major doubles, byte-shuffled, zlib."""
    flat = array("d")
    for row in rows:
        flat.extend(row)
    if width == 0:
        return zlib.compress(b"", level)
    cols = array("d")
    for j in range(width):
        cols.extend(flat[j::width])
    return zlib.compress(_shuffle(cols.tobytes()), level)


@dataclass
class Event:
    id: int
    kind: str
    subject: str  # the model, the target or the GPU it is about
    t: float
    detail: str
    before: float
    after: float

    @property
    def start(self) -> float:
        return self.t - self.before

    @property
    def end(self) -> float:
        return self.t + self.after

    def as_dict(self) -> dict:
        return {"id": self.id, "kind": self.kind, "subject": self.subject, "time": self.t,
                "start": self.start, "end": self.end, "detail": self.detail}


class Recorder:
    """The ring of polls. ``record`` is called by the poll loop after each poll (one thread);
    ``snapshot`` hands a reader (the listener) a consistent view to encode elsewhere."""

    def __init__(self, minutes: float = 30.0, max_bytes: int = 16 << 20, *, event_before: float = 600.0,
                 event_after: float = 600.0, max_events: int = 16, block_polls: int = 64,
                 block_seconds: float = 60.0, level: int = 6) -> None:
        self.horizon = minutes * 60.0
        self.max_bytes = max_bytes
        self.event_before = event_before
        self.event_after = event_after
        self.max_events = max_events
        self.block_polls = block_polls
        self.block_seconds = block_seconds
        self.level = level
        self.blocks: List[Block] = []
        self.events: List[Event] = []
        self.events_total: Dict[str, int] = {k: 0 for k in EVENT_KINDS}
        self.evicted_blocks = 0
        self.next_event_id = 1
        self._schemas: Dict[Tuple[Key, ...], Schema] = {}
        self._bytes = 0  # closed blocks and schemas
        # the open block
        self._vnotes: Optional[tuple] = None
        self._vkeys: Tuple[Key, ...] = ()
        self._pkeys: Optional[Tuple[Key, ...]] = None
        self._times: List[float] = []
        self._rows: List[tuple] = []
        self._width = 0
        # what the event detection remembers
        self._last_open: Dict[Tuple[str, str], float] = {}
        self._was: Dict[Tuple[str, str], bool] = {}
        self._restarts: Optional[int] = None
        self._xids: Dict[Tuple[int, str, int], int] = {}
        self._seen_up = False

    # -- recording ------------------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        """What the recorder holds now (estimated): closed blocks, schemas, the open block."""
        return self._bytes + self._open_bytes()

    def _open_bytes(self) -> int:
        # a tuple per poll, a pointer and a float object per value, a float per timestamp
        return len(self._rows) * (56 + 32 * self._width) + 32 * len(self._times)

    def record(self, t: float, vllm_rows: Optional[Sequence[tuple]], pub) -> None:
        """One poll: ``vllm_rows`` the (route, value) rows of the page read (None when none was),
        ``pub`` the state published for it."""
        if vllm_rows:
            vnotes, vvals = zip(*vllm_rows)
        else:
            vnotes, vvals = (), ()
        pkeys, pvals = published_rows(pub)
        if vnotes != self._vnotes or pkeys != self._pkeys or (
                self._times and (len(self._times) >= self.block_polls or t - self._times[0] >= self.block_seconds
                                 or t < self._times[-1])):
            self._close()
            if vnotes != self._vnotes:
                self._vnotes = vnotes
                self._vkeys = tuple(route_key(r) for r in vnotes)
            self._pkeys = pkeys
            self._width = len(vnotes) + len(pkeys)
        self._times.append(t)
        self._rows.append(vvals + tuple(pvals))
        if self._open_bytes() * 8 > self.max_bytes:
            self._close()  # the open block is never more than an eighth of the cap
        self._detect(t, pub)
        self._expire(t)

    def flush(self) -> None:
        """Close the open block (a reader wants everything up to now)."""
        self._close()

    def _close(self) -> None:
        if not self._times:
            return
        keys = self._vkeys + (self._pkeys or ())
        schema = self._schemas.get(keys)
        if schema is None:
            schema = self._schemas[keys] = Schema(keys)
            self._bytes += schema.nbytes
        schema.users += 1
        data = compress_rows(self._rows, self._width, self.level)
        b = Block(schema, array("d", self._times), data)
        for ev in self.events:
            if b.t1 >= ev.start and b.t0 <= ev.end:
                b.pins += 1
        self.blocks.append(b)
        self._bytes += b.nbytes
        self._times = []
        self._rows = []

    def _drop(self, i: int) -> None:
        b = self.blocks.pop(i)
        self._bytes -= b.nbytes
        self.evicted_blocks += 1
        s = b.schema
        s.users -= 1
        if s.users == 0:
            del self._schemas[s.keys]
            self._bytes -= s.nbytes

    def _expire(self, now: float) -> None:
        cutoff = now - self.horizon
        i = 0
        while i < len(self.blocks):
            b = self.blocks[i]
            if b.t1 >= cutoff:
                break
            if b.pins:
                i += 1
                continue
            self._drop(i)
        # Over the cap, in this order: the oldest block no event pins and no event opened now
        # could need (older than ``event_before``); else the oldest event is forgotten (its
        # blocks unpinned); else the oldest block.
        keep_from = now - self.event_before
        while self.nbytes > self.max_bytes and self.blocks:
            victim = next((j for j, b in enumerate(self.blocks) if not b.pins and b.t1 < keep_from), None)
            if victim is None and self.events:
                self._forget(self.events[0])
                continue
            if victim is None:
                victim = next((j for j, b in enumerate(self.blocks) if not b.pins), 0)
            self._drop(victim)

    # -- events ---------------------------------------------------------------------------
    def _forget(self, ev: Event) -> None:
        self.events.remove(ev)
        for b in self.blocks:
            if b.t1 >= ev.start and b.t0 <= ev.end:
                b.pins -= 1

    def open_event(self, t: float, kind: str, subject: str, detail: str) -> Optional[Event]:
        key = (kind, subject)
        last = self._last_open.get(key)
        if last is not None and t <= last + self.event_after:
            return None  # the previous one's window still covers this
        self._last_open[key] = t
        ev = Event(self.next_event_id, kind, subject, t, detail, self.event_before, self.event_after)
        self.next_event_id += 1
        self.events_total[kind] = self.events_total.get(kind, 0) + 1
        if self.max_events <= 0:
            return ev
        while len(self.events) >= self.max_events:
            self._forget(self.events[0])
        self.events.append(ev)
        for b in self.blocks:
            if b.t1 >= ev.start and b.t0 <= ev.end:
                b.pins += 1
        return ev

    def _edge(self, t: float, kind: str, subject: str, bad: bool, detail: str) -> None:
        key = (kind, subject)
        was = self._was.get(key, False)
        self._was[key] = bad
        if bad and not was:
            self.open_event(t, kind, subject, detail)

    def _detect(self, t: float, pub) -> None:
        for m in pub.signals.models:
            level = m.kv.pressure_level
            self._edge(t, "kv_thrashing", m.model, level is not None and level >= 3,
                       f"KV pressure level {level} (usage {m.kv.usage})")
            self._edge(t, "engine_stalled", m.model, bool(m.stalled), "requests running, no token produced")
        up = dict(pub.up).get("vllm")
        if up:
            self._seen_up = True
        self._edge(t, "vllm_unreachable", "vllm", up is False and self._seen_up, "vLLM could not be read")
        restarts = pub.vllm_restarts_total
        if self._restarts is not None and restarts > self._restarts:
            self.open_event(t, "vllm_restarted", "vllm", f"vLLM restarted ({restarts} restarts seen)")
        self._restarts = restarts
        if pub.gpu is not None:
            for (index, uuid, code), n in pub.gpu.xid_totals.items():
                k = (index, uuid, code)
                if n > self._xids.get(k, 0):
                    self.open_event(t, "gpu_xid", f"gpu {index}", f"XID {code} on GPU {index} ({uuid})")
                self._xids[k] = n

    # -- reading --------------------------------------------------------------------------
    def event(self, ident: int) -> Optional[Event]:
        return next((e for e in self.events if e.id == ident), None)

    def snapshot(self) -> Tuple[List[Block], List[Event]]:
        """The blocks (the open one closed first) and events now. Blocks never change once
        closed, so a reader can decode the list on another thread while polls go on; call
        this on the poll thread, or under the caller's lock."""
        self._close()
        return list(self.blocks), list(self.events)

    def stats(self) -> dict:
        return {"bytes": self.nbytes, "max_bytes": self.max_bytes, "blocks": len(self.blocks),
                "pinned_blocks": sum(1 for b in self.blocks if b.pins), "events": len(self.events),
                "first": self.blocks[0].t0 if self.blocks else None,
                "last": self.blocks[-1].t1 if self.blocks else None,
                "polls": sum(b.n for b in self.blocks) + len(self._times)}


# -- serving ---------------------------------------------------------------------------------

def parse_when(text: str, what: str) -> float:
    """Unix seconds or RFC 3339 (``2026-01-02T03:04:05Z``, offsets and fractions) -> seconds."""
    import datetime as _dt

    t = text.strip()
    if re.fullmatch(r"[+-]?\d+(\.\d+)?", t):  # not float(): "nan", "inf" and "1e3" are no times
        return float(t)
    try:
        d = _dt.datetime.fromisoformat(t.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(f"{what}: {text!r} is neither RFC 3339 nor unix seconds") from None
    if d.tzinfo is None:
        raise ValueError(f"{what}: {text!r} has no time zone (add Z or an offset)")
    return d.timestamp()


class _Job:
    """One encoding in a child process; ``kill`` from any thread ends it (before or after it starts)."""

    def __init__(self) -> None:
        import threading

        self.lock = threading.Lock()
        self.proc = None
        self.killed = False

    def kill(self) -> None:
        with self.lock:
            self.killed = True
            proc = self.proc
        if proc is not None and proc.poll() is None:
            try:
                proc.kill()
            except OSError:
                pass


class EncoderGone(Exception):
    """The encoding was cancelled (the client went, or the service closed)."""


class FlightService:
    """``/debug/flight`` and ``/debug/flight/events`` for the listener.

    The record is taken under the poll loop's lock (closing the open block: a few milliseconds)
    on one of this service's ``max_encoders`` threads, never on the event loop nor on the workers
    that build ``/metrics`` bodies. The blocks chosen by the range go, still compressed, to a
    child process (``flight_encode``: decode, OpenMetrics text, gzip) whose answer comes back
    over a pipe: the sidecar's interpreter only copies bytes, so the threads answering /metrics
    keep the GIL (measured: docs/performance.md, "A scrape during /debug/flight downloads").
    At most ``max_encoders`` downloads at once (default one: one core at most); another gets 503
    with ``Retry-After``; ``/debug/flight/events`` has a thread of its own, never behind a download. A child is
    killed when its client goes away, when it runs past ``timeout`` seconds, and on ``close``;
    each is waited for, so none is left behind (and one whose sidecar dies is killed by Linux:
    ``PR_SET_PDEATHSIG``). ``argv`` is the child's command line (tests put a slow one there)."""

    OM_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"

    def __init__(self, recorder: Recorder, lock, labels: Labels = (), max_encoders: int = 1,
                 timeout: float = 600.0, chunk_chars: int = 1 << 16) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self.recorder = recorder
        self.lock = lock
        self.labels = labels
        self.max_encoders = max(1, max_encoders)
        self.timeout = timeout
        self.chunk_chars = chunk_chars
        self.argv = child_argv()
        self._pool = ThreadPoolExecutor(self.max_encoders, thread_name_prefix="flight")
        self._small = ThreadPoolExecutor(1, thread_name_prefix="flight-events")  # the events, 404s: never behind a download
        self._jobs: set = set()
        self._closed = False
        self.busy = 0

    def children(self) -> List[int]:
        """The pids of the encoders running now."""
        return [j.proc.pid for j in list(self._jobs) if j.proc is not None and j.proc.poll() is None]

    def close(self) -> None:
        """Kill every encoder, wait for each, stop the threads."""
        self._closed = True
        for j in list(self._jobs):
            j.kill()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._small.shutdown(wait=True, cancel_futures=True)

    async def handle(self, loop, target: str, gz: bool) -> Tuple[int, bytes, str, Tuple[Tuple[str, str], ...]]:
        from urllib.parse import urlsplit

        if urlsplit(target).path.rstrip("/") != "/debug/flight":  # the events (small JSON): never refused
            return await loop.run_in_executor(self._small, self.respond, target, gz)
        if self.busy >= self.max_encoders:
            return 503, b"flight records are being encoded, retry\n", "text/plain; charset=utf-8", (("Retry-After", "2"),)
        self.busy += 1
        job = _Job()
        try:
            return await loop.run_in_executor(self._pool, self.respond, target, gz, job)
        except BaseException:  # cancelled (the client went, the listener stops) or failed: no child stays
            job.kill()
            raise
        finally:
            self.busy -= 1

    def respond(self, target: str, gz: bool, job: Optional[_Job] = None
                ) -> Tuple[int, bytes, str, Tuple[Tuple[str, str], ...]]:
        """(status, body, content type, headers) for a request target; runs on the service's thread."""
        import json
        from urllib.parse import parse_qs, urlsplit

        parts = urlsplit(target)
        path = parts.path.rstrip("/")
        q = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        plain = "text/plain; charset=utf-8"
        with self.lock:
            blocks, events = self.recorder.snapshot()
            stats = self.recorder.stats()
        if path == "/debug/flight/events":
            body = json.dumps({"labels": dict(self.labels), "recorder": stats,
                               "events": [e.as_dict() for e in events]}, indent=1).encode() + b"\n"
            return 200, body, "application/json", ()
        if path != "/debug/flight":
            return 404, b"not found\n", plain, ()
        start, end = -math.inf, math.inf
        try:
            if "event" in q:
                ev = next((e for e in events if str(e.id) == q["event"].strip()), None)
                if ev is None:
                    return 404, f"no event {q['event']!r} (see /debug/flight/events)\n".encode(), plain, ()
                start, end = ev.start, ev.end
            if "start" in q:
                start = parse_when(q["start"], "start")
            if "end" in q:
                end = parse_when(q["end"], "end")
        except ValueError as exc:
            return 400, f"{exc}\n".encode(), plain, ()
        if end < start:
            return 400, b"end is before start\n", plain, ()
        chosen = [(b.schema.packed, b.times.tobytes(), b.data) for b in blocks if b.t1 >= start and b.t0 <= end]
        payload = pack(chosen, start, end, self.labels, gz, self.chunk_chars)
        del chosen, blocks
        body = self._run(job or _Job(), payload)
        if gz:
            return 200, body, self.OM_TYPE, (("Content-Encoding", "gzip"), ("Vary", "Accept-Encoding"))
        return 200, body, self.OM_TYPE, (("Vary", "Accept-Encoding"),)

    def _run(self, job: _Job, payload: bytes) -> bytes:
        """The child's answer to ``payload``; raises EncoderGone when it was killed, RuntimeError
        when it failed or ran past the timeout."""
        import subprocess

        self._jobs.add(job)  # first: a close() from here on kills it, started or not
        with job.lock:
            if job.killed or self._closed:
                self._jobs.discard(job)
                raise EncoderGone("cancelled before it started")
            job.proc = proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                               stderr=subprocess.PIPE, close_fds=True)
        try:
            try:
                out, err = proc.communicate(payload, timeout=self.timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                raise RuntimeError(f"the flight encoder ran past {self.timeout:g} s") from None
            if job.killed:
                raise EncoderGone("killed")
            if proc.returncode != 0:
                tail = err.decode(errors="replace").strip().splitlines()[-1:] or [""]
                raise RuntimeError(f"the flight encoder exited {proc.returncode}: {tail[0][:300]}")
            return out
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            self._jobs.discard(job)


def child_argv() -> List[str]:
    """The encoder child's command: this interpreter, isolated (-I: no environment, no user site,
    no current directory), importing this very package by its path."""
    import os

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = ("import sys; sys.path.insert(0, sys.argv[1]); "
            "from exporter.runtime.flight_encode import child_main; child_main()")
    return [sys.executable, "-I", "-c", code, root]
