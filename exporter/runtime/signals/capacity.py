"""KV cache and queue: usage (the fullest engine), the pressure level, the predicted time to
full, and running, waiting and waiting-for-capacity requests (all engines summed)."""

from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

from ..inputs import Snapshot
from ..windows import gauge_values, linear_slope, sum_counters
from .results import KvQueue


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


def kv_and_queue(incs: Dict, latest: Snapshot, window_snaps: Sequence[Snapshot], model: str,
                 warn: float) -> KvQueue:
    usage = None
    if latest.present("kv_usage"):
        vals = gauge_values(latest, "kv_usage", model)
        usage = max(vals) if vals else None
    running = sum(gauge_values(latest, "running", model)) if latest.present("running") else None
    waiting = sum(gauge_values(latest, "waiting", model)) if latest.present("waiting") else None
    waiting_capacity = None
    if latest.present("waiting_by_reason"):
        by_reason: Dict[str, float] = {}
        for (k, mm, _e, x), v in latest.values.items():
            if k == "waiting_by_reason" and mm == model:
                by_reason[x] = by_reason.get(x, 0.0) + v
        waiting_capacity = by_reason.get("capacity", 0.0)
    elif waiting is not None and usage is not None:
        # older vLLM does not say why requests wait: with the cache this full, it is capacity
        waiting_capacity = waiting if usage >= warn else 0.0
    preempt_inc = (sum_counters(incs, "preemptions", model) or 0.0) if latest.present("preemptions") else None
    rejections = (sum_counters(incs, "admission_rejections", model) or 0.0) if latest.present("admission_rejections") else None
    to_full = None
    if usage is not None:
        pts = []
        for s in window_snaps:
            v = gauge_values(s, "kv_usage", model)
            if v:
                pts.append((s.t, max(v)))
        to_full = seconds_to_full(pts)
    return KvQueue(
        usage=usage,
        pressure_level=kv_pressure_level(usage, preempt_inc, waiting_capacity, rejections, warn),
        seconds_to_full=to_full,
        running=running,
        waiting=waiting,
        waiting_for_capacity=waiting_capacity,
    )
