"""GPUs: XID errors (fatal codes page, from the SLO's list), thermal throttling, uncorrectable
ECC errors. The sidecar serves XID as a counter per code, so a new error is an increase (or a
series that was not there a window ago)."""

from __future__ import annotations

from typing import List

from ..context import UNCORRECTED, Ctx
from .alert import Alert


def alerts(c: Ctx) -> List[Alert]:
    s, who, W = c.selector, c.who, c.rate_window
    gl = f"{c.per_pod}, gpu, uuid"
    hw = c.windows["hardware_errors"]
    fatal = "|".join(str(x) for x in c.slo["gpu"]["fatal_xids"])

    def xid_new(matcher: str) -> str:
        sel = s(matcher)
        return (f"sum by ({gl}, xid) (increase(vllm_sidecar_gpu_xid_errors_total{sel}[{hw}])) > 0\nor\n"
                f"sum by ({gl}, xid) (vllm_sidecar_gpu_xid_errors_total{sel}"
                f" unless vllm_sidecar_gpu_xid_errors_total{sel} offset {hw})")

    return [
        Alert("GPUXidErrors", xid_new(f'xid=~"{fatal}"'),
              "critical",
              f"GPU {{{{ $labels.gpu }}}} reported fatal XID {{{{ $labels.xid }}}} on {who}",
              "NVIDIA XID {{ $labels.xid }} is a hardware or driver fault (fallen off the bus, double-bit ECC, "
              "NVLink, row-remap failure): the GPU needs a reset or replacement. Drain the node."),
        Alert("GPUXidErrors", xid_new(f'xid!~"{fatal}"'),
              "warning",
              f"GPU {{{{ $labels.gpu }}}} reported XID {{{{ $labels.xid }}}} on {who}",
              "NVIDIA XID {{ $labels.xid }}: often an application fault (illegal memory access, page fault). "
              "Check vLLM's log at that time.",
              rule_id="GPUXidErrorsOther"),
        Alert("GPUThermalThrottling",
              f"max by ({gl}) (max_over_time(vllm_sidecar_gpu_thermal_throttle_active{s()}[{W}])) == 1",
              "warning",
              f"GPU {{{{ $labels.gpu }}}} thermally throttled on {who}",
              "The GPU's clocks are held down by temperature or power brake: throughput per GPU drops. Check "
              "cooling and the node's power."),
        Alert("GPUUncorrectableECCErrors",
              f"sum by ({gl}) (increase(vllm_sidecar_gpu_ecc_errors_total{s(UNCORRECTED)}[{hw}])) > 0",
              "critical",
              f"GPU {{{{ $labels.gpu }}}} has uncorrectable ECC errors on {who}",
              "Uncorrectable memory errors corrupt computation: results may be wrong. Drain the node and have "
              "the GPU checked."),
    ]
