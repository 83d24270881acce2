"""Collectors: fresh metric families on every scrape, from the latest published state.

One collector per source, as node_exporter keeps one per subsystem: ``health`` (the sidecar
itself and each source's success), ``vllm`` (the derived signals), ``gpu`` (NVML or dcgm, the
same families). ``SidecarCollector.collect`` reads one ``Published`` object (immutable,
swapped in by the poll loop), so a scrape never waits on vLLM or NVML and never sees half of a
poll. Names follow the contract: prefix ``vllm_sidecar_``, base units, ``_total`` on counters,
no ``pod``/``namespace``/``instance`` labels, no colons.
"""

from __future__ import annotations

from typing import Callable, Iterable, List

from prometheus_client.core import Metric

from ..state import Published
from . import gpu, health, vllm
from .base import PREFIX  # noqa: F401 - this package's interface
from .gpu import GPU_COUNTERS, GPU_GAUGES  # noqa: F401 - this package's interface (the console, the recorder, the README test)
from .vllm import DERIVED, POD_DERIVED, RESOLUTION, Point, signal_points  # noqa: F401 - this package's interface


def build_families(pub: Published) -> List[Metric]:
    out = health.families(pub)
    out += vllm.families(pub.signals)
    if pub.gpu is not None:
        out += gpu.families(pub.gpu)
    return out


class SidecarCollector:
    """A custom collector reading the latest ``Published`` state on each scrape."""

    def __init__(self, state: Callable[[], Published]) -> None:
        self._state = state

    def describe(self) -> List[Metric]:
        return []  # families vary with what vLLM serves; nothing to check at registration

    def collect(self) -> Iterable[Metric]:
        return build_families(self._state())
