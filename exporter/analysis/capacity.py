"""The capacity model after launch, filled from history instead of by hand.

From the raw vLLM series over a range (two weeks by default) and the SLO file, per model:

- the real peak request rate and when it happened; prompt and output token distributions (mean,
  p50, p95 from vLLM's histograms over the whole range); the prefix-cache hit ratio; the
  speculative-decoding acceptance where vLLM counts it;
- what one replica sustains: the highest generation tokens/s a replica held for
  ``capacity.sustain`` with every latency objective met throughout (TTFT p95, TTFT mean and
  inter-token latency: the three latency alerts' conditions all false). It is computed by the
  pack's own ``capacity`` recording rules, evaluated here over history with the backtest engine,
  so the report and the dashboard's headroom panel give the same number for the same data;
  beside it, the load-latency curve it is read from (every replica at every step: tokens/s
  against each latency), binned;
- for a target rate (given, or the peak plus ``capacity.headroom``): replicas needed
  (``target x mean output tokens / sustainable tokens/s``, rounded up), whether the replicas
  serving now are enough and by how much;
- the trend of the periodic (daily) peaks: a least-squares line with the slope's confidence
  interval; "no trend" when that interval contains zero; otherwise when the line reaches the
  current capacity, with Fieller's interval for that date.

``compute`` is pure: a ``Store`` of raw samples and ``Options`` in, a ``CapacityReport`` out. The
command line loads the store (``sources``) and writes the report (``capacity_report``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..pack.context import Ctx
from ..pack.names import grouping, model_labels
from ..pack.recording import capacity as capacity_family
from ..pack.recording import capacity_names, recording_rules
from .promql.ast import VectorSelector, walk
from .promql.durations import format_duration
from .promql.engine import DEFAULT_LOOKBACK_MS, Evaluator
from .promql.labels import Labels, drop_name, keep
from .promql.parser import parse
from .promql.vector import EvalError, Vec
from .rulefile import Group, groups_from_data
from .rules import RuleEvalError
from .rules import run as run_rules
from .series import Store
from .stats import crossing, linear_fit

DAY_MS = 86_400_000
CURVE_BINS = 12
LIMIT_NEAR = 0.9       # an objective missed at >= 90% of the sustainable load: the limit was reached
MIN_COVERAGE = 0.9     # a trend period counts when samples cover at least 90% of its steps
MIN_PERIODS = 3        # a fit with an uncertainty needs three periods


class CapacityError(ValueError):
    """Options or input that make the capacity model impossible; one line."""


@dataclass(frozen=True)
class Objectives:
    ttft_p95_seconds: float
    ttft_mean_seconds: float
    itl_mean_seconds: float

    @classmethod
    def from_slo(cls, slo) -> "Objectives":
        o = slo["objectives"]
        # the rules write the ITL objective with 6 significant digits; so does this
        return cls(float(o["ttft_p95_seconds"]), float(o["ttft_mean_seconds"]),
                   float(f"{1.0 / o['output_tokens_per_second']:.6g}"))

    def met(self, ttft_p95: np.ndarray, ttft_mean: np.ndarray, itl_mean: np.ndarray) -> np.ndarray:
        """True where every objective holds (NaN or absent: not met), as the rules say."""
        with np.errstate(invalid="ignore"):
            return (ttft_p95 <= self.ttft_p95_seconds) & (ttft_mean <= self.ttft_mean_seconds) & \
                (itl_mean <= self.itl_mean_seconds)


@dataclass
class Options:
    slo: dict
    start_ms: int
    end_ms: int
    step_ms: int = 60_000
    target_qps: Optional[float] = None
    headroom: Optional[float] = None        # default: the SLO's capacity.headroom
    trend_period_ms: int = DAY_MS
    confidence: float = 0.95
    model: Optional[str] = None             # only this model_name
    lookback_ms: int = DEFAULT_LOOKBACK_MS


@dataclass(frozen=True)
class Distribution:
    mean: Optional[float]
    p50: Optional[float]
    p95: Optional[float]


@dataclass(frozen=True)
class Peak:
    value: float
    at_ms: int


@dataclass(frozen=True)
class CurveBin:
    lo: float                  # tokens/s per replica, (lo, hi]
    hi: float
    points: int
    tokens_per_second: float   # medians of the points in the bin
    ttft_p95: Optional[float]
    ttft_mean: Optional[float]
    itl_mean: Optional[float]
    within_share: float        # share of the points where every objective held


@dataclass(frozen=True)
class Points:
    """Every replica at every step with traffic: the load-latency scatter."""

    tokens_per_second: np.ndarray
    ttft_p95: np.ndarray
    ttft_mean: np.ndarray
    itl_mean: np.ndarray
    within: np.ndarray


@dataclass(frozen=True)
class Sustainable:
    tokens_per_second: Optional[float]     # held for capacity.sustain within every objective; None: never
    at_ms: Optional[int]
    replica: Dict[str, str]
    instantaneous_max: Optional[float]     # the best single step within every objective
    bound: str                             # "observed": objectives were missed just above it; "lower": never
                                           # pushed that far, the real limit is higher; "none": never met
    missed_near_limit: int                 # steps with an objective missed at >= LIMIT_NEAR x the figure


@dataclass(frozen=True)
class PeriodPeak:
    start_ms: int
    value: float
    at_ms: int


@dataclass(frozen=True)
class Trend:
    status: str                     # "too-few" | "no-trend" | "rising" | "falling"
    period_ms: int
    confidence: float
    peaks: List[PeriodPeak]
    slope_per_day: Optional[float] = None
    slope_low: Optional[float] = None
    slope_high: Optional[float] = None
    level_now: Optional[float] = None       # the line at the last period
    crosses_at_ms: Optional[int] = None     # when the line reaches the capacity
    crosses_earliest_ms: Optional[int] = None
    crosses_latest_ms: Optional[int] = None
    note: str = ""


@dataclass(frozen=True)
class Target:
    qps: float
    source: str                       # "given" or "peak + headroom"
    replicas_now: int
    replicas_needed: Optional[int]
    capacity_qps: Optional[float]
    margin: Optional[float]           # capacity / target - 1
    enough: Optional[bool]            # None: unknown (no sustainable figure)


@dataclass
class ModelCapacity:
    labels: Dict[str, str]
    peak_qps: Optional[Peak]
    peak_tokens_per_second: Optional[Peak]
    prompt_tokens: Distribution
    output_tokens: Distribution
    prefix_cache_hit_ratio: Optional[float]
    spec_decode_acceptance: Optional[float]
    replicas_now: int
    sustainable: Sustainable
    capacity_tokens_per_second: Optional[float]
    capacity_qps: Optional[float]
    curve: List[CurveBin]
    points: Points
    trend: Trend
    target: Optional[Target]
    rules_at_end: Dict[str, Optional[float]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.labels.get("model_name", "")


@dataclass
class CapacityReport:
    start_ms: int
    end_ms: int
    step_ms: int
    objectives: Objectives
    settings: Dict[str, object]        # the SLO's capacity section and the headroom used
    models: List[ModelCapacity]
    rule_names: Dict[str, str]
    notes: List[str] = field(default_factory=list)


# -- which rules and series -------------------------------------------------------------------------

def _ctx(opts: Options) -> Ctx:
    slo = opts.slo
    if opts.model:
        slo = dict(slo)
        esc = opts.model.replace("\\", "\\\\").replace('"', '\\"')
        slo["selector"] = ", ".join(x for x in (slo["selector"].strip().strip(","), f'model_name="{esc}"') if x)
    return Ctx(slo)


def rule_groups(c: Ctx) -> Tuple[List[Group], Dict[str, str]]:
    """The pack's recording rules the model needs over history: the per-replica within-SLO and
    sustained series, the best sustained per model, the per-model request and token rates, and
    what they read; in the pack's
    order. The rules over the long windows (sustainable, peak, capacity, headroom) are evaluated
    once, at the end, by ``rules_at_end``."""
    names = capacity_names(c)
    wanted = {names["within"], names["sustained"], names["sustained_best"], c.mrec("vllm_requests_finished", "rate"),
              c.mrec("vllm_generation_tokens", "rate")}
    at_end = {names[k] for k in ("sustainable", "peak", "capacity", "headroom")}
    rules = [r for r in recording_rules(c) if r.record not in at_end]
    by_name: Dict[str, List] = {}
    for r in rules:
        by_name.setdefault(r.record, []).append(r)
    todo = list(wanted)
    while todo:
        name = todo.pop()
        for r in by_name.get(name, []):
            for node in walk(parse(r.expr)):
                if isinstance(node, VectorSelector) and node.name in by_name and node.name not in wanted:
                    wanted.add(node.name)
                    todo.append(node.name)
    chosen = [r.as_rule() for r in rules if r.record in wanted]
    return groups_from_data([{"name": "capacity", "rules": chosen}], "<the pack's capacity rules>"), names


def range_exprs(c: Ctx, range_ms: int) -> Dict[str, str]:
    """Whole-range figures per model, as PromQL evaluated once at the end of the range."""
    svc, s, r = c.svc, c.s(), format_duration(max(range_ms, 1))

    def inc(metric: str) -> str:
        return f"sum by ({svc}) (increase({metric}{s}[{r}]))"

    def ratio(num: str, den: str) -> str:
        return f"{inc(num)}\n/\n({inc(den)} > 0)"

    out: Dict[str, str] = {}
    for key, hist in (("prompt", "vllm:request_prompt_tokens"), ("output", "vllm:request_generation_tokens")):
        out[f"{key}_mean"] = ratio(hist + "_sum", hist + "_count")
        for q in ("0.5", "0.95"):
            out[f"{key}_p{q[2:].ljust(2, '0')}"] = \
                f"histogram_quantile({q}, sum by ({svc}, le) (increase({hist}_bucket{s}[{r}])))"
    out["prefix_cache_hit_ratio"] = (f"(\n{ratio('vllm:prefix_cache_hits_total', 'vllm:prefix_cache_queries_total')}\n)"
                                     "\nor\n(\n"
                                     f"{ratio('vllm:gpu_prefix_cache_hits_total', 'vllm:gpu_prefix_cache_queries_total')}\n)")
    out["spec_decode_acceptance"] = ratio("vllm:spec_decode_num_accepted_tokens_total",
                                          "vllm:spec_decode_num_draft_tokens_total")
    return out


END_RULES = ("sustainable", "peak", "capacity", "headroom")


def end_groups(c: Ctx) -> List[Group]:
    """The headroom rules over the long windows, run once at the end (after ``rule_groups``)."""
    names = capacity_names(c)
    chosen = [r.as_rule() for r in capacity_family(c) if r.record in {names[k] for k in END_RULES}]
    return groups_from_data([{"name": "capacity-at-end", "rules": chosen}], "<the pack's capacity rules>")


def selectors(opts: Options) -> Tuple[List[Tuple[str, int]], List[str]]:
    """The raw selectors to read and from when (ms), and the names the rules record (to drop)."""
    from .backtest import raw_selectors

    c = _ctx(opts)
    groups, _ = rule_groups(c)
    # the rules run from the start, the whole-range figures once at the end
    by_rules, recorded = raw_selectors(groups, [], opts.lookback_ms)
    extra = [parse(e) for e in list(range_exprs(c, opts.end_ms - opts.start_ms).values())]
    at_end, _ = raw_selectors([], extra, opts.lookback_ms)
    frm = {sel: opts.start_ms - ms for sel, ms in by_rules.items()}
    for sel, ms in at_end.items():
        frm[sel] = min(frm.get(sel, opts.end_ms), opts.end_ms - ms)
    return sorted(frm.items()), recorded


# -- the pieces (pure, each tested on its own) --------------------------------------------------------

def peak(times: np.ndarray, values: np.ndarray, present: np.ndarray) -> Optional[Peak]:
    """The highest value and its (first) time."""
    ok = present & np.isfinite(values)
    if not ok.any():
        return None
    v = np.where(ok, values, -np.inf)
    i = int(np.argmax(v))
    return Peak(float(v[i]), int(times[i]))


def period_peaks(times: np.ndarray, values: np.ndarray, present: np.ndarray, period_ms: int, step_ms: int,
                 min_coverage: float = MIN_COVERAGE) -> List[PeriodPeak]:
    """The peak of each period (aligned to unix time 0: UTC days for 1d) whose samples cover at
    least ``min_coverage`` of its steps."""
    ok = present & np.isfinite(values)
    out: List[PeriodPeak] = []
    if not ok.any():
        return out
    per = times // period_ms
    expected = max(period_ms // step_ms, 1)
    for p in np.unique(per[ok]):
        sel = ok & (per == p)
        if sel.sum() < min_coverage * expected:
            continue
        idx = np.nonzero(sel)[0]
        j = idx[int(np.argmax(values[idx]))]
        out.append(PeriodPeak(int(p * period_ms), float(values[j]), int(times[j])))
    return out


def trend(peaks: Sequence[PeriodPeak], period_ms: int, capacity: Optional[float], confidence: float) -> Trend:
    """A least-squares line through the periodic peaks (x in days); when it reaches ``capacity``."""
    if len(peaks) < MIN_PERIODS:
        return Trend("too-few", period_ms, confidence, list(peaks),
                     note=f"{len(peaks)} full period(s) of {format_duration(period_ms)}; a trend needs {MIN_PERIODS}")
    x = [p.start_ms / DAY_MS for p in peaks]
    y = [p.value for p in peaks]
    fit = linear_fit(x, y)
    lo, hi = fit.slope_interval(confidence)
    last_x = x[-1]
    common = dict(period_ms=period_ms, confidence=confidence, peaks=list(peaks), slope_per_day=fit.slope,
                  slope_low=lo, slope_high=hi, level_now=fit.at(last_x))
    if not fit.significant(confidence):
        return Trend("no-trend", note="the slope's confidence interval contains zero", **common)
    status = "rising" if fit.slope > 0 else "falling"
    if capacity is None:
        return Trend(status, note="no capacity figure to reach", **common)
    cr = crossing(fit, capacity, confidence)

    def ms(d: Optional[float]) -> Optional[int]:
        return None if d is None or not math.isfinite(d) else int(round(d * DAY_MS))

    if status == "falling" and fit.at(last_x) < capacity:
        return Trend(status, note="falling and below the capacity: no crossing ahead", **common)
    note = "the line is already above the capacity" if fit.at(last_x) >= capacity else ""
    return Trend(status, crosses_at_ms=ms(cr.estimate), crosses_earliest_ms=ms(cr.earliest),
                 crosses_latest_ms=ms(cr.latest), note=note, **common)


def curve(points: Points, objectives: Objectives, bins: int = CURVE_BINS) -> List[CurveBin]:
    """The load-latency curve: points binned by tokens/s per replica (equal widths from 0 to the
    highest load), the medians of each bin."""
    x = points.tokens_per_second
    if not len(x) or not np.nanmax(x) > 0:
        return []
    top = float(np.nanmax(x))
    width = top / bins
    idx = np.clip(np.ceil(x / width).astype(np.int64) - 1, 0, bins - 1)
    out = []

    def med(a: np.ndarray) -> Optional[float]:
        a = a[np.isfinite(a)]
        return float(np.median(a)) if len(a) else None

    for b in range(bins):
        sel = idx == b
        if not sel.any():
            continue
        out.append(CurveBin(b * width, (b + 1) * width, int(sel.sum()), float(np.median(x[sel])),
                            med(points.ttft_p95[sel]), med(points.ttft_mean[sel]), med(points.itl_mean[sel]),
                            float(points.within[sel].mean())))
    return out


def sustainable(sustained: Vec, within: Vec, times: np.ndarray, points: Points) -> Sustainable:
    """The best sustained within-objective level over every replica and step, where it was, and
    whether the objectives were missed near it (the limit was reached) or never (a lower bound)."""
    best, at, who = None, None, {}
    if sustained.n:
        v = np.where(sustained.P, sustained.V, -np.inf)
        i, j = np.unravel_index(int(np.argmax(v)), v.shape)
        if np.isfinite(v[i, j]):
            best, at, who = float(v[i, j]), int(times[j]), dict(drop_name(sustained.labels[i]))
    inst = None
    if within.n:
        w = np.where(within.P, within.V, -np.inf)
        if np.isfinite(w.max()):
            inst = float(w.max())
    if best is None or best <= 0:
        return Sustainable(None, None, {}, inst if inst and inst > 0 else None, "none", 0)
    missed = int(((~points.within) & (points.tokens_per_second >= LIMIT_NEAR * best)).sum())
    return Sustainable(best, at, who, inst, "observed" if missed else "lower", missed)


def target(target_qps: Optional[float], peak_qps: Optional[Peak], headroom: float, replicas_now: int,
           per_replica: Optional[float], mean_output: Optional[float]) -> Optional[Target]:
    """Replicas needed for the target rate and the verdict for the replicas serving now."""
    if target_qps is not None:
        qps, source = target_qps, "given"
    elif peak_qps is not None:
        qps, source = peak_qps.value * (1 + headroom), "peak + headroom"
    else:
        return None
    if not per_replica or not mean_output:
        return Target(qps, source, replicas_now, None, None, None, None)
    needed = max(1, math.ceil(qps * mean_output / per_replica - 1e-9))
    cap_qps = replicas_now * per_replica / mean_output
    margin = cap_qps / qps - 1 if qps > 0 else None
    return Target(qps, source, replicas_now, needed, cap_qps, margin, replicas_now >= needed)


# -- putting it together ------------------------------------------------------------------------------

def _key(ls: Labels, names: Sequence[str]) -> Labels:
    return keep(drop_name(ls), names)


def _rows(vec: Vec, names: Sequence[str], extra: Optional[Tuple[str, str]] = None) -> Dict[Labels, int]:
    out = {}
    for i, ls in enumerate(vec.labels):
        if extra is not None and dict(ls).get(extra[0]) != extra[1]:
            continue
        out[_key(ls, names)] = i
    return out


def _aligned(vec: Vec, rows: Dict[Labels, int], key: Labels, steps: int) -> np.ndarray:
    i = rows.get(key)
    if i is None:
        return np.full(steps, np.nan)
    return np.where(vec.P[i], vec.V[i], np.nan)


def _scalar_by_model(vec, svc_names: Sequence[str]) -> Dict[Labels, float]:
    out: Dict[Labels, float] = {}
    if isinstance(vec, Vec):
        for i, ls in enumerate(vec.labels):
            if vec.P[i, -1] and math.isfinite(vec.V[i, -1]):
                out[_key(ls, svc_names)] = float(vec.V[i, -1])
    return out


def compute(store: Store, opts: Options) -> CapacityReport:
    if opts.end_ms <= opts.start_ms:
        raise CapacityError("the end is not after the start")
    if opts.step_ms <= 0:
        raise CapacityError("the step must be positive")
    steps = (opts.end_ms - opts.start_ms) // opts.step_ms + 1
    if steps > 2_000_000:
        raise CapacityError(f"{steps} steps: too many; use a longer --step or a shorter range")
    c = _ctx(opts)
    slo = opts.slo
    headroom = float(slo["capacity"]["headroom"] if opts.headroom is None else opts.headroom)
    objectives = Objectives.from_slo(slo)
    groups, names = rule_groups(c)
    times = opts.start_ms + opts.step_ms * np.arange(steps, dtype=np.int64)
    try:
        run_rules(groups, store, times, opts.step_ms, opts.lookback_ms)
    except (RuleEvalError, ValueError) as exc:
        raise CapacityError(str(exc)) from None
    # the outer labels (cluster) first, as the rules keep them: two clusters' llm/vllm-0 are two rows
    replica_names = grouping(slo, list(c.replica) + ["model_name"])
    svc_names = grouping(slo, model_labels(c.replica))

    def over_range(expr: str) -> Vec:
        ev = Evaluator(store, times, opts.step_ms, opts.lookback_ms)
        out = ev.eval(parse(expr))
        if not isinstance(out, Vec):
            raise CapacityError(f"{expr!r} is not a vector")
        return out

    def at_end(exprs: Dict[str, str]) -> Dict[str, Dict[Labels, float]]:
        ev = Evaluator(store, np.array([opts.end_ms], dtype=np.int64), opts.step_ms, opts.lookback_ms)
        got = {}
        for k, e in exprs.items():
            try:
                got[k] = _scalar_by_model(ev.eval(parse(e)), svc_names)
            except EvalError as exc:
                raise CapacityError(f"{k}: {exc}") from None
        return got

    gen = over_range(c.rec("vllm_generation_tokens", "rate"))
    ttft = over_range(c.rec("vllm_time_to_first_token_seconds", "histogram_quantile"))
    ttft_mean = over_range(c.rec("vllm_time_to_first_token_seconds", "mean"))
    itl = over_range(c.rec("vllm_inter_token_latency_seconds", "mean"))
    within = over_range(names["within"])
    sustained = over_range(names["sustained"])
    qps = over_range(c.mrec("vllm_requests_finished", "rate"))
    tokens = over_range(c.mrec("vllm_generation_tokens", "rate"))
    whole = at_end(range_exprs(c, opts.end_ms - opts.start_ms))
    end_t = np.array([opts.end_ms], dtype=np.int64)
    try:
        run_rules(end_groups(c), store, end_t, opts.step_ms, opts.lookback_ms)
    except (RuleEvalError, ValueError) as exc:
        raise CapacityError(str(exc)) from None
    rules_end = at_end({**{k: names[k] for k in END_RULES},
                        "replicas": f"count by ({c.svc}) ({c.rec('vllm_generation_tokens', 'rate')})"})

    gen_rows = _rows(gen, replica_names)
    ttft_rows = _rows(ttft, replica_names, ("quantile", "0.95"))
    mean_rows, itl_rows = _rows(ttft_mean, replica_names), _rows(itl, replica_names)
    qps_rows, tok_rows = _rows(qps, svc_names), _rows(tokens, svc_names)
    models = sorted(set(qps_rows) | set(tok_rows) | {_key(k, svc_names) for k in gen_rows})
    report = CapacityReport(opts.start_ms, opts.end_ms, opts.step_ms, objectives,
                            {**slo["capacity"], "headroom": headroom}, [],
                            {**names, "qps": c.mrec("vllm_requests_finished", "rate"),
                             "tokens": c.mrec("vllm_generation_tokens", "rate")})
    if not models:
        report.notes.append("no vLLM request or token series in the range" +
                            (f" for model {opts.model!r}" if opts.model else ""))
    for m in models:
        replicas = [k for k in gen_rows if _key(k, svc_names) == m]
        xs, p95s, means, itls = [], [], [], []
        for r in replicas:
            x = _aligned(gen, gen_rows, r, steps)
            keep_steps = np.isfinite(x) & (x > 0)
            xs.append(x[keep_steps])
            p95s.append(_aligned(ttft, ttft_rows, r, steps)[keep_steps])
            means.append(_aligned(ttft_mean, mean_rows, r, steps)[keep_steps])
            itls.append(_aligned(itl, itl_rows, r, steps)[keep_steps])

        def cat(a: List[np.ndarray]) -> np.ndarray:
            return np.concatenate(a) if a else np.empty(0)

        p95_all, mean_all, itl_all = cat(p95s), cat(means), cat(itls)
        pts = Points(cat(xs), p95_all, mean_all, itl_all, objectives.met(p95_all, mean_all, itl_all))
        mine = [i for i, ls in enumerate(sustained.labels) if _key(ls, svc_names) == m]
        mine_w = [i for i, ls in enumerate(within.labels) if _key(ls, svc_names) == m]
        sus = sustainable(sustained.take(mine), within.take(mine_w), times, pts)
        q_series = _aligned(qps, qps_rows, m, steps)
        t_series = _aligned(tokens, tok_rows, m, steps)
        pk = peak(times, q_series, np.isfinite(q_series))
        pk_tok = peak(times, t_series, np.isfinite(t_series))
        replicas_now = int(rules_end["replicas"].get(m, 0))
        mean_out = whole["output_mean"].get(m)
        cap_tok = replicas_now * sus.tokens_per_second if sus.tokens_per_second else None
        cap_qps = cap_tok / mean_out if cap_tok and mean_out else None
        peaks = period_peaks(times, q_series, np.isfinite(q_series), opts.trend_period_ms, opts.step_ms)
        tr = trend(peaks, opts.trend_period_ms, cap_qps, opts.confidence)
        tg = target(opts.target_qps, pk, headroom, replicas_now, sus.tokens_per_second, mean_out)
        report.models.append(ModelCapacity(
            labels=dict(m), peak_qps=pk, peak_tokens_per_second=pk_tok,
            prompt_tokens=Distribution(whole["prompt_mean"].get(m), whole["prompt_p50"].get(m),
                                       whole["prompt_p95"].get(m)),
            output_tokens=Distribution(mean_out, whole["output_p50"].get(m), whole["output_p95"].get(m)),
            prefix_cache_hit_ratio=whole["prefix_cache_hit_ratio"].get(m),
            spec_decode_acceptance=whole["spec_decode_acceptance"].get(m),
            replicas_now=replicas_now, sustainable=sus, capacity_tokens_per_second=cap_tok, capacity_qps=cap_qps,
            curve=curve(pts, objectives), points=pts, trend=tr, target=tg,
            rules_at_end={k: rules_end[k].get(m) for k in END_RULES}))
    return report
