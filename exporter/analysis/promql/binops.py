"""Binary operators between scalars and instant vectors, with vector matching (``on``,
``ignoring``, ``group_left``, ``group_right``), the set operators ``and``/``or``/``unless`` and
comparisons with and without ``bool`` — Prometheus 2.42's ``VectorBinop``, ``VectorAnd``,
``VectorOr``, ``VectorUnless`` and ``VectorscalarBinop``.

Label matching is done once per pair of series (labels do not change over time); values are
then combined for every step at once. The errors Prometheus raises at a step (duplicate series
on the "one" side, many-to-one without ``group_left``, duplicate output label sets) are raised
at the first step where they happen.
"""

from __future__ import annotations

from typing import Dict, List, Tuple

import numpy as np

from .ast import COMPARISONS, VectorMatching
from .labels import NAME, Labels, drop_name, fmt, get, keep, signature, without
from .vector import EvalError, Vec, build, empty


def arith(op: str, a, b):
    """Go's ``scalarBinop`` / ``vectorElemBinop`` value for arithmetic operators."""
    with np.errstate(all="ignore"):
        if op == "+":
            return a + b
        if op == "-":
            return a - b
        if op == "*":
            return a * b
        if op == "/":
            return np.true_divide(a, b)
        if op == "%":
            return np.fmod(a, b)
        if op == "^":
            return np.power(a, b)
        if op == "atan2":
            return np.arctan2(a, b)
    raise ValueError(op)


def compare(op: str, a, b):
    with np.errstate(invalid="ignore"):
        if op == "==":
            return a == b
        if op == "!=":
            return a != b
        if op == ">":
            return a > b
        if op == "<":
            return a < b
        if op == ">=":
            return a >= b
        if op == "<=":
            return a <= b
    raise ValueError(op)


def scalar_scalar(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if op in COMPARISONS:
        return compare(op, a, b).astype(np.float64)
    return arith(op, a, b)


def _drops_name(op: str) -> bool:
    return op in ("+", "-", "*", "/", "%", "^")


def vector_scalar(op: str, vec: Vec, s: np.ndarray, swap: bool, return_bool: bool, times: np.ndarray) -> Vec:
    if vec.n == 0:
        return vec
    lv, rv = (s[None, :], vec.V) if swap else (vec.V, s[None, :])
    if op in COMPARISONS:
        keep_ = compare(op, lv, rv)
        value = vec.V
    else:
        keep_ = np.ones(vec.V.shape, bool)
        value = arith(op, lv, rv)
    if return_bool:
        value = keep_.astype(np.float64)
        present = vec.P
    else:
        present = vec.P & keep_
    labels = vec.labels
    if _drops_name(op) or return_bool:
        labels = [drop_name(ls) for ls in labels]
    return build(labels, np.where(present, value, np.nan), present, vec.K, times)


def _sig_index(sigs: List[Labels]) -> Dict[Labels, List[int]]:
    out: Dict[Labels, List[int]] = {}
    for i, s in enumerate(sigs):
        out.setdefault(s, []).append(i)
    return out


def _any_by_sig(vec: Vec, index: Dict[Labels, List[int]]) -> Dict[Labels, np.ndarray]:
    return {s: vec.P[rows].any(axis=0) for s, rows in index.items()}


def set_op(op: str, lhs: Vec, rhs: Vec, m: VectorMatching, times: np.ndarray) -> Vec:
    S = len(times)
    lsig = [signature(ls, m.labels, m.on) for ls in lhs.labels]
    rsig = [signature(ls, m.labels, m.on) for ls in rhs.labels]
    if op in ("and", "unless"):
        if lhs.n == 0:
            return lhs
        r_any = _any_by_sig(rhs, _sig_index(rsig))
        none = np.zeros(S, bool)
        hit = np.array([r_any.get(s, none) for s in lsig])
        present = lhs.P & (hit if op == "and" else ~hit)
        return build(lhs.labels, lhs.V, present, lhs.K, times, lhs.T)
    # or: every lhs sample, plus the rhs samples whose signature the lhs lacks at that step
    if rhs.n == 0:
        return lhs
    if lhs.n == 0:
        return rhs
    l_any = _any_by_sig(lhs, _sig_index(lsig))
    none = np.zeros(S, bool)
    taken = np.array([l_any.get(s, none) for s in rsig])
    rp = rhs.P & ~taken
    offset = float(np.max(lhs.K)) - float(np.min(rhs.K)) + 1.0  # every rhs key after every lhs key
    K = np.concatenate([lhs.keys2d(), rhs.keys2d() + offset]) if (lhs.K.ndim == 2 or rhs.K.ndim == 2) \
        else np.concatenate([lhs.K, rhs.K + offset])
    T = None
    if lhs.T is not None and rhs.T is not None:
        T = np.concatenate([lhs.T, rhs.T])
    return build(lhs.labels + rhs.labels, np.concatenate([lhs.V, rhs.V]), np.concatenate([lhs.P, rp]), K, times, T)


def _result_labels(lhs: Labels, rhs: Labels, op: str, m: VectorMatching, return_bool: bool) -> Labels:
    """Go's ``resultMetric`` (``lhs`` is the "many" side after the one-to-many swap)."""
    out = lhs
    if _drops_name(op):
        out = drop_name(out)
    if m.card == "one-to-one":
        out = keep(out, m.labels) if m.on else without(out, m.labels)
    if m.include:
        d = dict(out)
        for name in m.include:
            v = get(rhs, name)
            if v:
                d[name] = v
            else:
                d.pop(name, None)
        out = tuple(sorted(d.items()))
    if return_bool:
        out = drop_name(out)
    return out


def vector_vector(op: str, lhs: Vec, rhs: Vec, m: VectorMatching, return_bool: bool, times: np.ndarray) -> Vec:
    S = len(times)
    if lhs.n == 0 or rhs.n == 0:
        return empty(S)
    swapped = m.card == "one-to-many"
    many, one = (rhs, lhs) if swapped else (lhs, rhs)
    msig = [signature(ls, m.labels, m.on) for ls in many.labels]
    osig = [signature(ls, m.labels, m.on) for ls in one.labels]
    one_index = _sig_index(osig)
    many_any = many.present_any()
    one_any = one.present_any()
    side = "left" if swapped else "right"
    for sig, rows in one_index.items():
        if len(rows) > 1:
            cnt = one.P[rows].sum(axis=0)
            bad = np.nonzero((cnt > 1) & many_any & one_any)[0]
            if len(bad):
                raise EvalError(f"found duplicate series for the match group {fmt(sig)} on the {side} hand-side of "
                                f"the operation: [{', '.join(fmt(one.labels[r]) for r in rows[:2])}];many-to-many "
                                f"matching not allowed: matching labels must be unique on one side", int(times[bad[0]]))
    li: List[int] = []
    ri: List[int] = []
    for i, sig in enumerate(msig):
        for r in one_index.get(sig, ()):
            li.append(i)
            ri.append(r)
    if not li:
        return empty(S)
    li_a, ri_a = np.array(li), np.array(ri)
    vm, vo = many.V[li_a], one.V[ri_a]
    vl, vr = (vo, vm) if swapped else (vm, vo)
    both = many.P[li_a] & one.P[ri_a]
    if op in COMPARISONS:
        keep_ = compare(op, vl, vr)
        value = vl
    else:
        keep_ = np.ones(vl.shape, bool)
        value = arith(op, vl, vr)
    if return_bool:
        value = keep_.astype(np.float64)
        present = both
    else:
        present = both & keep_
    out_labels = [_result_labels(many.labels[i], one.labels[r], op, m, return_bool) for i, r in zip(li, ri)]
    # matchedSigs: one-to-one allows one match per signature; many-to-one one per output series
    groups: Dict[Tuple, List[int]] = {}
    for pair, i in enumerate(li):
        key = (msig[i],) if m.card == "one-to-one" else (msig[i], out_labels[pair])
        groups.setdefault(key, []).append(pair)
    for pairs in groups.values():
        if len(pairs) > 1:
            bad = np.nonzero(present[pairs].sum(axis=0) > 1)[0]
            if len(bad):
                what = ("multiple matches for labels: many-to-one matching must be explicit (group_left/group_right)"
                        if m.card == "one-to-one" else
                        "multiple matches for labels: grouping labels must ensure unique matches")
                raise EvalError(what, int(times[bad[0]]))
    K = many.K[li_a]
    return build(out_labels, np.where(present, value, np.nan), present, K, times)


__all__ = ["arith", "compare", "scalar_scalar", "vector_scalar", "vector_vector", "set_op", "NAME"]
