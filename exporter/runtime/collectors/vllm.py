"""The vLLM collector: the derived signals of every model as metric families.

``DERIVED`` is the one table of every derived series per model: its name (without the prefix),
help text, extra labels and how to read it from a ``ModelSignals``; ``POD_DERIVED`` the same for
the series without model_name, read from ``Signals`` (the GPUs' mean utilization, LoRA). Distributions are served as summaries
(windowed quantiles plus cumulative ``_sum`` and ``_count``, as client libraries serve windowed
quantiles), so ``promtool check metrics`` accepts the output.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter
from typing import Callable, Dict, Iterator, List, NamedTuple, Optional, Tuple

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..signals import Distribution, Lora, ModelSignals, Signals
from .base import PREFIX


@dataclass(frozen=True)
class Series:
    """One derived series per model. ``read`` is where its value is in a ``ModelSignals``: a
    field path (``"kv.usage"``, kept in ``at`` so the console can read the page back into the
    same field) or, for a value made of several fields, a function. ``help`` is served on
    /metrics and is the row's meaning in the README and docs/interface.md (``make docs``), so
    it is written for readers."""

    help: str
    read: Callable[[ModelSignals], object]
    extra: Tuple[str, ...] = ()  # labels besides model_name
    summary: bool = False  # ``read`` gives a Distribution
    counter: bool = False  # a counter (its name ends in _total), not a gauge
    section: str = "vllm"  # the README's metric table it is a row of (``metric_docs.SECTIONS``)
    at: Optional[Tuple[str, str]] = field(default=None, init=False)  # (part, field) when ``read`` is a path

    def __post_init__(self) -> None:
        if isinstance(self.read, str):
            part, name = self.read.split(".")
            object.__setattr__(self, "at", (part, name))
            object.__setattr__(self, "read", attrgetter(self.read))


def _flag(v: Optional[bool]) -> Optional[float]:
    return None if v is None else (1.0 if v else 0.0)


DERIVED: Dict[str, Series] = {
    "generation_tokens_per_second": Series("Output tokens per second over the window, all engines summed, counter resets handled.",
                                           "throughput.generation_tokens_per_second"),
    "prompt_tokens_per_second": Series("Prompt (prefill) tokens per second over the window.",
                                       "throughput.prompt_tokens_per_second"),
    "requests_finished_per_second": Series("Finished requests per second over the window, by vLLM's finished_reason.",
                                           "throughput.finished_per_second", ("finished_reason",)),
    "request_error_ratio": Series("Requests finished with reason error over all finished requests except client aborts, over the window.",
                                  "throughput.error_ratio"),
    "availability_requests_total": Series("Requests the availability SLI counts since the sidecar started, as the pack's SLI does (availability_sli): the counted handlers' HTTP answers except 4xx (on a page of one model), else vLLM's finished requests except client aborts; "
                                          "what grew at each poll, counter resets, restarts and lazily created series handled as for every rate. The pack reads its rate where the sidecar serves it.",
                                          "availability.requests_total", counter=True),
    "availability_errors_total": Series("Failed requests the availability SLI counts since the sidecar started, by source: engine (vLLM's requests finished with reason error), http (the counted handlers' 5xx answers); "
                                        "availability_sli engine serves the first, http the second, combined both (the pack takes the larger rate). On a page with several models, engine only: HTTP answers carry no model.",
                                        "availability.errors_total", ("source",), counter=True),
    "corrupted_requests_per_second": Series("Requests with NaN logits per second (only when vLLM counts them).",
                                            "throughput.corrupted_requests_per_second"),
    "admission_rejections_per_second": Series("Requests rejected by vLLM's queue limits per second.",
                                              "throughput.admission_rejections_per_second"),
    "preemptions_per_second": Series("Preemptions per second over the window.", "throughput.preemptions_per_second"),
    "kv_cache_usage_ratio": Series("KV-cache usage 0-1, the highest engine, whichever name vLLM uses.", "kv.usage"),
    "kv_cache_pressure_level": Series("0 ok, 1 elevated (usage at or above the warn threshold), 2 saturated (requests waiting for KV capacity or admissions rejected), 3 thrashing (preempting).",
                                      "kv.pressure_level"),
    "kv_cache_seconds_to_full": Series("Predicted seconds until the KV cache is full at the window's linear trend; only for a real rising trend: "
                                       "slope at least 0.0001/s, requests running, not already full, prediction within 3600 s; absent otherwise.",
                                       "kv.seconds_to_full"),
    "requests_running": Series("Requests in the running batch, all engines summed.", "kv.running"),
    "requests_waiting": Series("Requests waiting to be scheduled, all engines summed.", "kv.waiting"),
    "requests_waiting_for_capacity": Series("Waiting requests held back by the KV cache: vLLM's reason=capacity waiters (on older releases every waiting request) while KV usage is at or above the warn threshold, or while the batch runs below batch_room of its ceiling (the next request does not fit, whatever the usage reads); 0 when the batch is at its ceiling (see requests_waiting_for_batch).", "kv.waiting_for_capacity"),
    "requests_waiting_for_batch": Series("Requests waiting for capacity behind a batch at its ceiling (not the KV cache's doing).",
                                         "kv.waiting_for_batch"),
    "capacity_wait_cause": Series("1 for the explanation of the capacity waiters now: kv_usage (cache at the warn level), kv_batch (batch below its ceiling: the KV cache holds them back), batch_full (batch at its ceiling), none (nobody waits for capacity).",
                                  lambda m: {m.kv.wait_cause: 1.0} if m.kv.wait_cause else None, ("cause",)),
    "batch_ceiling_requests": Series("The batch ceiling the capacity explanation uses: max_num_seqs when configured (source=config), else the highest batch of the polls where nothing waited for capacity over the last hours (source=learned); absent while unknown.",
                                     lambda m: {m.kv.ceiling_source: m.kv.batch_ceiling} if m.kv.batch_ceiling is not None else None,
                                     ("source",)),
    "kv_cache_usage_peak_ratio": Series("Highest KV-cache usage of every poll in the window (the saw-tooth a scrape misses).",
                                        "kv.usage_peak"),
    "kv_cache_warn_poll_ratio": Series("Share of the window's polls with KV-cache usage at or above the warn threshold.",
                                       "kv.warn_poll_ratio"),
    "kv_cache_capacity_wait_poll_ratio": Series("Share of the window's polls at which requests were held back by the KV cache (requests_waiting_for_capacity above 0).",
                                                "kv.capacity_wait_poll_ratio"),
    "preemption_poll_ratio": Series("Share of the window's polls that saw vLLM preempt a request (preemptions as events, whatever the scrape interval).",
                                    "kv.preempting_poll_ratio"),
    "kv_cache_held_back_ratio": Series("The KV alert's held-back signal made at every poll, averaged over the SLO's windows.held_back: at each poll the share of the window's polls with requests held back by the cache, 1 while preempting (within windows.sustain) with that share at kv_cache.held_back_share within windows.held_back, or rejecting requests (within windows.rate); absent until the polls reach back over the whole window.",
                                       "kv.held_back_ratio"),
    "kv_cache_held_back_recent_ratio": Series("The same held-back signal averaged over the SLO's windows.episode_recent (what keeps a chronic overload one episode).",
                                              "kv.held_back_recent_ratio"),
    "long_prompt_requests_per_second": Series("Finished requests per second whose prompt exceeded the long-prompt threshold (interpolated inside vLLM's bucket).",
                                              "prompts.long_per_second"),
    "long_prompt_request_ratio": Series("Share of finished requests whose prompt exceeded the long-prompt threshold.",
                                        "prompts.long_ratio"),
    "ttft_seconds": Series("Time to first token: quantiles over the window; _sum and _count are vLLM's totals.",
                           "latency.ttft", summary=True),
    "ttft_mean_seconds": Series("Mean time to first token over the window.", "latency.ttft_mean"),
    "inter_token_latency_seconds": Series("Inter-token latency: quantiles over the window; _sum and _count are vLLM's totals.",
                                          "latency.itl", summary=True),
    "e2e_request_latency_seconds": Series("End-to-end request latency: quantiles over the window; _sum and _count are vLLM's totals.",
                                          "latency.e2e", summary=True),
    "queue_time_seconds": Series("Time requests spent waiting: quantiles over the window; _sum and _count are vLLM's totals.",
                                 "latency.queue_time", summary=True),
    "prompt_length_tokens": Series("Prompt length: quantiles over the window; _sum and _count are vLLM's totals.",
                                   "prompts.length", summary=True),
    "ttft_slo_attainment_ratio": Series("Share of requests whose time to first token met the TTFT objective, over the window.",
                                        "latency.ttft_slo_attainment"),
    "itl_slo_attainment_ratio": Series("Share of requests whose time per output token met the generation-speed objective, over the window.",
                                       "latency.itl_slo_attainment"),
    "prefix_cache_hit_ratio": Series("Prefix-cache hit tokens over queried tokens, over the window.",
                                     "caches.prefix_cache_hit_ratio"),
    "spec_decode_acceptance_ratio": Series("Accepted over drafted speculative tokens, over the window.",
                                           "caches.spec_decode_acceptance_ratio"),
    "spec_decode_mean_accepted_length": Series("Speculative decoding's mean accepted length over the window: 1 + accepted tokens / drafts (the tokens one verify step yields).",
                                               "caches.spec_decode_mean_accepted_length"),
    "spec_decode_position_acceptance_ratio": Series("Per draft position: drafts whose token at that position was accepted / drafts, over the window.",
                                                    "caches.spec_decode_position_acceptance", ("position",)),
    "throughput_baseline_tokens_per_second": Series("Learned normal generation throughput of this pod while its GPUs are busy (a high percentile over the baseline horizon; prompt tokens/s on a prefill instance). "
                                                    "Never learned from a time the sidecar reports as degraded: KV pressure level 2 or more, requests held back by the cache, a long-prompt surge, "
                                                    "a stalled or sleeping engine, a busy pod already flagged low.",
                                                    lambda m: m.busy_low.baseline if m.busy_low else None),
    "throughput_low_threshold_tokens_per_second": Series("Throughput under which a busy pod is flagged: the baseline times the low fraction; before a baseline is learned, the planned per-replica rate (SLO gpu_busy_low.planned_tokens_per_second) times the low fraction, never below the floor.",
                                                         lambda m: m.busy_low.threshold if m.busy_low else None),
    "gpu_busy_low_throughput": Series("1 while the pod's GPUs are busy (mean utilization at or above the busy threshold) and generation throughput (prompt throughput on a prefill instance) is far below this pod's normal; never while the engine sleeps.",
                                      lambda m: _flag(m.busy_low.flagged) if m.busy_low else None),
    "engine_stalled": Series("1 while requests are running and no token has been produced for the stall time, or while requests wait with none running and the engine makes no iteration (vllm:iteration_tokens_total) and no token: "
                             "a wedged engine, which vLLM's own /health still answers 200 for. 0 while the engine sleeps.",
                             lambda m: _flag(m.stalled)),
    "engine_sleep_level": Series("vLLM's sleep mode (vllm:engine_sleep_state): 0 awake, 1 weights offloaded, 2 weights and KV cache discarded (the lowest of the model's engines); absent where vLLM does not say. "
                                 "A sleeping engine is not stalled, not down and not spare capacity; top says it sleeps.",
                                 lambda m: m.sleep_level),
    "kv_transfer_failure_ratio": Series("Failed KV transfers / (failed + completed) over the window (prefill/decode disaggregation; NIXL or Mooncake).",
                                        "kv_transfer.failure_ratio", section="kv_transfer"),
    "kv_transfer_failures_per_second": Series("Failed KV transfers per second over the window, by kind: transfer (every failure the connector counts, handshakes and notifications included), notification (NIXL's failed notifications, a part of the former).",
                                              "kv_transfer.failures_per_second", ("kind",), section="kv_transfer"),
    "kv_transfer_seconds": Series("KV transfer time: quantiles over the window; _sum and _count are vLLM's totals.",
                                  "kv_transfer.transfer_seconds", summary=True, section="kv_transfer"),
    "kv_transfer_post_seconds": Series("KV transfer post time: quantiles over the window; _sum and _count are vLLM's totals.",
                                       "kv_transfer.post_seconds", summary=True, section="kv_transfer"),
    "kv_transfer_bytes_per_second": Series("Bytes of KV cache moved per second over the window.", "kv_transfer.bytes_per_second", section="kv_transfer"),
    "kv_transfers_per_second": Series("Completed KV transfers per second over the window.", "kv_transfer.transfers_per_second", section="kv_transfer"),
    "kv_expired_requests_per_second": Series("Requests per second whose KV lease expired on the producer before the consumer read it.",
                                             "kv_transfer.expired_per_second", section="kv_transfer"),
    "kv_notifications_after_expiry_per_second": Series("Transfer notifications per second that came after the request's KV lease expired (its blocks may have been reused).",
                                                       "kv_transfer.notifications_after_expiry_per_second", section="kv_transfer"),
    "requests_waiting_kv_fetch": Series("Waiting requests by async KV fetch stage (waiting_to_start, in_progress, completed_waiting), all engines summed; KV consumers only.",
                                        "kv_transfer.waiting_fetch", ("stage",), section="kv_transfer"),
    "prompt_tokens_transferred_ratio": Series("Share of prompt tokens that arrived by KV transfer (vLLM's source external_kv_transfer) over prompt tokens from every source, over the window. On a decode instance a fall to 0 means its prompts are recomputed: the transfer failed silently.",
                                              "kv_transfer.prompt_tokens_transferred_ratio", section="kv_transfer"),
    "external_prefix_cache_hit_ratio": Series("External (KV connector) prefix-cache hit tokens / queried tokens, over the window.",
                                              "kv_transfer.external_prefix_cache_hit_ratio", section="kv_transfer"),
}
# The distributions served as summaries, for the resolution flag below
_SUMMARIES = tuple(name for name, series in DERIVED.items() if series.summary)
RESOLUTION = ("quantile_resolution_limited",
              "1 when the summary's quantile (for_quantile; promtool keeps the quantile label for summaries) fell in vLLM's first bucket and is served as that bucket's upper bound "
              "(the value is at most this; the histogram cannot say more), 0 when interpolated.")

@dataclass(frozen=True)
class PodSeries:
    """A derived series without model_name: ``read`` gives a number, or {label value: number}
    when ``label`` is set, or {(value, ...): number} when ``labels`` names several; None leaves
    it out."""

    help: str
    read: Callable[[Signals], object]
    label: str = ""
    labels: Tuple[str, ...] = ()
    section: str = "vllm"  # as ``Series.section``

    def items(self, v) -> Iterator[Tuple[Dict[str, str], float]]:
        """(labels, value) of each sample of a value ``read`` gave."""
        if self.labels:
            for key, x in sorted(v.items()):
                yield dict(zip(self.labels, key)), float(x)
        elif self.label:
            for key, x in sorted(v.items()):
                yield {self.label: key}, float(x)
        else:
            yield {}, float(v)


def _role_info(s: Signals) -> Optional[Dict[str, float]]:
    return {s.role: 1.0} if s.role else None


def _role_conflict(s: Signals) -> Optional[Dict[Tuple[str, str], float]]:
    return {(s.role, why): 1.0 for why in s.role_conflicts} if s.role and s.role_conflicts else None


def _lora(read: Callable[[Lora], object]) -> Callable[[Signals], object]:
    return lambda s: read(s.lora) if s.lora is not None else None


def _by_adapter(attr: str) -> Callable[[Signals], object]:
    def read(lo: Lora) -> Optional[Dict[str, float]]:
        out = {a.name: _flag(getattr(a, attr)) for a in lo.adapters}
        vals = {k: v for k, v in out.items() if v is not None}
        return vals or None
    return _lora(read)


_MEMBERSHIP = "vLLM says which adapters have requests, not how many: 0/1, never a count of requests."
_APART = ("Only when vLLM lists running and waiting adapters apart: vLLM 0.32 lists every adapter with a request "
          "running or waiting under both labels, so on its pages this is left out (see lora_adapter_active).")

# Derived series without model_name
POD_DERIVED: Dict[str, PodSeries] = {
    "gpu_mean_utilization_ratio": PodSeries("Mean utilization of the pod's GPUs over the window.",
                                            lambda s: s.gpu_mean_utilization),
    "lora_adapter_active": PodSeries(
        "1 while the LoRA adapter has at least one request running or waiting in vLLM (named in the newest "
        "vllm:lora_requests_info series), 0 for the other adapters known. " + _MEMBERSHIP,
        _by_adapter("active"), "adapter", section="lora"),
    "lora_adapter_running": PodSeries("1 while the LoRA adapter has a request running, 0 otherwise. " + _APART + " "
                                      + _MEMBERSHIP, _by_adapter("running"), "adapter", section="lora"),
    "lora_adapter_waiting": PodSeries("1 while the LoRA adapter has a request waiting, 0 otherwise. " + _APART + " "
                                      + _MEMBERSHIP, _by_adapter("waiting"), "adapter", section="lora"),
    "lora_adapters_active": PodSeries("LoRA adapters with at least one request running or waiting (adapters, not "
                                      "requests).", _lora(lambda lo: lo.active), section="lora"),
    "lora_adapters_running": PodSeries("LoRA adapters with a request running (adapters, not requests). " + _APART,
                                       _lora(lambda lo: lo.running), section="lora"),
    "lora_adapters_waiting": PodSeries("LoRA adapters with a request waiting (adapters, not requests). " + _APART,
                                       _lora(lambda lo: lo.waiting), section="lora"),
    "lora_adapters_known": PodSeries("LoRA adapters vLLM has had requests for since it started (every adapter named "
                                     "in any vllm:lora_requests_info series, those over the label cap included).",
                                     _lora(lambda lo: lo.known), section="lora"),
    "lora_max_adapters": PodSeries("vLLM's max_lora (--max-loras): the most LoRA adapters one batch can hold. More adapters active than this means "
                                   "some adapters' requests are all waiting.",
                                   _lora(lambda lo: lo.max_adapters), section="lora"),
    "role_info": PodSeries("1, labelled with this replica's role in prefill/decode disaggregation as given to the "
                           "sidecar (--role: prefill, decode or both); rules and panels join on it (a pod without it counts as both). "
                           "Like every derived series, absent while vLLM is not read.", _role_info, "role"),
    "role_conflict": PodSeries("1 while vLLM's page contradicts the role given: reason no_kv_consumer (role decode, no "
                               "vllm:num_requests_kv_fetch_by_stage: this vLLM receives no KV) or receives_kv (role "
                               "prefill, prompt tokens arriving by KV transfer); absent otherwise. A kv_both page looks like a consumer's and is "
                               "never a conflict by itself. Said once in the log.",
                               _role_conflict, labels=("role", "reason")),
}


class Point(NamedTuple):
    """One derived sample: (name without prefix, labels, value). For tests and the console."""

    name: str
    labels: Dict[str, str]
    value: float


def signal_points(signals: Signals) -> Iterator[Point]:
    """Every derived sample in ``signals``, quantiles of distributions included."""
    for name, pod in POD_DERIVED.items():
        v = pod.read(signals)
        if v is None:
            continue
        for labels, x in pod.items(v):
            yield Point(name, labels, x)
    for m in signals.models:
        for name, series in DERIVED.items():
            v = series.read(m)
            if v is None:
                continue
            lab = {"model_name": m.model}
            if series.summary:
                assert isinstance(v, Distribution)
                for q, x in v.quantiles:
                    yield Point(name, {**lab, "quantile": repr(q)}, x)
                    yield Point(RESOLUTION[0], {**lab, "metric": PREFIX + name, "for_quantile": repr(q)},
                                1.0 if q in v.bounded else 0.0)
            elif series.extra:
                for key, x in v.items():  # type: ignore[union-attr]
                    yield Point(name, {**lab, series.extra[0]: key}, x)
            else:
                yield Point(name, lab, float(v))  # type: ignore[arg-type]


def families(signals: Signals) -> List[Metric]:
    out: List[Metric] = []
    for name, pod in POD_DERIVED.items():
        v = pod.read(signals)
        if v is None:
            continue
        names = list(pod.labels) or ([pod.label] if pod.label else [])
        fam = GaugeMetricFamily(PREFIX + name, pod.help, labels=names)
        for labels, x in pod.items(v):
            fam.add_metric([labels[n] for n in names], x)
        if fam.samples:
            out.append(fam)
    for name, series in sorted(DERIVED.items()):
        if series.summary:
            fam = Metric(PREFIX + name, series.help, "summary")
        elif series.counter:
            fam = CounterMetricFamily(PREFIX + name, series.help, labels=["model_name", *series.extra])
        else:
            fam = GaugeMetricFamily(PREFIX + name, series.help, labels=["model_name", *series.extra])
        for m in signals.models:
            v = series.read(m)
            if v is None:
                continue
            if series.summary:
                assert isinstance(v, Distribution)
                for q, x in v.quantiles:
                    fam.add_sample(PREFIX + name, {"model_name": m.model, "quantile": repr(q)}, x)
                fam.add_sample(PREFIX + name + "_sum", {"model_name": m.model}, v.sum)
                fam.add_sample(PREFIX + name + "_count", {"model_name": m.model}, v.count)
            elif series.extra:
                for key, x in v.items():  # type: ignore[union-attr]
                    fam.add_metric([m.model, key], x)
            else:
                fam.add_metric([m.model], float(v))  # type: ignore[arg-type]
        if fam.samples:
            out.append(fam)
    res = GaugeMetricFamily(PREFIX + RESOLUTION[0], RESOLUTION[1], labels=["model_name", "metric", "for_quantile"])
    for m in signals.models:
        for name in _SUMMARIES:
            d = DERIVED[name].read(m)
            if d is not None:
                for q, _x in d.quantiles:
                    res.add_metric([m.model, PREFIX + name, repr(q)], 1.0 if q in d.bounded else 0.0)
    if res.samples:
        out.append(res)
    return out
