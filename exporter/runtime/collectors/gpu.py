"""The GPU collectors: the pod's GPUs as metric families, from whichever source read them
(NVML in the pod, or the node's dcgm-exporter). Each source is its own collector with its own
``vllm_sidecar_collector_success{collector="nvml"|"dcgm"}`` (see ``health``); the families
are the same. Values a GPU does not support are left out, not reported as 0."""

from __future__ import annotations

from typing import List

from prometheus_client.core import Metric

from ..gpu import THERMAL_REASONS, THROTTLE_REASONS, GpuState
from .base import counter as _counter
from .base import gauge as _gauge

GPU_GAUGES = (
    ("utilization", "gpu_utilization_ratio",
     "Share of the last sample period a kernel ran on the GPU (NVML utilization.gpu), 0-1."),
    ("memory_used_bytes", "gpu_memory_used_bytes", "GPU memory in use."),
    ("memory_total_bytes", "gpu_memory_total_bytes", "GPU memory installed."),
    ("power_watts", "gpu_power_watts", "GPU power draw."),
    ("power_limit_watts", "gpu_power_limit_watts", "Enforced GPU power limit."),
    ("temperature_celsius", "gpu_temperature_celsius", "GPU core temperature."),
    ("sm_clock_hertz", "gpu_sm_clock_hertz", "Current SM clock."),
    ("sm_activity", "gpu_sm_activity_ratio", "Share of SMs busy (NVML GPM, Hopper and newer), 0-1."),
    ("sm_occupancy", "gpu_sm_occupancy_ratio", "Active warps over the theoretical maximum (NVML GPM), 0-1."),
)
GPU_COUNTERS = (
    ("energy_joules_total", "gpu_energy_joules", "Energy used by the GPU since the driver loaded."),
)


def families(state: GpuState) -> List[Metric]:
    out: List[Metric] = []
    labels = ["gpu", "uuid"]
    info = _gauge("gpu_info", "GPU identity; always 1.", ["gpu", "uuid", "name", "driver_version"])
    for g in state.gpus:
        info.add_metric([str(g.index), g.uuid, g.name, state.driver_version], 1)
    out.append(info)
    for make, table in ((_gauge, GPU_GAUGES), (_counter, GPU_COUNTERS)):
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
    thermal = _gauge("gpu_thermal_throttle_active", "1 while any of " + ", ".join(THERMAL_REASONS) + " holds the "
                     "clocks down (heat or the power brake), 0 while none does: the reasons above in one series a "
                     "GPU, for the alert to read.", labels)
    for g in state.gpus:
        if g.thermal_throttled is not None:
            thermal.add_metric([str(g.index), g.uuid], 1 if g.thermal_throttled else 0)
    if thermal.samples:
        out.append(thermal)
    xid = _counter("gpu_xid_errors", "XID errors the GPU reported since the sidecar started, by XID code.",
                   labels + ["xid"])
    for (index, uuid, code), n in sorted(state.xid_totals.items()):
        xid.add_metric([str(index), uuid, str(code)], n)
    out.append(xid)
    return out
