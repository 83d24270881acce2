"""KV cache and queue: usage (the fullest engine), the pressure level, the predicted time to
full, and running, waiting and waiting-for-capacity requests (all engines summed).

All of it but the time to full is known from the first read: usage and queue lengths are
gauges; the pressure level too, unless the page shows preemptions (or rejections) since vLLM
started, which may or may not fall in the window: then it waits for a second read.

Seconds to full is served only for a real rising trend: the least-squares slope of the fullest
engine's usage over the window must be at least ``MIN_SLOPE_PER_SECOND`` (0.0001/s, i.e. 0.6 % of
the cache a minute), requests must be running, the cache must not already be full, and the
prediction must lie within ``HORIZON_SECONDS`` (one hour: a 60 s trend says nothing about the
cache further away). Otherwise it is left out.
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

from ..inputs import Snapshot
from ..rolling import View, linear_slope
from .results import KvQueue

MIN_SLOPE_PER_SECOND = 1e-4
HORIZON_SECONDS = 3600.0


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


def time_to_full(usage: Optional[float], slope: Optional[float], running: Optional[float] = None) -> Optional[float]:
    """Seconds until usage reaches 1 at ``slope`` (per second), or None when that is not a real
    rising trend (see the module docstring)."""
    if usage is None or slope is None or usage >= 1.0:
        return None
    if running is not None and running <= 0:
        return None  # idle: nothing is filling the cache
    if slope < MIN_SLOPE_PER_SECOND:
        return None
    secs = (1.0 - usage) / slope
    return secs if secs <= HORIZON_SECONDS else None


def seconds_to_full(points: Sequence[Tuple[float, float]], running: Optional[float] = None) -> Optional[float]:
    """Linear prediction of when KV usage reaches 1, from (t, usage) over the window."""
    if not points:
        return None
    return time_to_full(points[-1][1], linear_slope(points), running)


def _first_read_level(latest: Snapshot, model: str, usage: Optional[float], waiting_capacity: Optional[float],
                      warn: float) -> Optional[int]:
    """The level from one page: known unless preemptions (or rejections) happened at some
    time since vLLM started, which one page cannot place inside or outside the window."""
    if usage is None or not latest.present("preemptions"):
        return None
    if sum(v for _e, _x, v in latest.by_model.get(("preemptions", model), ())) > 0:
        return None
    rejected_ever = sum(v for _e, _x, v in latest.by_model.get(("admission_rejections", model), ())) > 0
    if (waiting_capacity or 0) > 0:
        return 2
    if rejected_ever:
        return None
    return 1 if usage >= warn else 0


def kv_and_queue(view: View, model: str, warn: float) -> KvQueue:
    latest = view.latest
    usage = None
    if latest.present("kv_usage"):
        vals = latest.gauge("kv_usage", model)
        usage = max(vals) if vals else None
    running = sum(latest.gauge("running", model)) if latest.present("running") else None
    waiting = sum(latest.gauge("waiting", model)) if latest.present("waiting") else None
    # Requests held back for KV capacity. vLLM's reason="capacity" counts every request waiting for
    # scheduling capacity (a full batch as well as a full cache, all but the deferred ones); older
    # vLLM does not say why requests wait at all. Either way they are the cache's doing only while
    # the cache is this full: below the warn level they wait for the batch, not for KV.
    waiting_capacity = None
    candidates = None
    if latest.present("waiting_by_reason"):
        by_reason: Dict[str, float] = {}
        for _e, x, v in latest.by_model.get(("waiting_by_reason", model), ()):
            by_reason[x] = by_reason.get(x, 0.0) + v
        candidates = by_reason.get("capacity", 0.0)
    elif waiting is not None:
        candidates = waiting
    if candidates is not None and usage is not None:
        waiting_capacity = candidates if usage >= warn else 0.0
    if view.polls < 2:
        level = _first_read_level(latest, model, usage, waiting_capacity, warn)
        to_full = None
    else:
        preempt_inc = (view.increase("preemptions", model) or 0.0) if latest.present("preemptions") else None
        rejections = ((view.increase("admission_rejections", model) or 0.0)
                      if latest.present("admission_rejections") else None)
        level = kv_pressure_level(usage, preempt_inc, waiting_capacity, rejections, warn)
        to_full = time_to_full(usage, view.kv_slope(model), running)
    return KvQueue(
        usage=usage,
        pressure_level=level,
        seconds_to_full=to_full,
        running=running,
        waiting=waiting,
        waiting_for_capacity=waiting_capacity,
    )
