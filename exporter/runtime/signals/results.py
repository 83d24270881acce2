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
class Availability:
    """The availability SLI's counters since the sidecar's first page (``availability``)."""

    requests_total: Optional[float] = None
    errors_total: Mapping[str, float] = field(default_factory=dict)  # by source: engine, http


@dataclass(frozen=True)
class KvQueue:
    usage: Optional[float] = None
    pressure_level: Optional[int] = None
    seconds_to_full: Optional[float] = None
    running: Optional[float] = None
    waiting: Optional[float] = None
    waiting_for_capacity: Optional[float] = None  # held back by the KV cache (any cause below)
    # why requests wait for capacity now: "kv_usage" (cache at the warn level), "kv_batch" (the
    # batch runs far below its ceiling: the next request does not fit), "batch_full" (the batch is
    # at its ceiling: not the cache), "none" (nobody waits for capacity)
    wait_cause: Optional[str] = None
    waiting_for_batch: Optional[float] = None  # capacity waiters explained by a full batch
    batch_ceiling: Optional[float] = None  # the replica's batch ceiling in force
    ceiling_source: Optional[str] = None  # "config" (max_num_seqs given) or "learned" (uncontended polls)
    # over the sidecar's window, from every poll (what a 15-60 s scrape cannot sample)
    usage_peak: Optional[float] = None
    warn_poll_ratio: Optional[float] = None  # share of polls with usage at or above the warn level
    capacity_wait_poll_ratio: Optional[float] = None  # share of polls with requests held back by the cache
    preempting_poll_ratio: Optional[float] = None  # share of polls that saw a preemption
    # the pack's held-back signal made at every poll (capacity.HeldBackRule): its mean over
    # windows.held_back (once the polls span it) and over windows.episode_recent
    held_back_ratio: Optional[float] = None
    held_back_recent_ratio: Optional[float] = None


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
    spec_decode_mean_accepted_length: Optional[float] = None  # 1 + accepted / drafts: tokens per verify step
    spec_decode_position_acceptance: Optional[Mapping[str, float]] = None  # by draft position: accepted / drafts


@dataclass(frozen=True)
class KvTransfer:
    """The KV connector's health (prefill/decode disaggregation), over the window; every field
    None where the page has no such series (no connector, or a connector without it)."""

    failure_ratio: Optional[float] = None  # failed / (failed + completed) transfers
    failures_per_second: Optional[Mapping[str, float]] = None  # kind: transfer, notification
    transfer_seconds: Optional[Distribution] = None
    post_seconds: Optional[Distribution] = None
    bytes_per_second: Optional[float] = None
    transfers_per_second: Optional[float] = None
    expired_per_second: Optional[float] = None  # KV leases expired before the consumer read them
    notifications_after_expiry_per_second: Optional[float] = None
    waiting_fetch: Optional[Mapping[str, float]] = None  # requests waiting on an async KV fetch, by stage
    prompt_tokens_transferred_ratio: Optional[float] = None  # source external_kv_transfer / all sources
    external_prefix_cache_hit_ratio: Optional[float] = None


@dataclass(frozen=True)
class BusyLow:
    """GPU busy, tokens low: the threshold in force and the verdict."""

    baseline: Optional[float]  # the learned normal; None before enough busy history
    threshold: float  # baseline x fraction, or the floor
    flagged: bool


@dataclass(frozen=True)
class LoraAdapter:
    """One LoRA adapter vLLM has had requests for since it started.

    vLLM 0.32 says which adapters have requests, never how many. ``active``: the adapter has at
    least one request waiting or running now. ``running``/``waiting``: which of the two, only
    when vLLM tells them apart (see ``Lora.distinguished``); None otherwise."""

    name: str
    active: bool
    running: Optional[bool] = None
    waiting: Optional[bool] = None


@dataclass(frozen=True)
class Lora:
    """vLLM's LoRA state now, for the whole pod (vLLM's LoRA metric has no model or engine).

    ``adapters``: every adapter known (had a request since vLLM started), at most
    ``max_label_values`` of them, by name; the counts include any left out by that cap.
    ``distinguished``: some series on the page lists different adapters as running and as
    waiting, so the two labels mean what they say. vLLM 0.32 fills both labels from the same
    table (every adapter with a request in flight, running or waiting), so on its pages they never
    differ and running/waiting are None."""

    max_adapters: Optional[int]  # vLLM's max_lora: the most adapters in one batch
    adapters: Tuple[LoraAdapter, ...]
    known: int
    active: int
    running: Optional[int] = None
    waiting: Optional[int] = None
    distinguished: bool = False

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
    kv_transfer: KvTransfer = KvTransfer()
    sleep_level: Optional[int] = None  # 0 awake, 1 weights offloaded, 2 discard all; None: vLLM does not say
    availability: Availability = Availability()

    @property
    def sleeping(self) -> bool:
        return bool(self.sleep_level)


@dataclass(frozen=True)
class Signals:
    """Everything derived from one poll's window."""

    gpu_mean_utilization: Optional[float] = None
    models: Tuple[ModelSignals, ...] = ()
    lora: Optional[Lora] = None  # None: vLLM serves no LoRA state (LoRA off, or no request yet)
    role: Optional[str] = None  # the replica's role as given (prefill, decode, both); None: not known
    role_conflicts: Tuple[str, ...] = ()  # why vLLM's page contradicts the role (reasons, sorted)

    def model(self, name: str) -> Optional[ModelSignals]:
        return next((m for m in self.models if m.model == name), None)
