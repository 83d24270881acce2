"""Dashboard: GPU utilization, SM activity, memory, power, temperature, clocks and errors."""

from __future__ import annotations

from typing import Any, Dict

from .builder import FLAG_MAP, SEL_POD, Builder, Panel, Row, Target


def gpu(b: Builder) -> Dict[str, Any]:
    g = f"{{{SEL_POD}}}"
    legend = "{{pod}} GPU {{gpu}}"
    items = [
        Row("Load"),
        Panel("GPU utilization", "Share of time a kernel ran (NVML utilization.gpu), per GPU. 100% can still mean "
              "little work: compare SM activity.",
              [Target(f"vllm_sidecar_gpu_utilization_ratio{g}", legend)], unit="percentunit", w=12, min=0, max=1),
        Panel("SM activity", "Share of SMs busy (NVML GPM, Hopper and newer); empty on older GPUs.",
              [Target(f"vllm_sidecar_gpu_sm_activity_ratio{g}", legend, empty_ok="GPUs without GPM (before Hopper)")],
              unit="percentunit", w=12, min=0, max=1),
        Panel("GPU memory", "Memory used and installed per GPU.",
              [Target(f"vllm_sidecar_gpu_memory_used_bytes{g}", legend + " used"),
               Target(f"vllm_sidecar_gpu_memory_total_bytes{g}", legend + " total")], unit="bytes", w=12),
        Panel("Power", "Power draw and enforced limit per GPU.",
              [Target(f"vllm_sidecar_gpu_power_watts{g}", legend),
               Target(f"vllm_sidecar_gpu_power_limit_watts{g}", legend + " limit")], unit="watt", w=12),
        Row("Health"),
        Panel("Temperature", "GPU core temperature.", [Target(f"vllm_sidecar_gpu_temperature_celsius{g}", legend)],
              unit="celsius", w=8, thresholds=((83, "orange"), (90, "red")), threshold_style="line",
              runbooks=("GPUThermalThrottling",)),
        Panel("SM clock", "Current SM clock; drops when throttled.",
              [Target(f"vllm_sidecar_gpu_sm_clock_hertz{g}", legend)], unit="hertz", w=8),
        Panel("Clock throttle reasons", "Clock event (throttle) reasons in force per GPU.",
              [Target(f'vllm_sidecar_gpu_clock_throttle_active{{{SEL_POD}, reason!="gpu_idle"}} == 1',
                      legend + " {{reason}}", empty_ok="nothing throttles the clocks")],
              kind="state-timeline", unit="none", w=8, mappings=FLAG_MAP, runbooks=("GPUThermalThrottling",)),
        Panel("XID errors", "XID errors reported through NVML events since the sidecar started, per XID code: a step "
              "is a new error (the counter, not its increase, so the first error of a code shows too).",
              [Target(f"sum by (pod, gpu, xid) (vllm_sidecar_gpu_xid_errors_total{g})",
                      "{{pod}} GPU {{gpu}} XID {{xid}}", empty_ok="no XID error since the sidecar started")],
              unit="short", w=12, runbooks=("GPUXidErrors",)),
        Panel("ECC errors", "ECC memory errors per interval, corrected and uncorrected.",
              [Target(f"sum by (pod, gpu, type) (increase(vllm_sidecar_gpu_ecc_errors_total{g}[$__rate_interval]))",
                      "{{pod}} GPU {{gpu}} {{type}}")], unit="short", w=12, runbooks=("GPUUncorrectableECCErrors",)),
        Panel("GPU inventory", "GPUs the sidecars see, with model and driver.",
              [Target(f"vllm_sidecar_gpu_info{g}", fmt="table", instant=True)], kind="table", unit="none", w=24, h=6,
              extra={"transformations": [{"id": "organize", "options": {
                  "excludeByName": {"Time": True, "Value": True, "__name__": True, "job": True, "instance": True}}}]}),
    ]
    return b.dashboard("vllm-gpu", "vLLM / GPU", "Utilization, SM activity, memory, power, temperature, clocks, "
                       "throttling, XID and ECC errors, per replica and GPU.", items)
