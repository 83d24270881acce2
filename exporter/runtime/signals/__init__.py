"""Derived signals: pure functions from snapshots (and GPU readings) to typed results.

Nothing here reads a clock, a socket or a global: ``derive`` takes the window's snapshots, the
stall horizon's snapshots, ``now``, the configuration, the GPU utilization history and the
learned baseline, and returns ``Signals`` (see ``results``). One module per signal family:

    throughput   tokens, finished requests, errors, preemptions, rejections per second
    capacity     KV usage, pressure level, time to full, running and waiting requests
    latency      TTFT/ITL/e2e/queue distributions, TTFT mean, SLO attainment; prompt lengths
    caches       prefix-cache hits, speculative-decoding acceptance
    anomaly      a stalled engine; GPU busy with tokens low against the learned baseline

A signal whose inputs are missing, or that has nothing to say (no request finished in the
window, so no quantile), is None and left out; it is never reported as 0.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from ..config import Config
from ..inputs import Snapshot
from ..windows import counter_increases, histogram_increases
from .anomaly import Baseline, busy_low, engine_stalled, mean_utilization, percentile
from .caches import caches, counter_ratio
from .capacity import kv_and_queue, kv_pressure_level, seconds_to_full
from .latency import distribution, latency, prompts
from .results import (QUANTILES, BusyLow, Caches, Distribution, KvQueue, Latency, ModelSignals, Prompts,
                      Signals, Throughput)
from .throughput import throughput

__all__ = [
    "QUANTILES", "Baseline", "BusyLow", "Caches", "Distribution", "KvQueue", "Latency", "ModelSignals",
    "Prompts", "Signals", "Throughput", "busy_low", "caches", "counter_ratio", "derive", "distribution",
    "engine_stalled", "kv_and_queue", "kv_pressure_level", "latency", "mean_utilization", "percentile",
    "prompts", "seconds_to_full", "throughput",
]


def derive(
    window_snaps: Sequence[Snapshot],
    stall_snaps: Sequence[Snapshot],
    now: float,
    cfg: Config,
    util_history: Sequence[Tuple[float, float]] = (),
    baseline: Optional[Baseline] = None,
) -> Signals:
    """Every derived signal for every model seen in the window."""
    if len(window_snaps) < 2:
        return Signals()
    first, latest = window_snaps[0], window_snaps[-1]
    span = latest.t - first.t
    incs = counter_increases(window_snaps)
    hincs = histogram_increases(window_snaps)
    util = mean_utilization(util_history, now, cfg.window) if util_history else None
    models: List[ModelSignals] = []
    for model in sorted(latest.models):
        tp = throughput(incs, span, latest, model)
        models.append(ModelSignals(
            model=model,
            throughput=tp,
            kv=kv_and_queue(incs, latest, window_snaps, model, cfg.kv_warn_threshold),
            latency=latency(hincs, latest, model, cfg.slo_ttft_p95_seconds, cfg.slo_itl_seconds),
            prompts=prompts(hincs, latest, model, span, cfg.long_prompt_tokens),
            caches=caches(incs, latest, model),
            stalled=engine_stalled(stall_snaps, now, cfg.stall_seconds, model),
            busy_low=busy_low(model, tp.generation_tokens_per_second, util, baseline,
                              busy_utilization=cfg.busy_utilization, low_fraction=cfg.low_throughput_fraction,
                              floor=cfg.throughput_floor, min_busy_seconds=cfg.baseline_min_seconds,
                              quantile=cfg.baseline_quantile),
        ))
    return Signals(gpu_mean_utilization=util, models=tuple(models))
