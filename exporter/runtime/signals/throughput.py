"""Throughput: tokens, finished requests, errors, preemptions and rejections per second over the
window, all engines summed, counter resets handled (``windows.counter_increases``)."""

from __future__ import annotations

from typing import Dict, Optional

from ..inputs import Snapshot
from ..windows import by_extra, sum_counters
from .results import Throughput


def _rate(incs, key: str, model: str, span: float) -> Optional[float]:
    inc = sum_counters(incs, key, model)
    if inc is None or span <= 0:
        return None
    return inc / span


def throughput(incs: Dict, span: float, latest: Snapshot, model: str) -> Throughput:
    finished: Dict[str, float] = {}
    error_ratio = None
    if latest.present("request_success") and span > 0:
        incs_by_reason = by_extra(incs, "request_success", model)
        finished = {reason: inc / span for reason, inc in sorted(incs_by_reason.items())}
        served = sum(v for r, v in incs_by_reason.items() if r != "abort")
        if served > 0:
            error_ratio = incs_by_reason.get("error", 0.0) / served
    rejections = None
    if latest.present("admission_rejections") and span > 0:
        rejections = (sum_counters(incs, "admission_rejections", model) or 0.0) / span
    return Throughput(
        generation_tokens_per_second=_rate(incs, "generation_tokens", model, span),
        prompt_tokens_per_second=_rate(incs, "prompt_tokens", model, span),
        preemptions_per_second=_rate(incs, "preemptions", model, span),
        corrupted_requests_per_second=(_rate(incs, "corrupted_requests", model, span)
                                       if latest.present("corrupted_requests") else None),
        admission_rejections_per_second=rejections,
        finished_per_second=finished,
        error_ratio=error_ratio,
    )
