"""An instant vector over every step of a grid, as one block: series by steps.

``Vec.V[i, s]`` is series ``i``'s value at step ``s`` and ``Vec.P[i, s]`` whether it has a sample
there at all (a NaN value is a real sample; absence is ``P`` false). ``Vec.K`` orders the series
the way Prometheus' vector would be ordered at each step (storage order for selectors, first
appearance for aggregations, left-hand side first for binary operators): it matters because
``sum``, ``avg`` and friends add in that order, and floating-point addition is not associative.
``K`` is one key per series, or one per series and step when the order changes over time.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import numpy as np

from .labels import Labels, fmt


class EvalError(ValueError):
    """An evaluation that Prometheus would fail, at the first step (ms) where it fails."""

    def __init__(self, message: str, t_ms: Optional[int] = None) -> None:
        super().__init__(message)
        self.message = message
        self.t_ms = t_ms

    def __str__(self) -> str:
        if self.t_ms is None:
            return self.message
        return f"{self.message} (at t={self.t_ms / 1000:g}s)"


@dataclass
class Vec:
    labels: List[Labels]
    V: np.ndarray
    P: np.ndarray
    K: np.ndarray
    T: Optional[np.ndarray] = None  # sample timestamps (ms) for plain selectors, for timestamp()

    @property
    def n(self) -> int:
        return len(self.labels)

    @property
    def steps(self) -> int:
        return self.V.shape[1]

    def take(self, rows: Sequence[int]) -> "Vec":
        rows = np.asarray(rows, dtype=np.int64)
        return Vec([self.labels[i] for i in rows], self.V[rows], self.P[rows], self.K[rows],
                   None if self.T is None else self.T[rows])

    def keys2d(self) -> np.ndarray:
        return self.K if self.K.ndim == 2 else np.broadcast_to(self.K[:, None], self.V.shape)

    def present_any(self) -> np.ndarray:
        return self.P.any(axis=0) if self.n else np.zeros(self.steps, bool)


def empty(steps: int) -> Vec:
    return Vec([], np.empty((0, steps)), np.zeros((0, steps), bool), np.empty(0))


def build(labels: Sequence[Labels], V: np.ndarray, P: np.ndarray, K: np.ndarray, times: np.ndarray,
          T: Optional[np.ndarray] = None, what: str = "vector cannot contain metrics with the same labelset") -> Vec:
    """A ``Vec`` from rows that may repeat a label set (rows never present are dropped). Rows with
    the same labels merge into one series; if two are present at the same step Prometheus fails
    the query with ``what``."""
    live = P.any(axis=1)
    if not live.all():
        idx = np.nonzero(live)[0]
        labels = [labels[i] for i in idx]
        V, P, K = V[idx], P[idx], K[idx]
        T = None if T is None else T[idx]
    by: Dict[Labels, List[int]] = {}
    for i, ls in enumerate(labels):
        by.setdefault(ls, []).append(i)
    if len(by) == len(labels):
        return Vec(list(labels), V, P, K, T)
    out_l: List[Labels] = []
    rows_v, rows_p, rows_k, rows_t = [], [], [], []
    K2 = K if K.ndim == 2 else np.broadcast_to(K[:, None], V.shape)
    for ls, rows in by.items():
        if len(rows) == 1:
            i = rows[0]
            out_l.append(ls)
            rows_v.append(V[i])
            rows_p.append(P[i])
            rows_k.append(K2[i])
            rows_t.append(None if T is None else T[i])
            continue
        count = P[rows].sum(axis=0)
        bad = np.nonzero(count > 1)[0]
        if len(bad):
            raise EvalError(f"{what}: {fmt(ls)}", int(times[bad[0]]))
        v = np.full(V.shape[1], np.nan)
        p = np.zeros(V.shape[1], bool)
        k = np.zeros(V.shape[1])
        t = None if T is None else np.zeros(V.shape[1], np.int64)
        for i in rows:
            m = P[i]
            v[m] = V[i][m]
            p |= m
            k[m] = K2[i][m]
            if t is not None:
                t[m] = T[i][m]
        out_l.append(ls)
        rows_v.append(v)
        rows_p.append(p)
        rows_k.append(k)
        rows_t.append(t)
    Tn = None if T is None else np.array(rows_t)
    return Vec(out_l, np.array(rows_v), np.array(rows_p), np.array(rows_k), Tn)


def simplify_keys(K: np.ndarray, P: np.ndarray) -> np.ndarray:
    """Per-step keys that never change where the series is present become one key per series."""
    if K.ndim == 1 or not len(K):
        return K
    big = np.where(P, K, np.nan)
    lo = np.nanmin(np.where(P.any(axis=1)[:, None], big, 0.0), axis=1)
    hi = np.nanmax(np.where(P.any(axis=1)[:, None], big, 0.0), axis=1)
    if np.array_equal(lo, hi):
        return lo
    return K
