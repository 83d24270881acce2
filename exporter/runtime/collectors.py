"""The Prometheus collector: fresh metric families on every scrape, from the latest state.

``SidecarCollector.collect`` reads one ``Published`` object (an immutable snapshot swapped in by
the poll loop) and builds new families from it, so a scrape never waits on vLLM or NVML and
never sees half of a poll. Names follow ``shared/CONTRACT.md``: prefix ``vllm_sidecar_``, base
units, ``_total`` on counters, no ``pod``/``namespace``/``instance`` labels, no colons.
"""

from __future__ import annotations

from typing import Callable, Dict, Iterable, List, Tuple

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from .gpu import THROTTLE_REASONS
from .state import Published

PREFIX = "vllm_sidecar_"

# Derived signals: name (without prefix) -> (help, label names besides model_name)
DERIVED: Dict[str, Tuple[str, Tuple[str, ...]]] = {
    "generation_tokens_per_second": ("Output tokens per second over the window, all engines summed, counter resets handled.", ()),
    "prompt_tokens_per_second": ("Prompt (prefill) tokens per second over the window.", ()),
    "requests_finished_per_second": ("Finished requests per second over the window, by vLLM's finished_reason.", ("finished_reason",)),
    "request_error_ratio": ("Requests finished with reason error over all finished requests except client aborts, over the window.", ()),
    "corrupted_requests_per_second": ("Requests with NaN logits per second (only when vLLM counts them).", ()),
    "admission_rejections_per_second": ("Requests rejected by vLLM's queue limits per second.", ()),
    "preemptions_per_second": ("Preemptions per second over the window.", ()),
    "kv_cache_usage_ratio": ("KV-cache usage 0-1, the highest engine, whichever name vLLM uses.", ()),
    "kv_cache_pressure_level": ("0 ok, 1 elevated (usage at or above the warn threshold), 2 saturated (requests waiting for KV capacity or admissions rejected), 3 thrashing (preempting).", ()),
    "kv_cache_seconds_to_full": ("Predicted seconds until the KV cache is full at the window's linear trend; absent when usage is not rising.", ()),
    "requests_running": ("Requests in the running batch, all engines summed.", ()),
    "requests_waiting": ("Requests waiting to be scheduled, all engines summed.", ()),
    "requests_waiting_for_capacity": ("Waiting requests held back for lack of KV capacity.", ()),
    "long_prompt_requests_per_second": ("Finished requests per second whose prompt exceeded the long-prompt threshold (interpolated inside vLLM's bucket).", ()),
    "long_prompt_request_ratio": ("Share of finished requests whose prompt exceeded the long-prompt threshold.", ()),
    "ttft_seconds": ("Time to first token at the quantile, over the window.", ("quantile",)),
    "ttft_mean_seconds": ("Mean time to first token over the window.", ()),
    "inter_token_latency_seconds": ("Inter-token latency at the quantile, over the window.", ("quantile",)),
    "e2e_request_latency_seconds": ("End-to-end request latency at the quantile, over the window.", ("quantile",)),
    "queue_time_seconds": ("Time requests spent waiting at the quantile, over the window.", ("quantile",)),
    "prompt_length_tokens": ("Prompt length at the quantile, over the window.", ("quantile",)),
    "ttft_slo_attainment_ratio": ("Share of requests whose time to first token met the TTFT objective, over the window.", ()),
    "itl_slo_attainment_ratio": ("Share of requests whose time per output token met the generation-speed objective, over the window.", ()),
    "prefix_cache_hit_ratio": ("Prefix-cache hit tokens over queried tokens, over the window.", ()),
    "spec_decode_acceptance_ratio": ("Accepted over drafted speculative tokens, over the window.", ()),
    "throughput_baseline_tokens_per_second": ("Learned normal generation throughput of this pod while its GPUs are busy (a high percentile over the baseline horizon).", ()),
    "throughput_low_threshold_tokens_per_second": ("Throughput under which a busy pod is flagged: the baseline times the low fraction, or the floor before a baseline is learned.", ()),
    "gpu_busy_low_throughput": ("1 while the pod's GPUs are busy and generation throughput is far below this pod's normal.", ()),
    "engine_stalled": ("1 while requests are running and no token has been produced for the stall time.", ()),
}
# Derived series without model_name
POD_DERIVED: Dict[str, str] = {
    "gpu_mean_utilization_ratio": "Mean utilization of the pod's GPUs over the window.",
}


def _gauge(name: str, doc: str, labels: Iterable[str] = (), unit: str = "") -> GaugeMetricFamily:
    return GaugeMetricFamily(PREFIX + name, doc, labels=list(labels))


def _counter(name: str, doc: str, labels: Iterable[str] = ()) -> CounterMetricFamily:
    return CounterMetricFamily(PREFIX + name, doc, labels=list(labels))


class SidecarCollector:
    """A custom collector reading the latest ``Published`` state on each scrape."""

    def __init__(self, state: Callable[[], Published]) -> None:
        self._state = state

    def describe(self) -> List[Metric]:
        return []  # families vary with what vLLM serves; nothing to check at registration

    def collect(self) -> Iterable[Metric]:
        return build_families(self._state())


def build_families(pub: Published) -> List[Metric]:
    out: List[Metric] = []

    # -- self-health ---------------------------------------------------------------------------
    info = _gauge("build_info", "Build of the sidecar; always 1.", ["version"])
    info.add_metric([pub.version], 1)
    out.append(info)
    up = _gauge("target_up", "1 when the last read of the target (vllm, gpu) succeeded.", ["target"])
    for target, ok in pub.up:
        up.add_metric([target], 1 if ok else 0)
    out.append(up)
    last = _gauge("last_success_timestamp_seconds", "When the target was last read successfully (unix seconds).", ["target"])
    for target, ts in pub.last_success:
        last.add_metric([target], ts)
    out.append(last)
    errs = _counter("poll_errors", "Failed reads of a target, by short reason.", ["target", "reason"])
    for (target, reason), n in pub.errors_total:
        errs.add_metric([target, reason], n)
    out.append(errs)
    missing = _gauge("input_missing", "1 for each vLLM input the derivations need that the page lacks under every known name; 0 when present.", ["metric"])
    for name, is_missing in pub.input_missing:
        missing.add_metric([name], 1 if is_missing else 0)
    out.append(missing)
    resolved = _gauge("input_resolved", "1 for the vLLM metric name each input was read from on the last page.", ["input", "metric"])
    for key, name in pub.input_resolved:
        resolved.add_metric([key, name], 1)
    out.append(resolved)
    malformed = _counter("parse_malformed_lines", "Lines of vLLM pages that could not be read and were skipped.")
    malformed.add_metric([], pub.malformed_lines_total)
    out.append(malformed)
    restarts = _counter("vllm_restarts", "vLLM restarts seen (its process start time changed).")
    restarts.add_metric([], pub.vllm_restarts_total)
    out.append(restarts)
    dur = _gauge("poll_duration_seconds", "How long the last read of the target took.", ["target"])
    for target, secs in pub.poll_seconds:
        dur.add_metric([target], secs)
    out.append(dur)
    if pub.page_bytes:
        pb = _gauge("vllm_page_bytes", "Size of the last vLLM page read (after decompression).")
        pb.add_metric([], pub.page_bytes)
        out.append(pb)

    # -- derived -------------------------------------------------------------------------------
    families: Dict[str, GaugeMetricFamily] = {}
    for p in pub.points:
        fam = families.get(p.name)
        if fam is None:
            if p.name in DERIVED:
                doc, extra = DERIVED[p.name]
                fam = _gauge(p.name, doc, ("model_name",) + extra)
            elif p.name in POD_DERIVED:
                fam = _gauge(p.name, POD_DERIVED[p.name])
            else:
                raise KeyError(f"derived signal {p.name} has no documentation in collector.DERIVED")
            families[p.name] = fam
        lab = p.labels
        fam.add_metric([lab[k] for k in fam._labelnames], p.value)  # noqa: SLF001
    out.extend(families[k] for k in sorted(families))

    # -- GPUs --------------------------------------------------------------------------------------
    if pub.gpu is not None:
        out.extend(gpu_families(pub.gpu))
    return out


_GPU_GAUGES = (
    ("utilization", "gpu_utilization_ratio", "Share of the last sample period a kernel ran on the GPU (NVML utilization.gpu), 0-1."),
    ("memory_used_bytes", "gpu_memory_used_bytes", "GPU memory in use."),
    ("memory_total_bytes", "gpu_memory_total_bytes", "GPU memory installed."),
    ("power_watts", "gpu_power_watts", "GPU power draw."),
    ("power_limit_watts", "gpu_power_limit_watts", "Enforced GPU power limit."),
    ("temperature_celsius", "gpu_temperature_celsius", "GPU core temperature."),
    ("sm_clock_hertz", "gpu_sm_clock_hertz", "Current SM clock."),
    ("sm_activity", "gpu_sm_activity_ratio", "Share of SMs busy (NVML GPM, Hopper and newer), 0-1."),
    ("sm_occupancy", "gpu_sm_occupancy_ratio", "Active warps over the theoretical maximum (NVML GPM), 0-1."),
)
_GPU_COUNTERS = (
    ("energy_joules_total", "gpu_energy_joules", "Energy used by the GPU since the driver loaded."),
)


def gpu_families(state) -> List[Metric]:
    out: List[Metric] = []
    labels = ["gpu", "uuid"]
    info = _gauge("gpu_info", "GPU identity; always 1.", ["gpu", "uuid", "name", "driver_version"])
    for g in state.gpus:
        info.add_metric([str(g.index), g.uuid, g.name, state.driver_version], 1)
    out.append(info)
    for make, table in ((_gauge, _GPU_GAUGES), (_counter, _GPU_COUNTERS)):
        for attr, name, doc in table:
            fam = make(name, doc, labels)
            for g in state.gpus:
                v = getattr(g, attr)
                if v is not None:  # unsupported values are left out, not reported as 0
                    fam.add_metric([str(g.index), g.uuid], v)
            if fam.samples:
                out.append(fam)
    ecc = _counter("gpu_ecc_errors", "ECC memory errors since the GPU was installed (NVML aggregate counts), by type.",
                   labels + ["type"])
    for g in state.gpus:
        if g.ecc_corrected_total is not None:
            ecc.add_metric([str(g.index), g.uuid, "corrected"], g.ecc_corrected_total)
        if g.ecc_uncorrected_total is not None:
            ecc.add_metric([str(g.index), g.uuid, "uncorrected"], g.ecc_uncorrected_total)
    if ecc.samples:
        out.append(ecc)
    thr = _gauge("gpu_clock_throttle_active", "1 for each clock throttle (clock event) reason in force now.",
                 labels + ["reason"])
    for g in state.gpus:
        if g.throttle_reasons is None:
            continue
        for bit, reason in THROTTLE_REASONS:
            thr.add_metric([str(g.index), g.uuid, reason], 1 if g.throttle_reasons & bit else 0)
    if thr.samples:
        out.append(thr)
    xid = _counter("gpu_xid_errors", "XID errors the GPU reported since the sidecar started, by XID code.",
                   labels + ["xid"])
    for (index, uuid, code), n in sorted(state.xid_totals.items()):
        xid.add_metric([str(index), uuid, str(code)], n)
    out.append(xid)
    return out
