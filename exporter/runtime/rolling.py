"""Sliding windows with constant work per poll: reset-adjusted running totals and a ring of them.

``Windows.add`` takes one snapshot at a time. For every counter and histogram series it works
out the increase since the same series was last seen (counter resets handled) and adds it to a
running total per ``(input, model_name, extra label)`` and per histogram bucket, all engines
together: a "virtual counter" that never goes down. After each poll the totals are copied into a
ring of ``(t, totals)`` (one flat ``array('d')``), so the increase over any window the ring
covers is one subtraction per total, ``totals(last) - totals(first)``, whatever the number of
polls in the window. Gauges are read from the latest snapshot; the KV-usage trend keeps running
sums for its least-squares slope; the stall check keeps, per model, when requests were last not
running and when the engine was last not wedged (requests waiting, none running). The cost of a
poll grows with the series on the page, never with the window.

Increases, like Prometheus' ``rate()``: a value lower than the one before means the counter
restarted from zero, so the whole new value is the increase (for a histogram: its count or any
bucket went down). Beyond ``rate()``:

- a change of vLLM's ``process_start_time_seconds`` to a later, never seen value is a restart:
  every series counts from zero, even one that already climbed past its old value;
- a start time seen before, or earlier than the current one, is another process answering the
  same URL (two servers behind a Service): nothing is reset and no restart is counted; each
  process keeps its own last values, so increases stay each process's own and add up to what the
  processes did together (``other_process`` in the result; the poll loop reports it);
- a series missing from a page is remembered (its last value, for ``memory`` seconds): when it
  comes back, its increase is its growth since it was last seen, never its whole value, and its
  total stays in the window while it is away;
- the OpenAI server's answers (``inputs.HTTP_KEY``, added up by status) are counted as vLLM's
  counters are, under model_name "" (the pod's), kept whatever models come and go;
- a series seen for the first time while the process is the same counts its value as an
  increase only when it was created since the previous poll: vLLM creates labelled series lazily
  at their first event. With the series' ``_created`` time on the page that is known (created
  after the previous poll, with one poll interval of tolerance for clocks). Without it, the value
  must be small: no more than one poll's worth of that input for that model (the largest
  increase of one series of it in the previous poll, at least 1). Otherwise it counts from its
  current value (an engine label changing, or a series the sidecar missed, never spikes a rate).

The first snapshot is the baseline: it holds no increase. Time going backwards (a corrected
clock) starts everything again. Nothing here reads a clock.
"""

from __future__ import annotations

import math
from array import array
from bisect import bisect_left, bisect_right
from collections import OrderedDict, deque
from typing import Deque, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

from .inputs import COUNTER, HTTP_KEY, INPUTS, Hist, HistKey, SeriesKey, Snapshot

# vLLM's counters, and the HTTP answers (model_name "": the pod's, kept whatever models come and go)
_COUNTER_KEYS = frozenset(i.key for i in INPUTS if i.kind == COUNTER) | {HTTP_KEY}
_MAX_PROCESSES = 4


# No vLLM counter grows faster than this (tokens, requests, seconds, per second): a bigger jump
# between two reads of one series is a wrong value, rejected, never a rate.
MAX_RATE_PER_SECOND = 1e9


class AddResult(NamedTuple):
    restart: bool  # a new vLLM process (later start time, never seen before)
    other_process: bool  # a process seen before or older than the current one answered
    rejected: int = 0  # values rejected as impossible (a jump too big, a drop without a restart)


class _Proc:
    """The last value of every series of one vLLM process, and when it was seen."""

    __slots__ = ("start", "last", "hlast", "seen", "down")

    def __init__(self, start: Optional[float]) -> None:
        self.start = start
        self.down: set = set()  # series that went down on the last read without a restart
        self.last: Dict[SeriesKey, Tuple[float, float]] = {}
        self.hlast: Dict[HistKey, Tuple[Hist, float, Tuple[int, ...]]] = {}
        self.seen = -math.inf


class HistSlots:
    """Where one histogram's totals are: a slot per bucket bound (sorted), the sum's, the count's."""

    __slots__ = ("les", "slots", "by_le", "sum", "count")

    def __init__(self, sum_slot: int, count_slot: int) -> None:
        self.les: List[float] = []
        self.slots: List[int] = []
        self.by_le: Dict[float, int] = {}
        self.sum = sum_slot
        self.count = count_slot


class _Trend:
    """Running sums for the least-squares slope of (t, y) over a sliding window."""

    __slots__ = ("pts", "t0", "st", "sy", "stt", "sty", "pops")

    def __init__(self) -> None:
        self.pts: Deque[Tuple[float, float]] = deque()
        self.t0 = 0.0
        self.st = self.sy = self.stt = self.sty = 0.0
        self.pops = 0

    def _sums(self) -> None:
        self.t0 = self.pts[0][0] if self.pts else 0.0
        self.st = self.sy = self.stt = self.sty = 0.0
        for t, y in self.pts:
            self._plus(t, y, 1.0)
        self.pops = 0

    def _plus(self, t: float, y: float, sign: float) -> None:
        x = t - self.t0
        self.st += sign * x
        self.sy += sign * y
        self.stt += sign * x * x
        self.sty += sign * x * y

    def add(self, t: float, y: float) -> None:
        if not self.pts:
            self.t0 = t
        self.pts.append((t, y))
        self._plus(t, y, 1.0)

    def evict(self, lo: float) -> None:
        pts = self.pts
        while pts and pts[0][0] < lo:
            t, y = pts.popleft()
            self._plus(t, y, -1.0)
            self.pops += 1
        if self.pops >= max(16, len(pts)):
            self._sums()  # now and then from scratch (amortized constant): no drift, origin kept near

    def slope(self) -> Optional[float]:
        n = len(self.pts)
        if n < 2:
            return None
        den = n * self.stt - self.st * self.st
        if den <= 1e-9 * max(1.0, n * self.stt):
            return None
        return (n * self.sty - self.st * self.sy) / den


class _Credit:
    """What a series seen for the first time in this process adds (see the module docstring)."""

    __slots__ = ("prev_t", "other", "fresh", "created", "step", "tolerance")

    def __init__(self, prev_t: Optional[float], other: bool, fresh: bool, created: Dict,
                 step: Dict[Tuple[str, str], float], tolerance: float) -> None:
        self.prev_t, self.other, self.fresh = prev_t, other, fresh
        self.created, self.step, self.tolerance = created, step, tolerance

    def __call__(self, key: SeriesKey, value: float) -> float:
        if self.prev_t is None or self.other:
            return 0.0  # the baseline, or a process whose history we do not have
        if self.fresh:
            return value  # a new process: its counters started from zero
        c = self.created.get(key)
        if c is not None:
            return value if c >= self.prev_t - self.tolerance else 0.0
        return value if value <= max(1.0, self.step.get((key[0], key[1]), 0.0)) else 0.0


def _hist_step(h: Hist, p: Hist, dt: float, whole: bool, named: bool, was_down: bool) -> str:
    """What one histogram read after ``p`` is: ``add`` (its increase, or its whole value when
    ``whole``: counts went down on an unnamed process), ``suspect`` (down without a restart, or
    its sum down: wrong once, left out), ``suspect_again`` (the sum down twice in a row: a new
    baseline, rejected), ``baseline`` (down twice in a row on a named process: a reset we cannot
    place, a new baseline) or ``jump`` (an impossible increase, left out)."""
    if whole and named:
        return "baseline" if was_down else "suspect"
    if not whole and h.count - p.count > MAX_RATE_PER_SECOND * max(dt, 1e-3):
        return "jump"
    if not whole and h.sum < p.sum:
        # counts up or level but the sum down: observations are never negative, so one of the
        # two pages is wrong (a page cut inside the number). Once: left out; twice in a row: a
        # new baseline, never a negative increase.
        return "suspect_again" if was_down else "suspect"
    return "add"


class Windows:
    """Running totals and their ring (see the module docstring). Owned by one poll loop."""

    def __init__(self, window: float, retention: float = 0.0, poll_interval: float = 1.0,
                 memory: Optional[float] = None) -> None:
        self.window = float(window)
        self.retention = max(float(retention), self.window)
        self.poll_interval = float(poll_interval)
        self.memory = float(memory) if memory is not None else self.retention
        self.reset()

    def reset(self) -> None:
        """Forget everything (time went backwards, or the poll loop asks after a failure)."""
        self._procs: "OrderedDict[Optional[float], _Proc]" = OrderedDict()
        self._proc: Optional[_Proc] = None
        self._agg: List[float] = []
        self._slot_keys: List[tuple] = []
        self._ctr: Dict[Tuple[str, str], Dict[str, int]] = {}
        self._hst: Dict[Tuple[str, str], HistSlots] = {}
        self._times: List[float] = []
        self._ring: List[array] = []
        self._head = 0
        self._trend: Dict[str, _Trend] = {}
        self._not_running: Dict[str, float] = {}
        self._not_queued: Dict[str, float] = {}  # last time not (requests waiting, none running)
        self._absent_t = -math.inf
        self._model_seen: Dict[str, float] = {}
        self._step: Dict[Tuple[str, str], float] = {}
        self._seen_at: Dict[Tuple[str, str], float] = {}  # (counter input, model) -> last on a page
        self.latest: Optional[Snapshot] = None
        self.other_process_t = -math.inf  # when another process last answered
        self.polls = 0

    # -- slots ---------------------------------------------------------------------------------
    def _new_slot(self, key: tuple) -> int:
        self._agg.append(0.0)
        self._slot_keys.append(key)
        return len(self._agg) - 1

    def _ctr_slot(self, inp: str, model: str, extra: str) -> int:
        d = self._ctr.get((inp, model))
        if d is None:
            d = self._ctr[(inp, model)] = {}
        slot = d.get(extra)
        if slot is None:
            slot = d[extra] = self._new_slot(("c", inp, model, extra))
        return slot

    def _hist_slots(self, inp: str, model: str, les: Tuple[float, ...]) -> Tuple[int, ...]:
        hs = self._hst.get((inp, model))
        if hs is None:
            hs = self._hst[(inp, model)] = HistSlots(self._new_slot(("s", inp, model)),
                                                      self._new_slot(("n", inp, model)))
        by_le = hs.by_le
        out = []
        for le in les:
            slot = by_le.get(le)
            if slot is None:
                slot = by_le[le] = self._new_slot(("b", inp, model, le))
                hs.les = sorted(by_le)
                hs.slots = [by_le[x] for x in hs.les]
            out.append(slot)
        return tuple(out)

    # -- one poll ------------------------------------------------------------------------------
    def _process_for(self, snap: Snapshot, t: float) -> Tuple[_Proc, bool, bool, bool]:
        """(process state, fresh: its values count from zero, restart, other process)."""
        start = snap.process_start
        cur = self._proc
        if cur is None:
            proc = _Proc(start)
            self._procs[start] = proc
            return proc, False, False, False
        if start is None or start == cur.start:
            return cur, False, False, False
        if cur.start is None:  # the start time appeared: the same process, now named
            self._procs.pop(None, None)
            cur.start = start
            self._procs[start] = cur
            return cur, False, False, False
        known = self._procs.get(start)
        if known is not None or start < cur.start:
            proc = known or _Proc(start)
            self._procs[start] = proc
            self._procs.move_to_end(start)
            return proc, False, False, True
        proc = _Proc(start)
        self._procs[start] = proc
        while len(self._procs) > _MAX_PROCESSES:
            self._procs.popitem(last=False)
        return proc, True, True, False

    def add(self, snap: Snapshot) -> AddResult:
        t = snap.t
        if self._times and t < self._times[-1]:
            self.reset()
        prev_t = self._times[-1] if self._times else None
        proc, fresh, restart, other = self._process_for(snap, t)
        if other:
            self.other_process_t = t
        self._proc = proc
        proc.seen = t
        credit = _Credit(prev_t, other, fresh, snap.created, self._step, self.poll_interval + 1.0)
        new_step: Dict[Tuple[str, str], float] = {}
        rejected = self._add_counters(snap, proc, credit, new_step)
        rejected += self._add_hists(snap, proc, credit, new_step)
        self._step = new_step
        self._add_gauges(snap, prev_t)
        self._push_row(t)
        self.latest = snap
        self.polls += 1
        if self.polls % 32 == 0:
            self._forget(t)
        return AddResult(restart, other, rejected)

    def _add_counters(self, snap: Snapshot, proc: _Proc, credit: "_Credit",
                      new_step: Dict[Tuple[str, str], float]) -> int:
        """Every counter series' increase into its total; the values rejected."""
        t, agg, last, down = snap.t, self._agg, proc.last, proc.down
        rejected = 0
        named = proc.start is not None  # a known start time: a drop without its change is wrong
        for key, v in snap.values.items():
            inp = key[0]
            if inp not in _COUNTER_KEYS:
                continue
            prev = last.get(key)
            if prev is None:
                inc = credit(key, v)
            else:
                p, pt_ = prev
                if v >= p:
                    inc = v - p
                    if inc > MAX_RATE_PER_SECOND * max(t - pt_, 1e-3):
                        rejected += 1  # an impossible jump: this value is wrong, keep the last
                        continue
                    down.discard(key)
                elif named and key not in down:
                    rejected += 1  # down without a restart: wrong once; twice in a row, a reset
                    down.add(key)
                    continue
                else:
                    down.discard(key)
                    inc = v if not named else 0.0
            last[key] = (v, t)
            self._seen_at[(inp, key[1])] = t
            d = self._ctr.get((inp, key[1]))
            slot = d.get(key[3]) if d is not None else None
            if slot is None:
                slot = self._ctr_slot(inp, key[1], key[3])
            if inc:
                agg[slot] += inc
                mk = (inp, key[1])
                if inc > new_step.get(mk, 0.0):
                    new_step[mk] = inc
        return rejected

    def _add_hists(self, snap: Snapshot, proc: _Proc, credit: "_Credit",
                   new_step: Dict[Tuple[str, str], float]) -> int:
        """Every histogram's increase (buckets, sum, count) into its totals; the values rejected."""
        t, agg, hlast, down = snap.t, self._agg, proc.hlast, proc.down
        rejected = 0
        named = proc.start is not None
        for hkey, h in snap.hists.items():
            prev = hlast.get(hkey)
            les = tuple([le for le, _c in h.buckets])
            same = prev is not None and prev[3] == les
            if prev is not None and not same:
                if set(les) < set(prev[3]):
                    continue  # buckets missing from this page: incomplete, keep the last one whole
                hlast[hkey] = (h, t, self._hist_slots(hkey[0], hkey[1], les), les)
                continue  # a new bucket layout: a new baseline, no increase from it
            slots = prev[2] if same else self._hist_slots(hkey[0], hkey[1], les)
            hs = self._hst[(hkey[0], hkey[1])]
            if prev is None:
                whole = credit((hkey[0], hkey[1], hkey[2], ""), h.count) > 0
            else:
                p = prev[0]
                whole = h.count < p.count or any(c < pc for (_le, c), (_ple, pc) in zip(h.buckets, p.buckets))
                verdict = _hist_step(h, p, t - prev[1], whole, named, hkey in down)
                if verdict == "jump":
                    rejected += 1
                    continue
                if verdict == "suspect":
                    rejected += 1
                    down.add(hkey)
                    continue
                if verdict != "add":  # baseline, suspect_again: a reset we cannot place, a new baseline
                    rejected += verdict == "suspect_again"
                    down.discard(hkey)
                    hlast[hkey] = (h, t, slots, les)
                    continue
                down.discard(hkey)
                if not whole:
                    for slot, (_le, c), (_ple, pc) in zip(slots, h.buckets, p.buckets):
                        agg[slot] += c - pc
                    agg[hs.sum] += h.sum - p.sum
                    agg[hs.count] += h.count - p.count
                    mk = (hkey[0], hkey[1])
                    if h.count - p.count > new_step.get(mk, 0.0):
                        new_step[mk] = h.count - p.count
            if whole:
                for slot, (_le, c) in zip(slots, h.buckets):
                    agg[slot] += c
                agg[hs.sum] += h.sum
                agg[hs.count] += h.count
            hlast[hkey] = (h, t, slots, les)
        return rejected

    def _add_gauges(self, snap: Snapshot, prev_t: Optional[float]) -> None:
        """Gauges, the KV trend and the stall bookkeeping, per model."""
        t = snap.t
        lo = t - self.window
        seen = self._model_seen
        for m in snap.models:
            if m not in seen:
                self._not_running[m] = self._not_queued[m] = prev_t if prev_t is not None else -math.inf
            seen[m] = t
        if not (snap.present("running") and snap.present("generation_tokens")):
            self._absent_t = t
        for m in seen:
            idle = sum(snap.gauge("running", m)) <= 0
            if idle:
                self._not_running[m] = t
            if not idle or sum(snap.gauge("waiting", m)) <= 0:
                self._not_queued[m] = t
            kv = snap.gauge("kv_usage", m)
            tr = self._trend.get(m)
            if kv:
                if tr is None:
                    tr = self._trend[m] = _Trend()
                tr.add(t, max(kv))
            if tr is not None:
                tr.evict(lo)

    def _push_row(self, t: float) -> None:
        """The totals as the ring's newest row; rows older than the retention dropped now and then."""
        self._times.append(t)
        self._ring.append(array("d", self._agg))
        horizon = t - self.retention
        times = self._times
        while self._head < len(times) - 1 and times[self._head] < horizon:
            self._head += 1
        if self._head > 64 and self._head * 2 > len(times):
            del times[: self._head]
            del self._ring[: self._head]
            self._head = 0

    def _forget(self, t: float) -> None:
        """Drop what has not been seen for ``memory`` seconds (series, processes, models)."""
        lo = t - self.memory
        for start, proc in list(self._procs.items()):
            if proc is not self._proc and proc.seen < lo:
                del self._procs[start]
                continue
            for key in [k for k, (_v, seen) in proc.last.items() if seen < lo]:
                del proc.last[key]
            for key in [k for k, v in proc.hlast.items() if v[1] < lo]:
                del proc.hlast[key]
        gone = [m for m, seen in self._model_seen.items() if seen < lo]
        for k in [k for k, seen in self._seen_at.items() if seen < lo]:
            del self._seen_at[k]
        for m in gone:
            del self._model_seen[m]
            self._not_running.pop(m, None)
            self._not_queued.pop(m, None)
            self._trend.pop(m, None)
        if gone:
            self._compact()

    def _compact(self) -> None:
        """Renumber the totals of the models still known; rewrite the ring to match."""
        keep = [i for i, key in enumerate(self._slot_keys) if key[2] in self._model_seen or key[2] == ""]
        if len(keep) == len(self._slot_keys):
            return
        self._slot_keys = [self._slot_keys[i] for i in keep]
        self._agg = [self._agg[i] for i in keep]
        ring = self._ring
        for k in range(self._head, len(ring)):
            old = ring[k]
            n = len(old)
            ring[k] = array("d", [old[i] if i < n else 0.0 for i in keep])
        del ring[: self._head]
        del self._times[: self._head]
        self._head = 0
        self._ctr = {}
        self._hst = {}
        for idx, key in enumerate(self._slot_keys):
            if key[0] == "c":
                self._ctr.setdefault((key[1], key[2]), {})[key[3]] = idx
        for idx, key in enumerate(self._slot_keys):
            if key[0] in ("s", "n"):
                hs = self._hst.get((key[1], key[2]))
                if hs is None:
                    hs = self._hst[(key[1], key[2])] = HistSlots(-1, -1)
                if key[0] == "s":
                    hs.sum = idx
                else:
                    hs.count = idx
        for idx, key in enumerate(self._slot_keys):
            if key[0] == "b":
                hs = self._hst[(key[1], key[2])]
                hs.by_le[key[3]] = idx
        for hs in self._hst.values():
            hs.les = sorted(hs.by_le)
            hs.slots = [hs.by_le[x] for x in hs.les]
        for proc in self._procs.values():  # cached slot numbers are stale: look them up again
            for key, (h, seen, _slots, les) in list(proc.hlast.items()):
                if key[1] in self._model_seen:
                    proc.hlast[key] = (h, seen, self._hist_slots(key[0], key[1], les), les)
                else:
                    del proc.hlast[key]
            for key in [k for k in proc.last if k[1] not in self._model_seen and k[1] != ""]:
                del proc.last[key]

    # -- reading (what a Window reads) -------------------------------------------------------
    def view(self, now: float, seconds: Optional[float] = None) -> "Window":
        return Window(self, now, self.window if seconds is None else seconds)

    def multiple_processes(self, now: float) -> bool:
        """Another process answered within the windows' memory."""
        return now - self.other_process_t <= self.memory

    def series_count(self) -> int:
        """Series remembered, all processes (for the soak test and the bench)."""
        return sum(len(p.last) + len(p.hlast) for p in self._procs.values())

    def totals_count(self) -> int:
        return len(self._agg)

    def ring_length(self) -> int:
        return len(self._times) - self._head

    def rows_within(self, since: float, until: float) -> Tuple[int, int]:
        """The first and last rows of the ring taken in ``[since, until]`` (last < first: none)."""
        times = self._times
        hi = bisect_right(times, until, self._head) - 1
        lo = bisect_left(times, since, self._head, max(self._head, hi + 1))
        return lo, hi

    def row_at_or_before(self, t: float) -> Optional[int]:
        """The last row taken at or before ``t``; None when the ring does not reach back so far."""
        k = bisect_right(self._times, t, self._head) - 1
        return k if k >= self._head else None

    def row(self, k: int) -> Tuple[float, array]:
        """One row of the ring: when it was taken, the totals then (by slot)."""
        return self._times[k], self._ring[k]

    def counter_slots(self, key: str, model: str) -> Dict[str, int]:
        """The total of each extra label value of a counter input for one model (empty: never seen)."""
        return self._ctr.get((key, model)) or {}

    def totals(self, key: str, model: str) -> Dict[str, float]:
        """The running total (every increase since the windows started) of each extra label
        value of a counter input for one model (empty: never seen)."""
        agg = self._agg
        return {x: agg[slot] for x, slot in self.counter_slots(key, model).items()}

    def hist_slots(self, key: str, model: str) -> Optional[HistSlots]:
        """Where a histogram input's totals are for one model (None: never seen)."""
        return self._hst.get((key, model))

    def last_seen(self, key: str, model: str) -> Optional[float]:
        """When a counter input of one model was last on a page."""
        return self._seen_at.get((key, model))

    def kv_slope(self, model: str) -> Optional[float]:
        """The KV usage trend over the window, per second (None without two points)."""
        tr = self._trend.get(model)
        return tr.slope() if tr is not None else None

    def last_not_running(self, model: str) -> float:
        """When a poll last saw no request running for the model (inf: model never seen)."""
        return self._not_running.get(model, math.inf)

    def last_not_wedged(self, model: str) -> float:
        """When a poll last saw the model not wedged (requests waiting and none running)."""
        return self._not_queued.get(model, math.inf)

    def inputs_missing_at(self) -> float:
        """When a page last lacked the running or generation-tokens input."""
        return self._absent_t


class Window:
    """One window of the ring, ending at ``now``: increases as differences of two rows. Reads
    ``Windows`` through its public reading methods only."""

    def __init__(self, w: Windows, now: float, seconds: float) -> None:
        self.w = w
        lo, hi = w.rows_within(now - seconds, now)
        self.polls = hi - lo + 1 if hi >= lo else 0
        self.latest = w.latest
        if self.polls:
            (first_t, first), (last_t, last) = w.row(lo), w.row(hi)
            if len(first) < len(last):  # totals added since: they started from 0
                first = first + array("d", bytes(8 * (len(last) - len(first))))
            self._first = first
            self._last = last
            self.first_t = first_t
            self.span = last_t - first_t
        else:
            self._first = self._last = array("d")
            self.first_t = now
            self.span = 0.0
        self.now = now
        self._hists: Dict[Tuple[str, str], Optional[Hist]] = {}  # read once per window

    def hist(self, key: str, model: str) -> Optional[Hist]:
        """The histogram of what was observed in the window (one model, engines added); worked
        out once per window and input (the signals read some twice)."""
        k = (key, model)
        try:
            return self._hists[k]
        except KeyError:
            h = self._hists[k] = self._hist(key, model)
            return h

    def _inc(self, slot: int) -> float:
        first, last = self._first, self._last
        a = last[slot] if slot < len(last) else 0.0
        b = first[slot] if slot < len(first) else 0.0
        return a - b

    def increase(self, key: str, model: str) -> Optional[float]:
        """Increase of one counter input for one model over the window, all engines and extra
        label values summed; None when the model never had that input."""
        d = self.w.counter_slots(key, model)
        if not d:
            return None
        return sum(self._inc(s) for s in d.values())

    def span_of(self, key: str, model: str) -> float:
        """The window's span for one counter input: up to when it was last on a page, so that
        a series missing from the latest page (or rejected on it) lowers no rate."""
        seen = self.w.last_seen(key, model)
        end = self.first_t + self.span
        if seen is not None and self.first_t < seen < end:
            return seen - self.first_t
        return self.span

    def by_extra(self, key: str, model: str) -> Dict[str, float]:
        d = self.w.counter_slots(key, model)
        return {x: self._inc(s) for x, s in sorted(d.items())}

    def _hist(self, key: str, model: str) -> Optional[Hist]:
        hs = self.w.hist_slots(key, model)
        if hs is None or not hs.les:
            return None
        first, last = self._first, self._last
        if not last:
            return None
        count = last[hs.count] - first[hs.count]
        # Each page's histogram is cumulative (``inputs`` checks), but the difference of two can
        # come out not cumulative where a page's counts were rounded or written separately; no
        # bucket may hold more than the ones above it: clip from the top, at the count.
        top = count
        out = []
        for le, s in zip(reversed(hs.les), reversed(hs.slots)):
            c = last[s] - first[s]
            if c > top:
                c = top
            top = c
            out.append((le, c))
        out.reverse()
        return Hist(buckets=tuple(out), sum=last[hs.sum] - first[hs.sum], count=count)

    def kv_slope(self, model: str) -> Optional[float]:
        return self.w.kv_slope(model)

    def stalled(self, model: str, stall_seconds: float) -> Optional[bool]:
        """Requests running throughout the last ``stall_seconds`` and not one token produced; or
        a wedged engine: requests waiting and none running throughout, no token and no engine
        iteration (``iterations``, where the page has it).

        None while the history does not reach back that far or the inputs were missing."""
        w = self.w
        anchor = w.row_at_or_before(self.now - stall_seconds)
        if anchor is None:
            return None
        at, first = w.row(anchor)
        if w.inputs_missing_at() >= at:
            return None
        wedged = w.last_not_wedged(model) < at
        if w.last_not_running(model) >= at and not wedged:
            return False
        last = self._last

        def grew(slots) -> bool:
            return sum((last[s] if s < len(last) else 0.0) - (first[s] if s < len(first) else 0.0)
                       for s in slots) > 0

        if grew(w.counter_slots("generation_tokens", model).values()):
            return False
        steps = w.counter_slots("iterations", model)
        return not (wedged and steps and grew(steps.values()))


def merge_hists(hists: Iterable[Hist]) -> Optional[Hist]:
    """Add histograms (the engines of one model) bucket by bucket."""
    if isinstance(hists, (list, tuple)) and len(hists) == 1:
        return hists[0]
    b: Dict[float, float] = {}
    s = c = 0.0
    n = 0
    for h in hists:
        n += 1
        for le, v in h.buckets:
            b[le] = b.get(le, 0.0) + v
        s += h.sum
        c += h.count
    if n == 0:
        return None
    return Hist(buckets=tuple(sorted(b.items())), sum=s, count=c)


def model_hist(snap: Snapshot, key: str, model: str) -> Optional[Hist]:
    """One model's histogram on one page, all engines added."""
    return merge_hists(snap.hists_by_model.get((key, model), ()))


def linear_slope(points: Sequence[Tuple[float, float]]) -> Optional[float]:
    """Least-squares slope of (t, y) points; None with fewer than two distinct times."""
    n = len(points)
    if n < 2:
        return None
    mt = sum(t for t, _ in points) / n
    my = sum(y for _, y in points) / n
    den = sum((t - mt) ** 2 for t, _ in points)
    if den == 0:
        return None
    return sum((t - mt) * (y - my) for t, y in points) / den


def restarted(prev: Snapshot, cur: Snapshot) -> bool:
    """True when vLLM's process start time changed between two snapshots."""
    return (prev.process_start is not None and cur.process_start is not None
            and prev.process_start != cur.process_start)


def windows_over(snaps: Sequence[Snapshot], window: float, retention: float = 0.0,
                 poll_interval: float = 1.0) -> Windows:
    """A Windows fed with ``snaps`` in order (for tests and one-off derivations)."""
    w = Windows(window, retention, poll_interval)
    for s in snaps:
        w.add(s)
    return w
