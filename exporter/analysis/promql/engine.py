"""Evaluating a PromQL expression at every step of a grid at once.

``Evaluator(store, times, interval_ms)`` answers, for each step time ``t`` in ``times``, what an
instant query at ``t`` would return (what a rule evaluated at ``t`` sees): an instant vector as
a ``Vec`` (series by steps), a scalar as one value per step, a string as itself.

Semantics of Prometheus 2.42 that matter here:

- an instant selector takes each series' latest sample at or before ``t - offset`` if it is at
  most the lookback delta (5 minutes) old and not a stale marker;
- a range selector ``[r]`` takes the samples in ``[t - offset - r, t - offset]``, both ends
  included (``left_open=True`` gives Prometheus 3's ``(t - offset - r, ...]``, which also makes
  the lookback window left-open);
- nothing later than ``t`` is visible at ``t`` (a rule at ``t`` runs before later samples
  exist), which only matters for negative offsets;
- a subquery ``expr[r:s]`` evaluates ``expr`` at the multiples of ``s`` (default: the grid's
  interval, as promtool and the rule manager use) inside each window;
- ``@`` pins a selector or subquery to a time; ``start()``/``end()`` are ``t`` itself (each rule
  evaluation is its own instant query), or the start and end of a range query (``start_end``);
- inside a subquery, what an inner step may see is what the outer evaluation that reads it may
  see (its horizon), so an ``@`` or a negative offset inside reaches past the inner step.

Results of sub-expressions listed in ``shared`` are cached for the evaluator's lifetime (one
block of steps), so rules that repeat ``rate(x[5m])`` compute it once.

Series order: ``sum`` and ``avg`` add members in the order of the vector, which for a selector is
the order the storage returns series in. Prometheus' TSDB returns them unsorted from the head
block (in the order the series were created), which no recording of history preserves; the
engine uses label order. Floating-point addition depends on order, so a sum of three or more
non-integer values can differ from Prometheus' in the last bit. ``order="reverse"`` or an integer
seed (a random order) changes the order: the tests use it to tell such order-dependent results
from exact ones.
"""

from __future__ import annotations

from typing import Dict, FrozenSet, List, Optional, Tuple, Union

import numpy as np

from . import aggregate as agg
from . import binops, functions
from .ast import (
    AggregateExpr,
    BinaryExpr,
    Call,
    Expr,
    MatrixSelector,
    NumberLiteral,
    ParenExpr,
    StringLiteral,
    SubqueryExpr,
    UnaryExpr,
    VectorSelector,
    unwrap_parens,
    walk,
)
from .labels import Labels, MatcherSet, drop_name
from .vector import EvalError, Vec, build, empty
from .windows import RANGE_FUNCTIONS, Window, bounds, holt_winters, predict_linear, quantile_over_time

Value = Union[Vec, np.ndarray, str]
DEFAULT_LOOKBACK_MS = 5 * 60 * 1000


class _Source:
    """Sample arrays of one series as a range function reads them."""

    __slots__ = ("labels", "key", "t", "v", "tkey")

    def __init__(self, labels: Labels, key: float, t: np.ndarray, v: np.ndarray, tkey) -> None:
        self.labels, self.key, self.t, self.v, self.tkey = labels, key, t, v, tkey


class Evaluator:
    def __init__(self, store, times: np.ndarray, interval_ms: int, lookback_ms: int = DEFAULT_LOOKBACK_MS,
                 left_open: bool = False, shared: FrozenSet[str] = frozenset(),
                 horizon: Optional[np.ndarray] = None, order: Union[None, str, int] = None,
                 start_end: Optional[Tuple[int, int]] = None, lagged: FrozenSet[str] = frozenset()) -> None:
        self.store = store
        self.times = np.asarray(times, dtype=np.int64)
        self.S = len(self.times)
        self.interval_ms = int(interval_ms)
        self.lookback_ms = int(lookback_ms)
        self.left_open = left_open
        self.shared = shared
        self.horizon = self.times if horizon is None else horizon
        # names recorded by a rule that runs after the reader at the same evaluation (later in
        # its group, or in a later group): what the reader sees of them ends before its horizon
        self.lagged = lagged
        self.order = order
        self.start_end = start_end
        self._cache: Dict[str, Value] = {}
        self._reads: Dict[str, List[MatcherSet]] = {}
        self._matchers: Dict[str, MatcherSet] = {}

    # -- entry -----------------------------------------------------------------------------

    def eval(self, node: Expr) -> Value:
        key = None
        if self.shared and not isinstance(node, (NumberLiteral, StringLiteral)):
            key = str(node)
            if key in self.shared:
                got = self._cache.get(key)
                if got is not None:
                    return got
            else:
                key = None
        out = self._eval(node)
        if key is not None:
            self._cache[key] = out
            self._reads[key] = [MatcherSet(n.matchers) for n in walk(node) if isinstance(n, VectorSelector)]
        return out

    def forget(self, name: str) -> None:
        """Drop cached results that read series named ``name`` (a rule just wrote some)."""
        for key in [k for k, sels in self._reads.items() if any(m.matches_name(name) for m in sels)]:
            del self._cache[key]
            del self._reads[key]

    def _eval(self, node: Expr) -> Value:
        if isinstance(node, NumberLiteral):
            return np.full(self.S, node.val)
        if isinstance(node, StringLiteral):
            return node.val
        if isinstance(node, ParenExpr):
            return self.eval(node.expr)
        if isinstance(node, VectorSelector):
            return self.select(node)
        if isinstance(node, UnaryExpr):
            return self.unary(node)
        if isinstance(node, BinaryExpr):
            return self.binary(node)
        if isinstance(node, AggregateExpr):
            return self.aggregation(node)
        if isinstance(node, Call):
            return self.call(node)
        if isinstance(node, (MatrixSelector, SubqueryExpr)):
            raise EvalError("a range vector cannot be the result of a rule or query here")
        raise EvalError(f"cannot evaluate {type(node).__name__}")  # pragma: no cover

    # -- selectors -------------------------------------------------------------------------

    def _keys(self, n: int) -> np.ndarray:
        """Order keys of ``n`` series as the storage would list them (see ``order``)."""
        base = np.arange(n, dtype=np.float64)
        if self.order is None:
            return base
        if self.order == "reverse":
            return -base
        return np.random.default_rng([int(self.order), n]).permutation(n).astype(np.float64)

    def _matcher_set(self, vs: VectorSelector) -> MatcherSet:
        text = vs.selector_text()
        ms = self._matchers.get(text)
        if ms is None:
            ms = self._matchers[text] = MatcherSet(vs.matchers)
        return ms

    def _series(self, vs: VectorSelector):
        return self.store.select(self._matcher_set(vs))

    def _visible(self, vs: VectorSelector) -> np.ndarray:
        """The latest sample time ``vs`` may see at each step: the horizon, or just before it for a
        name in ``lagged`` (its writer has not run yet at that evaluation)."""
        if self.lagged and any(self._matcher_set(vs).matches_name(n) for n in self.lagged):
            return self.horizon - 1
        return self.horizon

    def _pinned(self, at) -> Optional[int]:
        """The time an ``@`` pins to: its own, or the range query's start or end (``start_end``);
        None when it pins nothing (no ``@``, or ``start()``/``end()`` of a rule's instant query,
        which are the evaluation time itself)."""
        if at is None:
            return None
        if at.preprocessor:
            if self.start_end is None:
                return None
            return self.start_end[0] if at.preprocessor == "start" else self.start_end[1]
        return at.ms

    def _ref_times(self, vs_offset: int, at) -> np.ndarray:
        pin = self._pinned(at)
        base = self.times if pin is None else np.full(self.S, pin, np.int64)
        return base - vs_offset

    def select(self, vs: VectorSelector) -> Vec:
        series = self._series(vs)
        S = self.S
        if not series:
            return empty(S)
        ref = self._ref_times(vs.offset_ms, vs.at)
        seek = np.minimum(ref, self._visible(vs))
        oldest = ref - self.lookback_ms
        labels: List[Labels] = []
        Vs, Ps, Ts = [], [], []
        groups: Dict[object, List[int]] = {}
        for i, s in enumerate(series):
            groups.setdefault(s.time_key(), []).append(i)
        rows_order: List[int] = []
        for rows in groups.values():
            t = series[rows[0]].t
            idx = np.searchsorted(t, seek, side="right") - 1
            has = idx >= 0
            safe = np.where(has, idx, 0)
            ts = t[safe] if len(t) else np.zeros(S, np.int64)
            fresh = has & ((ts > oldest) if self.left_open else (ts >= oldest))
            for r in rows:
                s = series[r]
                p = fresh
                if s.stale is not None:
                    p = p & ~s.stale[safe]
                Vs.append(s.v[safe] if len(s.v) else np.zeros(S))
                Ps.append(p)
                Ts.append(ts)
                rows_order.append(r)
        order = np.argsort(rows_order)
        labels = [series[r].labels for r in sorted(rows_order)]
        V = np.array(Vs)[order]
        P = np.array(Ps)[order]
        T = np.array(Ts)[order]
        keep = P.any(axis=1)
        idx = np.nonzero(keep)[0]
        keys = self._keys(len(series))[idx]
        return Vec([labels[i] for i in idx], V[idx], P[idx], keys, T[idx])

    def _windows(self, arg: Expr) -> List[Window]:
        """The range argument of a function as groups of series sharing sample times."""
        arg = unwrap_parens(arg)
        if isinstance(arg, MatrixSelector):
            vs = arg.selector
            maxt = self._ref_times(vs.offset_ms, vs.at)
            rng = arg.range_ms
            found = self._series(vs)
            keys = self._keys(len(found))
            sources = [_Source(s.labels, keys[k], *s.without_stale(), s.time_key(clean=True))
                       for k, s in enumerate(found)]
        elif isinstance(arg, SubqueryExpr):
            maxt = self._ref_times(arg.offset_ms, arg.at)
            rng = arg.range_ms
            sources = self._subquery(arg, maxt)
        else:  # pragma: no cover - the parser guarantees a range argument
            raise EvalError(f"expected a range vector, got {arg}")
        mint = maxt - rng
        # stored samples later than the horizon do not exist yet; a subquery's points are
        # computed, each from what its own evaluation may see (``_subquery``)
        visible = maxt if isinstance(arg, SubqueryExpr) else np.minimum(maxt, self._visible(arg.selector))
        groups: Dict[object, List[_Source]] = {}
        for src in sources:
            groups.setdefault(src.tkey, []).append(src)
        out = []
        for members in groups.values():
            t = members[0].t
            lo, hi = bounds(t, mint, visible, self.left_open)
            X = np.array([m.v for m in members]) if len(t) else np.zeros((len(members), 0))
            out.append(Window([m.labels for m in members], np.array([m.key for m in members]), t, X,
                              lo, hi, mint, maxt, rng))
        return out

    def _subquery(self, sq: SubqueryExpr, maxt: np.ndarray) -> List[_Source]:
        step = sq.step_ms or self.interval_ms
        if self._pinned(sq.at) is not None:
            lo_t, hi_t = int(maxt[0]) - sq.range_ms, int(maxt[0])
        else:
            lo_t, hi_t = int(maxt.min()) - sq.range_ms, int(maxt.max())
        first = -(-lo_t // step) * step  # first multiple of step >= lo_t
        inner_times = np.arange(first, hi_t + 1, step, dtype=np.int64)
        if not len(inner_times):
            return []
        # What the inner steps may see is what the outer evaluation that reads them may see: the
        # horizon of the earliest outer step whose window holds the inner step (not the inner
        # step itself: an ``@`` or a negative offset inside the subquery reaches past it).
        reader = np.searchsorted(maxt, inner_times, side="left")  # maxt never decreases
        horizon = self.horizon[np.clip(reader, 0, self.S - 1)]
        inner = Evaluator(self.store, inner_times, step, self.lookback_ms, self.left_open,
                          horizon=horizon, order=self.order, start_end=self.start_end, lagged=self.lagged)
        res = inner.eval(sq.expr)
        if not isinstance(res, Vec):  # pragma: no cover - the parser checks the type
            raise EvalError("subquery is only allowed on instant vector")
        out = []
        shared: Dict[bytes, np.ndarray] = {}
        keys = self._keys(res.n)
        for i, ls in enumerate(res.labels):
            p = res.P[i]
            key = p.tobytes()
            t = shared.get(key)
            if t is None:
                t = shared[key] = inner_times[p]
            out.append(_Source(ls, keys[i], t, res.V[i][p], key))
        return out

    # -- operators -------------------------------------------------------------------------

    def unary(self, node: UnaryExpr) -> Value:
        v = self.eval(node.expr)
        if node.op == "+":
            return v
        if isinstance(v, np.ndarray):
            return -v
        return build([drop_name(ls) for ls in v.labels], -v.V, v.P, v.K, self.times)

    def binary(self, node: BinaryExpr) -> Value:
        lhs, rhs = self.eval(node.lhs), self.eval(node.rhs)
        op = node.op
        if isinstance(lhs, np.ndarray) and isinstance(rhs, np.ndarray):
            return binops.scalar_scalar(op, lhs, rhs)
        if isinstance(lhs, Vec) and isinstance(rhs, np.ndarray):
            return binops.vector_scalar(op, lhs, rhs, False, node.return_bool, self.times)
        if isinstance(lhs, np.ndarray) and isinstance(rhs, Vec):
            return binops.vector_scalar(op, rhs, lhs, True, node.return_bool, self.times)
        assert isinstance(lhs, Vec) and isinstance(rhs, Vec) and node.matching is not None
        if op in ("and", "or", "unless"):
            return binops.set_op(op, lhs, rhs, node.matching, self.times)
        return binops.vector_vector(op, lhs, rhs, node.matching, node.return_bool, self.times)

    def aggregation(self, node: AggregateExpr) -> Vec:
        param = None
        if node.param is not None:
            param = self.eval(node.param)
        vec = self.eval(node.expr)
        assert isinstance(vec, Vec)
        return agg.aggregate(node.op, vec, node.grouping, node.without, param, self.times)

    # -- functions -------------------------------------------------------------------------

    def call(self, node: Call) -> Value:
        name = node.func
        args = node.args
        times = self.times
        if name in RANGE_FUNCTIONS or name in ("quantile_over_time", "predict_linear", "holt_winters",
                                               "absent_over_time"):
            return self.range_call(node)
        if name == "time":
            return times.astype(np.float64) / 1000
        if name == "pi":
            return np.full(self.S, np.pi)
        if name == "vector":
            return functions.vector(self.eval(args[0]), times)
        if name == "scalar":
            return functions.scalar(self.eval(args[0]), times)
        if name in functions.DATE_FUNCTIONS:
            return functions.date_function(name, self.eval(args[0]) if args else None, times)
        if name == "absent":
            vec = self.eval(args[0])
            return functions.absent(vec.present_any(), args[0], times)
        if name == "histogram_quantile":
            return functions.hist_quantile(self.eval(args[0]), self.eval(args[1]), times)
        if name in ("histogram_count", "histogram_sum", "histogram_fraction"):
            for a in args:
                self.eval(a)
            return empty(self.S)  # native histograms only: classic series give nothing
        vec = self.eval(args[0])
        assert isinstance(vec, Vec)
        if name in functions.SIMPLE:
            return functions.simple(name, vec, times)
        if name == "clamp":
            return functions.clamp(vec, self.eval(args[1]), self.eval(args[2]), times)
        if name == "clamp_min":
            return functions.clamp(vec, self.eval(args[1]), None, times)
        if name == "clamp_max":
            return functions.clamp(vec, None, self.eval(args[1]), times)
        if name == "round":
            return functions.round_(vec, self.eval(args[1]) if len(args) > 1 else None, times)
        if name == "timestamp":
            if not isinstance(unwrap_parens(args[0]), VectorSelector):
                vec = Vec(vec.labels, vec.V, vec.P, vec.K, None)
            return functions.timestamp(vec, times)
        if name in ("sort", "sort_desc"):
            return functions.sort(vec, name == "sort_desc", times)
        if name == "label_replace":
            return functions.label_replace(vec, *(self.eval(a) for a in args[1:]), times)
        if name == "label_join":
            strs = [self.eval(a) for a in args[1:]]
            return functions.label_join(vec, strs[0], strs[1], strs[2:], times)
        raise EvalError(f"function {name!r} is not supported by the backtest")  # pragma: no cover

    def range_call(self, node: Call) -> Vec:
        name = node.func
        args = node.args
        S = self.S
        mi = next(i for i, a in enumerate(args) if unwrap_parens(a).type == "matrix")
        others = {i: self.eval(a) for i, a in enumerate(args) if i != mi}
        windows = self._windows(args[mi])
        if name == "absent_over_time":
            seen = np.zeros(S, bool)
            for w in windows:
                seen |= w.cnt >= 1
            return functions.absent(seen, args[mi], self.times)
        if name == "holt_winters":
            sf, tf = others[1], others[2]
            bad = np.nonzero((sf <= 0) | (sf >= 1) | (tf <= 0) | (tf >= 1))[0]
            if len(bad):
                raise EvalError("invalid smoothing or trend factor in holt_winters(): expected 0 < sf, tf < 1",
                                int(self.times[bad[0]]))
        labels: List[Labels] = []
        Vs, Ps, Ks = [], [], []
        keep_name = name in ("last_over_time", "first_over_time")
        for w in windows:
            if name == "quantile_over_time":
                V, P = quantile_over_time(w, others[0])
            elif name == "predict_linear":
                V, P = predict_linear(w, self.times, others[1])
            elif name == "holt_winters":
                V, P = holt_winters(w, others[1], others[2])
            else:
                V, P = RANGE_FUNCTIONS[name](w)
            labels.extend(w.labels if keep_name else [drop_name(ls) for ls in w.labels])
            Vs.append(np.asarray(V))
            Ps.append(np.asarray(P))
            Ks.append(w.keys)
        if not labels:
            return empty(S)
        V = np.concatenate(Vs)
        P = np.concatenate(Ps)
        K = np.concatenate(Ks)
        order = np.argsort(K, kind="stable")
        return build([labels[i] for i in order], V[order], P[order], K[order], self.times)

