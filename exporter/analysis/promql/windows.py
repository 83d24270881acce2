"""Range-vector functions over every step at once: ``rate``, ``increase``, ``delta``, ``irate``,
``idelta``, ``deriv``, ``predict_linear``, ``holt_winters``, ``changes``, ``resets`` and the
``*_over_time`` family, each a transcription of Prometheus 2.42's ``promql/functions.go``
(plus Prometheus 3's experimental ``first_over_time`` and ``mad_over_time``, which the parser
takes only in its ``prometheus3`` mode).

A ``Window`` is a group of series that share their sample times, with each step's window
``[lo, hi)`` into them found once by binary search. Order-free results (counts, first and last,
extremes) are gathered directly; functions that Go computes with a running sum (Kahan sums,
running means, least squares) run the same recurrence element by element, vectorized across
series and steps, so the floating-point result is the same to the last bit.

Window bounds follow Prometheus 2.x: a range ``[5m]`` at time ``t`` holds samples with
``t - 5m <= ts <= t`` (both ends included). Prometheus 3.0 excludes the left end;
``left_open=True`` gives that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Tuple

import numpy as np

from .labels import Labels

Result = Tuple[np.ndarray, np.ndarray]  # values (g, S), present (g, S)


@dataclass
class Window:
    labels: List[Labels]
    keys: np.ndarray   # (g,)
    t: np.ndarray      # (T,) int64 sample times shared by the group
    X: np.ndarray      # (g, T) values
    lo: np.ndarray     # (S,) first sample index in each step's window
    hi: np.ndarray     # (S,) one past the last
    mint: np.ndarray   # (S,) window start (ms), range start for extrapolation
    maxt: np.ndarray   # (S,) window end (ms), range end for extrapolation
    range_ms: int

    @property
    def cnt(self) -> np.ndarray:
        return self.hi - self.lo

    @property
    def shape(self) -> Tuple[int, int]:
        return self.X.shape[0], len(self.lo)

    def at(self, idx: np.ndarray) -> np.ndarray:
        """Values at per-step sample indices (clipped into range; callers mask)."""
        T = self.X.shape[1]
        if not T:
            return np.zeros(self.shape)
        return self.X[:, np.minimum(np.maximum(idx, 0), T - 1)]

    def times(self, idx: np.ndarray) -> np.ndarray:
        if not len(self.t):
            return np.zeros(len(idx), np.int64)
        return self.t[np.minimum(np.maximum(idx, 0), len(self.t) - 1)]


def bounds(t: np.ndarray, mint: np.ndarray, maxt: np.ndarray, left_open: bool) -> Tuple[np.ndarray, np.ndarray]:
    lo = np.searchsorted(t, mint, side="right" if left_open else "left")
    hi = np.searchsorted(t, maxt, side="right")
    return lo, np.maximum(hi, lo)


def kahan_inc(inc, s, c):
    """Go's ``kahanSumInc`` (Neumaier), elementwise."""
    t = s + inc
    big = np.abs(s) >= np.abs(inc)
    c = c + np.where(big, (s - t) + inc, (inc - t) + s)
    return t, c


def _err():
    return np.errstate(divide="ignore", invalid="ignore", over="ignore")


# -- rate, increase, delta -------------------------------------------------------------------

def extrapolated_rate(w: Window, is_counter: bool, is_rate: bool) -> Result:
    g, S = w.shape
    cnt = w.cnt
    ok = cnt >= 2
    first_i, last_i = w.lo, w.hi - 1
    first, last = w.at(first_i), w.at(last_i)
    with _err():
        result = last - first
        if is_counter and g and w.X.shape[1] > 1:
            result = _add_resets(w, result, ok)
        tf, tl = w.times(first_i), w.times(last_i)
        duration_to_start = (tf - w.mint).astype(np.float64) / 1000
        duration_to_end = (w.maxt - tl).astype(np.float64) / 1000
        sampled = (tl - tf).astype(np.float64) / 1000
        avg = sampled / np.where(ok, cnt - 1, 1).astype(np.float64)
        dts = np.broadcast_to(duration_to_start, (g, S))
        if is_counter:
            zero = sampled * (first / result)
            use = (result > 0) & (first >= 0) & (zero < dts)
            dts = np.where(use, zero, dts)
        threshold = avg * 1.1
        ext = np.broadcast_to(sampled, (g, S)).copy()
        ext += np.where(dts < threshold, dts, avg / 2)
        ext += np.where(duration_to_end < threshold, duration_to_end, avg / 2)
        factor = ext / sampled
        if is_rate:
            factor = factor / (w.range_ms / 1000)
        result = result * factor
    return result, np.broadcast_to(ok, (g, S))


def _add_resets(w: Window, result: np.ndarray, ok: np.ndarray) -> np.ndarray:
    """Add the value before every counter reset inside each window, in time order."""
    X = w.X
    g, T = X.shape
    with _err():
        reset = X[:, 1:] < X[:, :-1]          # reset at sample i (i >= 1) is reset[:, i-1]
    if not reset.any():
        return result
    cum = np.zeros((g, T), np.int64)
    np.cumsum(reset, axis=1, out=cum[:, 1:])  # cum[:, i] = resets at positions 1..i
    lo = np.clip(w.lo, 0, T - 1)
    last = np.clip(w.hi - 1, 0, T - 1)
    k = np.where(ok, cum[:, last] - cum[:, lo], 0)  # resets at positions lo+1 .. hi-1
    rows, steps = np.nonzero(k)
    if not len(rows):
        return result
    result = result.copy()
    flat_pos = np.nonzero(np.concatenate([np.zeros((g, 1), bool), reset], axis=1).ravel())[0]
    start = np.searchsorted(flat_pos, rows * T + lo[steps] + 1)
    kk = k[rows, steps]
    xf = X.ravel()
    for j in range(int(kk.max())):
        sel = kk > j
        p = flat_pos[start[sel] + j]
        result[rows[sel], steps[sel]] += xf[p - 1]
    return result


def instant_value(w: Window, is_rate: bool) -> Result:
    g, S = w.shape
    ok = w.cnt >= 2
    last, prev = w.at(w.hi - 1), w.at(w.hi - 2)
    interval = w.times(w.hi - 1) - w.times(w.hi - 2)
    ok = ok & (interval != 0)
    with _err():
        if is_rate:
            res = np.where(last < prev, last, last - prev)
            res = res / (interval.astype(np.float64) / 1000)
        else:
            res = last - prev
    return res, np.broadcast_to(ok, (g, S))


# -- sequential aggregations over time -------------------------------------------------------

def _steps(w: Window):
    """(j, values at the j-th sample of each window, which windows have one)."""
    cnt = w.cnt
    top = int(cnt.max()) if len(cnt) else 0
    for j in range(top):
        yield j, w.at(w.lo + j), j < cnt


def sum_over_time(w: Window) -> Result:
    g, S = w.shape
    s = np.zeros((g, S))
    c = np.zeros((g, S))
    with _err():
        for _, x, valid in _steps(w):
            ns, nc = kahan_inc(x, s, c)
            s = np.where(valid, ns, s)
            c = np.where(valid, nc, c)
        out = np.where(np.isinf(s), s, s + c)
    return out, np.broadcast_to(w.cnt >= 1, (g, S))


def avg_over_time(w: Window) -> Result:
    g, S = w.shape
    mean = np.zeros((g, S))
    c = np.zeros((g, S))
    # scratch buffers: this loop runs once per sample of the longest window
    inc, t, d1, d2 = (np.empty((g, S)) for _ in range(4))
    big = np.empty((g, S), bool)
    with _err():
        for j, x, valid in _steps(w):
            count = float(j + 1)
            # inc = x/count - mean/count; then Go's kahanSumInc(inc, mean, c)
            np.divide(x, count, out=inc)
            np.divide(mean, count, out=d1)
            np.subtract(inc, d1, out=inc)
            np.add(mean, inc, out=t)
            np.abs(mean, out=d1)
            np.abs(inc, out=d2)
            np.greater_equal(d1, d2, out=big)
            np.subtract(mean, t, out=d1)
            np.add(d1, inc, out=d1)        # (sum - t) + inc
            np.subtract(inc, t, out=d2)
            np.add(d2, mean, out=d2)       # (inc - t) + sum
            np.copyto(d2, d1, where=big)
            upd = valid
            inf = np.isinf(mean)
            if inf.any():
                skip = inf & ((np.isinf(x) & ((mean > 0) == (x > 0))) | (~np.isinf(x) & ~np.isnan(x)))
                upd = valid & ~skip
            if upd.all():
                np.add(c, d2, out=c)
                mean, t = t, mean
            else:
                np.copyto(c, c + d2, where=np.broadcast_to(upd, c.shape))
                np.copyto(mean, t, where=np.broadcast_to(upd, mean.shape))
        out = np.where(np.isinf(mean), mean, mean + c)
    return out, np.broadcast_to(w.cnt >= 1, (g, S))


def _extreme(w: Window, pick: Callable) -> Result:
    g, S = w.shape
    out = w.at(w.lo)
    with _err():
        for _, x, valid in _steps(w):
            out = np.where(valid, pick(out, x), out)
    return out, np.broadcast_to(w.cnt >= 1, (g, S))


def max_over_time(w: Window) -> Result:
    # Go: max = v0; for v: if v > max || isNaN(max) { max = v }
    return _extreme(w, lambda m, x: np.where((x > m) | np.isnan(m), x, m))


def min_over_time(w: Window) -> Result:
    return _extreme(w, lambda m, x: np.where((x < m) | np.isnan(m), x, m))


def count_over_time(w: Window) -> Result:
    g, S = w.shape
    return np.broadcast_to(w.cnt.astype(np.float64), (g, S)), np.broadcast_to(w.cnt >= 1, (g, S))


def last_over_time(w: Window) -> Result:
    g, S = w.shape
    return w.at(w.hi - 1), np.broadcast_to(w.cnt >= 1, (g, S))


def first_over_time(w: Window) -> Result:
    """Prometheus 3 (experimental): the window's first sample."""
    g, S = w.shape
    return w.at(w.lo), np.broadcast_to(w.cnt >= 1, (g, S))


def present_over_time(w: Window) -> Result:
    g, S = w.shape
    return np.ones((g, S)), np.broadcast_to(w.cnt >= 1, (g, S))


def _stdvar(w: Window) -> Tuple[np.ndarray, np.ndarray]:
    g, S = w.shape
    mean = np.zeros((g, S))
    cmean = np.zeros((g, S))
    aux = np.zeros((g, S))
    caux = np.zeros((g, S))
    with _err():
        for j, x, valid in _steps(w):
            count = float(j + 1)
            delta = x - (mean + cmean)
            nm, ncm = kahan_inc(delta / count, mean, cmean)
            na, nca = kahan_inc(delta * (x - (nm + ncm)), aux, caux)
            mean = np.where(valid, nm, mean)
            cmean = np.where(valid, ncm, cmean)
            aux = np.where(valid, na, aux)
            caux = np.where(valid, nca, caux)
        var = (aux + caux) / np.maximum(w.cnt, 1)
    return var, np.broadcast_to(w.cnt >= 1, (g, S))


def stdvar_over_time(w: Window) -> Result:
    return _stdvar(w)


def stddev_over_time(w: Window) -> Result:
    var, p = _stdvar(w)
    with _err():
        return np.sqrt(var), p


def quantile_values(q: np.ndarray, vals: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Go's ``quantile``: ``vals`` (..., m) sorted NaN first, then ascending, padding last;
    ``n`` real values per row; ``q`` broadcast against the leading axes."""
    with _err():
        nf = n.astype(np.float64)
        rank = q * (nf - 1)
        lower = np.maximum(0, np.floor(rank))
        upper = np.minimum(nf - 1, lower + 1)
        weight = rank - np.floor(rank)
        li = np.clip(np.nan_to_num(lower), 0, max(vals.shape[-1] - 1, 0)).astype(np.int64)
        ui = np.clip(np.nan_to_num(upper), 0, max(vals.shape[-1] - 1, 0)).astype(np.int64)
        lv = np.take_along_axis(vals, li[..., None], axis=-1)[..., 0]
        uv = np.take_along_axis(vals, ui[..., None], axis=-1)[..., 0]
        out = lv * (1 - weight) + uv * weight
        out = np.where(np.isnan(q), np.nan, out)
        out = np.where(q < 0, -np.inf, out)
        out = np.where(q > 1, np.inf, out)
        out = np.where(n == 0, np.nan, out)
    return out


def sort_nan_first(vals: np.ndarray, valid: np.ndarray) -> np.ndarray:
    """Sort along the last axis as Go's ``vectorByValueHeap`` orders (NaN lowest); entries not
    ``valid`` go last."""
    isn = np.isnan(vals) & valid
    nn = isn.sum(axis=-1, keepdims=True)
    ordered = np.sort(np.where(valid & ~isn, vals, np.inf), axis=-1)
    pos = np.arange(vals.shape[-1])
    shifted = np.take_along_axis(ordered, np.clip(pos - nn, 0, vals.shape[-1] - 1), axis=-1)
    return np.where(pos < nn, np.nan, shifted)


def quantile_over_time(w: Window, q: np.ndarray) -> Result:
    g, S = w.shape
    cnt = w.cnt
    m = int(cnt.max()) if len(cnt) else 0
    out = np.full((g, S), np.nan)
    if m:
        idx = w.lo[:, None] + np.arange(m)[None, :]            # (S, m)
        valid = np.arange(m)[None, :] < cnt[:, None]            # (S, m)
        vals = w.X[:, np.clip(idx, 0, w.X.shape[1] - 1)]        # (g, S, m)
        vals = sort_nan_first(vals, np.broadcast_to(valid, vals.shape))
        out = quantile_values(np.broadcast_to(q, (g, S)), vals, np.broadcast_to(cnt, (g, S)))
    return out, np.broadcast_to(cnt >= 1, (g, S))


def mad_over_time(w: Window) -> Result:
    """Prometheus 3 (experimental): the median absolute deviation of the window's samples (the
    median, by Go's ``quantile``, of each sample's distance to their median)."""
    g, S = w.shape
    cnt = w.cnt
    m = int(cnt.max()) if len(cnt) else 0
    out = np.full((g, S), np.nan)
    if m:
        idx = w.lo[:, None] + np.arange(m)[None, :]
        valid = np.broadcast_to(np.arange(m)[None, :] < cnt[:, None], (g, S, m))
        raw = w.X[:, np.clip(idx, 0, w.X.shape[1] - 1)]
        n = np.broadcast_to(cnt, (g, S))
        half = np.full((g, S), 0.5)
        median = quantile_values(half, sort_nan_first(raw, valid), n)
        with _err():
            dev = np.abs(raw - median[..., None])
        out = quantile_values(half, sort_nan_first(dev, valid), n)
    return out, np.broadcast_to(cnt >= 1, (g, S))


def _count_pairs(w: Window, pred: Callable) -> Result:
    g, S = w.shape
    X = w.X
    T = X.shape[1]
    hit = np.zeros((g, T), np.int64)
    if T > 1:
        with _err():
            np.cumsum(pred(X[:, 1:], X[:, :-1]), axis=1, out=hit[:, 1:])
    lo = np.clip(w.lo, 0, max(T - 1, 0))
    last = np.clip(w.hi - 1, 0, max(T - 1, 0))
    ok = w.cnt >= 1
    n = np.where(ok, hit[:, last] - hit[:, lo], 0) if T else np.zeros((g, S), np.int64)
    return n.astype(np.float64), np.broadcast_to(ok, (g, S))


def changes(w: Window) -> Result:
    return _count_pairs(w, lambda cur, prev: (cur != prev) & ~(np.isnan(cur) & np.isnan(prev)))


def resets(w: Window) -> Result:
    return _count_pairs(w, lambda cur, prev: cur < prev)


# -- least squares ---------------------------------------------------------------------------

def linear_regression(w: Window, intercept_ms: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Go's ``linearRegression``: slope and intercept at ``intercept_ms`` (per step)."""
    g, S = w.shape
    z = lambda: np.zeros((g, S))  # noqa: E731
    n, sx, cx, sy, cy, sxy, cxy, sx2, cx2 = (z() for _ in range(9))
    init_y = w.at(w.lo)
    const_y = np.ones((g, S), bool)
    with _err():
        for j, y, valid in _steps(w):
            if j > 0:
                const_y &= ~(valid & (y != init_y))
            x = (w.times(w.lo + j) - intercept_ms).astype(np.float64) / 1e3
            x = np.broadcast_to(x, (g, S))
            n = np.where(valid, n + 1.0, n)
            a, b = kahan_inc(x, sx, cx)
            sx, cx = np.where(valid, a, sx), np.where(valid, b, cx)
            a, b = kahan_inc(y, sy, cy)
            sy, cy = np.where(valid, a, sy), np.where(valid, b, cy)
            a, b = kahan_inc(x * y, sxy, cxy)
            sxy, cxy = np.where(valid, a, sxy), np.where(valid, b, cxy)
            a, b = kahan_inc(x * x, sx2, cx2)
            sx2, cx2 = np.where(valid, a, sx2), np.where(valid, b, cx2)
        sx, sy, sxy, sx2 = sx + cx, sy + cy, sxy + cxy, sx2 + cx2
        cov = sxy - sx * sy / n
        var = sx2 - sx * sx / n
        slope = cov / var
        intercept = sy / n - slope * sx / n
    inf_y = np.isinf(init_y)
    slope = np.where(const_y, np.where(inf_y, np.nan, 0.0), slope)
    intercept = np.where(const_y, np.where(inf_y, np.nan, init_y), intercept)
    return slope, intercept


def deriv(w: Window) -> Result:
    g, S = w.shape
    slope, _ = linear_regression(w, w.times(w.lo))
    return slope, np.broadcast_to(w.cnt >= 2, (g, S))


def predict_linear(w: Window, steps: np.ndarray, duration: np.ndarray) -> Result:
    g, S = w.shape
    slope, intercept = linear_regression(w, steps)
    with _err():
        return slope * duration + intercept, np.broadcast_to(w.cnt >= 2, (g, S))


def holt_winters(w: Window, sf: np.ndarray, tf: np.ndarray) -> Result:
    g, S = w.shape
    cnt = w.cnt
    s0 = np.zeros((g, S))
    s1 = w.at(w.lo)
    b = w.at(w.lo + 1) - w.at(w.lo)
    with _err():
        for j, x, valid in _steps(w):
            if j == 0:
                continue
            xs = sf * x
            # calcTrendValue(i-1, ...): the raw b on the first step, the smoothed trend after
            nb = b if j == 1 else tf * (s1 - s0) + (1 - tf) * b
            y = (1 - sf) * (s1 + nb)
            ns0, ns1 = s1, xs + y
            s0 = np.where(valid, ns0, s0)
            s1 = np.where(valid, ns1, s1)
            b = np.where(valid, nb, b)
    return s1, np.broadcast_to(cnt >= 2, (g, S))


RANGE_FUNCTIONS: Dict[str, Callable[..., Result]] = {
    "rate": lambda w: extrapolated_rate(w, True, True),
    "increase": lambda w: extrapolated_rate(w, True, False),
    "delta": lambda w: extrapolated_rate(w, False, False),
    "irate": lambda w: instant_value(w, True),
    "idelta": lambda w: instant_value(w, False),
    "sum_over_time": sum_over_time,
    "avg_over_time": avg_over_time,
    "max_over_time": max_over_time,
    "min_over_time": min_over_time,
    "count_over_time": count_over_time,
    "last_over_time": last_over_time,
    "first_over_time": first_over_time,
    "mad_over_time": mad_over_time,
    "present_over_time": present_over_time,
    "stddev_over_time": stddev_over_time,
    "stdvar_over_time": stdvar_over_time,
    "changes": changes,
    "resets": resets,
    "deriv": deriv,
}
