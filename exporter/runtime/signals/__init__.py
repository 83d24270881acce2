"""Derived signals: pure functions from snapshots (and GPU readings) to typed results.

Nothing here reads a clock, a socket or a global: ``derive`` takes the window's snapshots, the
stall horizon's snapshots, ``now``, the configuration, the GPU utilization history and the
learned baseline, and returns ``Signals`` (see ``results``). One module per signal family:

    throughput   tokens, finished requests, errors, preemptions, rejections per second
    capacity     KV usage, pressure level, time to full, running and waiting requests
    latency      TTFT/ITL/e2e/queue distributions, TTFT mean, SLO attainment; prompt lengths
    caches       prefix-cache hits, speculative-decoding acceptance
    anomaly      a stalled engine; GPU busy with tokens low against the learned baseline
    lora         LoRA adapters with requests now, adapters known, vLLM's max_lora (whole pod)

A signal whose inputs are missing, or that has nothing to say (no request finished in the
window, so no quantile), is None and left out; it is never reported as 0.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from ..config import Config
from ..inputs import Snapshot
from ..rolling import Window, Windows
from .anomaly import Baseline, busy_low, engine_stalled, mean_utilization, percentile
from .caches import caches, counter_ratio
from .capacity import (
    HORIZON_SECONDS,
    MIN_SLOPE_PER_SECOND,
    CapacityTracker,
    classify,
    kv_and_queue,
    kv_pressure_level,
    seconds_to_full,
    time_to_full,
)
from .latency import cap, distribution, latency, prompts, quantile_or_bound
from .lora import lora
from .results import (
    QUANTILES,
    BusyLow,
    Caches,
    Distribution,
    KvQueue,
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
    "HORIZON_SECONDS", "MIN_SLOPE_PER_SECOND", "QUANTILES", "Baseline", "BusyLow", "Caches", "CapacityTracker",
    "classify", "Distribution",
    "KvQueue", "Latency", "Lora", "LoraAdapter", "ModelSignals", "Prompts", "Signals", "Throughput", "busy_low", "cap",
    "caches", "counter_ratio", "derive", "derive_view", "distribution", "engine_stalled", "kv_and_queue",
    "kv_pressure_level", "latency", "lora", "mean_utilization", "percentile", "prompts", "quantile_or_bound",
    "seconds_to_full", "throughput", "time_to_full", "tracker_for",
]


def tracker_for(cfg: Config) -> CapacityTracker:
    """The capacity tracker the poll loop feeds for ``cfg``."""
    return CapacityTracker(cfg.window, cfg.kv_warn_threshold, cfg.batch_room, cfg.max_num_seqs)


def derive_view(view: Window, cfg: Config, util: Optional[float] = None,
                baseline: Optional[Baseline] = None, tracker: Optional[CapacityTracker] = None) -> Signals:
    """Every derived signal for every model on the latest page of ``view``.

    One snapshot in the window: the gauges (KV usage, running, waiting, waiting for capacity,
    the pressure level where one page settles it, LoRA). Two or more: everything.
    """
    if view.polls == 0 or view.latest is None:
        return Signals(gpu_mean_utilization=util)
    latest = view.latest
    first = view.polls < 2
    models: List[ModelSignals] = []
    for model in sorted(latest.models):
        kv = kv_and_queue(view, model, cfg.kv_warn_threshold, cfg.batch_room, tracker, cfg.max_num_seqs)
        if first:
            models.append(ModelSignals(model=model, throughput=Throughput(), kv=kv, latency=Latency(),
                                       prompts=Prompts(), caches=Caches()))
            continue
        tp = throughput(view, model)
        models.append(ModelSignals(
            model=model,
            throughput=tp,
            kv=kv,
            latency=latency(view, model, cfg.slo_ttft_p95_seconds, cfg.slo_itl_seconds),
            prompts=prompts(view, model, cfg.long_prompt_tokens),
            caches=caches(view, model),
            stalled=view.stalled(model, cfg.stall_seconds),
            busy_low=busy_low(model, tp.generation_tokens_per_second, util, baseline,
                              busy_utilization=cfg.busy_utilization, low_fraction=cfg.low_throughput_fraction,
                              floor=cfg.throughput_floor, min_busy_seconds=cfg.baseline_min_seconds,
                              quantile=cfg.baseline_quantile),
        ))
    return Signals(gpu_mean_utilization=util, models=tuple(models), lora=lora(latest))


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
    for s in snaps:
        if s.t <= now:
            w.add(s)
            tracker.observe(s)
    util = mean_utilization(util_history, now, cfg.window) if util_history else None
    return derive_view(w.view(now, now - window_snaps[0].t), cfg, util, baseline, tracker)
