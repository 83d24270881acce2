"""Reading the pod's GPUs through NVML.

The ``pynvml`` module (from the ``nvidia-ml-py`` package) is passed in, so tests and the demo can
hand over the stand-in in ``exporter.fakenvml``, which has the same functions, exception classes
and units. Units are converted here to base units: ratios 0-1, bytes, watts, celsius, hertz,
joules.

Failure rules:

- a value the GPU does not support (``NVMLError_NotSupported``, ``NoPermission``,
  ``FunctionNotFound``) is left out, silently and for good for that GPU;
- a GPU that fails (``GpuIsLost``, ``Unknown``…) is left out of this read, counted with its
  reason, and tried again on the next read; the other GPUs keep reporting;
- NVML that does not load is a failed read of the whole ``gpu`` target.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

from .gpu import GpuReading, GpuState, GpuUnavailable

log = logging.getLogger("vllm_sidecar.gpu")

XID_EVENT = 0x0000000000000008  # nvmlEventTypeXidCriticalError
GPM_SM_UTIL = 2  # NVML_GPM_METRIC_SM_UTIL, percent
GPM_SM_OCCUPANCY = 3  # NVML_GPM_METRIC_SM_OCCUPANCY, percent


def _to_str(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def visible_devices_from_env(env: Dict[str, str]) -> Optional[List[str]]:
    """GPU UUIDs or indices the container runtime was told to expose, if it says."""
    raw = env.get("NVIDIA_VISIBLE_DEVICES", "").strip()
    if not raw or raw in ("all", "void", "none"):
        return None
    return [p.strip() for p in raw.split(",") if p.strip()]


class _Device:
    def __init__(self, handle: Any, index: int, uuid: str, name: str) -> None:
        self.handle = handle
        self.index = index
        self.uuid = uuid
        self.name = name
        self.unsupported: Set[str] = set()
        self.gpm: Optional[bool] = None
        self.gpm_prev: Any = None


class NvmlSource:
    """Reads the GPUs through an NVML module (real ``pynvml`` or a stand-in)."""

    kind = "nvml"
    reasons = ("nvml_init", "nvml", "gpu_lost")

    def __init__(self, nvml: Any, devices: Optional[Sequence[str]] = None) -> None:
        self.nvml = nvml
        self.wanted = list(devices) if devices else None
        self._devices: List[_Device] = []
        self._event_set: Any = None
        self._xid: Dict[Tuple[int, str, int], int] = {}
        self._open = False
        self.driver_version = ""
        self._benign = tuple(
            getattr(nvml, n)
            for n in ("NVMLError_NotSupported", "NVMLError_NoPermission", "NVMLError_FunctionNotFound")
            if hasattr(nvml, n)
        )

    # -- lifecycle ------------------------------------------------------------------
    def open(self) -> None:
        nv = self.nvml
        try:
            nv.nvmlInit()
        except nv.NVMLError as exc:
            raise GpuUnavailable("nvml_init", f"NVML did not initialise: {exc}") from exc
        except OSError as exc:  # pragma: no cover - a broken library file
            raise GpuUnavailable("nvml_init", f"NVML did not load: {exc}") from exc
        try:
            self.driver_version = _to_str(nv.nvmlSystemGetDriverVersion())
        except nv.NVMLError:
            self.driver_version = ""
        devices = []
        count = nv.nvmlDeviceGetCount()
        for i in range(count):
            try:
                h = nv.nvmlDeviceGetHandleByIndex(i)
                uuid = _to_str(nv.nvmlDeviceGetUUID(h))
                name = _to_str(nv.nvmlDeviceGetName(h))
            except nv.NVMLError as exc:
                log.warning("GPU %d cannot be identified: %s", i, exc)
                continue
            if self.wanted is not None and uuid not in self.wanted and str(i) not in self.wanted:
                continue
            devices.append(_Device(h, i, uuid, name))
        self._devices = devices
        self._register_xid_events()
        self._open = True

    def close(self) -> None:
        nv = self.nvml
        for d in self._devices:
            if d.gpm_prev is not None:
                try:
                    nv.nvmlGpmSampleFree(d.gpm_prev)
                except nv.NVMLError:
                    pass
                d.gpm_prev = None
        if self._event_set is not None:
            try:
                nv.nvmlEventSetFree(self._event_set)
            except nv.NVMLError:
                pass
            self._event_set = None
        if self._open:
            try:
                nv.nvmlShutdown()
            except nv.NVMLError:
                pass
        self._open = False

    def _register_xid_events(self) -> None:
        nv = self.nvml
        try:
            self._event_set = nv.nvmlEventSetCreate()
        except nv.NVMLError as exc:
            log.info("NVML events unavailable, XID errors will not be counted: %s", exc)
            self._event_set = None
            return
        for d in self._devices:
            try:
                supported = nv.nvmlDeviceGetSupportedEventTypes(d.handle)
                if supported & XID_EVENT:
                    nv.nvmlDeviceRegisterEvents(d.handle, XID_EVENT, self._event_set)
            except nv.NVMLError as exc:
                log.info("GPU %d: XID events not available: %s", d.index, exc)

    # -- reading --------------------------------------------------------------------
    def _value(self, d: _Device, what: str, fn, *args):
        if what in d.unsupported:
            return None
        try:
            return fn(d.handle, *args)
        except self._benign:
            d.unsupported.add(what)
            return None

    def _read_device(self, d: _Device) -> GpuReading:
        nv = self.nvml
        r = GpuReading(index=d.index, uuid=d.uuid, name=d.name)
        util = self._value(d, "util", nv.nvmlDeviceGetUtilizationRates)
        if util is not None:
            r.utilization = util.gpu / 100.0
        mem = self._value(d, "mem", nv.nvmlDeviceGetMemoryInfo)
        if mem is not None:
            r.memory_used_bytes = float(mem.used)
            r.memory_total_bytes = float(mem.total)
        p = self._value(d, "power", nv.nvmlDeviceGetPowerUsage)
        if p is not None:
            r.power_watts = p / 1000.0
        pl = self._value(d, "power_limit", nv.nvmlDeviceGetEnforcedPowerLimit)
        if pl is not None:
            r.power_limit_watts = pl / 1000.0
        t = self._value(d, "temp", nv.nvmlDeviceGetTemperature, 0)  # NVML_TEMPERATURE_GPU
        if t is not None:
            r.temperature_celsius = float(t)
        c = self._value(d, "sm_clock", nv.nvmlDeviceGetClockInfo, 1)  # NVML_CLOCK_SM
        if c is not None:
            r.sm_clock_hertz = c * 1e6
        fn = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or nv.nvmlDeviceGetCurrentClocksThrottleReasons
        tr = self._value(d, "throttle", fn)
        if tr is not None:
            r.throttle_reasons = int(tr)
        # aggregate (lifetime) ECC counts are counters; volatile ones reset at driver reload
        # each read has its own key: a GPU that cannot count one kind still counts the other
        ce = self._value(d, "ecc_corrected", nv.nvmlDeviceGetTotalEccErrors, 0, 1)
        if ce is not None:
            r.ecc_corrected_total = float(ce)
        ue = self._value(d, "ecc_uncorrected", nv.nvmlDeviceGetTotalEccErrors, 1, 1)
        if ue is not None:
            r.ecc_uncorrected_total = float(ue)
        e = self._value(d, "energy", nv.nvmlDeviceGetTotalEnergyConsumption)
        if e is not None:
            r.energy_joules_total = e / 1000.0
        self._read_gpm(d, r)
        return r

    def _read_gpm(self, d: _Device, r: GpuReading) -> None:
        nv = self.nvml
        if d.gpm is None:
            try:
                d.gpm = bool(nv.nvmlGpmQueryDeviceSupport(d.handle).isSupportedDevice)
            except (nv.NVMLError, AttributeError):
                d.gpm = False
        if not d.gpm:
            return
        try:
            sample = nv.nvmlGpmSampleAlloc()
            nv.nvmlGpmSampleGet(d.handle, sample)
        except nv.NVMLError as exc:
            log.info("GPU %d: GPM sampling failed, SM activity left out: %s", d.index, exc)
            d.gpm = False
            return
        prev, d.gpm_prev = d.gpm_prev, sample
        if prev is None:
            return
        try:
            mg = nv.c_nvmlGpmMetricsGet_t()
            mg.version = nv.NVML_GPM_METRICS_GET_VERSION
            mg.numMetrics = 2
            mg.sample1 = prev
            mg.sample2 = sample
            mg.metrics[0].metricId = GPM_SM_UTIL
            mg.metrics[1].metricId = GPM_SM_OCCUPANCY
            nv.nvmlGpmMetricsGet(mg)
            if mg.metrics[0].nvmlReturn == 0:
                r.sm_activity = mg.metrics[0].value / 100.0
            if mg.metrics[1].nvmlReturn == 0:
                r.sm_occupancy = mg.metrics[1].value / 100.0
        except nv.NVMLError as exc:
            log.info("GPU %d: GPM metrics failed: %s", d.index, exc)
        finally:
            try:
                nv.nvmlGpmSampleFree(prev)
            except nv.NVMLError:
                pass

    def _drain_xid(self, errors: List[Tuple[str, str]]) -> None:
        nv = self.nvml
        if self._event_set is None:
            return
        by_uuid = {d.uuid: d for d in self._devices}
        for _ in range(10_000):  # bounded: a flood of events cannot wedge the poll
            try:
                data = nv.nvmlEventSetWait(self._event_set, 0)
            except nv.NVMLError_Timeout:
                return
            except nv.NVMLError as exc:
                errors.append(("nvml", f"reading NVML events failed: {exc}"))
                return
            if not data.eventType & XID_EVENT:
                continue
            try:
                uuid = _to_str(nv.nvmlDeviceGetUUID(data.device))
            except nv.NVMLError:
                continue
            d = by_uuid.get(uuid)
            if d is None:
                continue
            key = (d.index, d.uuid, int(data.eventData))
            self._xid[key] = self._xid.get(key, 0) + 1

    def read(self) -> GpuState:
        nv = self.nvml
        if not self._open:
            self.open()
        state = GpuState(ok=True, driver_version=self.driver_version)
        for d in self._devices:
            try:
                state.gpus.append(self._read_device(d))
            except nv.NVMLError as exc:
                reason = "gpu_lost" if isinstance(exc, getattr(nv, "NVMLError_GpuIsLost", ())) else "nvml"
                state.errors.append((reason, f"GPU {d.index} ({d.uuid}): {exc}"))
                state.ok = False
        self._drain_xid(state.errors)
        state.xid_totals = dict(self._xid)
        return state


def load_nvml() -> Any:
    """Import the real NVML bindings (``nvidia-ml-py``)."""
    import pynvml  # noqa: PLC0415 - optional at import time

    return pynvml

