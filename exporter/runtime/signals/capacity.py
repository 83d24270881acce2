"""KV cache and queue: usage (the fullest engine), the pressure level, the predicted time to
full, and running, waiting and waiting-for-capacity requests (all engines summed).

Requests waiting for capacity (vLLM's ``reason="capacity"``; on old releases every waiting
request) are the cache's doing when either the cache is at the warn level (``kv_usage``) or the
batch runs far below the replica's ceiling (``kv_batch``: below ``batch_room`` of it; the batch has
room, so the next request does not fit in the cache whatever the usage gauge reads: long prompts
leave blocks free that no waiting prompt fits in). Only a batch at its ceiling explains them
otherwise (``batch_full``). The ceiling is ``max_num_seqs`` when the operator gives it, else
learned by ``CapacityTracker``: the highest batch of the polls where nothing waited for capacity
(uncontended: the batch was what the traffic asked for, so a flood's small KV-bound batch is never
learned as the ceiling, and a sidecar started in the middle of a flood has no ceiling until the
flood ends), over ``horizon`` seconds, at least ``MIN_CEILING``. With no ceiling known, only the
usage explains.

``CapacityTracker`` also keeps, per poll, the KV usage, whether the cache held requests back and
whether a preemption happened, so the window's peak usage and the share of polls under each are
served: what a 15-60 s scrape of the saw-toothing usage gauge cannot sample.

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

from collections import deque
from typing import Deque, Dict, NamedTuple, Optional, Sequence, Tuple

from ..inputs import Snapshot
from ..rolling import Window, linear_slope
from .results import KvQueue

MIN_SLOPE_PER_SECOND = 1e-4
HORIZON_SECONDS = 3600.0
MIN_CEILING = 2.0  # a learned ceiling counts from this many requests in one batch
CEILING_HORIZON = 6 * 3600.0  # the learned ceiling is the highest uncontended batch this long back
_BUCKET = 60.0  # the learned ceiling keeps one maximum per minute


class Cause(NamedTuple):
    kv_bound: Optional[float]  # waiters held back by the KV cache
    batch_bound: Optional[float]  # waiters behind a full batch
    cause: Optional[str]  # kv_usage, kv_batch, batch_full, none


def classify(usage: Optional[float], running: Optional[float], candidates: Optional[float],
             ceiling: Optional[float], warn: float, batch_room: float) -> Cause:
    """Why the capacity waiters wait (see the module docstring)."""
    if candidates is None or usage is None:
        return Cause(None, None, None)
    if candidates <= 0:
        return Cause(0.0, 0.0, "none")
    if usage >= warn:
        return Cause(candidates, 0.0, "kv_usage")
    if ceiling is not None and running is not None and running < batch_room * ceiling:
        return Cause(candidates, 0.0, "kv_batch")
    return Cause(0.0, candidates, "batch_full")


def _candidates(snap: Snapshot, model: str) -> Optional[float]:
    """Requests waiting for scheduling capacity: vLLM's reason=capacity, else (old releases) every
    waiting request."""
    if snap.present("waiting_by_reason"):
        return sum(v for _e, x, v in snap.by_model.get(("waiting_by_reason", model), ()) if x == "capacity")
    if snap.present("waiting"):
        return sum(snap.gauge("waiting", model))
    return None


def _gauges(snap: Snapshot, model: str) -> Tuple[Optional[float], Optional[float]]:
    usage = None
    if snap.present("kv_usage"):
        vals = snap.gauge("kv_usage", model)
        usage = max(vals) if vals else None
    running = sum(snap.gauge("running", model)) if snap.present("running") else None
    return usage, running


class _Poll(NamedTuple):
    t: float
    usage: Optional[float]
    held: bool
    preempted: bool


class CapacityTracker:
    """Per model: the learned batch ceiling and, per poll, what the window's shares are made of.
    Fed one snapshot per poll (``observe``); ``window`` seconds of polls are kept."""

    def __init__(self, window: float, warn: float, batch_room: float, max_num_seqs: float = 0.0,
                 horizon: float = CEILING_HORIZON) -> None:
        self.window = window
        self.warn = warn
        self.batch_room = batch_room
        self.max_num_seqs = max_num_seqs
        self.horizon = horizon
        self._polls: Dict[str, Deque[_Poll]] = {}
        self._peaks: Dict[str, Deque[Tuple[float, float]]] = {}  # (minute, highest uncontended batch)
        self._preempt_total: Dict[str, float] = {}
        self.last_t: Optional[float] = None

    def reset(self) -> None:
        self._polls.clear()
        self._preempt_total.clear()
        self.last_t = None

    def ceiling(self, model: str, now: float) -> Tuple[Optional[float], Optional[str]]:
        if self.max_num_seqs and self.max_num_seqs > 0:
            return float(self.max_num_seqs), "config"
        peaks = self._peaks.get(model)
        if peaks:
            while peaks and peaks[0][0] < now - self.horizon:
                peaks.popleft()
            best = max((v for _t, v in peaks), default=0.0)
            if best >= MIN_CEILING:
                return best, "learned"
        return None, None

    def observe(self, snap: Snapshot) -> None:
        t = snap.t
        if self.last_t is not None and t < self.last_t:  # the clock went back: start again
            self.reset()
        self.last_t = t
        for model in snap.models:
            usage, running = _gauges(snap, model)
            cand = _candidates(snap, model)
            ceiling, _src = self.ceiling(model, t)
            c = classify(usage, running, cand, ceiling, self.warn, self.batch_room)
            preempted = False
            if snap.present("preemptions"):
                total = sum(snap.gauge("preemptions", model))
                prev = self._preempt_total.get(model)
                preempted = prev is not None and total > prev
                self._preempt_total[model] = total
            polls = self._polls.setdefault(model, deque())
            polls.append(_Poll(t, usage, bool(c.kv_bound), preempted))
            while polls and polls[0].t <= t - self.window:
                polls.popleft()
            if cand == 0 and running is not None:  # uncontended: the batch is what traffic asked for
                minute = t - t % _BUCKET
                peaks = self._peaks.setdefault(model, deque())
                if peaks and peaks[-1][0] == minute:
                    if running > peaks[-1][1]:
                        peaks[-1] = (minute, running)
                else:
                    peaks.append((minute, running))
        for model in [m for m in self._polls if m not in snap.models]:
            polls = self._polls[model]
            while polls and polls[0].t <= t - self.window:
                polls.popleft()
            if not polls:
                del self._polls[model]

    def stats(self, model: str, now: float) -> Tuple[Optional[float], Optional[float], Optional[float], Optional[float]]:
        """Over the window ending at ``now``: peak usage, and the shares of polls with usage at the
        warn level, with requests held back by the cache, with a preemption."""
        polls = [p for p in self._polls.get(model, ()) if now - self.window < p.t <= now]
        if not polls:
            return None, None, None, None
        usages = [p.usage for p in polls if p.usage is not None]
        n = len(polls)
        peak = max(usages) if usages else None
        warn = sum(1 for u in usages if u >= self.warn) / len(usages) if usages else None
        held = sum(1 for p in polls if p.held) / n
        # the first poll of a model has no earlier total to compare: it counts from the second
        pre = sum(1 for p in polls[1:] if p.preempted) / (n - 1) if n > 1 else None
        return peak, warn, held, pre


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


def kv_and_queue(view: Window, model: str, warn: float, batch_room: float,
                 tracker: Optional[CapacityTracker] = None, max_num_seqs: float = 0.0) -> KvQueue:
    latest = view.latest
    usage, running = _gauges(latest, model)
    waiting = sum(latest.gauge("waiting", model)) if latest.present("waiting") else None
    # Requests held back for KV capacity. vLLM's reason="capacity" counts every request waiting for
    # scheduling capacity (a full batch as well as a full cache, all but the deferred ones); older
    # vLLM does not say why requests wait at all. Either way they are the cache's doing while the
    # cache is at the warn level or the batch has room (``classify``); behind a full batch they
    # wait for the batch, not for KV.
    if tracker is not None:
        ceiling, source = tracker.ceiling(model, latest.t)
    elif max_num_seqs and max_num_seqs > 0:
        ceiling, source = float(max_num_seqs), "config"
    else:
        ceiling, source = None, None
    cause = classify(usage, running, _candidates(latest, model), ceiling, warn, batch_room)
    waiting_capacity = cause.kv_bound
    peak = warn_share = held_share = pre_share = None
    if tracker is not None:
        peak, warn_share, held_share, pre_share = tracker.stats(model, latest.t)
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
        wait_cause=cause.cause,
        waiting_for_batch=cause.batch_bound,
        batch_ceiling=ceiling,
        ceiling_source=source,
        usage_peak=peak,
        warn_poll_ratio=warn_share,
        capacity_wait_poll_ratio=held_share,
        preempting_poll_ratio=pre_share,
    )
