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
- what one replica sustains in a unit that survives a change of load mix: weighted tokens/s,
  ``output tokens/s + w x prompt tokens/s``, where ``w`` (what one prompt token costs in output
  tokens) is fitted from the replica's own history at saturation (steps where requests waited
  in ``capacity.saturated_share`` of the rate window: the replica ran at its limit, so
  ``output + w x prompt`` is the same constant whatever the mix; output against prompt tokens/s
  through the best saturated step of each mix is a line of slope ``-w``), or taken from
  ``capacity.prefill_weight`` when the history cannot tell (no saturated steps, one mix only, a
  line that does not fall); the report says which. The highest weighted level held for ``capacity.sustain`` within every
  objective is the replica's capacity; a request of the observed mix costs
  ``w x mean prompt + mean output``, so the capacity in requests/s follows for any mix, and is
  shown per load mix (steps grouped by prompt tokens per output token, in bands of a factor of 2)
  when the mix moved in the range. Output tokens/s alone are not a capacity when prompt lengths
  change: a prefill-heavy stretch makes few output tokens at full load;
- for a target rate (given, or the peak plus ``capacity.headroom``): replicas needed
  (``target x (w x mean prompt + mean output) / sustainable weighted tokens/s``, rounded up),
  whether the replicas serving now are enough and by how much;
- the trend of the periodic (daily) peaks: a least-squares line with the slope's confidence
  interval; "no trend" when that interval contains zero; otherwise when the line reaches the
  current capacity, with Fieller's interval for that date.

``compute`` is pure: a ``Store`` of raw samples and ``Options`` in, a ``CapacityReport`` out. The
command line loads the store (``sources``) and writes the report (``capacity_report``). The work is
split by job: which rules and series (``capacity_rules``), the pure pieces and their figures
(``capacity_fit``), the cost (``capacity_cost``), prefill and decode sized apart where replicas
have roles (``capacity_sides``); this module evaluates the series and puts the figures together. Against a
server (``capacity --engine server``) no raw sample comes here: ``compute`` is given a
``remote.RuleServer`` that answers every recording rule over raw series with ``query_range``
(6-hour chunks) and the whole-range figures with instant queries; the rules over recorded series
and all that follows run here over those answers, so the report is the local path's (proven on a
real Prometheus: tests/analysis/test_capacity.py) while this process holds recorded series, not samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..pack.context import Ctx
from ..pack.names import grouping, model_labels
from ..pack.recording import capacity_names
from ..slo import seconds
from . import capacity_cost as costing
from . import capacity_sides as sides_model
from .capacity_fit import (
    CURVE_BINS,
    DAY_MS,
    LIMIT_NEAR,
    MIN_COVERAGE,
    MIN_FIT_SPREAD,
    MIN_FIT_STEPS,
    MIN_PERIODS,
    MIX_BAND,
    CurveBin,
    Mix,
    Objectives,
    Peak,
    PeriodPeak,
    Points,
    PrefillWeight,
    Sustainable,
    Target,
    Trend,
    Weighted,
    curve,
    fit_prefill_weight,
    load_mixes,
    mix_band,
    peak,
    period_peaks,
    sustainable,
    sustained_level,
    target,
    trend,
    weighted_capacity,
)
from .capacity_rules import (
    END_RULES,
    ctx_for,
    end_groups,
    opencost_exprs,
    range_exprs,
    role_expr,
    rule_groups,
    selectors,
    server_for,
    side_exprs,
)
from .promql.engine import DEFAULT_LOOKBACK_MS, Evaluator
from .promql.labels import Labels, drop_name, keep
from .promql.parser import parse
from .promql.vector import EvalError, Vec
from .rulemanager import RuleEvalError
from .rulemanager import run as run_rules
from .series import Store

# the pieces and the rules' names, for the callers that knew them here
__all__ = [
    "CURVE_BINS", "DAY_MS", "END_RULES", "LIMIT_NEAR", "MIN_COVERAGE", "MIN_FIT_SPREAD", "MIN_FIT_STEPS",
    "MIN_PERIODS", "MIX_BAND", "CapacityError", "Ctx", "capacity_names", "CapacityReport", "CurveBin", "Distribution", "Mix",
    "ModelCapacity", "Objectives", "Options", "Peak", "PeriodPeak", "Points", "PrefillWeight", "Sustainable",
    "Target", "Trend", "Weighted", "compute", "plan_only", "curve", "end_groups", "fit_prefill_weight", "load_mixes",
    "mix_band", "peak", "period_peaks", "range_exprs", "rule_groups", "selectors", "server_for", "sustainable",
    "sustained_level", "target", "trend", "weighted_capacity",
]

class CapacityError(ValueError):
    """Options or input that make the capacity model impossible; one line."""



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
    asked: sides_model.Asked = field(default_factory=sides_model.Asked)  # prefill and decode apart: the flags



@dataclass(frozen=True)
class Distribution:
    mean: Optional[float]
    p50: Optional[float]
    p95: Optional[float]



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
    weighted: Optional[Weighted] = None
    output_only_capacity_qps: Optional[float] = None  # replicas x sustainable output / mean output (old unit)
    cost: Optional[costing.ModelCost] = None           # what the fleet costs, from the SLO's prices
    gpu_utilization: Optional[float] = None            # mean over the range (the sidecars' NVML utilization)
    tokens_per_joule: Optional[float] = None           # output tokens over the GPUs' energy, over the range
    sides: Optional[sides_model.SidesPlan] = None      # prefill and decode apart, where replicas have those roles

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
    plan: Optional[sides_model.SidesPlan] = None       # ``plan_only``: prefill and decode sized from the SLO alone



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


@dataclass
class _Evaluated:
    """Every series the model reads over the range (per replica, or per model), on the grid, and
    the whole-range figures and the headroom rules at the end (per model)."""

    steps: int
    times: np.ndarray
    names: Dict[str, str]
    replica_names: List[str]
    svc_names: List[str]
    series: Dict[str, Vec]
    whole: Dict[str, Dict[Labels, float]]
    rules_end: Dict[str, Dict[Labels, float]]
    end_vec: object = None         # a whole-range expression at the end of the range (here, or by the server)


def _evaluate(store: Store, opts: Options, server=None) -> _Evaluated:
    """Run the pack's rules over the range (here, or by ``server``), then read their series."""
    steps = (opts.end_ms - opts.start_ms) // opts.step_ms + 1
    if steps > 2_000_000:
        raise CapacityError(f"{steps} steps: too many; use a longer --step or a shorter range")
    c = ctx_for(opts)
    slo = opts.slo
    groups, names = rule_groups(c)
    times = opts.start_ms + opts.step_ms * np.arange(steps, dtype=np.int64)
    try:
        if server is not None:
            run_rules(groups, store, times, opts.step_ms, opts.lookback_ms, block_steps=server.block_steps,
                      served=server)
        else:
            run_rules(groups, store, times, opts.step_ms, opts.lookback_ms)
    except (RuleEvalError, ValueError) as exc:
        raise CapacityError(str(exc)) from None
    # the outer labels (cluster) first, as the rules keep them: two clusters' llm/vllm-0 are two rows
    replica_names = grouping(slo, list(c.replica) + ["model_name"])
    svc_names = grouping(slo, model_labels(c.replica))

    def over_range(expr: str) -> Vec:
        out = Evaluator(store, times, opts.step_ms, opts.lookback_ms).eval(parse(expr))
        if not isinstance(out, Vec):
            raise CapacityError(f"{expr!r} is not a vector")
        return out

    def at_end(exprs: Dict[str, str], by: Sequence[str] = svc_names) -> Dict[str, Dict[Labels, float]]:
        ev = Evaluator(store, np.array([opts.end_ms], dtype=np.int64), opts.step_ms, opts.lookback_ms)
        got = {}
        for k, e in exprs.items():
            try:
                got[k] = _scalar_by_model(ev.eval(parse(e)), by)
            except EvalError as exc:
                raise CapacityError(f"{k}: {exc}") from None
        return got

    series = {
        "gen": c.rec("vllm_generation_tokens", "rate"),
        "ttft": c.rec("vllm_time_to_first_token_seconds", "histogram_quantile"),
        "ttft_mean": c.rec("vllm_time_to_first_token_seconds", "mean"),
        "itl": c.rec("vllm_inter_token_latency_seconds", "mean"),
        "within": names["within"], "sustained": names["sustained"],
        "prompt": c.rec("vllm_prompt_tokens", "rate"), "rqps": c.rec("vllm_requests_finished", "rate"),
        # saturated: requests waited at capacity.saturated_share of the evaluations of the rate window
        # or more (the replica ran at its limit)
        "saturated": f"avg_over_time(({c.rec('vllm_requests_waiting', 'sum')} > bool 0)[{c.rate_window}:]) "
                     f">= {slo['capacity']['saturated_share']:g}",
        "qps": c.mrec("vllm_requests_finished", "rate"), "tokens": c.mrec("vllm_generation_tokens", "rate"),
    }
    vecs = {k: over_range(e) for k, e in series.items()}
    if server is not None:  # whole-range figures over raw series: evaluated by the server
        whole = {k: _scalar_by_model(server.instant(e, opts.end_ms), svc_names)
                 for k, e in range_exprs(c, opts.end_ms - opts.start_ms).items()}
    else:
        whole = at_end(range_exprs(c, opts.end_ms - opts.start_ms))
    try:
        run_rules(end_groups(c), store, np.array([opts.end_ms], dtype=np.int64), opts.step_ms, opts.lookback_ms)
    except (RuleEvalError, ValueError) as exc:
        raise CapacityError(str(exc)) from None
    rules_end = at_end({**{k: names[k] for k in END_RULES},
                        "replicas": f"count by ({c.per_model}) ({c.rec('vllm_generation_tokens', 'rate')})"})
    names = {**names, "qps": c.mrec("vllm_requests_finished", "rate"),
             "tokens": c.mrec("vllm_generation_tokens", "rate")}
    def end_vec(expr: str) -> Vec:
        if server is not None:
            return server.instant(expr, opts.end_ms)
        ev = Evaluator(store, np.array([opts.end_ms], dtype=np.int64), opts.step_ms, opts.lookback_ms)
        try:
            out = ev.eval(parse(expr))
        except EvalError as exc:
            raise CapacityError(f"{expr!r}: {exc}") from None
        if not isinstance(out, Vec):
            raise CapacityError(f"{expr!r} is not a vector")
        return out

    return _Evaluated(steps, times, names, replica_names, svc_names, vecs, whole, rules_end, end_vec)


def _replica_series(ev: _Evaluated, objectives: Objectives, m: Labels) -> Tuple[List[Dict], Points]:
    """Model ``m``'s replicas: each one's aligned series (``labels``, ``output``, ``prompt``,
    ``qps``, ``saturated``, ``within``), and the load-latency points of every replica."""
    v, steps, rn = ev.series, ev.steps, ev.replica_names
    gen_rows = _rows(v["gen"], rn)
    ttft_rows = _rows(v["ttft"], rn, ("quantile", "0.95"))
    mean_rows, itl_rows = _rows(v["ttft_mean"], rn), _rows(v["itl"], rn)
    prompt_rows, rqps_rows, sat_rows = _rows(v["prompt"], rn), _rows(v["rqps"], rn), _rows(v["saturated"], rn)
    series, xs, p95s, means, itls = [], [], [], [], []
    for r in [k for k in gen_rows if _key(k, ev.svc_names) == m]:
        x = _aligned(v["gen"], gen_rows, r, steps)
        p95 = _aligned(v["ttft"], ttft_rows, r, steps)
        mean = _aligned(v["ttft_mean"], mean_rows, r, steps)
        itl = _aligned(v["itl"], itl_rows, r, steps)
        keep_steps = np.isfinite(x) & (x > 0)
        xs.append(x[keep_steps])
        p95s.append(p95[keep_steps])
        means.append(mean[keep_steps])
        itls.append(itl[keep_steps])
        series.append({
            "labels": dict(drop_name(r)), "output": x, "prompt": _aligned(v["prompt"], prompt_rows, r, steps),
            "qps": _aligned(v["rqps"], rqps_rows, r, steps),
            "saturated": np.isfinite(_aligned(v["saturated"], sat_rows, r, steps)),
            "within": objectives.met(p95, mean, itl), "ttft_p95": p95, "ttft_mean": mean, "itl_mean": itl})

    def cat(a: List[np.ndarray]) -> np.ndarray:
        return np.concatenate(a) if a else np.empty(0)

    p95_all, mean_all, itl_all = cat(p95s), cat(means), cat(itls)
    return series, Points(cat(xs), p95_all, mean_all, itl_all, objectives.met(p95_all, mean_all, itl_all))


def _model(ev: _Evaluated, m: Labels, opts: Options, objectives: Objectives, headroom: float) -> ModelCapacity:
    """Every figure of model ``m``."""
    slo, steps, times, whole = opts.slo, ev.steps, ev.times, ev.whole
    series, pts = _replica_series(ev, objectives, m)
    sustained, within = ev.series["sustained"], ev.series["within"]
    mine = [i for i, ls in enumerate(sustained.labels) if _key(ls, ev.svc_names) == m]
    mine_w = [i for i, ls in enumerate(within.labels) if _key(ls, ev.svc_names) == m]
    sus = sustainable(sustained.take(mine), within.take(mine_w), times, pts)
    q_series = _aligned(ev.series["qps"], _rows(ev.series["qps"], ev.svc_names), m, steps)
    t_series = _aligned(ev.series["tokens"], _rows(ev.series["tokens"], ev.svc_names), m, steps)
    pk = peak(times, q_series, np.isfinite(q_series))
    pk_tok = peak(times, t_series, np.isfinite(t_series))
    replicas_now = int(ev.rules_end["replicas"].get(m, 0))
    mean_out = whole["output_mean"].get(m)
    mean_prompt = whole["prompt_mean"].get(m)
    cap_tok = replicas_now * sus.tokens_per_second if sus.tokens_per_second else None
    old_qps = cap_tok / mean_out if cap_tok and mean_out else None

    def joined(key: str) -> np.ndarray:
        return np.concatenate([x[key] for x in series]) if series else np.empty(0)

    pw = fit_prefill_weight(joined("prompt"), joined("output"), joined("saturated").astype(bool),
                            float(slo["capacity"]["prefill_weight"]), opts.confidence)
    tgt_qps = opts.target_qps if opts.target_qps is not None else \
        (pk.value * (1 + headroom) if pk is not None else None)
    # a load mix counts once it was seen for a whole rate window
    window_steps = max(int(seconds(slo["capacity"]["sustain"]) * 1000) // opts.step_ms, 1)
    wc = weighted_capacity(series, times, pw, window_steps, mean_prompt, mean_out, tgt_qps,
                           max(int(seconds(slo["windows"]["rate"]) * 1000) // opts.step_ms, 1))
    per_replica_qps = wc.tokens_per_second / wc.request_cost if wc.tokens_per_second and wc.request_cost else None
    cap_qps = replicas_now * per_replica_qps if per_replica_qps else None
    peaks = period_peaks(times, q_series, np.isfinite(q_series), opts.trend_period_ms, opts.step_ms)
    tr = trend(peaks, opts.trend_period_ms, cap_qps, opts.confidence)
    tg = target(opts.target_qps, pk, headroom, replicas_now, wc.tokens_per_second, wc.request_cost)
    replica_hours = sum(int(np.isfinite(x["output"]).sum()) for x in series) * opts.step_ms / 3_600_000
    mc = costing.model_cost(costing.prices(slo, whole["gpus_per_replica"].get(m)), replicas_now,
                            tg.replicas_needed if tg is not None else None, replica_hours,
                            whole["output_total"].get(m), whole["requests_total"].get(m), per_replica_qps,
                            mean_out, tg.qps if tg is not None else None)
    sides = _sides(ev, series, opts, objectives, (mean_prompt, mean_out))
    return ModelCapacity(
        labels=dict(m), peak_qps=pk, peak_tokens_per_second=pk_tok,
        prompt_tokens=Distribution(mean_prompt, whole["prompt_p50"].get(m), whole["prompt_p95"].get(m)),
        output_tokens=Distribution(mean_out, whole["output_p50"].get(m), whole["output_p95"].get(m)),
        prefix_cache_hit_ratio=whole["prefix_cache_hit_ratio"].get(m),
        spec_decode_acceptance=whole["spec_decode_acceptance"].get(m),
        replicas_now=replicas_now, sustainable=sus, capacity_tokens_per_second=cap_tok, capacity_qps=cap_qps,
        curve=curve(pts, objectives), points=pts, trend=tr, target=tg,
        rules_at_end={k: ev.rules_end[k].get(m) for k in END_RULES}, weighted=wc, output_only_capacity_qps=old_qps,
        cost=mc, gpu_utilization=whole["gpu_utilization"].get(m), tokens_per_joule=whole["tokens_per_joule"].get(m),
        sides=sides)


def _labelled(vec: Vec) -> List[Tuple[Dict[str, str], float]]:
    """(labels, value) of each series present at the one step of ``vec``."""
    return [(dict(drop_name(ls)), float(vec.V[i, -1])) for i, ls in enumerate(vec.labels)
            if vec.P[i, -1] and math.isfinite(vec.V[i, -1])]


def _by_key(vec: Vec, names: Sequence[str]) -> Dict[Tuple, float]:
    return {tuple(ls.get(k, "") for k in names): v for ls, v in _labelled(vec)}


def _opencost(ev: _Evaluated, range_ms: int) -> Dict[str, Optional[float]]:
    """OpenCost's price of a GPU-hour over the range (None where the Prometheus has no such series)."""
    out: Dict[str, Optional[float]] = {}
    for k, e in opencost_exprs(range_ms).items():
        got = _labelled(ev.end_vec(e))
        out[k] = got[0][1] if len(got) == 1 and got[0][1] > 0 else None
    return out


def _sides(ev: _Evaluated, series: List[Dict], opts: Options, objectives: Objectives,
           model_mix: Tuple[Optional[float], Optional[float]]) -> Optional[sides_model.SidesPlan]:
    """Prefill and decode sized apart, when some of the model's replicas have those roles (the
    sidecar's ``vllm_sidecar_role_info``, joined on the replica labels; none: role both)."""
    rng = opts.end_ms - opts.start_ms
    c = ctx_for(opts)
    pod_names = grouping(opts.slo, list(c.replica))
    roles = {}
    for ls, _ in _labelled(ev.end_vec(role_expr(c, rng))):
        roles[tuple(ls.get(k, "") for k in pod_names)] = ls.get("role", "both")
    role_of = [roles.get(tuple(x["labels"].get(k, "") for k in pod_names), "both") for x in series]
    if not any(r in sides_model.ROLES for r in role_of):
        return None
    whole = {k: _by_key(ev.end_vec(e), ev.replica_names) for k, e in side_exprs(c, rng).items()}
    window_steps = max(int(seconds(opts.slo["capacity"]["sustain"]) * 1000) // opts.step_ms, 1)
    o = objectives
    history = {}
    for role in sides_model.ROLES:
        mine = [x for x, r in zip(series, role_of) if r == role]
        keys = [tuple(x["labels"].get(k, "") for k in ev.replica_names) for x in mine]

        def col(k: str, keys=keys) -> List[Optional[float]]:
            return [whole[k].get(key) for key in keys]

        hit = sides_model.pooled_ratio(col("hits"), col("queries"))
        acc = sides_model.pooled_ratio(col("accepted"), col("drafts"))
        sidecar_len = [x for x in col("sidecar_accepted_length") if x is not None]
        length = 1 + acc if acc is not None else (sum(sidecar_len) / len(sidecar_len) if sidecar_len else None)
        rows = []
        with np.errstate(invalid="ignore"):
            for x, key in zip(mine, keys):
                if role == "prefill":
                    h = sides_model.pooled_ratio([whole["hits"].get(key)], [whole["queries"].get(key)]) or 0.0
                    level = x["prompt"] * (1 - h)
                    within = (x["ttft_p95"] <= o.ttft_p95_seconds) & (x["ttft_mean"] <= o.ttft_mean_seconds)
                else:
                    level, within = x["output"], x["itl_mean"] <= o.itl_mean_seconds
                rows.append({"labels": x["labels"], "level": level, "within": within, "qps": x["qps"]})
        history[role] = sides_model.side_history(
            role, rows, ev.times, window_steps, hit, length if role == "decode" else None,
            sides_model.pooled_ratio(col("prompt_sum"), col("prompt_count")),
            sides_model.pooled_ratio(col("output_sum"), col("output_count")))
    return sides_model.plan(opts.slo, opts.asked, history, _opencost(ev, rng), model_mix)


def plan_only(opts: Options) -> CapacityReport:
    """No history: prefill and decode sized from the SLO's planned figures and the flags alone."""
    slo = opts.slo
    report = CapacityReport(opts.start_ms, opts.end_ms, opts.step_ms, Objectives.from_slo(slo),
                            dict(slo["capacity"]), [], {})
    report.plan = sides_model.plan(slo, opts.asked)
    report.notes.append("planned from the SLO file and the flags alone (--plan): no history was read")
    return report


def compute(store: Store, opts: Options, server=None) -> CapacityReport:
    """The report from ``store`` (raw samples: the local path), or with ``server`` (a
    ``remote.RuleServer``; ``store`` then starts empty) from a server that evaluates every rule
    and whole-range figure that reads raw series; the rules over recorded series, the headroom
    rules at the end and everything after run here on the recorded series it answered."""
    if opts.end_ms <= opts.start_ms:
        raise CapacityError("the end is not after the start")
    if opts.step_ms <= 0:
        raise CapacityError("the step must be positive")
    slo = opts.slo
    headroom = float(slo["capacity"]["headroom"] if opts.headroom is None else opts.headroom)
    objectives = Objectives.from_slo(slo)
    ev = _evaluate(store, opts, server)
    gen_rows = _rows(ev.series["gen"], ev.replica_names)
    models = sorted(set(_rows(ev.series["qps"], ev.svc_names)) | set(_rows(ev.series["tokens"], ev.svc_names)) |
                    {_key(k, ev.svc_names) for k in gen_rows})
    report = CapacityReport(opts.start_ms, opts.end_ms, opts.step_ms, objectives,
                            {**slo["capacity"], "headroom": headroom}, [], ev.names)
    if not models:
        report.notes.append("no vLLM request or token series in the range" +
                            (f" for model {opts.model!r}" if opts.model else ""))
    for m in models:
        report.models.append(_model(ev, m, opts, objectives, headroom))
    return report
