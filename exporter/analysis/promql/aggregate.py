"""Aggregation operators (``sum``, ``avg``, ``min``, ``max``, ``count``, ``group``, ``stddev``,
``stdvar``, ``quantile``, ``topk``, ``bottomk``, ``count_values``) with ``by`` / ``without``, as
Prometheus 2.42's ``evaluator.aggregation`` computes them.

Groups are formed once (labels do not change over time). Inside a group, members are combined
in the vector's order at each step, with Go's recurrences: ``sum`` is a plain running sum (no
Kahan in 2.42), ``avg`` the incremental mean with its infinity guards, ``stddev``/``stdvar``
Welford's update; ``min``/``max`` ignore NaN unless every member is NaN. The j-th member of
every group is processed together, so the Python loop runs over the largest group's size, not
over groups.
"""

from __future__ import annotations

from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from .labels import Labels, grouping_key, make
from .vector import EvalError, Vec, build, empty, simplify_keys
from .windows import quantile_values, sort_nan_first


def _groups(vec: Vec, grouping: Sequence[str], without: bool) -> Tuple[List[Labels], np.ndarray]:
    index: Dict[Labels, int] = {}
    gid = np.empty(vec.n, np.int64)
    for i, ls in enumerate(vec.labels):
        gid[i] = index.setdefault(grouping_key(ls, grouping, without), len(index))
    return list(index), gid


class _Members:
    """Members of every group, position by position, in each step's vector order."""

    def __init__(self, vec: Vec, gid: np.ndarray, ngroups: int) -> None:
        self.vec = vec
        static = vec.K.ndim == 1
        order = np.lexsort((vec.K if static else np.arange(vec.n), gid))
        counts = np.bincount(gid, minlength=ngroups)
        self.m = int(counts.max()) if len(counts) else 0
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        tbl = np.full((ngroups, self.m), -1, np.int64)
        pos = np.arange(vec.n) - starts[gid[order]]
        tbl[gid[order], pos] = order
        self.tbl = tbl
        self.static = static
        if not static and self.m > 1:
            S = vec.steps
            valid = tbl >= 0
            safe = np.where(valid, tbl, 0)
            K = np.where(valid[:, :, None] & vec.P[safe], vec.K[safe], np.inf)
            o = np.argsort(K, axis=1, kind="stable")
            self.rows = np.take_along_axis(np.broadcast_to(safe[:, :, None], (ngroups, self.m, S)), o, axis=1)
            self.valid = np.take_along_axis(np.broadcast_to(valid[:, :, None], (ngroups, self.m, S)), o, axis=1)

    def __iter__(self) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
        vec = self.vec
        S = vec.steps
        cols = np.arange(S)
        for j in range(self.m):
            if self.static or self.m == 1:
                r = self.tbl[:, j]
                ok = r >= 0
                rs = np.where(ok, r, 0)
                yield vec.V[rs], vec.P[rs] & ok[:, None]
            else:
                r = self.rows[:, j, :]
                yield vec.V[r, cols], vec.P[r, cols] & self.valid[:, j, :]


def _group_keys(vec: Vec, gid: np.ndarray, ngroups: int) -> np.ndarray:
    K = np.full((ngroups, vec.steps), np.inf)
    K2 = vec.keys2d()
    for i in range(vec.n):
        np.minimum(K[gid[i]], np.where(vec.P[i], K2[i], np.inf), out=K[gid[i]])
    present = np.isfinite(K)
    return simplify_keys(np.where(present, K, 0.0), present)


def aggregate(op: str, vec: Vec, grouping: Sequence[str], without: bool, param, times: np.ndarray) -> Vec:
    S = len(times)
    if vec.n == 0:
        return empty(S)
    if op in ("topk", "bottomk"):
        return _topk(op, vec, grouping, without, param, times)
    if op == "count_values":
        return _count_values(vec, grouping, without, param, times)
    labels, gid = _groups(vec, grouping, without)
    G = len(labels)
    members = _Members(vec, gid, G)
    present = np.zeros((G, S), bool)
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        if op == "quantile":
            out = _quantile(members, param, G, S)
            for _v, p in members:
                present |= p
        else:
            out = np.zeros((G, S))
            mean = np.zeros((G, S))
            count = np.zeros((G, S))
            for v, p in members:
                first = p & ~present
                more = p & present
                if op == "sum":
                    out = np.where(first, v, np.where(more, out + v, out))
                elif op in ("max", "min"):
                    better = (out < v) if op == "max" else (out > v)
                    out = np.where(first, v, np.where(more & (better | np.isnan(out)), v, out))
                elif op == "avg":
                    count = count + p
                    skip = np.isinf(mean) & ((np.isinf(v) & ((mean > 0) == (v > 0))) | (~np.isinf(v) & ~np.isnan(v)))
                    upd = more & ~skip
                    mean = np.where(first, v, np.where(upd, mean + (v / count - mean / count), mean))
                elif op in ("stddev", "stdvar"):
                    count = count + p
                    delta = v - mean
                    nmean = mean + delta / count
                    out = np.where(first, 0.0, np.where(more, out + delta * (v - nmean), out))
                    mean = np.where(first, v, np.where(more, nmean, mean))
                elif op in ("count", "group"):
                    count = count + p
                else:  # pragma: no cover - the parser allows only the operators above
                    raise EvalError(f"unknown aggregation {op!r}")
                present |= p
            if op == "avg":
                out = mean
            elif op in ("count",):
                out = count
            elif op == "group":
                out = np.ones((G, S))
            elif op == "stdvar":
                out = out / count
            elif op == "stddev":
                out = np.sqrt(out / count)
    keys = _group_keys(vec, gid, G)
    return build(labels, np.where(present, out, np.nan), present, keys, times)


def _quantile(members: _Members, q: np.ndarray, G: int, S: int) -> np.ndarray:
    vals, valid = [], []
    for v, p in members:
        vals.append(v)
        valid.append(p)
    V = np.stack(vals, axis=-1)       # (G, S, m)
    P = np.stack(valid, axis=-1)
    n = P.sum(axis=-1)
    srt = sort_nan_first(V, P)
    return quantile_values(np.broadcast_to(q, (G, S)), srt, n)


def _topk(op: str, vec: Vec, grouping: Sequence[str], without: bool, param: np.ndarray, times: np.ndarray) -> Vec:
    """Each group's k largest (``topk``) or smallest members, NaN last, ties to the earlier
    member; the members keep their own labels."""
    S = len(times)
    labels, gid = _groups(vec, grouping, without)
    with np.errstate(invalid="ignore"):
        k = np.where(np.isnan(param), 0, np.trunc(np.clip(param, -2 ** 62, 2 ** 62))).astype(np.int64)
    K2 = vec.keys2d()
    keep = np.zeros(vec.P.shape, bool)
    rank_out = np.zeros(vec.P.shape)
    for g in range(len(labels)):
        rows = np.nonzero(gid == g)[0]
        V, P, K = vec.V[rows], vec.P[rows], K2[rows]
        score = -V if op == "topk" else V
        score = np.where(np.isnan(score), np.inf, score)
        # sort by presence, score, then vector order
        order = np.lexsort((K, score, ~P), axis=0)
        rank = np.empty_like(order)
        np.put_along_axis(rank, order, np.arange(len(rows))[:, None].repeat(S, axis=1), axis=0)
        keep[rows] = P & (rank < k[None, :])
        rank_out[rows] = rank
    gk = _group_keys(vec, gid, len(labels))
    gk2 = gk if gk.ndim == 2 else np.broadcast_to(gk[:, None], (len(labels), S))
    keys = gk2[gid] * (vec.n + 1) + rank_out
    return build(vec.labels, np.where(keep, vec.V, np.nan), keep, keys, times)


def format_value(v: float) -> str:
    """Go's ``strconv.FormatFloat(v, 'f', -1, 64)``."""
    if np.isnan(v):
        return "NaN"
    if np.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return np.format_float_positional(v, unique=True, trim="-")


def _count_values(vec: Vec, grouping: Sequence[str], without: bool, label: str, times: np.ndarray) -> Vec:
    import re

    if not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", label or ""):
        raise EvalError(f"invalid label name {label!r}", int(times[0]))
    S = len(times)
    grouping = list(grouping) if without else sorted(set(grouping) | {label})
    out: Dict[Labels, np.ndarray] = {}
    first_key: Dict[Labels, np.ndarray] = {}
    K2 = vec.keys2d()
    present_vals = vec.V[vec.P]
    distinct = np.unique(present_vals[~np.isnan(present_vals)])
    candidates: List[Optional[float]] = list(distinct) + ([None] if np.isnan(present_vals).any() else [])
    for val in candidates:
        hit = vec.P & (np.isnan(vec.V) if val is None else (vec.V == val))
        text = "NaN" if val is None else format_value(float(val))
        for i in np.nonzero(hit.any(axis=1))[0]:
            ls = make({**dict(vec.labels[i]), label: text})
            key = grouping_key(ls, grouping, without)
            cnt = out.setdefault(key, np.zeros(S))
            cnt += hit[i]
            k = first_key.setdefault(key, np.full(S, np.inf))
            np.minimum(k, np.where(hit[i], K2[i], np.inf), out=k)
    labels = list(out)
    if not labels:
        return empty(S)
    C = np.array([out[lab] for lab in labels])
    Kk = np.array([first_key[lab] for lab in labels])
    P = C > 0
    return build(labels, C, P, np.where(P, Kk, 0.0), times)
