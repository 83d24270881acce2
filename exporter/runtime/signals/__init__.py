"""Derived signals: pure functions from snapshots (and GPU readings) to typed results.

Nothing here reads a clock, a socket or a global: ``derive`` takes the window's snapshots, the
stall horizon's snapshots, ``now``, the configuration, the GPU utilization history and the
learned baseline, and returns ``Signals`` (see ``results``). One module per signal family:

    throughput   tokens, finished requests, errors, preemptions, rejections per second
    availability the availability SLI's requests and errors, counted poll by poll (a counter kept
                 by the poll loop, as the capacity tracker is)
    capacity     KV usage, pressure level, time to full, running and waiting requests
    latency      TTFT/ITL/e2e/queue distributions, TTFT mean, SLO attainment; prompt lengths
    caches       prefix-cache hits, speculative-decoding acceptance, mean accepted length, by position
    anomaly      a stalled (or wedged) engine, a sleeping one; GPU busy with tokens low against the
                 learned baseline or the plan, by the replica's role
    kvtransfer   KV transfer health (disaggregation); whether the page contradicts the role given
    lora         LoRA adapters with requests now, adapters known, vLLM's max_lora (whole pod)

The replica's role (``cfg.role``: prefill, decode or both) changes what "GPU busy, tokens low"
measures (``anomaly.work_rate``); a replica of role both is derived exactly as before roles.

A signal whose inputs are missing, or that has nothing to say (no request finished in the
window, so no quantile), is None and left out; it is never reported as 0.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from ..config import Config
from ..inputs import Snapshot
from ..rolling import Window, Windows
from .anomaly import (
    Baseline,
    busy_low,
    degraded,
    engine_stalled,
    learnable,
    mean_utilization,
    percentile,
    sleep_level,
    work_rate,
)
from .availability import AvailabilityCounter
from .caches import caches, counter_ratio
from .capacity import (
    HORIZON_SECONDS,
    MIN_SLOPE_PER_SECOND,
    CapacityTracker,
    HeldBackRule,
    classify,
    kv_and_queue,
    kv_pressure_level,
    seconds_to_full,
    time_to_full,
)
from .kvtransfer import kv_transfer, role_conflicts
from .latency import cap, distribution, latency, prompts, quantile_or_bound
from .lora import lora
from .results import (
    QUANTILES,
    Availability,
    BusyLow,
    Caches,
    Distribution,
    KvQueue,
    KvTransfer,
    Latency,
    Lora,
    LoraAdapter,
    ModelSignals,
    Prompts,
    Signals,
    Throughput,
)
from .throughput import throughput

__all__ = [
    "HORIZON_SECONDS", "MIN_SLOPE_PER_SECOND", "QUANTILES", "Availability", "AvailabilityCounter", "Baseline",
    "BusyLow", "Caches", "CapacityTracker", "HeldBackRule",
    "classify", "counter_for", "Distribution", "KvQueue", "KvTransfer", "Latency", "Lora", "LoraAdapter", "ModelSignals",
    "Prompts", "Signals", "Throughput", "busy_low", "cap", "caches", "counter_ratio", "degraded", "derive",
    "derive_view", "distribution", "engine_stalled", "kv_and_queue", "kv_pressure_level", "kv_transfer", "latency",
    "learnable", "lora", "mean_utilization", "percentile", "prompts", "quantile_or_bound", "role_conflicts",
    "seconds_to_full", "sleep_level", "throughput", "time_to_full", "tracker_for", "work_rate",
]


def tracker_for(cfg: Config) -> CapacityTracker:
    """The capacity tracker the poll loop feeds for ``cfg``."""
    rule = HeldBackRule(cfg.held_back_window, cfg.held_back_recent_window, cfg.held_back_share,
                        cfg.preempting_window, cfg.rejecting_window)
    return CapacityTracker(cfg.window, cfg.kv_warn_threshold, cfg.batch_room, cfg.max_num_seqs, rule=rule)


def counter_for(cfg: Config) -> AvailabilityCounter:
    """The availability counter the poll loop feeds for ``cfg``."""
    return AvailabilityCounter(getattr(cfg, "availability_sli", "combined"))


def derive_view(view: Window, cfg: Config, util: Optional[float] = None,
                baseline: Optional[Baseline] = None, tracker: Optional[CapacityTracker] = None,
                counted: Optional[AvailabilityCounter] = None) -> Signals:
    """Every derived signal for every model on the latest page of ``view`` (``counted``: the
    availability counter fed with the same pages, whose totals are served with them).

    One snapshot in the window: the gauges (KV usage, running, waiting, waiting for capacity,
    the pressure level where one page settles it, the sleep level, LoRA). Two or more: everything.
    """
    role = getattr(cfg, "role", "both")
    if view.polls == 0 or view.latest is None:
        return Signals(gpu_mean_utilization=util, role=role)
    latest = view.latest
    first = view.polls < 2
    models: List[ModelSignals] = []
    for model in sorted(latest.models):
        kv = kv_and_queue(view, model, cfg.kv_warn_threshold, cfg.batch_room, tracker, cfg.max_num_seqs)
        level = sleep_level(latest, model)
        avail = counted.totals(model) if counted is not None else Availability()
        if first:
            models.append(ModelSignals(model=model, throughput=Throughput(), kv=kv, latency=Latency(),
                                       prompts=Prompts(), caches=Caches(), sleep_level=level, availability=avail))
            continue
        models.append(_model(view, cfg, model, kv, level, util, baseline, role, avail))
    return Signals(gpu_mean_utilization=util, models=tuple(models), lora=lora(latest), role=role,
                   role_conflicts=role_conflicts(view, role))


def _model(view: Window, cfg: Config, model: str, kv: KvQueue, level: Optional[int], util: Optional[float],
           baseline: Optional[Baseline], role: str, avail: Availability) -> ModelSignals:
    """One model's signals over a window of two reads or more."""
    tp = throughput(view, model)
    sleeping = bool(level)
    stalled = view.stalled(model, cfg.stall_seconds)
    partial = ModelSignals(model=model, throughput=tp, kv=kv, latency=Latency(), prompts=Prompts(),
                           caches=Caches())
    planned = cfg.planned_prefill_tokens_per_second if role == "prefill" else cfg.planned_tokens_per_second
    if view.span < cfg.window - 2 * cfg.poll_interval:
        # the plan judges a full window only (give or take a late poll): never a pod's first
        # seconds, its warm-up
        planned = 0.0
    return ModelSignals(
        model=model,
        throughput=tp,
        kv=kv,
        latency=latency(view, model, cfg.slo_ttft_p95_seconds, cfg.slo_itl_seconds),
        prompts=prompts(view, model, cfg.long_prompt_tokens),
        caches=caches(view, model),
        stalled=False if sleeping and stalled is not None else stalled,
        busy_low=busy_low(model, work_rate(partial, role), util, baseline,
                          busy_utilization=cfg.busy_utilization, low_fraction=cfg.low_throughput_fraction,
                          floor=cfg.throughput_floor, min_busy_seconds=cfg.baseline_min_seconds,
                          quantile=cfg.baseline_quantile, planned=planned, sleeping=sleeping),
        kv_transfer=kv_transfer(view, model),
        sleep_level=level,
        availability=avail,
    )


def derive(
    window_snaps: Sequence[Snapshot],
    stall_snaps: Sequence[Snapshot],
    now: float,
    cfg: Config,
    util_history: Sequence[Tuple[float, float]] = (),
    baseline: Optional[Baseline] = None,
) -> Signals:
    """``derive_view`` over snapshots given as lists (tests, one-off derivations): the window is
    ``window_snaps``, the stall history ``stall_snaps``, both fed in time order to one
    ``Windows`` as the poll loop feeds its own."""
    if not window_snaps:
        return Signals()
    snaps = sorted({id(s): s for s in (*stall_snaps, *window_snaps)}.values(), key=lambda s: s.t)
    w = Windows(cfg.window, max(cfg.window, cfg.stall_seconds) + 3 * cfg.poll_interval, cfg.poll_interval)
    tracker = tracker_for(cfg)
    counted = counter_for(cfg)
    for s in snaps:
        if s.t <= now:
            w.add(s)
            tracker.observe(s)
            counted.observe(w, s.models)
    util = mean_utilization(util_history, now, cfg.window) if util_history else None
    return derive_view(w.view(now, now - window_snaps[0].t), cfg, util, baseline, tracker, counted)
