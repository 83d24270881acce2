"""What one read of the pod's GPUs yields, whichever source read them (NVML or dcgm-exporter).

Values are in base units (ratios 0-1, bytes, watts, celsius, hertz, joules); a value the GPU
does not support is None and left out of the output, never reported as 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

# Clock event (throttle) reasons: bit -> label value. Same bits in NVML's old "throttle" names.
THROTTLE_REASONS: Tuple[Tuple[int, str], ...] = (
    (0x0000000000000001, "gpu_idle"),
    (0x0000000000000002, "applications_clocks_setting"),
    (0x0000000000000004, "sw_power_cap"),
    (0x0000000000000008, "hw_slowdown"),
    (0x0000000000000010, "sync_boost"),
    (0x0000000000000020, "sw_thermal_slowdown"),
    (0x0000000000000040, "hw_thermal_slowdown"),
    (0x0000000000000080, "hw_power_brake_slowdown"),
    (0x0000000000000100, "display_clock_setting"),
)
# the reasons that hold the clocks down for heat or power, not by choice: a GPU under any of them
# is "thermally throttled" (served as one series per GPU for the rules)
THERMAL_REASONS: Tuple[str, ...] = ("sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
THERMAL_MASK = sum(bit for bit, reason in THROTTLE_REASONS if reason in THERMAL_REASONS)


@dataclass
class GpuReading:
    index: int
    uuid: str
    name: str
    utilization: Optional[float] = None  # 0-1
    memory_used_bytes: Optional[float] = None
    memory_total_bytes: Optional[float] = None
    power_watts: Optional[float] = None
    power_limit_watts: Optional[float] = None
    temperature_celsius: Optional[float] = None
    sm_clock_hertz: Optional[float] = None
    throttle_reasons: Optional[int] = None  # bitmask
    ecc_corrected_total: Optional[float] = None
    ecc_uncorrected_total: Optional[float] = None
    energy_joules_total: Optional[float] = None
    sm_activity: Optional[float] = None  # 0-1, GPM
    sm_occupancy: Optional[float] = None  # 0-1, GPM

    @property
    def thermal_throttled(self) -> Optional[bool]:
        """Whether any of ``THERMAL_REASONS`` holds the clocks down; None when the reasons are unknown."""
        return None if self.throttle_reasons is None else bool(self.throttle_reasons & THERMAL_MASK)


@dataclass
class GpuState:
    """One read of every GPU this container sees."""

    ok: bool
    gpus: List[GpuReading] = field(default_factory=list)
    driver_version: str = ""
    xid_totals: Dict[Tuple[int, str, int], int] = field(default_factory=dict)
    errors: List[Tuple[str, str]] = field(default_factory=list)  # (reason, message)

    def mean_utilization(self) -> Optional[float]:
        vals = [g.utilization for g in self.gpus if g.utilization is not None]
        return sum(vals) / len(vals) if vals else None


class GpuUnavailable(Exception):
    """NVML could not be loaded or initialised."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
