"""``histogram_quantile`` over classic (``le``) buckets, as Prometheus 2.42's
``promql/functions.go`` and ``promql/quantile.go`` compute it, for every step of the grid.

This module does the grouping (the series' labels without ``le`` and ``__name__``; a series whose
``le`` is not a number is skipped) and hands each step's buckets to the project's one
``bucketQuantile``, ``exporter.runtime.buckets.histogram_quantile`` (the sidecar's own), so the
sidecar and the backtest cannot disagree on a quantile. It is written in a handful of element
operations; ``NumpyOps`` gives numpy's, so the one implementation runs over every step at once.

Native histograms are not read by this project's sources, so only classic buckets are handled.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import numpy as np

from ...runtime.buckets import bucket_quantile
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


class NumpyOps:
    """``bucket_quantile``'s element operations over every step at once."""

    where = staticmethod(np.where)
    isnan = staticmethod(np.isnan)

    @staticmethod
    def index(i: int, like: np.ndarray) -> np.ndarray:
        return np.full(np.shape(like), i, np.int64)

    @staticmethod
    def stack(rows):
        return np.array(rows)

    @staticmethod
    def take(M: np.ndarray, i: np.ndarray) -> np.ndarray:
        return M[i, np.arange(M.shape[1])]

    @staticmethod
    def pick(bounds, i: np.ndarray) -> np.ndarray:
        return np.asarray(bounds, dtype=np.float64)[i]

    @staticmethod
    def div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return a / b


def _columns(q: np.ndarray, bounds: List[float], C: np.ndarray) -> np.ndarray:
    """``bucketQuantile`` at each column of counts ``C`` (buckets by steps)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.asarray(bucket_quantile(np.asarray(q, np.float64), bounds, list(C), NumpyOps), np.float64)


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
            vals[cs] = _columns(q[cs], bounds[sel].tolist(), V[sel][:, cs])
        out_l.append(without(key, ("__name__",)))
        out_v.append(vals)
        out_p.append(present)
    if not out_l:
        return [], np.empty((0, S)), np.zeros((0, S), bool)
    return out_l, np.array(out_v), np.array(out_p)
