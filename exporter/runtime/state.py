"""The contract between the poll loop and the collectors: one immutable ``Published`` state.

The poll loop builds a new ``Published`` after every poll and swaps one reference; collectors
only ever read the latest one, so a scrape never waits on vLLM or NVML and never sees half of a
poll.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple

from .. import __version__
from .gpu import GpuState
from .signals import Signals


@dataclass(frozen=True)
class Published:
    """Everything one scrape shows. Never mutated after it is published."""

    t: float
    signals: Signals = Signals()
    up: Tuple[Tuple[str, bool], ...] = ()
    last_success: Tuple[Tuple[str, float], ...] = ()
    errors_total: Tuple[Tuple[Tuple[str, str], int], ...] = ()
    input_missing: Tuple[Tuple[str, bool], ...] = ()
    input_resolved: Tuple[Tuple[str, str], ...] = ()
    gpu: Optional[GpuState] = None
    malformed_lines_total: int = 0
    malformed_by_reason: Tuple[Tuple[str, int], ...] = ()  # lines or values left out, by reason
    dropped_by_reason: Tuple[Tuple[str, int], ...] = ()  # samples over a cap, by cap
    capped_now: Tuple[Tuple[str, int], ...] = ()  # on the last page: how many models/engines/values over a cap
    vllm_restarts_total: int = 0
    vllm_multiple_processes: Optional[bool] = None  # None while vLLM is not read
    poll_seconds: Tuple[Tuple[str, float], ...] = ()
    page_bytes: int = 0
    version: str = __version__
    gpu_source: str = ""  # "nvml" or "dcgm": the collector that reads the gpu target
    flight_events_total: Tuple[Tuple[str, int], ...] = ()  # flight-recorder events opened, by kind

    def inputs_missing_count(self) -> Optional[int]:
        """How many required inputs the last page lacked; None while vLLM is not read."""
        return sum(1 for _, missing in self.input_missing if missing) if self.input_missing else None

    def collector_name(self, target: str) -> str:
        """The collector behind a target: vllm, or the GPU source's kind."""
        return (self.gpu_source or target) if target == "gpu" else target
