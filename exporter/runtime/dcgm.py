"""The ``dcgm`` GPU source: this pod's GPUs as the node's dcgm-exporter reports them.

In Kubernetes a sidecar container does not see the GPUs its neighbour (vLLM) requested: the
device plugin injects them into the requesting container only. NVML in the sidecar then sees
none. dcgm-exporter, run once per node (GPU Operator), knows every GPU and, with its Kubernetes
mapping, which pod and container each one is allocated to. This source reads that exporter
(host IP from the downward API), keeps only the series whose ``pod`` and ``namespace`` are this
pod's, and maps them to the same readings the NVML source produces, in base units.

Label names are dcgm-exporter's own (``gpu``, ``UUID`` or ``uuid`` in its old mode, ``modelName``,
``DCGM_FI_DRIVER_VERSION``, ``pod``, ``namespace``, ``container``). DCGM's "blank" sentinels
(values of 9.2e18 and more, printed by older releases) are left out. dcgm-exporter reports XID as
the value of the last XID (a gauge); this source turns every change of it into one count of a
counter per XID code.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

from .exposition import Parser
from .fetch import REASONS as FETCH_REASONS
from .fetch import FetchError, PageFetcher
from .gpu import GpuReading, GpuState, GpuUnavailable

BLANK = 9.0e18  # DCGM_INT64_BLANK and friends are just below 2**63

# DCGM field -> (reading attribute, factor to base units)
FIELDS: Dict[str, Tuple[str, float]] = {
    "DCGM_FI_DEV_GPU_UTIL": ("utilization", 0.01),
    "DCGM_FI_DEV_POWER_USAGE": ("power_watts", 1.0),
    "DCGM_FI_DEV_POWER_MGMT_LIMIT": ("power_limit_watts", 1.0),
    "DCGM_FI_DEV_ENFORCED_POWER_LIMIT": ("power_limit_watts", 1.0),
    "DCGM_FI_DEV_GPU_TEMP": ("temperature_celsius", 1.0),
    "DCGM_FI_DEV_SM_CLOCK": ("sm_clock_hertz", 1e6),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("energy_joules_total", 0.001),
    "DCGM_FI_PROF_SM_ACTIVE": ("sm_activity", 1.0),
    "DCGM_FI_PROF_SM_OCCUPANCY": ("sm_occupancy", 1.0),
    "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL": ("ecc_corrected_total", 1.0),
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": ("ecc_uncorrected_total", 1.0),
    "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": ("throttle_reasons", 1.0),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": ("throttle_reasons", 1.0),
}
MIB = 1024 * 1024


class DcgmSource:
    kind = "dcgm"
    reasons = FETCH_REASONS + ("unmapped",)

    def __init__(self, url: str, pod: str, namespace: str, timeout: float = 2.0,
                 max_bytes: int = 16 * 1024 * 1024, client: Optional[PageFetcher] = None) -> None:
        self.url = url
        self.pod = pod
        self.namespace = namespace
        self.client = client or PageFetcher(url, timeout, max_bytes)
        self.parser = Parser()
        self._last_xid: Dict[str, float] = {}
        self._xid: Dict[Tuple[int, str, int], int] = {}

    def open(self) -> None:  # nothing to open: each read is one HTTP request
        return

    def close(self) -> None:
        self.client.close()

    def read(self) -> GpuState:
        try:
            text = self.client.fetch()
        except FetchError as exc:
            raise GpuUnavailable(exc.reason, f"dcgm-exporter: {exc.message}") from None
        return self.read_page(text)

    def read_page(self, text: str) -> GpuState:
        page = self.parser.parse(text)
        if not any(s.name.startswith("DCGM_FI_") for s in page.samples):
            raise GpuUnavailable("parse", "dcgm-exporter page has no DCGM_FI_ series")
        gpus: Dict[str, GpuReading] = {}
        fb: Dict[str, Dict[str, float]] = {}
        driver = ""
        for s in page.samples:
            if not s.name.startswith("DCGM_FI_"):
                continue
            lab = dict(s.labels)
            if lab.get("pod") != self.pod or lab.get("namespace") != self.namespace:
                continue  # another pod's GPU, or an idle one
            uuid = lab.get("UUID") or lab.get("uuid") or ""
            try:
                index = int(lab.get("gpu", "-1"))
            except ValueError:
                continue
            r = gpus.get(uuid)
            if r is None:
                r = gpus[uuid] = GpuReading(index=index, uuid=uuid, name=lab.get("modelName", ""))
            driver = driver or lab.get("DCGM_FI_DRIVER_VERSION", "")
            v = s.value
            if v != v or abs(v) >= BLANK:  # NaN or DCGM's blank: not supported
                continue
            if s.name in FIELDS:
                attr, factor = FIELDS[s.name]
                setattr(r, attr, int(v) if attr == "throttle_reasons" else v * factor)
            elif s.name in ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED"):
                fb.setdefault(uuid, {})[s.name] = v
            elif s.name == "DCGM_FI_DEV_XID_ERRORS":
                self._count_xid(r, v)
        if not gpus:
            raise GpuUnavailable("unmapped", f"dcgm-exporter reports no GPU for pod {self.namespace}/{self.pod}: "
                                             "is its Kubernetes pod mapping on?")
        for uuid, parts in fb.items():
            r = gpus[uuid]
            if "DCGM_FI_DEV_FB_USED" in parts:
                r.memory_used_bytes = parts["DCGM_FI_DEV_FB_USED"] * MIB
                if "DCGM_FI_DEV_FB_FREE" in parts:
                    r.memory_total_bytes = sum(parts.values()) * MIB
        mine = {(r.index, r.uuid) for r in gpus.values()}
        return GpuState(ok=True, gpus=sorted(gpus.values(), key=lambda g: g.index), driver_version=driver,
                        xid_totals={k: n for k, n in self._xid.items() if (k[0], k[1]) in mine})

    def _count_xid(self, r: GpuReading, value: float) -> None:
        prev = self._last_xid.get(r.uuid)
        self._last_xid[r.uuid] = value
        if value and value != prev:
            key = (r.index, r.uuid, int(value))
            self._xid[key] = self._xid.get(key, 0) + 1
