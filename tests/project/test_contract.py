"""The public interface (docs/interface.md): every name it fixes exists, with the promised shape."""

import subprocess
import sys

from conftest import ROOT
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
CONTRACT_FLAGS = ["--vllm-url", "--listen", "--poll-interval", "--window", "--gpu", "--config"]


def test_every_contract_metric_is_served():
    served = sidecar_output_names()
    missing = [m for m in CONTRACT_METRICS if m not in served]
    assert not missing, missing


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
