"""Quantiles and counts read from cumulative histogram buckets: Prometheus'
``bucketQuantile`` (2.42, ``promql/quantile.go``), the project's one implementation of
``histogram_quantile`` over classic buckets. The sidecar calls it for one step (plain floats,
``ScalarOps``), the backtest's PromQL engine (``analysis/promql/quantile.py``) for every step
of a grid at once with numpy's element operations, so the two cannot disagree on a quantile."""

from __future__ import annotations

import math
from operator import itemgetter
from typing import Iterable, List, Sequence, Tuple

Buckets = List[Tuple[float, float]]  # (upper bound, cumulative count), sorted


class ScalarOps:
    """The element operations ``bucket_quantile`` is written in, for one step (plain floats).

    The PromQL engine passes numpy's versions (``analysis/promql/quantile.py``) and so runs the
    very same code over every step at once; the sidecar needs no numpy."""

    @staticmethod
    def where(cond, a, b):
        return a if cond else b

    @staticmethod
    def isnan(x) -> bool:
        return math.isnan(x)

    @staticmethod
    def stack(rows):
        return rows

    @staticmethod
    def index(i: int, like) -> int:
        """The bucket index ``i`` at every step of ``like``."""
        return i

    @staticmethod
    def take(rows, i):
        """Each step's count in bucket ``i`` (its own ``i`` per step) of ``stack(counts)``."""
        return rows[i]

    @staticmethod
    def pick(bounds, i):
        """Bound ``i`` (its own ``i`` per step)."""
        return bounds[i]

    @staticmethod
    def div(a, b):
        """Go's float division: x/0 is ±Inf, 0/0 NaN."""
        try:
            return a / b
        except ZeroDivisionError:
            return math.nan if a == 0 or math.isnan(a) else math.copysign(math.inf, a) * math.copysign(1, b)


def _coalesce_monotonic(bounds: Sequence[float], counts: Sequence, ops) -> Tuple[List[float], List]:
    """``coalesceBuckets`` then ``ensureMonotonic`` (Prometheus 2.42 ``promql/quantile.go``) on
    buckets sorted by bound: equal bounds merged (counts added); a count below the highest one
    before it takes that count. Comparisons with NaN are false, so a NaN count stays and a NaN
    first count freezes everything after it, as in Go."""
    B: List[float] = []
    C: List = []
    for le, c in zip(bounds, counts):
        if B and B[-1] == le:
            C[-1] = C[-1] + c
        else:
            B.append(le)
            C.append(c)
    if C and ops is ScalarOps:  # the same steps with ScalarOps.where written out (one step, floats)
        hi = C[0]
        for i in range(1, len(C)):
            c = C[i]
            if c < hi:
                C[i] = hi
            if c > hi:
                hi = c
    elif C:
        hi = C[0]
        for i in range(1, len(C)):
            c = C[i]
            C[i] = ops.where(c < hi, hi, c)
            hi = ops.where(c > hi, c, hi)
    return B, C


def bucket_quantile(q, bounds: Sequence[float], counts: Sequence, ops=ScalarOps, prepared: bool = False):
    """Prometheus' ``bucketQuantile`` (2.42, ``promql/quantile.go``): the project's one
    implementation of ``histogram_quantile`` over classic buckets. The sidecar calls it for one
    step (floats, ``ScalarOps``); the backtest's PromQL engine for every step of a grid at once
    (``counts`` a list of arrays, numpy's ops). ``bounds`` are sorted ascending (equal ones
    allowed); ``counts`` are the cumulative counts, one per bound.

    Same results as Prometheus: ``q`` NaN gives NaN, ``q < 0`` -Inf, ``q > 1`` +Inf; NaN without
    a ``+Inf`` highest bound, with fewer than two buckets (after merging equal bounds) or without
    observations; the rank's bucket found with Go's ``sort.Search`` (a binary search, so
    non-monotonic or NaN input lands where Prometheus lands); the ``+Inf`` bucket answers with the
    highest finite bound; linear interpolation inside a bucket, the first bucket starting at 0
    when its bound is positive (its bound when it is not). ``prepared``: already merged and made
    monotonic (``prepare_buckets``).
    """
    where = ops.where
    B, C = (list(bounds), list(counts)) if prepared else _coalesce_monotonic(bounds, counts, ops)
    n = len(B)
    if not n or B[-1] != math.inf or n < 2:
        body = math.nan
    else:
        M = ops.stack(C)
        obs = C[-1]
        rank = q * obs
        lo, hi = ops.index(0, obs), ops.index(n - 1, obs)  # sort.Search(n-1, C[i] >= rank)
        for _ in range((n - 1).bit_length() + 1):  # enough rounds for the longest search
            h = (lo + hi) // 2
            f = ops.take(M, h) >= rank
            active = lo < hi
            lo, hi = where(active, where(f, lo, h + 1), lo), where(active, where(f, h, hi), hi)
        b = lo
        prev_i = where(b > 0, b - 1, 0)
        bc, prev = ops.take(M, b), ops.take(M, prev_i)
        end, start = ops.pick(B, b), where(b > 0, ops.pick(B, prev_i), 0.0)
        count = where(b > 0, bc - prev, bc)
        r = where(b > 0, rank - prev, rank)
        val = start + (end - start) * ops.div(r, count)
        val = where(b == 0, B[0] if B[0] <= 0 else val, val)
        val = where(b == n - 1, B[n - 2], val)
        body = where(obs == 0, math.nan, val)
    return where(ops.isnan(q), math.nan, where(q < 0, -math.inf, where(q > 1, math.inf, body)))


def prepare_buckets(buckets: Iterable[Tuple[float, float]]) -> Buckets:
    """Cumulative buckets (upper bound, count) sorted, equal bounds merged and made monotonic,
    as ``bucketQuantile`` prepares them."""
    pairs = sorted(buckets, key=itemgetter(0))
    B, C = _coalesce_monotonic([le for le, _ in pairs], [c for _, c in pairs], ScalarOps)
    return list(zip(B, C))


def histogram_quantile(q: float, buckets: Sequence[Tuple[float, float]], prepared: bool = False) -> float:
    """Prometheus' ``histogram_quantile`` of cumulative buckets (upper bound, count) at one step:
    ``bucket_quantile`` on them (``prepared``: they come from ``prepare_buckets``)."""
    b = buckets if prepared else sorted(buckets, key=lambda x: x[0])
    return bucket_quantile(q, [le for le, _ in b], [c for _, c in b], ScalarOps, prepared)


def count_at_or_below(x: float, buckets: Sequence[Tuple[float, float]], prepared: bool = False) -> float:
    """Observations at or below ``x``, interpolated linearly inside the bucket holding ``x``.

    The same estimate as Prometheus' ``histogram_fraction(0, x)`` times the count. Above the
    highest finite bound nothing more is known, so observations in the ``+Inf`` bucket count as
    above ``x``. ``prepared``: the buckets come from ``prepare_buckets``.
    """
    b = buckets if prepared else prepare_buckets(buckets)
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
