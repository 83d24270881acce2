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
command line loads the store (``sources``) and writes the report (``capacity_report``). Against a
server (``capacity --engine server``) no raw sample comes here: ``compute`` is given a
``remote.RuleServer`` that answers every recording rule over raw series with ``query_range``
(6-hour chunks) and the whole-range figures with instant queries; the rules over recorded series
and all that follows run here over those answers, so the report is the local path's (proven on a
real Prometheus: tests/test_capacity.py) while this process holds recorded series, not samples.
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
from ..slo import seconds
from . import capacity_cost as costing
from .promql.ast import VectorSelector, walk
from .promql.durations import format_duration
from .promql.engine import DEFAULT_LOOKBACK_MS, Evaluator
from .promql.labels import Labels, drop_name, keep
from .promql.parser import parse
from .promql.vector import EvalError, Vec
from .rulefile import Group, groups_from_data
from .rulemanager import RuleEvalError
from .rulemanager import run as run_rules
from .series import Store
from .stats import crossing, linear_fit

DAY_MS = 86_400_000
CURVE_BINS = 12
LIMIT_NEAR = 0.9       # an objective missed at >= 90% of the sustainable load: the limit was reached
MIN_COVERAGE = 0.9     # a trend period counts when samples cover at least 90% of its steps
MIN_PERIODS = 3        # a fit with an uncertainty needs three periods
MIN_FIT_STEPS = 6      # the prefill weight is fitted from at least this many saturated steps ...
MIN_FIT_SPREAD = 1.5   # ... whose prompt tokens/s differ by at least this factor (two mixes, not one)
MIX_BAND = 2.0         # load mixes: prompt tokens per output token in bands of this factor


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


@dataclass(frozen=True)
class PrefillWeight:
    """What one prompt token costs in output tokens, and where that number comes from."""

    weight: float
    source: str                        # "fitted": from saturated steps; "slo": capacity.prefill_weight
    saturated_steps: int               # replica-steps at saturation in the range
    level: Optional[float] = None      # fitted: the weighted tokens/s a replica makes at saturation
    low: Optional[float] = None        # fitted: the weight's confidence interval
    high: Optional[float] = None
    note: str = ""


@dataclass(frozen=True)
class Mix:
    """One load mix seen in the range: steps whose prompt tokens per output token fall in
    [lo, hi), what a replica held there, and what it sustains at that mix."""

    lo: float
    hi: float
    steps: int                         # replica-steps with traffic
    first_ms: int
    last_ms: int
    prompt_tokens: float               # mean per request in the mix
    output_tokens: float
    held_qps: float                    # the highest a replica held there (rate window)
    held_tokens_per_second: float      # output tokens/s, the highest a replica held there
    saturated_share: float             # share of its steps saturated (requests waited in most of the rate window)
    within_share: float                # share of its steps within every objective
    capacity_qps: Optional[float]      # what one replica sustains at this mix within every objective
    capacity_tokens_per_second: Optional[float]
    replicas_needed: Optional[int]     # for the target, were all of it this mix


@dataclass(frozen=True)
class Weighted:
    """The capacity in weighted tokens/s (output + weight x prompt)."""

    weight: PrefillWeight
    tokens_per_second: Optional[float]  # sustainable per replica; None: never within the objectives
    at_ms: Optional[int]
    replica: Dict[str, str]
    bound: str                           # as Sustainable.bound
    missed_near_limit: int
    request_cost: Optional[float]        # weight x mean prompt + mean output of the range's mix
    mixes: List[Mix]


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
              c.mrec("vllm_generation_tokens", "rate"), c.rec("vllm_prompt_tokens", "rate"),
              c.rec("vllm_requests_finished", "rate"), c.rec("vllm_requests_waiting", "sum")}
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
    svc, s, r = c.per_model, c.selector(), format_duration(max(range_ms, 1))

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
    # what the range served, for its cost per token and per request
    out["output_total"] = inc("vllm:generation_tokens_total")
    out["requests_total"] = inc("vllm:request_success_total")
    # efficiency over the range, for the replicas serving at its end (the sidecar's GPU series carry
    # no model_name: joined on the replica labels): mean GPU utilization (each replica's GPUs
    # averaged, then the replicas), and output tokens per joule where the GPUs count energy
    model_of = f"* on ({c.per_pod}) group_left (model_name)\n  group by ({c.per_pod}, model_name) (vllm:num_requests_running{s})"
    energy = f"sum by ({c.per_pod}) (increase(vllm_sidecar_gpu_energy_joules_total{s}[{r}]))"
    pod = c.per_pod
    out["gpu_utilization"] = (f"avg by ({svc}) (\n  avg by ({pod}) (avg_over_time(vllm_sidecar_gpu_utilization_ratio{s}[{r}]))"
                              f"\n  {model_of}\n)")
    out["tokens_per_joule"] = (f"sum by ({svc}) (\n  sum by ({c.per_replica}) (increase(vllm:generation_tokens_total{s}[{r}]))\n"
                               f"  and on ({c.per_pod})\n  ({energy} > 0)\n)\n/\n"
                               f"(sum by ({svc}) (\n  {energy}\n  {model_of}\n) > 0)")
    # GPUs per replica as the sidecars count them (the most any replica of the model has)
    out["gpus_per_replica"] = (f"max by ({svc}) (\n  count by ({c.per_pod}) (vllm_sidecar_gpu_info{s})\n"
                               f"  * on ({c.per_pod}) group_left (model_name)\n"
                               f"  group by ({c.per_pod}, model_name) (vllm:num_requests_running{s})\n)")
    return out


END_RULES = ("sustainable", "peak", "capacity", "headroom")


def end_groups(c: Ctx) -> List[Group]:
    """The headroom rules over the long windows, run once at the end (after ``rule_groups``)."""
    names = capacity_names(c)
    chosen = [r.as_rule() for r in capacity_family(c) if r.record in {names[k] for k in END_RULES}]
    return groups_from_data([{"name": "capacity-at-end", "rules": chosen}], "<the pack's capacity rules>")


def server_for(opts: Options, url: str, chunk_ms: int = 6 * 3600_000, session=None):
    """The ``remote.RuleServer`` for ``compute(Store(), opts, server)``: the model's rules
    evaluated by the Prometheus at ``url`` where they read raw series."""
    from .remote import RuleServer

    return RuleServer(rule_groups(_ctx(opts))[0], url, opts.step_ms, chunk_ms, session=session)


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
    """Replicas needed for the target rate and the verdict for the replicas serving now.
    ``per_replica`` is what one replica sustains and ``mean_output`` what one request costs, in the
    same unit (weighted tokens: ``w x mean prompt + mean output``; output tokens: the mean output)."""
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


def fit_prefill_weight(prompt: np.ndarray, output: np.ndarray, saturated: np.ndarray, fallback: float,
                       confidence: float = 0.95) -> PrefillWeight:
    """The prefill weight from saturated steps: at its limit a replica makes ``C = output + w x prompt``
    weighted tokens/s whatever the mix, so at saturation output tokens/s against prompt tokens/s lie
    on a line of slope ``-w``. Whatever else happens on the machine (a noisy neighbour, a slow
    scrape) only lowers a step below that line, so the line is drawn through the best saturated
    step of each load mix (the highest output tokens/s in each band of ``mix_band``): through two
    mixes exactly, through three or more by least squares (with the weight's confidence interval).
    Needs ``MIN_FIT_STEPS`` saturated steps, two mixes whose prompt tokens/s are ``MIN_FIT_SPREAD``
    apart, and a falling line; otherwise ``fallback`` (the SLO's ``capacity.prefill_weight``), with
    the reason."""
    ok = saturated & np.isfinite(prompt) & np.isfinite(output) & (output > 0) & (prompt >= 0)
    n = int(ok.sum())

    def slo(why: str) -> PrefillWeight:
        return PrefillWeight(float(fallback), "slo", n, note=why)

    if n < MIN_FIT_STEPS:
        return slo(f"{n} saturated step(s) (requests waiting in capacity.saturated_share of the rate window); "
                   f"a fit needs {MIN_FIT_STEPS}")
    idx = np.nonzero(ok)[0]
    bands = mix_band(prompt[idx], output[idx])
    best = [idx[bands == b][int(np.argmax(output[idx[bands == b]]))] for b in np.unique(bands)]
    x, y = prompt[best], output[best]
    if len(best) < 2 or x.min() * MIN_FIT_SPREAD > x.max():
        return slo(f"the saturated steps are one mix (prompt tokens/s {prompt[idx].min():.0f} to "
                   f"{prompt[idx].max():.0f}); a fit needs two, {MIN_FIT_SPREAD:g}x apart")
    order = np.argsort(x)
    x, y = x[order], y[order]
    lo = hi = None
    if len(best) == 2:
        slope = float((y[1] - y[0]) / (x[1] - x[0]))
        level = float(y[0] - slope * x[0])
    else:
        fit = linear_fit(x.tolist(), y.tolist())
        slope, level = fit.slope, fit.intercept
        lo, hi = fit.slope_interval(confidence)
    pts = ", ".join(f"{a:.0f} prompt → {b:.0f} output tokens/s" for a, b in zip(x, y))
    if not slope < 0:
        return slo(f"the best saturated steps of {len(best)} mixes ({pts}) do not fall: slope {slope:+.3g}")
    return PrefillWeight(-slope, "fitted", n, level=level, low=None if hi is None else -hi,
                         high=None if lo is None else -lo,
                         note=f"through the best saturated step of each of {len(best)} mixes ({pts}), "
                              f"{n} saturated steps")


def sustained_level(u: np.ndarray, within: np.ndarray, window_steps: int) -> np.ndarray:
    """Per step, the lowest of ``u`` over the last ``window_steps`` steps when every objective held
    at each (0 where one did not), where the replica was there for the whole window and one step
    before it (NaN otherwise): the ``sustained`` recording rule, on the evaluation grid."""
    n = len(u)
    out = np.full(n, np.nan)
    k = max(int(window_steps), 1)
    present = np.isfinite(u)
    level = np.where(within & present, u, 0.0)
    for j in range(k, n):
        if present[j - k:j + 1].all():
            out[j] = level[j - k + 1:j + 1].min()
    return out


def mix_band(prompt: np.ndarray, output: np.ndarray) -> np.ndarray:
    """The load mix of each step: the band of prompt tokens per output token (``MIX_BAND`` apart,
    anchored at 1: ... [0.5, 1) [1, 2) [2, 4) ...), as an integer; a large negative number for
    steps without prompt tokens."""
    with np.errstate(divide="ignore", invalid="ignore"):
        r = prompt / output
        b = np.floor(np.log(r) / math.log(MIX_BAND))
    return np.where(np.isfinite(b), b, -10_000).astype(np.int64)


def load_mixes(times: np.ndarray, prompt: np.ndarray, output: np.ndarray, qps: np.ndarray, saturated: np.ndarray,
               within: np.ndarray, min_steps: int) -> List[Tuple[int, np.ndarray]]:
    """(band, mask) of each load mix with at least ``min_steps`` steps, in order of first time."""
    has = np.isfinite(prompt) & np.isfinite(output) & (output > 0) & np.isfinite(qps) & (qps > 0)
    bands = mix_band(prompt, output)
    found = []
    for b in np.unique(bands[has]):
        sel = has & (bands == b)
        if sel.sum() >= min_steps:
            found.append((int(times[sel].min()), int(b), sel))
    return [(b, sel) for _, b, sel in sorted(found)]


def weighted_capacity(replicas: Sequence[Dict[str, np.ndarray]], times: np.ndarray, weight: PrefillWeight,
                      window_steps: int, mean_prompt: Optional[float], mean_output: Optional[float],
                      target_qps: Optional[float], mix_steps: int = 1) -> Weighted:
    """The weighted capacity of a model from its replicas' series (each a dict of aligned arrays:
    ``labels``, ``output``, ``prompt``, ``qps``, ``saturated``, ``within``)."""
    w = weight.weight
    best, at, who = None, None, {}
    us = []
    for r in replicas:
        u = r["output"] + w * np.where(np.isfinite(r["prompt"]), r["prompt"], 0.0)
        us.append(u)
        lvl = sustained_level(u, r["within"], window_steps)
        if np.isfinite(lvl).any():
            j = int(np.nanargmax(lvl))
            if lvl[j] > 0 and (best is None or lvl[j] > best):
                best, at, who = float(lvl[j]), int(times[j]), dict(r["labels"])
    missed = 0
    if best is not None:
        for r, u in zip(replicas, us):
            missed += int((np.isfinite(u) & ~r["within"] & (u >= LIMIT_NEAR * best)).sum())
    bound = "none" if best is None else ("observed" if missed else "lower")
    cost = w * mean_prompt + mean_output if mean_prompt is not None and mean_output else None

    def cat(key: str) -> np.ndarray:
        return np.concatenate([r[key] for r in replicas]) if replicas else np.empty(0)

    t_all = np.concatenate([times for _ in replicas]) if replicas else np.empty(0, dtype=np.int64)
    p_all, g_all, q_all = cat("prompt"), cat("output"), cat("qps")
    sat_all = cat("saturated").astype(bool) if replicas else np.empty(0, bool)
    win_all = cat("within").astype(bool) if replicas else np.empty(0, bool)
    mixes = []
    for b, sel in load_mixes(t_all, p_all, g_all, q_all, sat_all, win_all, mix_steps):
        q_sum = float(q_all[sel].sum())
        mp, mo = float(p_all[sel].sum()) / q_sum, float(g_all[sel].sum()) / q_sum
        per_req = w * mp + mo
        cq = best / per_req if best and per_req > 0 else None
        lo = 0.0 if b <= -10_000 else MIX_BAND ** b
        mixes.append(Mix(lo, MIX_BAND ** (b + 1) if b > -10_000 else 0.0, int(sel.sum()), int(t_all[sel].min()),
                         int(t_all[sel].max()), mp, mo, float(q_all[sel].max()), float(g_all[sel].max()),
                         float(sat_all[sel].mean()), float(win_all[sel].mean()), cq, cq * mo if cq else None,
                         max(1, math.ceil(target_qps / cq - 1e-9)) if cq and target_qps else None))
    return Weighted(weight, best, at, who, bound, missed, cost, mixes)


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


def compute(store: Store, opts: Options, server=None) -> CapacityReport:
    """The report from ``store`` (raw samples: the local path), or with ``server`` (a
    ``remote.RuleServer``; ``store`` then starts empty) from a server that evaluates every rule
    and whole-range figure that reads raw series; the rules over recorded series, the headroom
    rules at the end and everything after run here on the recorded series it answered."""
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
    prompt = over_range(c.rec("vllm_prompt_tokens", "rate"))
    rqps = over_range(c.rec("vllm_requests_finished", "rate"))
    # saturated: requests waited at capacity.saturated_share of the evaluations of the rate window or
    # more (the replica ran at its limit)
    saturated = over_range(f"avg_over_time(({c.rec('vllm_requests_waiting', 'sum')} > bool 0)[{c.rate_window}:]) "
                           f">= {slo['capacity']['saturated_share']:g}")
    qps = over_range(c.mrec("vllm_requests_finished", "rate"))
    tokens = over_range(c.mrec("vllm_generation_tokens", "rate"))
    if server is not None:  # whole-range figures over raw series: evaluated by the server
        whole = {k: _scalar_by_model(server.instant(e, opts.end_ms), svc_names)
                 for k, e in range_exprs(c, opts.end_ms - opts.start_ms).items()}
    else:
        whole = at_end(range_exprs(c, opts.end_ms - opts.start_ms))
    end_t = np.array([opts.end_ms], dtype=np.int64)
    try:
        run_rules(end_groups(c), store, end_t, opts.step_ms, opts.lookback_ms)
    except (RuleEvalError, ValueError) as exc:
        raise CapacityError(str(exc)) from None
    rules_end = at_end({**{k: names[k] for k in END_RULES},
                        "replicas": f"count by ({c.per_model}) ({c.rec('vllm_generation_tokens', 'rate')})"})

    gen_rows = _rows(gen, replica_names)
    ttft_rows = _rows(ttft, replica_names, ("quantile", "0.95"))
    mean_rows, itl_rows = _rows(ttft_mean, replica_names), _rows(itl, replica_names)
    qps_rows, tok_rows = _rows(qps, svc_names), _rows(tokens, svc_names)
    prompt_rows, rqps_rows, sat_rows = _rows(prompt, replica_names), _rows(rqps, replica_names), \
        _rows(saturated, replica_names)
    window_steps = max(int(seconds(slo["capacity"]["sustain"]) * 1000) // opts.step_ms, 1)
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

        series = []
        for r in replicas:
            series.append({
                "labels": dict(drop_name(r)), "output": _aligned(gen, gen_rows, r, steps),
                "prompt": _aligned(prompt, prompt_rows, r, steps), "qps": _aligned(rqps, rqps_rows, r, steps),
                "saturated": np.isfinite(_aligned(saturated, sat_rows, r, steps)),
                "within": objectives.met(_aligned(ttft, ttft_rows, r, steps), _aligned(ttft_mean, mean_rows, r, steps),
                                         _aligned(itl, itl_rows, r, steps))})

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
        mean_prompt = whole["prompt_mean"].get(m)
        cap_tok = replicas_now * sus.tokens_per_second if sus.tokens_per_second else None
        old_qps = cap_tok / mean_out if cap_tok and mean_out else None

        def joined(key: str, series=series) -> np.ndarray:
            return np.concatenate([x[key] for x in series]) if series else np.empty(0)

        pw = fit_prefill_weight(joined("prompt"), joined("output"), joined("saturated").astype(bool),
                                float(slo["capacity"]["prefill_weight"]), opts.confidence)
        tgt_qps = opts.target_qps if opts.target_qps is not None else \
            (pk.value * (1 + headroom) if pk is not None else None)
        # a load mix counts once it was seen for a whole rate window
        wc = weighted_capacity(series, times, pw, window_steps, mean_prompt, mean_out, tgt_qps,
                               max(int(seconds(c.rate_window) * 1000) // opts.step_ms, 1))
        cap_qps = replicas_now * wc.tokens_per_second / wc.request_cost \
            if wc.tokens_per_second and wc.request_cost else None
        per_replica_qps = wc.tokens_per_second / wc.request_cost if wc.tokens_per_second and wc.request_cost else None
        peaks = period_peaks(times, q_series, np.isfinite(q_series), opts.trend_period_ms, opts.step_ms)
        tr = trend(peaks, opts.trend_period_ms, cap_qps, opts.confidence)
        tg = target(opts.target_qps, pk, headroom, replicas_now, wc.tokens_per_second, wc.request_cost)
        replica_hours = sum(int(np.isfinite(x["output"]).sum()) for x in series) * opts.step_ms / 3_600_000
        mc = costing.model_cost(costing.prices(slo, whole["gpus_per_replica"].get(m)), replicas_now,
                                tg.replicas_needed if tg is not None else None, replica_hours,
                                whole["output_total"].get(m), whole["requests_total"].get(m), per_replica_qps,
                                mean_out, tg.qps if tg is not None else None)
        report.models.append(ModelCapacity(
            labels=dict(m), peak_qps=pk, peak_tokens_per_second=pk_tok,
            prompt_tokens=Distribution(whole["prompt_mean"].get(m), whole["prompt_p50"].get(m),
                                       whole["prompt_p95"].get(m)),
            output_tokens=Distribution(mean_out, whole["output_p50"].get(m), whole["output_p95"].get(m)),
            prefix_cache_hit_ratio=whole["prefix_cache_hit_ratio"].get(m),
            spec_decode_acceptance=whole["spec_decode_acceptance"].get(m),
            replicas_now=replicas_now, sustainable=sus, capacity_tokens_per_second=cap_tok, capacity_qps=cap_qps,
            curve=curve(pts, objectives), points=pts, trend=tr, target=tg,
            rules_at_end={k: rules_end[k].get(m) for k in END_RULES}, weighted=wc, output_only_capacity_qps=old_qps,
            cost=mc, gpu_utilization=whole["gpu_utilization"].get(m), tokens_per_joule=whole["tokens_per_joule"].get(m)))
    return report
