"""Sliding windows over snapshots, and the counter and histogram arithmetic on them.

Everything here is a pure function of the snapshots it is given, except ``History``, which only
stores them. Time is never read from a clock: each snapshot carries the time it was taken and
callers pass ``now``.

Counter resets are handled the way Prometheus' ``rate()`` handles them (a value lower than the
one before means the counter restarted from zero, so the whole new value is the increase), with
two improvements: a change of vLLM's ``process_start_time_seconds`` marks a restart even when
the new counter has already climbed past the old value, and a series that appears while the
process is the same (vLLM creates labelled series lazily) counts its first value instead of
losing it.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Deque, Dict, Iterable, List, Optional, Sequence, Tuple

from .inputs import COUNTER, INPUT_BY_KEY, Hist, HistKey, SeriesKey, Snapshot

Buckets = List[Tuple[float, float]]  # (upper bound, cumulative count), sorted


class History:
    """The snapshots of the last ``retention`` seconds, oldest first."""

    def __init__(self, retention: float) -> None:
        self.retention = float(retention)
        self._snaps: Deque[Snapshot] = deque()

    def add(self, snap: Snapshot) -> None:
        if self._snaps and snap.t < self._snaps[-1].t:
            # time went backwards (a replayed or corrected clock): start again
            self._snaps.clear()
        self._snaps.append(snap)
        horizon = snap.t - self.retention
        while len(self._snaps) > 1 and self._snaps[0].t < horizon:
            self._snaps.popleft()

    def window(self, now: float, seconds: float) -> List[Snapshot]:
        lo = now - seconds
        return [s for s in self._snaps if lo <= s.t <= now]

    def latest(self) -> Optional[Snapshot]:
        return self._snaps[-1] if self._snaps else None

    def __len__(self) -> int:
        return len(self._snaps)


def restarted(prev: Snapshot, cur: Snapshot) -> bool:
    """True when vLLM's process changed between two snapshots."""
    return (
        prev.process_start is not None
        and cur.process_start is not None
        and prev.process_start != cur.process_start
    )


def _is_counter(key: str) -> bool:
    return INPUT_BY_KEY[key].kind == COUNTER


def counter_increases(snaps: Sequence[Snapshot]) -> Dict[SeriesKey, float]:
    """Increase of every counter series across the snapshots, resets handled."""
    out: Dict[SeriesKey, float] = {}
    for prev, cur in zip(snaps, snaps[1:]):
        reset_all = restarted(prev, cur)
        pv = prev.values
        for key, v in cur.values.items():
            if not _is_counter(key[0]):
                continue
            p = pv.get(key)
            if p is None or reset_all or v < p:
                inc = v if v > 0 else 0.0
            else:
                inc = v - p
            out[key] = out.get(key, 0.0) + inc
    return out


def histogram_increases(snaps: Sequence[Snapshot]) -> Dict[HistKey, Hist]:
    """Increase of every histogram series across the snapshots, as a histogram of its own."""
    acc: Dict[HistKey, Dict[str, object]] = {}
    for prev, cur in zip(snaps, snaps[1:]):
        reset_all = restarted(prev, cur)
        for key, h in cur.hists.items():
            p = prev.hists.get(key)
            reset = (
                p is None
                or reset_all
                or h.count < p.count
                or any(c < pc for (_, c), (_, pc) in zip(h.buckets, p.buckets))
            )
            a = acc.setdefault(key, {"b": {}, "sum": 0.0, "count": 0.0})
            b = a["b"]
            if reset:
                for le, c in h.buckets:
                    b[le] = b.get(le, 0.0) + c
                a["sum"] += h.sum
                a["count"] += h.count
            else:
                prev_b = dict(p.buckets)
                for le, c in h.buckets:
                    b[le] = b.get(le, 0.0) + c - prev_b.get(le, 0.0)
                a["sum"] += h.sum - p.sum
                a["count"] += h.count - p.count
    return {
        k: Hist(buckets=tuple(sorted(a["b"].items())), sum=a["sum"], count=a["count"])
        for k, a in acc.items()
    }


def sum_counters(incs: Dict[SeriesKey, float], key: str, model: str) -> Optional[float]:
    """Total increase of one input for one model, all engines and extra labels summed."""
    vals = [v for (k, m, _e, _x), v in incs.items() if k == key and m == model]
    return sum(vals) if vals else None


def by_extra(incs: Dict[SeriesKey, float], key: str, model: str) -> Dict[str, float]:
    out: Dict[str, float] = {}
    for (k, m, _e, x), v in incs.items():
        if k == key and m == model:
            out[x] = out.get(x, 0.0) + v
    return out


def merge_hists(hists: Iterable[Hist]) -> Optional[Hist]:
    """Add histograms (the engines of one model) bucket by bucket."""
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


def model_hist(hists: Dict[HistKey, Hist], key: str, model: str) -> Optional[Hist]:
    return merge_hists(h for (k, m, _e), h in hists.items() if k == key and m == model)


def _monotonic(buckets: Sequence[Tuple[float, float]]) -> Buckets:
    out: Buckets = []
    hi = 0.0
    for le, c in buckets:
        hi = max(hi, c)
        out.append((le, hi))
    return out


def histogram_quantile(q: float, buckets: Sequence[Tuple[float, float]]) -> float:
    """Prometheus' ``histogram_quantile`` on cumulative buckets (upper bound, count).

    Same rules: NaN without a ``+Inf`` bucket or without observations; the ``+Inf`` bucket
    answers with the highest finite bound; linear interpolation inside a bucket, the first
    bucket starting at 0 when its bound is positive.
    """
    if math.isnan(q):
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    if not buckets or not math.isinf(buckets[-1][0]):
        return math.nan
    b = _monotonic(sorted(buckets))
    if len(b) < 2:
        return math.nan
    observations = b[-1][1]
    if observations == 0:
        return math.nan
    rank = q * observations
    idx = len(b) - 1
    for i in range(len(b) - 1):
        if b[i][1] >= rank:
            idx = i
            break
    if idx == len(b) - 1:
        return b[-2][0]
    if idx == 0 and b[0][0] <= 0:
        return b[0][0]
    start, end, count = 0.0, b[idx][0], b[idx][1]
    if idx > 0:
        start = b[idx - 1][0]
        count -= b[idx - 1][1]
        rank -= b[idx - 1][1]
    if count == 0:
        return end
    return start + (end - start) * (rank / count)


def count_at_or_below(x: float, buckets: Sequence[Tuple[float, float]]) -> float:
    """Observations at or below ``x``, interpolated linearly inside the bucket holding ``x``.

    The same estimate as Prometheus' ``histogram_fraction(0, x)`` times the count. Above the
    highest finite bound nothing more is known, so observations in the ``+Inf`` bucket count as
    above ``x``.
    """
    b = _monotonic(sorted(buckets))
    lo_bound, lo_count = 0.0, 0.0
    for le, c in b:
        if math.isinf(le):
            return lo_count
        if x <= le:
            if x <= lo_bound or le == lo_bound:
                return lo_count if x < le else c
            return lo_count + (c - lo_count) * (x - lo_bound) / (le - lo_bound)
        lo_bound, lo_count = le, c
    return lo_count


def gauge_values(snap: Snapshot, key: str, model: str) -> List[float]:
    """Every engine's value of a gauge input for one model (extra labels kept apart)."""
    return [v for (k, m, _e, _x), v in snap.values.items() if k == key and m == model]


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
