"""Dashboard: GPU utilization, SM activity, memory, power, temperature, clocks and errors."""

from __future__ import annotations

from typing import Any, Dict

from .builder import FLAG_MAP, Builder, Panel, Row, Target

# NVIDIA's usual slowdown region: GPUs throttle from the mid-80s and shut down in the 90s
TEMP_WARN, TEMP_HOT = 83, 90


def gpu(b: Builder) -> Dict[str, Any]:
    def g(metric: str, *extra: str) -> str:  # GPU series carry no model_name
        return b.s(metric, False, True, *extra)

    legend = "{{pod}} GPU {{gpu}}"
    throttled = g("vllm_sidecar_gpu_clock_throttle_active", 'reason!="gpu_idle"')
    items = [
        Row("Load"),
        Panel("GPU utilization", "Share of time a kernel ran (NVML utilization.gpu), per GPU. 100% can still mean "
              "little work: compare SM activity.",
              [Target(g("vllm_sidecar_gpu_utilization_ratio"), legend)], unit="percentunit", w=12, min=0, max=1),
        Panel("SM activity", "Share of SMs busy (NVML GPM, Hopper and newer); empty on older GPUs.",
              [Target(g("vllm_sidecar_gpu_sm_activity_ratio"), legend, empty_ok="GPUs without GPM (before Hopper)")],
              unit="percentunit", w=12, min=0, max=1),
        Panel("GPU memory", "Memory used and installed per GPU.",
              [Target(g("vllm_sidecar_gpu_memory_used_bytes"), legend + " used"),
               Target(g("vllm_sidecar_gpu_memory_total_bytes"), legend + " total")], unit="bytes", w=12),
        Panel("Power", "Power draw and enforced limit per GPU.",
              [Target(g("vllm_sidecar_gpu_power_watts"), legend),
               Target(g("vllm_sidecar_gpu_power_limit_watts"), legend + " limit")], unit="watt", w=12),
        Row("Health"),
        Panel("Temperature", "GPU core temperature.", [Target(g("vllm_sidecar_gpu_temperature_celsius"), legend)],
              unit="celsius", w=8, thresholds=((TEMP_WARN, "orange"), (TEMP_HOT, "red")), threshold_style="line",
              runbooks=("GPUThermalThrottling",)),
        Panel("SM clock", "Current SM clock; drops when throttled.",
              [Target(g("vllm_sidecar_gpu_sm_clock_hertz"), legend)], unit="hertz", w=8),
        Panel("Clock throttle reasons", "Clock event (throttle) reasons in force per GPU.",
              [Target(f"{throttled} == 1",
                      legend + " {{reason}}", empty_ok="nothing throttles the clocks")],
              kind="state-timeline", unit="none", w=8, mappings=FLAG_MAP, runbooks=("GPUThermalThrottling",)),
        Panel("XID errors", "XID errors reported through NVML events since the sidecar started, per XID code: a step "
              "is a new error (the counter, not its increase, so the first error of a code shows too).",
              [Target(f"sum by ({b.by('pod', 'gpu', 'xid')}) ({g('vllm_sidecar_gpu_xid_errors_total')})",
                      "{{pod}} GPU {{gpu}} XID {{xid}}", empty_ok="no XID error since the sidecar started")],
              unit="short", w=12, runbooks=("GPUXidErrors",)),
        Panel("ECC errors", "ECC memory errors per interval, corrected and uncorrected.",
              [Target(f"sum by ({b.by('pod', 'gpu', 'type')}) "
                      f"(increase({g('vllm_sidecar_gpu_ecc_errors_total')}[$__rate_interval]))",
                      "{{pod}} GPU {{gpu}} {{type}}")], unit="short", w=12, runbooks=("GPUUncorrectableECCErrors",)),
        Panel("GPU inventory", "GPUs the sidecars see, with model and driver.",
              [Target(g("vllm_sidecar_gpu_info"), fmt="table", instant=True)], kind="table", unit="none", w=24, h=6,
              transformations=[{"id": "organize", "options": {
                  "excludeByName": {"Time": True, "Value": True, "__name__": True, "job": True, "instance": True}}}]),
    ]
    return b.dashboard("vllm-gpu", "vLLM / GPU", "Utilization, SM activity, memory, power, temperature, clocks, "
                       "throttling, XID and ECC errors, per replica and GPU.", items)
