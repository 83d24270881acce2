"""The public interface (docs/interface.md): every name it fixes exists, with the promised shape."""

import re
import subprocess
import sys

from conftest import ROOT
from exporter.runtime.collectors import metric_docs
from promql_names import sidecar_output_names
from promseries import rules_by_alert

CONTRACT_METRICS = [
    "vllm_sidecar_target_up", "vllm_sidecar_poll_errors_total", "vllm_sidecar_last_success_timestamp_seconds",
    "vllm_sidecar_input_missing", "vllm_sidecar_build_info",
    "vllm_sidecar_gpu_info", "vllm_sidecar_gpu_utilization_ratio", "vllm_sidecar_gpu_memory_used_bytes",
    "vllm_sidecar_gpu_memory_total_bytes", "vllm_sidecar_gpu_power_watts", "vllm_sidecar_gpu_temperature_celsius",
    "vllm_sidecar_gpu_xid_errors_total",
    "vllm_sidecar_generation_tokens_per_second", "vllm_sidecar_prompt_tokens_per_second",
    "vllm_sidecar_kv_cache_usage_ratio", "vllm_sidecar_kv_cache_pressure_level", "vllm_sidecar_preemptions_per_second",
    "vllm_sidecar_long_prompt_requests_per_second", "vllm_sidecar_ttft_seconds", "vllm_sidecar_gpu_busy_low_throughput",
    "vllm_sidecar_engine_stalled",
]
CONTRACT_ALERTS = [
    "VLLMKVCacheExhausted", "VLLMPreemptionsSustained", "VLLMTTFTHigh", "VLLMInterTokenLatencyHigh",
    "VLLMGPUBusyLowThroughput", "VLLMEngineStalled", "VLLMLongPromptSurge", "VLLMQueueBuildup",
    "VLLMCorruptedRequests", "VLLMErrorBudgetBurn", "VLLMTargetDown", "VLLMSidecarInputMissing", "GPUXidErrors",
]
# every derived series docs/interface.md named before its tables were generated (issue 30), as it
# wrote them: its table's minimum and its "Added since" lists; the generated tables keep each one
INTERFACE_DERIVED = [
    "vllm_sidecar_generation_tokens_per_second", "vllm_sidecar_prompt_tokens_per_second", "vllm_sidecar_kv_cache_usage_ratio",
    "vllm_sidecar_kv_cache_pressure_level", "vllm_sidecar_preemptions_per_second",
    "vllm_sidecar_long_prompt_requests_per_second", "vllm_sidecar_ttft_seconds{quantile}",
    "vllm_sidecar_gpu_busy_low_throughput", "vllm_sidecar_engine_stalled",
    "vllm_sidecar_kv_cache_usage_peak_ratio", "vllm_sidecar_kv_cache_warn_poll_ratio",
    "vllm_sidecar_kv_cache_capacity_wait_poll_ratio", "vllm_sidecar_preemption_poll_ratio",
    "vllm_sidecar_requests_waiting_for_batch", "vllm_sidecar_capacity_wait_cause{cause}",
    "vllm_sidecar_batch_ceiling_requests{source}", "vllm_sidecar_role_info{role}", "vllm_sidecar_role_conflict{role,reason}",
    "vllm_sidecar_kv_transfer_failure_ratio", "vllm_sidecar_kv_transfer_failures_per_second{kind}",
    "vllm_sidecar_kv_transfer_seconds", "vllm_sidecar_kv_transfer_post_seconds", "vllm_sidecar_kv_transfer_bytes_per_second",
    "vllm_sidecar_kv_transfers_per_second", "vllm_sidecar_kv_expired_requests_per_second",
    "vllm_sidecar_kv_notifications_after_expiry_per_second", "vllm_sidecar_requests_waiting_kv_fetch{stage}",
    "vllm_sidecar_prompt_tokens_transferred_ratio", "vllm_sidecar_external_prefix_cache_hit_ratio",
    "vllm_sidecar_spec_decode_mean_accepted_length", "vllm_sidecar_spec_decode_position_acceptance_ratio{position}",
    "vllm_sidecar_engine_sleep_level",
]
CONTRACT_FLAGS = ["--vllm-url", "--listen", "--poll-interval", "--window", "--gpu", "--config"]


def test_every_contract_metric_is_served():
    served = sidecar_output_names()
    missing = [m for m in CONTRACT_METRICS if m not in served]
    assert not missing, missing


def test_the_interface_generated_tables_keep_every_derived_name_it_had():
    """Names on the interface are extended, never changed or removed: each derived name it gave
    (with the labels it gave in braces) is still a row of its generated tables."""
    text = (ROOT / "docs" / "interface.md").read_text()
    rows = []
    for _name, start, end in metric_docs.regions(text):
        rows += re.findall(r"^\| `(vllm_sidecar_[a-z0-9_]+(?:\{[a-z_,]*\})?)` \|", text[start:end], re.M)
    bare = {r.split("{")[0] for r in rows}
    lost = [n for n in INTERFACE_DERIVED if (n not in rows if "{" in n else n not in bare)]
    assert not lost, lost
    assert set(m for m in CONTRACT_METRICS if m.removeprefix("vllm_sidecar_") in metric_docs.DERIVED) <= bare


def test_every_contract_alert_is_in_the_pack_with_its_labels_and_annotations():
    rules = rules_by_alert()
    for name in CONTRACT_ALERTS:
        assert name in rules, name
        for r in rules[name]:
            assert r["labels"]["severity"] in ("critical", "warning", "info")
            assert {"summary", "description", "runbook_url"} <= set(r["annotations"])


def test_command_line_flags_and_subcommands():
    r = subprocess.run([sys.executable, "-m", "exporter", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0
    for flag in CONTRACT_FLAGS:
        assert flag in r.stdout, flag
    assert "auto|nvml|dcgm|none" in r.stdout
    for sub in ("demo", "rules"):
        r = subprocess.run([sys.executable, "-m", "exporter", sub, "--help"], capture_output=True, text=True, cwd=ROOT)
        assert r.returncode == 0 and "usage" in r.stdout.lower(), sub
