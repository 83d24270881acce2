"""Instant-vector and scalar functions (``abs`` ... ``year``, ``label_replace``,
``label_join``, ``clamp*``, ``round``, ``scalar``, ``vector``, ``time``, ``absent``, ``sort``,
``timestamp``, ``histogram_quantile``), as in Prometheus 2.42's ``promql/functions.go``.

Every function here drops the metric name except ``label_replace``, ``label_join``, ``sort``,
``sort_desc`` and ``last_over_time`` (in ``windows``), as Prometheus does. Transcendental
functions (``exp``, ``ln``, ``sin`` ...) use numpy, which can differ from Go's own
implementations in the last bit; everything else is exact.
"""

from __future__ import annotations

import re
from typing import Callable, Dict, List, Optional

import numpy as np

from .ast import Expr, MatrixSelector, VectorSelector, unwrap_parens
from .labels import Labels, drop_name, expand, make, setl
from .parser import compile_regex
from .quantile import histogram_quantile
from .vector import EvalError, Vec, build, empty

_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")


def _sgn(x):
    return np.where(x < 0, -1.0, np.where(x > 0, 1.0, x))


SIMPLE: Dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "abs": np.abs, "ceil": np.ceil, "floor": np.floor, "exp": np.exp, "sqrt": np.sqrt, "ln": np.log,
    "log2": np.log2, "log10": np.log10, "sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin,
    "acos": np.arccos, "atan": np.arctan, "sinh": np.sinh, "cosh": np.cosh, "tanh": np.tanh,
    "asinh": np.arcsinh, "acosh": np.arccosh, "atanh": np.arctanh,
    "rad": lambda v: v * np.pi / 180, "deg": lambda v: v * 180 / np.pi, "sgn": _sgn,
}


def _map(vec: Vec, values: np.ndarray, times: np.ndarray, present: Optional[np.ndarray] = None) -> Vec:
    P = vec.P if present is None else (vec.P & present)
    return build([drop_name(ls) for ls in vec.labels], np.where(P, values, np.nan), P, vec.K, times)


def simple(name: str, vec: Vec, times: np.ndarray) -> Vec:
    with np.errstate(all="ignore"):
        return _map(vec, SIMPLE[name](vec.V), times)


def clamp(vec: Vec, lo: Optional[np.ndarray], hi: Optional[np.ndarray], times: np.ndarray) -> Vec:
    v = vec.V
    with np.errstate(invalid="ignore"):
        if hi is not None:
            v = np.where(np.isnan(v), v, np.minimum(hi, v))
            v = np.where(np.isnan(hi), np.nan, v)
        if lo is not None:
            v = np.where(np.isnan(v), v, np.maximum(lo, v))
            v = np.where(np.isnan(lo), np.nan, v)
        ok = None if lo is None or hi is None else ~(hi < lo)
    return _map(vec, v, times, ok)


def round_(vec: Vec, to_nearest: Optional[np.ndarray], times: np.ndarray) -> Vec:
    with np.errstate(all="ignore"):
        inv = 1.0 / (to_nearest if to_nearest is not None else np.ones(len(times)))
        return _map(vec, np.floor(vec.V * inv + 0.5) / inv, times)


def timestamp(vec: Vec, times: np.ndarray) -> Vec:
    t = vec.T if vec.T is not None else np.broadcast_to(times, vec.V.shape)
    return _map(vec, t.astype(np.float64) / 1000, times)


def scalar(vec: Vec, times: np.ndarray) -> np.ndarray:
    if vec.n == 0:
        return np.full(len(times), np.nan)
    count = vec.P.sum(axis=0)
    value = np.where(vec.P, vec.V, 0.0).sum(axis=0)
    return np.where(count == 1, value, np.nan)


def vector(s: np.ndarray, times: np.ndarray) -> Vec:
    return Vec([()], s[None, :].copy(), np.ones((1, len(times)), bool), np.zeros(1))


def absent_labels(arg: Expr) -> Labels:
    """``createLabelsForAbsentFunction``: the equality matchers of a selector argument."""
    arg = unwrap_parens(arg)
    if isinstance(arg, MatrixSelector):
        arg = arg.selector
    if not isinstance(arg, VectorSelector):
        return ()
    out: Dict[str, str] = {}
    has: Dict[str, bool] = {}
    for m in arg.matchers:
        if m.name == "__name__":
            continue
        if m.op == "=" and not has.get(m.name):
            out[m.name] = m.value
            has[m.name] = True
        else:
            out.pop(m.name, None)
    return make(out)


def absent(present_any: np.ndarray, arg: Expr, times: np.ndarray) -> Vec:
    p = ~present_any
    if not p.any():
        return empty(len(times))
    return Vec([absent_labels(arg)], np.ones((1, len(times))), p[None, :], np.zeros(1))


def label_replace(vec: Vec, dst: str, repl: str, src: str, regex: str, times: np.ndarray) -> Vec:
    try:
        rx = compile_regex(regex)
    except re.error:
        raise EvalError(f"invalid regular expression in label_replace(): {regex}", int(times[0])) from None
    if not _LABEL_NAME.match(dst):
        raise EvalError(f"invalid destination label name in label_replace(): {dst}", int(times[0]))
    out: List[Labels] = []
    for ls in vec.labels:
        m = rx.fullmatch(dict(ls).get(src, ""))
        if m is None:
            out.append(ls)
        else:
            out.append(setl(ls, dst, expand(repl, m)))
    return build(out, vec.V, vec.P, vec.K, times)


def label_join(vec: Vec, dst: str, sep: str, srcs: List[str], times: np.ndarray) -> Vec:
    for s in srcs:
        if not _LABEL_NAME.match(s):
            raise EvalError(f"invalid source label name in label_join(): {s}", int(times[0]))
    if not _LABEL_NAME.match(dst):
        raise EvalError(f"invalid destination label name in label_join(): {dst}", int(times[0]))
    out = []
    for ls in vec.labels:
        d = dict(ls)
        out.append(setl(ls, dst, sep.join(d.get(s, "") for s in srcs)))
    return build(out, vec.V, vec.P, vec.K, times)


def sort(vec: Vec, desc: bool, times: np.ndarray) -> Vec:
    """Reorders the vector (values ascending or descending, NaN last): only the order keys change."""
    if vec.n == 0:
        return vec
    score = -vec.V if desc else vec.V
    score = np.where(np.isnan(score), np.inf, score)
    order = np.lexsort((vec.keys2d(), score, ~vec.P), axis=0)
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(vec.n)[:, None].repeat(vec.steps, axis=1), axis=0)
    return Vec(vec.labels, vec.V, vec.P, rank.astype(np.float64), vec.T)


def _civil(secs: np.ndarray):
    """Calendar fields of unix seconds (UTC), as Go's ``time.Unix(int64(v), 0).UTC()``."""
    with np.errstate(invalid="ignore"):
        s = np.where(np.isfinite(secs), np.trunc(secs), 0).astype(np.int64)
    d = s.astype("datetime64[s]")
    day = d.astype("datetime64[D]")
    month = d.astype("datetime64[M]")
    year = d.astype("datetime64[Y]")
    return s, day, month, year


def date_part(name: str, secs: np.ndarray) -> np.ndarray:
    s, day, month, year = _civil(secs)
    if name == "hour":
        out = (s // 3600) % 24
    elif name == "minute":
        out = (s // 60) % 60
    elif name == "year":
        out = year.astype(np.int64) + 1970
    elif name == "month":
        out = month.astype(np.int64) % 12 + 1
    elif name == "day_of_month":
        out = (day - month.astype("datetime64[D]")).astype(np.int64) + 1
    elif name == "day_of_year":
        out = (day - year.astype("datetime64[D]")).astype(np.int64) + 1
    elif name == "day_of_week":
        out = (day.astype(np.int64) + 4) % 7
    elif name == "days_in_month":
        out = ((month + 1).astype("datetime64[D]") - month.astype("datetime64[D]")).astype(np.int64)
    else:  # pragma: no cover
        raise ValueError(name)
    return out.astype(np.float64)


def date_function(name: str, vec: Optional[Vec], times: np.ndarray) -> Vec:
    if vec is None:
        return Vec([()], date_part(name, times / 1000)[None, :], np.ones((1, len(times)), bool), np.zeros(1))
    return _map(vec, date_part(name, vec.V), times)


def hist_quantile(q: np.ndarray, vec: Vec, times: np.ndarray) -> Vec:
    labels, V, P = histogram_quantile(q, vec)
    # Prometheus returns these groups in Go map order (random); any order is as faithful
    return build(labels, V, P, np.arange(len(labels), dtype=np.float64), times)


DATE_FUNCTIONS = ("days_in_month", "day_of_month", "day_of_week", "day_of_year", "hour", "minute", "month", "year")
