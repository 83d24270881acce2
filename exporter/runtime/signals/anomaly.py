"""Anomalies: a stalled engine, a sleeping one, and "GPU busy, tokens low" against the throughput
this pod normally makes while busy (``Baseline``, learned by the poll loop from healthy samples
only).

A stalled engine (``rolling.Window.stalled``): for the stall time, either requests running and not
one token produced, or a wedged engine: requests waiting, none running, no engine iteration
(``vllm:iteration_tokens_total``'s count unchanged, where vLLM serves it) and no token. vLLM's own
``/health`` answers 200 on a hung engine (vLLM issues 39863 and 36451), so only the counters tell.

A sleeping engine (``vllm:engine_sleep_state``: ``awake`` 0; level 1 weights offloaded, level 2
everything discarded; ``sleep_level``) is neither stalled nor "GPU busy, tokens low", and never
spare capacity either: the derivations say it sleeps and flag nothing.

"GPU busy, tokens low" compares the work the replica's role does: generation tokens/s for a
decode replica or one that does both, prompt tokens/s for a prefill instance (which makes almost
no output tokens by design). The threshold is ``low_fraction`` of the learned baseline; until one
is learned, of the planned per-replica rate (``gpu_busy_low.planned_tokens_per_second``, or the
prefill plan) once the window is full (a pod's first seconds, its warm-up, are judged by the floor
alone), never below the floor. The baseline never learns from a poll the sidecar itself
reports as degraded (``learnable``): KV pressure saturated or thrashing, requests held back by the
cache, a long-prompt surge, a stalled or sleeping engine, or the flag itself. Otherwise a sidecar
that starts during a flood (or whose first busy minutes are the flood) learns the flood as normal
and never flags it."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Deque, Dict, Iterable, List, Optional, Sequence, Tuple

from ..inputs import Snapshot
from ..rolling import windows_over
from .results import BusyLow, ModelSignals


@dataclass
class Baseline:
    """Generation throughput seen while the GPUs were busy, per model, over a long horizon.

    It is state, but owned by one sidecar and passed in and out explicitly. ``record`` keeps at
    most one sample per ``spacing`` seconds, so six hours cost a few thousand floats per model.
    """

    horizon: float
    spacing: float = 10.0
    samples: Dict[str, Deque[Tuple[float, float]]] = field(default_factory=dict)
    _cache: Dict[Tuple[str, float], float] = field(default_factory=dict, repr=False)

    def record(self, model: str, t: float, tokens_per_second: float) -> None:
        if not math.isfinite(tokens_per_second) or tokens_per_second < 0:
            return  # never learn from an impossible number
        q = self.samples.setdefault(model, deque())
        if q and t - q[-1][0] < self.spacing:
            return
        q.append((t, tokens_per_second))
        while q and q[0][0] < t - self.horizon:
            q.popleft()
        self._cache = {k: v for k, v in self._cache.items() if k[0] != model}

    def forget_old(self, now: float, max_models: int) -> None:
        """Drop models with no sample within the horizon, then the stalest beyond ``max_models``
        (models come and go over days; the baseline must not keep them all)."""
        for m in [m for m, q in self.samples.items() if not q or q[-1][0] < now - self.horizon]:
            del self.samples[m]
        if len(self.samples) > max_models:
            for m in sorted(self.samples, key=lambda m: self.samples[m][-1][0])[: len(self.samples) - max_models]:
                del self.samples[m]
        self._cache = {}

    def busy_seconds(self, model: str) -> float:
        return len(self.samples.get(model, ())) * self.spacing

    def value(self, model: str, quantile: float) -> Optional[float]:
        q = self.samples.get(model)
        if not q:
            return None
        v = self._cache.get((model, quantile))
        if v is None:  # sorted once per new sample (one per ``spacing`` seconds), not per poll
            v = self._cache[(model, quantile)] = percentile([x for _, x in q], quantile)
        return v


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method)."""
    vals = sorted(values)
    if not vals:
        return math.nan
    pos = q * (len(vals) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(vals) - 1)
    return vals[lo] + (vals[hi] - vals[lo]) * (pos - lo)


def mean_utilization(util_history: Iterable[Tuple[float, float]], now: float, window: float) -> Optional[float]:
    vals = [u for t, u in util_history if now - window <= t <= now]
    return sum(vals) / len(vals) if vals else None


def engine_stalled(snaps: Sequence[Snapshot], now: float, stall_seconds: float, model: str) -> Optional[bool]:
    """Requests running throughout the last ``stall_seconds`` and not one token produced, or a
    wedged engine (requests waiting, none running, no iteration and no token; see the module
    docstring).

    None when the history does not yet cover the stall time or the inputs are missing. (The poll
    loop asks its own ``rolling.Window.stalled``, which keeps this answer up to date per poll.)
    """
    if not snaps:
        return None
    return windows_over(snaps, window=max(stall_seconds, 1.0)).view(now).stalled(model, stall_seconds)


def busy_low(model: str, gen: Optional[float], util: Optional[float], baseline: Optional[Baseline], *,
             busy_utilization: float, low_fraction: float, floor: float, min_busy_seconds: float,
             quantile: float, planned: float = 0.0, sleeping: bool = False) -> Optional[BusyLow]:
    """The verdict and the threshold it used; None without a throughput or a GPU reading.
    ``gen``: the throughput of the replica's work (see the module docstring); ``planned``: the
    planned per-replica rate (0: none) used while no baseline is learned."""
    if gen is None or util is None:
        return None
    learned = None
    if baseline is not None and baseline.busy_seconds(model) >= min_busy_seconds:
        learned = baseline.value(model, quantile)
    if learned is not None:
        threshold = low_fraction * learned
    else:
        threshold = max(floor, low_fraction * planned) if planned > 0 else floor
    flagged = util >= busy_utilization and gen < threshold and not sleeping
    return BusyLow(baseline=learned, threshold=threshold, flagged=flagged)


def work_rate(m: ModelSignals, role: str) -> Optional[float]:
    """The throughput that measures a replica's work: prompt tokens/s on a prefill instance,
    generation tokens/s otherwise."""
    tp = m.throughput
    return tp.prompt_tokens_per_second if role == "prefill" else tp.generation_tokens_per_second


def degraded(m: ModelSignals, long_prompt_rate: float) -> List[str]:
    """What the sidecar itself reports as wrong with this model now (empty when nothing): the
    polls a baseline must never learn from."""
    out = []
    kv = m.kv
    if kv.pressure_level is not None and kv.pressure_level >= 2:
        out.append("kv_pressure")
    if (kv.waiting_for_capacity or 0) > 0:
        out.append("held_back")
    if long_prompt_rate > 0 and (m.prompts.long_per_second or 0) > long_prompt_rate:
        out.append("long_prompt_surge")
    if m.stalled:
        out.append("stalled")
    if m.sleeping:
        out.append("sleeping")
    if m.busy_low is not None and m.busy_low.flagged:
        out.append("busy_low")
    return out


def learnable(m: ModelSignals, util: Optional[float], busy_utilization: float, role: str,
              long_prompt_rate: float) -> Optional[float]:
    """The throughput the baseline may learn from this poll, or None: only while the GPUs are
    busy and the sidecar reports nothing degraded (``degraded``)."""
    if util is None or util < busy_utilization:
        return None
    rate = work_rate(m, role)
    # long prompts are a prefill instance's ordinary work, never a reason to stop learning there
    if rate is None or degraded(m, 0.0 if role == "prefill" else long_prompt_rate):
        return None
    return rate


def sleep_level(snap: Snapshot, model: str) -> Optional[int]:
    """0 awake, 1 weights offloaded, 2 everything discarded; None where vLLM does not say. With
    several engines, the lowest level: the model sleeps only when every engine sleeps."""
    if not snap.present("sleep_state"):
        return None
    engines: Dict[str, Dict[str, float]] = {}
    for e, state, v in snap.by_model.get(("sleep_state", model), ()):
        engines.setdefault(e, {})[state] = v
    levels = []
    for states in engines.values():
        if states.get("awake", 1.0) >= 1.0:
            levels.append(0)
        elif states.get("discard_all", 0.0) >= 1.0:
            levels.append(2)
        else:
            levels.append(1)  # asleep: weights offloaded (or a level vLLM does not name)
    return min(levels) if levels else None
