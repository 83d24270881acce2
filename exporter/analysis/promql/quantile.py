"""``histogram_quantile`` over classic (``le``) buckets, as Prometheus 2.42's
``promql/quantile.go`` computes it, for every step at once.

Per group of buckets (the series' labels without ``le``): sort by upper bound; merge equal
bounds; make counts monotonic (a bucket lower than the one before takes its count); NaN when
the highest bound is not ``+Inf``, when fewer than two buckets remain, or when there are no
observations; the rank's bucket is found with Go's ``sort.Search`` (the same binary search, so
even non-monotonic NaN input lands where Prometheus lands); linear interpolation inside the
bucket, from 0 for the first bucket when its bound is positive; the second-highest bound when
the rank falls in the ``+Inf`` bucket. ``q < 0`` gives ``-Inf``, ``q > 1`` ``+Inf``.

Native histograms are not read by this project's sources, so only classic buckets are handled.
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Tuple

import numpy as np

from .labels import Labels, get, without
from .vector import Vec


def parse_le(text: str) -> Optional[float]:
    """Go's ``strconv.ParseFloat`` of an ``le`` value; None when it is not a number."""
    if "_" in text:  # Go takes underscores only after a base prefix; Python anywhere
        return None
    try:
        return float(text)
    except ValueError:
        return None


def _search(C: np.ndarray, rank: np.ndarray, n: int) -> np.ndarray:
    """Go's ``sort.Search(n, func(i) bool { return C[i] >= rank })`` per column."""
    S = C.shape[1]
    i = np.zeros(S, np.int64)
    j = np.full(S, n, np.int64)
    cols = np.arange(S)
    while True:
        active = i < j
        if not active.any():
            return i
        h = (i + j) // 2
        f = C[np.clip(h, 0, C.shape[0] - 1), cols] >= rank
        i = np.where(active & ~f, h + 1, i)
        j = np.where(active & f, h, j)


def bucket_quantile(q: np.ndarray, bounds: np.ndarray, C: np.ndarray) -> np.ndarray:
    """``bucketQuantile`` for buckets sorted by ``bounds`` (nb,) with counts ``C`` (nb, S), all
    present at every column."""
    S = C.shape[1]
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.full(S, np.nan)
        if math.isinf(bounds[-1]) and bounds[-1] > 0:
            # coalesce equal bounds (sorted, so equal ones are adjacent)
            keep = np.concatenate([[True], bounds[1:] != bounds[:-1]])
            if not keep.all():
                groups = np.cumsum(keep) - 1
                merged = np.zeros((int(groups[-1]) + 1, S))
                for row, gi in enumerate(groups):
                    merged[gi] = C[row] if keep[row] else merged[gi] + C[row]
                C, bounds = merged, bounds[keep]
            else:
                C = C.copy()
            # ensureMonotonic: running max, NaN untouched, nothing changes after a NaN first bucket
            if len(C) > 1:
                first_nan = np.isnan(C[0])
                run = np.fmax.accumulate(C, axis=0)
                fixed = np.where(np.isnan(C), C, run)
                C = np.where(first_nan[None, :], C, fixed)
            nb = len(bounds)
            if nb >= 2:
                obs = C[-1]
                rank = q * obs
                b = _search(C, rank, nb - 1)
                cols = np.arange(S)
                bc = C[np.clip(b, 0, nb - 1), cols]
                prevc = C[np.clip(b - 1, 0, nb - 1), cols]
                end = bounds[np.clip(b, 0, nb - 1)]
                start = np.where(b > 0, bounds[np.clip(b - 1, 0, nb - 1)], 0.0)
                count = np.where(b > 0, bc - prevc, bc)
                r = np.where(b > 0, rank - prevc, rank)
                val = start + (end - start) * (r / count)
                val = np.where((b == 0) & (bounds[0] <= 0), bounds[0], val)
                val = np.where(b == nb - 1, bounds[nb - 2], val)
                out = np.where(obs == 0, np.nan, val)
        out = np.where(np.isnan(q), np.nan, out)
        out = np.where(q < 0, -np.inf, out)
        out = np.where(q > 1, np.inf, out)
    return out


def histogram_quantile(q: np.ndarray, vec: Vec) -> Tuple[List[Labels], np.ndarray, np.ndarray]:
    """Output labels, values (n, S) and presence of ``histogram_quantile(q, vec)``."""
    S = vec.steps
    groups: Dict[Labels, List[Tuple[float, int]]] = {}
    for i, ls in enumerate(vec.labels):
        ub = parse_le(get(ls, "le"))
        if ub is None:
            continue
        groups.setdefault(without(ls, ("le",)), []).append((ub, i))
    out_l: List[Labels] = []
    out_v, out_p = [], []
    for key, members in groups.items():
        members.sort(key=lambda m: m[0])
        rows = np.array([i for _, i in members])
        bounds = np.array([ub for ub, _ in members])
        P = vec.P[rows]
        V = vec.V[rows]
        present = P.any(axis=0)
        vals = np.full(S, np.nan)
        # one computation per distinct set of present buckets (nearly always: all of them)
        patterns: Dict[bytes, List[int]] = {}
        cols = np.nonzero(present)[0]
        if len(cols):
            full = P[:, cols].all(axis=0)
            if full.all():
                patterns[b"all"] = list(cols)
            else:
                for c in cols:
                    patterns.setdefault(P[:, c].tobytes(), []).append(c)
        for pat, cs in patterns.items():
            cs = np.array(cs)
            sel = np.ones(len(rows), bool) if pat == b"all" else np.frombuffer(pat, dtype=bool)
            vals[cs] = bucket_quantile(q[cs], bounds[sel], V[sel][:, cs])
        out_l.append(without(key, ("__name__",)))
        out_v.append(vals)
        out_p.append(present)
    if not out_l:
        return [], np.empty((0, S)), np.zeros((0, S), bool)
    return out_l, np.array(out_v), np.array(out_p)
