"""The typed results of the derivations: one small frozen dataclass per signal family.

``None`` means "nothing to say" (an input is missing, no request finished in the window): the
collector leaves it out, never reports 0. The poll loop, the baseline learner, the console view
and the collectors all read these fields by name in code, never by searching a list.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional, Tuple

QUANTILES = (0.5, 0.95, 0.99)


@dataclass(frozen=True)
class Distribution:
    """A windowed distribution from one of vLLM's histograms, shaped like a client library's
    summary: quantiles over the window, ``count``/``sum`` cumulative (vLLM's own totals, all
    engines summed)."""

    quantiles: Tuple[Tuple[float, float], ...]  # (q, value) for the QUANTILES that have a value
    count: float
    sum: float
    bounded: Tuple[float, ...] = ()  # quantiles known only as "at most": the first bucket's bound

    def at(self, q: float) -> Optional[float]:
        return dict(self.quantiles).get(q)


@dataclass(frozen=True)
class Throughput:
    generation_tokens_per_second: Optional[float] = None
    prompt_tokens_per_second: Optional[float] = None
    preemptions_per_second: Optional[float] = None
    corrupted_requests_per_second: Optional[float] = None
    admission_rejections_per_second: Optional[float] = None
    finished_per_second: Mapping[str, float] = field(default_factory=dict)  # by finished_reason
    error_ratio: Optional[float] = None


@dataclass(frozen=True)
class KvQueue:
    usage: Optional[float] = None
    pressure_level: Optional[int] = None
    seconds_to_full: Optional[float] = None
    running: Optional[float] = None
    waiting: Optional[float] = None
    waiting_for_capacity: Optional[float] = None


@dataclass(frozen=True)
class Latency:
    ttft: Optional[Distribution] = None
    ttft_mean: Optional[float] = None
    itl: Optional[Distribution] = None
    e2e: Optional[Distribution] = None
    queue_time: Optional[Distribution] = None
    ttft_slo_attainment: Optional[float] = None
    itl_slo_attainment: Optional[float] = None


@dataclass(frozen=True)
class Prompts:
    length: Optional[Distribution] = None
    long_per_second: Optional[float] = None
    long_ratio: Optional[float] = None


@dataclass(frozen=True)
class Caches:
    prefix_cache_hit_ratio: Optional[float] = None
    spec_decode_acceptance_ratio: Optional[float] = None


@dataclass(frozen=True)
class BusyLow:
    """GPU busy, tokens low: the threshold in force and the verdict."""

    baseline: Optional[float]  # the learned normal; None before enough busy history
    threshold: float  # baseline x fraction, or the floor
    flagged: bool


@dataclass(frozen=True)
class ModelSignals:
    model: str
    throughput: Throughput
    kv: KvQueue
    latency: Latency
    prompts: Prompts
    caches: Caches
    stalled: Optional[bool] = None
    busy_low: Optional[BusyLow] = None


@dataclass(frozen=True)
class Signals:
    """Everything derived from one poll's window."""

    gpu_mean_utilization: Optional[float] = None
    models: Tuple[ModelSignals, ...] = ()

    def model(self, name: str) -> Optional[ModelSignals]:
        return next((m for m in self.models if m.model == name), None)
