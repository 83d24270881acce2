"""Anomalies: a stalled engine, and "GPU busy, tokens low" against the throughput this pod
normally makes while busy (``Baseline``, learned by the poll loop from healthy samples only)."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Deque, Dict, Iterable, Optional, Sequence, Tuple

from ..inputs import Snapshot
from ..rolling import windows_over
from .results import BusyLow


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
    """Requests running throughout the last ``stall_seconds`` and not one token produced.

    None when the history does not yet cover the stall time or the inputs are missing. (The poll
    loop asks its own ``rolling.Window.stalled``, which keeps this answer up to date per poll.)
    """
    if not snaps:
        return None
    return windows_over(snaps, window=max(stall_seconds, 1.0)).view(now).stalled(model, stall_seconds)


def busy_low(model: str, gen: Optional[float], util: Optional[float], baseline: Optional[Baseline], *,
             busy_utilization: float, low_fraction: float, floor: float, min_busy_seconds: float,
             quantile: float) -> Optional[BusyLow]:
    """The verdict and the threshold it used; None without a throughput or a GPU reading."""
    if gen is None or util is None:
        return None
    learned = None
    if baseline is not None and baseline.busy_seconds(model) >= min_busy_seconds:
        learned = baseline.value(model, quantile)
    threshold = low_fraction * learned if learned is not None else floor
    return BusyLow(baseline=learned, threshold=threshold, flagged=util >= busy_utilization and gen < threshold)
