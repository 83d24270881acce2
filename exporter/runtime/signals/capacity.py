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

It also makes the alerting pack's held-back signal at every poll (``HeldBackRule``, the SLO file's
windows and share): the share of polls with requests held back by the cache over the window, 1
while preempting (within ``windows.sustain``) with that share at ``kv_cache.held_back_share``
within ``windows.held_back``, or while rejecting requests (within ``windows.rate``); then its mean
over ``windows.held_back`` and over ``windows.episode_recent`` (the chronic overload's share), both
served once the polls reach back over the whole of ``windows.held_back``, as the pack asks for a
replica's whole window (a gap in the polls longer than that window starts it again). The pack
reads those two where the sidecar serves them, and makes the same from raw series only for pods
without it.

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

import math
from collections import deque
from typing import Deque, Dict, List, NamedTuple, Optional, Sequence, Tuple

from ..inputs import Snapshot
from ..rolling import Window, linear_slope
from .results import KvQueue

MIN_SLOPE_PER_SECOND = 1e-4
HORIZON_SECONDS = 3600.0
MIN_CEILING = 2.0  # a learned ceiling counts from this many requests in one batch
CEILING_HORIZON = 6 * 3600.0  # the learned ceiling is the highest uncontended batch this long back
_BUCKET = 60.0  # the learned ceiling keeps one maximum per minute
_PROCESSES = 4  # counter totals are kept for this many vLLM processes per model (two behind a URL, restarts)


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


class HeldBackRule(NamedTuple):
    """The pack's held-back signal, in seconds and a share (from the SLO file, see the module
    docstring)."""
    window: float = 120.0  # windows.held_back
    recent: float = 600.0  # windows.episode_recent
    share: float = 0.75  # kv_cache.held_back_share
    preempting: float = 120.0  # windows.sustain
    rejecting: float = 300.0  # windows.rate


class _Held(NamedTuple):
    t: float
    share: float  # the share of the window's polls with requests held back by the cache
    value: float  # that share, 1 while preempting or rejecting as the rule says


class CapacityTracker:
    """Per model: the learned batch ceiling and, per poll, what the window's shares are made of.
    Fed one snapshot per poll (``observe``); ``window`` seconds of polls are kept."""

    def __init__(self, window: float, warn: float, batch_room: float, max_num_seqs: float = 0.0,
                 horizon: float = CEILING_HORIZON, rule: Optional[HeldBackRule] = None) -> None:
        self.window = window
        self.warn = warn
        self.batch_room = batch_room
        self.max_num_seqs = max_num_seqs
        self.horizon = horizon
        self.rule = rule or HeldBackRule()
        self._polls: Dict[str, Deque[_Poll]] = {}
        self._peaks: Dict[str, Deque[Tuple[float, float]]] = {}  # (minute, highest uncontended batch)
        self._preempt_total: Dict[str, Dict[Optional[float], float]] = {}  # model -> process start -> total
        self._reject_total: Dict[str, Dict[Optional[float], float]] = {}
        self._last_event: Dict[Tuple[str, str], float] = {}  # (model, "preempted"|"rejected") -> when seen
        self._held: Dict[str, Deque[_Held]] = {}
        self._held_sum: Dict[str, float] = {}  # the sum of the values kept in _held, per model
        self._since: Dict[str, float] = {}  # when the model's polls began, without a gap longer than the window
        self.last_t: Optional[float] = None

    def reset(self) -> None:
        self._polls.clear()
        self._preempt_total.clear()
        self._reject_total.clear()
        self._last_event.clear()
        self._held.clear()
        self._held_sum.clear()
        self._since.clear()
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
            preempted = _grew(self._preempt_total, snap, "preemptions", model)
            if _grew(self._reject_total, snap, "admission_rejections", model):
                self._last_event[(model, "rejected")] = t
            if preempted:
                self._last_event[(model, "preempted")] = t
            polls = self._polls.setdefault(model, deque())
            polls.append(_Poll(t, usage, bool(c.kv_bound), preempted))
            while polls and polls[0].t <= t - self.window:
                polls.popleft()
            self._hold(model, t, sum(1 for p in polls if p.held) / len(polls))
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
        for model in [m for m in self._held if m not in snap.models]:
            held = self._held[model]
            while held and held[0].t <= t - max(self.rule.recent, self.rule.window):
                self._held_sum[model] -= held.popleft().value
            if not held:  # gone for the whole window: forget it
                del self._held[model]
                self._held_sum.pop(model, None)
                self._since.pop(model, None)
                self._preempt_total.pop(model, None)
                self._reject_total.pop(model, None)
                self._last_event.pop((model, "preempted"), None)
                self._last_event.pop((model, "rejected"), None)

    def _hold(self, model: str, t: float, share: float) -> None:
        """The held-back signal at this poll (see the module docstring), kept for its two means."""
        r = self.rule
        held = self._held.setdefault(model, deque())
        if held and t - held[-1].t > r.window:  # a gap longer than the window: start again
            held.clear()
        if not held:
            self._since[model] = t
        peak = share
        for h in reversed(held):  # the newest first, as far back as the window
            if h.t <= t - r.window:
                break
            peak = max(peak, h.share)
        preempting = t - self._last_event.get((model, "preempted"), -math.inf) < r.preempting
        rejecting = t - self._last_event.get((model, "rejected"), -math.inf) < r.rejecting
        flag = (preempting and peak >= r.share) or rejecting
        value = min(share + (1.0 if flag else 0.0), 1.0)
        held.append(_Held(t, share, value))
        total = (self._held_sum.get(model, 0.0) if len(held) > 1 else 0.0) + value
        while held and held[0].t <= t - max(r.recent, r.window):
            total -= held.popleft().value
        self._held_sum[model] = total

    def held_back(self, model: str, now: float) -> Tuple[Optional[float], Optional[float]]:
        """The held-back signal's mean over ``rule.window`` and over ``rule.recent``, ending at
        ``now``: both once the polls reach back over the whole of ``rule.window``."""
        held = self._held.get(model)
        if not held:
            return None, None
        r = self.rule
        if self._since[model] > now - r.window:  # not yet a whole window: neither
            return None, None
        if now == held[-1].t:  # as the poll loop asks: the longer window is all that is kept
            short, n_short = 0.0, 0
            for h in reversed(held):
                if h.t <= now - min(r.window, r.recent):
                    break
                short, n_short = short + h.value, n_short + 1
            whole = max(0.0, min(1.0, self._held_sum[model] / len(held)))
            short_mean = short / n_short
            return (short_mean, whole) if r.window <= r.recent else (whole, short_mean)
        window: List[float] = []
        recent: List[float] = []
        for h in reversed(held):  # the newest first
            if h.t > now:
                continue
            if h.t <= now - r.recent and h.t <= now - r.window:
                break
            if h.t > now - r.window:
                window.append(h.value)
            if h.t > now - r.recent:
                recent.append(h.value)
        if not window:
            return None, None
        return sum(window) / len(window), sum(recent) / len(recent)

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


def _grew(totals: Dict[str, Dict[Optional[float], float]], snap: Snapshot, key: str, model: str) -> bool:
    """Whether a counter input of ``model`` grew since the last poll that showed it from the same
    vLLM process (two processes behind one URL each keep their own total, as the windows do; a
    restart, a new process, counts from its second page); ``totals`` keeps the last total per
    process start time, of the last few processes."""
    if not snap.present(key):
        return False
    total = sum(v for _e, _x, v in snap.by_model.get((key, model), ()))
    per_process = totals.setdefault(model, {})
    prev = per_process.pop(snap.process_start, None)
    per_process[snap.process_start] = total  # the newest last
    while len(per_process) > _PROCESSES:
        del per_process[next(iter(per_process))]
    return prev is not None and total > prev


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
    peak = warn_share = held_share = pre_share = held_back = held_recent = None
    if tracker is not None:
        peak, warn_share, held_share, pre_share = tracker.stats(model, latest.t)
        held_back, held_recent = tracker.held_back(model, latest.t)
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
        held_back_ratio=held_back,
        held_back_recent_ratio=held_recent,
    )
