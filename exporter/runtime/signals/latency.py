"""Latency and prompt length: windowed quantiles of vLLM's histograms (the bucket increases over
the window, interpolated like ``histogram_quantile``), TTFT mean, SLO attainment, long prompts.

Two rules beyond ``histogram_quantile``:

- Resolution: a quantile whose rank falls in the first bucket is reported as that bucket's upper
  bound, not interpolated between 0 and it. vLLM's buckets cannot say more than "at most the
  first bound" (its queue-time histogram starts at 0.3 s while real queue times are often tens
  of microseconds; interpolation would report 0.15/0.285/0.297 s). Such quantiles are listed in
  ``Distribution.bounded`` and served as ``vllm_sidecar_quantile_resolution_limited`` = 1.
- Consistency: per request, queue time <= time to first token <= end-to-end latency, so the same
  quantile of each is ordered the same way. Bucket layouts and interpolation can break that; each
  quantile of the queue time is capped at the TTFT's and the e2e's, and TTFT's at the e2e's.
"""

from __future__ import annotations

import math
from typing import List, Optional, Tuple

from ..buckets import ScalarOps, bucket_quantile, count_at_or_below, prepare_buckets
from ..inputs import Hist
from ..rolling import Window, model_hist
from .results import QUANTILES, Distribution, Latency, Prompts


def quantile_or_bound(q: float, buckets) -> Tuple[float, bool]:
    """``histogram_quantile``, except that a rank inside the first bucket answers with that
    bucket's upper bound; the flag says so."""
    return quantiles_or_bounds((q,), buckets)[0]


def quantiles_or_bounds(qs, buckets, prepared: bool = False) -> List[Tuple[float, bool]]:
    """``quantile_or_bound`` for several quantiles, the buckets sorted and made monotonic once
    (``prepared``: they come from ``prepare_buckets``)."""
    b = buckets if prepared else prepare_buckets(buckets)
    out = []
    first_le, first_count = b[0] if b else (math.nan, 0.0)
    bounds, counts = [le for le, _ in b], [c for _, c in b]  # split once for every quantile
    for q in qs:
        v = bucket_quantile(q, bounds, counts, ScalarOps, True)  # histogram_quantile(q, b, prepared=True)
        if (not math.isnan(v) and 0 < first_le < math.inf and first_count > 0
                and q * b[-1][1] <= first_count):
            out.append((first_le, True))
        else:
            out.append((v, False))
    return out


def distribution(window: Optional[Hist], lifetime: Optional[Hist], prepared=None) -> Optional[Distribution]:
    """Quantiles over the window; None when nothing was observed in it. ``prepared``: the
    window's buckets through ``prepare_buckets`` already."""
    if window is None or window.count <= 0:
        return None
    qs = []
    bounded = []
    got = (quantiles_or_bounds(QUANTILES, window.buckets) if prepared is None
           else quantiles_or_bounds(QUANTILES, prepared, prepared=True))
    for q, (v, is_bound) in zip(QUANTILES, got):
        if not math.isnan(v):
            qs.append((q, v))
            if is_bound:
                bounded.append(q)
    if not qs:
        return None
    return Distribution(tuple(qs), count=lifetime.count if lifetime else window.count,
                        sum=lifetime.sum if lifetime else window.sum, bounded=tuple(bounded))


def cap(d: Optional[Distribution], *uppers: Optional[Distribution]) -> Optional[Distribution]:
    """``d`` with each quantile no higher than the same quantile of every one of ``uppers``."""
    if d is None:
        return None
    out = []
    for q, v in d.quantiles:
        for u in uppers:
            x = u.at(q) if u is not None else None
            if x is not None and x < v:
                v = x
        out.append((q, v))
    return Distribution(tuple(out), count=d.count, sum=d.sum, bounded=d.bounded)


def latency(view: Window, model: str, ttft_objective: float, itl_objective: float) -> Latency:
    latest = view.latest
    prepared = {}  # each histogram's buckets through prepare_buckets once (some are read twice)

    def prep(key: str, h: Hist):
        b = prepared.get(key)
        if b is None:
            b = prepared[key] = prepare_buckets(h.buckets)
        return b

    def dist(key: str) -> Optional[Distribution]:
        h = view.hist(key, model)
        if h is None or h.count <= 0:
            return None
        return distribution(h, model_hist(latest, key, model), prep(key, h))

    ttft = view.hist("ttft", model)
    ttft_mean = attainment = None
    if ttft is not None and ttft.count > 0:
        ttft_mean = ttft.sum / ttft.count
        attainment = count_at_or_below(ttft_objective, prep("ttft", ttft), prepared=True) / ttft.count
    itl = view.hist("itl", model)
    tpot = view.hist("tpot_request", model)
    per_request, per_key = (tpot, "tpot_request") if tpot is not None and tpot.count > 0 else (itl, "itl")
    itl_attainment = None
    if per_request is not None and per_request.count > 0:
        itl_attainment = count_at_or_below(itl_objective, prep(per_key, per_request), prepared=True) / per_request.count
    e2e = dist("e2e")
    ttft_d = cap(dist("ttft"), e2e)
    queue = cap(dist("queue_time"), ttft_d, e2e)
    return Latency(ttft=ttft_d, ttft_mean=ttft_mean, itl=dist("itl"), e2e=e2e,
                   queue_time=queue, ttft_slo_attainment=attainment,
                   itl_slo_attainment=itl_attainment)


def prompts(view: Window, model: str, long_tokens: float) -> Prompts:
    plen = view.hist("prompt_length", model)
    span = view.span
    long_rate = long_ratio = None
    prepared = prepare_buckets(plen.buckets) if plen is not None else None  # once for both
    if plen is not None and span > 0:
        long_count = max(0.0, plen.count - count_at_or_below(long_tokens, prepared, prepared=True))
        long_rate = long_count / span
        if plen.count > 0:
            long_ratio = long_count / plen.count
    return Prompts(length=distribution(plen, model_hist(view.latest, "prompt_length", model), prepared),
                   long_per_second=long_rate, long_ratio=long_ratio)
