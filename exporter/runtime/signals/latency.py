"""Latency and prompt length: windowed quantiles of vLLM's histograms (the bucket increases over
the window, interpolated like ``histogram_quantile``), TTFT mean, SLO attainment, long prompts."""

from __future__ import annotations

import math
from typing import Dict, Optional

from ..inputs import Hist, Snapshot
from ..windows import count_at_or_below, histogram_quantile, model_hist
from .results import QUANTILES, Distribution, Latency, Prompts


def distribution(window: Optional[Hist], lifetime: Optional[Hist]) -> Optional[Distribution]:
    """Quantiles over the window; None when nothing was observed in it."""
    if window is None or window.count <= 0:
        return None
    qs = []
    for q in QUANTILES:
        v = histogram_quantile(q, window.buckets)
        if not math.isnan(v):
            qs.append((q, v))
    if not qs:
        return None
    return Distribution(tuple(qs), count=lifetime.count if lifetime else window.count,
                        sum=lifetime.sum if lifetime else window.sum)


def latency(hincs: Dict, latest: Snapshot, model: str, ttft_objective: float, itl_objective: float) -> Latency:
    def dist(key: str) -> Optional[Distribution]:
        return distribution(model_hist(hincs, key, model), model_hist(latest.hists, key, model))

    ttft = model_hist(hincs, "ttft", model)
    ttft_mean = attainment = None
    if ttft is not None and ttft.count > 0:
        ttft_mean = ttft.sum / ttft.count
        attainment = count_at_or_below(ttft_objective, ttft.buckets) / ttft.count
    itl = model_hist(hincs, "itl", model)
    tpot = model_hist(hincs, "tpot_request", model)
    per_request = tpot if tpot is not None and tpot.count > 0 else itl
    itl_attainment = None
    if per_request is not None and per_request.count > 0:
        itl_attainment = count_at_or_below(itl_objective, per_request.buckets) / per_request.count
    return Latency(ttft=dist("ttft"), ttft_mean=ttft_mean, itl=dist("itl"), e2e=dist("e2e"),
                   queue_time=dist("queue_time"), ttft_slo_attainment=attainment,
                   itl_slo_attainment=itl_attainment)


def prompts(hincs: Dict, latest: Snapshot, model: str, span: float, long_tokens: float) -> Prompts:
    plen = model_hist(hincs, "prompt_length", model)
    long_rate = long_ratio = None
    if plen is not None and span > 0:
        long_count = max(0.0, plen.count - count_at_or_below(long_tokens, plen.buckets))
        long_rate = long_count / span
        if plen.count > 0:
            long_ratio = long_count / plen.count
    return Prompts(length=distribution(plen, model_hist(latest.hists, "prompt_length", model)),
                   long_per_second=long_rate, long_ratio=long_ratio)
