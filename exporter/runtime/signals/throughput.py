"""Throughput: tokens, finished requests, errors, preemptions and rejections per second over the
window, all engines summed, counter resets handled (increases from ``rolling.Window``)."""

from __future__ import annotations

from typing import Dict, Optional

from ..rolling import Window
from .results import Throughput


def _rate(view: Window, key: str, model: str) -> Optional[float]:
    inc = view.increase(key, model)
    span = view.span_of(key, model)
    if inc is None or span <= 0:
        return None
    return inc / span


def throughput(view: Window, model: str) -> Throughput:
    latest, span = view.latest, view.span
    finished: Dict[str, float] = {}
    error_ratio = None
    if latest.present("request_success") and span > 0:
        incs_by_reason = view.by_extra("request_success", model)
        rspan = view.span_of("request_success", model)
        finished = {reason: inc / rspan for reason, inc in incs_by_reason.items()}
        served = sum(v for r, v in incs_by_reason.items() if r != "abort")
        if served > 0:
            error_ratio = incs_by_reason.get("error", 0.0) / served
    rejections = None
    if latest.present("admission_rejections") and span > 0:
        rejections = (view.increase("admission_rejections", model) or 0.0) / view.span_of("admission_rejections", model)
    return Throughput(
        generation_tokens_per_second=_rate(view, "generation_tokens", model),
        prompt_tokens_per_second=_rate(view, "prompt_tokens", model),
        preemptions_per_second=_rate(view, "preemptions", model),
        corrupted_requests_per_second=(_rate(view, "corrupted_requests", model)
                                       if latest.present("corrupted_requests") else None),
        admission_rejections_per_second=rejections,
        finished_per_second=finished,
        error_ratio=error_ratio,
    )
