"""Derived signals: pure functions from snapshots (and GPU readings) to numbers.

Nothing here reads a clock, a socket or a global: ``derive`` takes the window's snapshots, the
stall horizon's snapshots, ``now``, the configuration, the GPU utilization history and the
learned baselines, and returns ``Point`` values. A test feeds samples and checks the numbers.

A signal whose inputs are missing, or that has nothing to say (no request finished in the
window, so no quantile), is left out; it is never reported as 0.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Deque, Dict, Iterable, List, Optional, Sequence, Tuple

from .config import Config
from .inputs import Snapshot
from .windows import (
    by_extra,
    count_at_or_below,
    counter_increases,
    gauge_values,
    histogram_increases,
    histogram_quantile,
    linear_slope,
    model_hist,
    sum_counters,
)

QUANTILES = (0.5, 0.95, 0.99)


class Point(Tuple[str, Tuple[Tuple[str, str], ...], float]):
    """(metric name without prefix, labels, value)."""

    __slots__ = ()

    def __new__(cls, name: str, labels: Dict[str, str], value: float) -> "Point":
        return tuple.__new__(cls, (name, tuple(sorted(labels.items())), float(value)))

    @property
    def name(self) -> str:
        return self[0]

    @property
    def labels(self) -> Dict[str, str]:
        return dict(self[1])

    @property
    def value(self) -> float:
        return self[2]


# -- throughput baseline --------------------------------------------------------------------


@dataclass
class Baseline:
    """Generation throughput seen while the GPUs were busy, per model, over a long horizon.

    It is state, but owned by one sidecar and passed in and out explicitly. ``record`` keeps at
    most one sample per ``spacing`` seconds, so six hours cost a few thousand floats per model.
    """

    horizon: float
    spacing: float = 10.0
    samples: Dict[str, Deque[Tuple[float, float]]] = field(default_factory=dict)

    def record(self, model: str, t: float, tokens_per_second: float) -> None:
        q = self.samples.setdefault(model, deque())
        if q and t - q[-1][0] < self.spacing:
            return
        q.append((t, tokens_per_second))
        while q and q[0][0] < t - self.horizon:
            q.popleft()

    def busy_seconds(self, model: str) -> float:
        return len(self.samples.get(model, ())) * self.spacing

    def value(self, model: str, quantile: float) -> Optional[float]:
        q = self.samples.get(model)
        if not q:
            return None
        return percentile([v for _, v in q], quantile)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method)."""
    vals = sorted(values)
    if not vals:
        return math.nan
    pos = q * (len(vals) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(vals) - 1)
    return vals[lo] + (vals[hi] - vals[lo]) * (pos - lo)


def mean_utilization(util_history: Iterable[Tuple[float, float]], now: float, window: float) -> Optional[float]:
    vals = [u for t, u in util_history if now - window <= t <= now]
    return sum(vals) / len(vals) if vals else None


# -- the signals ----------------------------------------------------------------------------


@dataclass
class ModelInputs:
    """What one model's derivations read, gathered once."""

    model: str
    span: float
    incs: Dict
    hincs: Dict
    latest: Snapshot


def _rate(incs, key: str, model: str, span: float) -> Optional[float]:
    inc = sum_counters(incs, key, model)
    if inc is None or span <= 0:
        return None
    return inc / span


def quantile_points(name: str, hist, model: str) -> List[Point]:
    if hist is None or hist.count <= 0:
        return []
    out = []
    for q in QUANTILES:
        v = histogram_quantile(q, hist.buckets)
        if not math.isnan(v):
            out.append(Point(name, {"model_name": model, "quantile": repr(q)}, v))
    return out


def kv_pressure_level(usage: Optional[float], preemptions: Optional[float], waiting_capacity: Optional[float],
                      rejections: Optional[float], warn: float) -> Optional[int]:
    """0 ok, 1 elevated, 2 saturated (capacity waits or rejections), 3 thrashing (preempting)."""
    if usage is None or preemptions is None:
        return None
    if preemptions > 0:
        return 3
    if (waiting_capacity or 0) > 0 or (rejections or 0) > 0:
        return 2
    if usage >= warn:
        return 1
    return 0


def seconds_to_full(points: Sequence[Tuple[float, float]]) -> Optional[float]:
    """Linear prediction of when KV usage reaches 1, from (t, usage) over the window."""
    if not points:
        return None
    usage = points[-1][1]
    if usage >= 1.0:
        return 0.0
    slope = linear_slope(points)
    if slope is None or slope <= 0:
        return None
    return (1.0 - usage) / slope


def engine_stalled(snaps: Sequence[Snapshot], now: float, stall_seconds: float, model: str) -> Optional[bool]:
    """Requests running throughout the last ``stall_seconds`` and not one token produced.

    None when the history does not yet cover the stall time or the inputs are missing.
    """
    anchor = None
    for i, s in enumerate(snaps):
        if s.t <= now - stall_seconds:
            anchor = i
    if anchor is None:
        return None
    span = snaps[anchor:]
    if not all(s.present("running") and s.present("generation_tokens") for s in span):
        return None
    for s in span:
        if sum(gauge_values(s, "running", model)) <= 0:
            return False
    inc = sum_counters(counter_increases(span), "generation_tokens", model)
    return (inc or 0.0) <= 0


def counter_ratio(latest: Snapshot, incs, model: str, num: str, den: str, legacy_gauge: str) -> Optional[float]:
    """Increase of ``num`` over increase of ``den`` in the window; on releases that only had a
    lifetime ratio gauge, that gauge; None when neither is there or nothing was counted."""
    if latest.present(num) and latest.present(den):
        d = sum_counters(incs, den, model) or 0.0
        return (sum_counters(incs, num, model) or 0.0) / d if d > 0 else None
    if latest.present(legacy_gauge):
        vals = gauge_values(latest, legacy_gauge, model)
        return max(vals) if vals else None
    return None


def derive_model(mi: ModelInputs, cfg: Config, window_snaps: Sequence[Snapshot]) -> List[Point]:
    m, span, incs, hincs, latest = mi.model, mi.span, mi.incs, mi.hincs, mi.latest
    lab = {"model_name": m}
    out: List[Point] = []

    def add(name: str, value: Optional[float], **extra: str) -> None:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return
        out.append(Point(name, {**lab, **extra}, value))

    gen = _rate(incs, "generation_tokens", m, span)
    add("generation_tokens_per_second", gen)
    add("prompt_tokens_per_second", _rate(incs, "prompt_tokens", m, span))
    preempt_rate = _rate(incs, "preemptions", m, span)
    add("preemptions_per_second", preempt_rate)
    if latest.present("corrupted_requests"):
        add("corrupted_requests_per_second", _rate(incs, "corrupted_requests", m, span))

    # finished requests, errors
    if latest.present("request_success") and span > 0:
        finished = by_extra(incs, "request_success", m)
        for reason, inc in sorted(finished.items()):
            add("requests_finished_per_second", inc / span, finished_reason=reason)
        served = sum(v for r, v in finished.items() if r != "abort")
        if served > 0:
            add("request_error_ratio", finished.get("error", 0.0) / served)

    # admission rejections
    rejections = None
    if latest.present("admission_rejections") and span > 0:
        rejections = sum_counters(incs, "admission_rejections", m) or 0.0
        add("admission_rejections_per_second", rejections / span)

    # queue and KV
    usage = None
    if latest.present("kv_usage"):
        vals = gauge_values(latest, "kv_usage", m)
        usage = max(vals) if vals else None
        add("kv_cache_usage_ratio", usage)
    running = sum(gauge_values(latest, "running", m)) if latest.present("running") else None
    waiting = sum(gauge_values(latest, "waiting", m)) if latest.present("waiting") else None
    add("requests_running", running)
    add("requests_waiting", waiting)
    waiting_capacity = None
    if latest.present("waiting_by_reason"):
        by_reason: Dict[str, float] = {}
        for (k, mm, _e, x), v in latest.values.items():
            if k == "waiting_by_reason" and mm == m:
                by_reason[x] = by_reason.get(x, 0.0) + v
        waiting_capacity = by_reason.get("capacity", 0.0)
    elif waiting is not None and usage is not None:
        # older vLLM does not say why requests wait: with the cache this full, it is capacity
        waiting_capacity = waiting if usage >= cfg.kv_warn_threshold else 0.0
    add("requests_waiting_for_capacity", waiting_capacity)
    preempt_inc = (sum_counters(incs, "preemptions", m) or 0.0) if latest.present("preemptions") else None
    level = kv_pressure_level(usage, preempt_inc, waiting_capacity, rejections, cfg.kv_warn_threshold)
    add("kv_cache_pressure_level", level)
    if usage is not None:
        pts = []
        for s in window_snaps:
            v = gauge_values(s, "kv_usage", m)
            if v:
                pts.append((s.t, max(v)))
        add("kv_cache_seconds_to_full", seconds_to_full(pts))

    # latency and length distributions over the window
    ttft = model_hist(hincs, "ttft", m)
    out += quantile_points("ttft_seconds", ttft, m)
    if ttft is not None and ttft.count > 0:
        add("ttft_mean_seconds", ttft.sum / ttft.count)
        add("ttft_slo_attainment_ratio", count_at_or_below(cfg.slo_ttft_p95_seconds, ttft.buckets) / ttft.count)
    itl = model_hist(hincs, "itl", m)
    out += quantile_points("inter_token_latency_seconds", itl, m)
    tpot = model_hist(hincs, "tpot_request", m)
    per_request = tpot if tpot is not None and tpot.count > 0 else itl
    if per_request is not None and per_request.count > 0:
        add("itl_slo_attainment_ratio",
            count_at_or_below(cfg.slo_itl_seconds, per_request.buckets) / per_request.count)
    out += quantile_points("e2e_request_latency_seconds", model_hist(hincs, "e2e", m), m)
    out += quantile_points("queue_time_seconds", model_hist(hincs, "queue_time", m), m)
    plen = model_hist(hincs, "prompt_length", m)
    out += quantile_points("prompt_length_tokens", plen, m)
    if plen is not None and span > 0:
        long_count = max(0.0, plen.count - count_at_or_below(cfg.long_prompt_tokens, plen.buckets))
        add("long_prompt_requests_per_second", long_count / span)
        if plen.count > 0:
            add("long_prompt_request_ratio", long_count / plen.count)

    # caches and speculative decoding
    add("prefix_cache_hit_ratio",
        counter_ratio(latest, incs, m, "prefix_cache_hits", "prefix_cache_queries", "prefix_cache_hit_rate_legacy"))
    add("spec_decode_acceptance_ratio",
        counter_ratio(latest, incs, m, "spec_accepted_tokens", "spec_draft_tokens", "spec_acceptance_legacy"))
    return out


def derive(
    window_snaps: Sequence[Snapshot],
    stall_snaps: Sequence[Snapshot],
    now: float,
    cfg: Config,
    util_history: Sequence[Tuple[float, float]] = (),
    baseline: Optional[Baseline] = None,
) -> List[Point]:
    """Every derived signal for every model seen in the window."""
    if len(window_snaps) < 2:
        return []
    first, latest = window_snaps[0], window_snaps[-1]
    span = latest.t - first.t
    incs = counter_increases(window_snaps)
    hincs = histogram_increases(window_snaps)
    util = mean_utilization(util_history, now, cfg.window) if util_history else None
    out: List[Point] = []
    if util is not None:
        out.append(Point("gpu_mean_utilization_ratio", {}, util))
    for model in sorted(latest.models):
        mi = ModelInputs(model, span, incs, hincs, latest)
        pts = derive_model(mi, cfg, window_snaps)
        out += pts
        stalled = engine_stalled(stall_snaps, now, cfg.stall_seconds, model)
        if stalled is not None:
            out.append(Point("engine_stalled", {"model_name": model}, 1.0 if stalled else 0.0))
        gen = next((p.value for p in pts if p.name == "generation_tokens_per_second"), None)
        out += busy_low_points(model, gen, util, baseline, cfg)
    return out


def busy_low_points(model: str, gen: Optional[float], util: Optional[float], baseline: Optional[Baseline],
                    cfg: Config) -> List[Point]:
    """``gpu_busy_low_throughput`` and the baseline it compares against."""
    if gen is None or util is None:
        return []
    lab = {"model_name": model}
    learned = None
    if baseline is not None and baseline.busy_seconds(model) >= cfg.baseline_min_seconds:
        learned = baseline.value(model, cfg.baseline_quantile)
    out = []
    if learned is not None:
        threshold = cfg.low_throughput_fraction * learned
        out.append(Point("throughput_baseline_tokens_per_second", lab, learned))
    else:
        threshold = cfg.throughput_floor
    out.append(Point("throughput_low_threshold_tokens_per_second", lab, threshold))
    flagged = util >= cfg.busy_utilization and gen < threshold
    out.append(Point("gpu_busy_low_throughput", lab, 1.0 if flagged else 0.0))
    return out
