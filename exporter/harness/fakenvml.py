"""A stand-in for the ``pynvml`` module, for machines without a GPU: tests and the demo.

It is shaped like the real module because it is built from it: the constants, the ctypes
structures (``c_nvmlUtilization_t``, ``c_nvmlMemory_t``, ``c_nvmlGpmMetricsGet_t``…) and the
exception classes (``NVMLError_GpuIsLost``, ``NVMLError_NotSupported``, ``NVMLError_Timeout``…)
are the real module's own objects, and the functions have the real names, arguments and units
(percent, milliwatts, millijoules, MHz, bytes). Only what the functions return comes from the
``FakeGpu`` objects instead of a driver, which a test or the simulator changes at will.
"""

from __future__ import annotations

import ctypes
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Set

import pynvml as _real

_COPIED_PREFIXES = ("NVML_", "NVMLError", "c_nvml", "struct_c_nvml", "nvmlClocks", "nvmlEventType")


@dataclass
class FakeGpu:
    """The state one simulated GPU reports. Units are NVML's own."""

    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    utilization_percent: int = 0
    memory_utilization_percent: int = 0
    memory_total: int = 80 * 1024**3
    memory_used: int = 0
    power_mw: int = 70_000
    power_limit_mw: int = 700_000
    temperature_c: int = 35
    sm_clock_mhz: int = 1980
    clock_event_reasons: int = 0
    ecc_corrected: int = 0
    ecc_uncorrected: int = 0
    energy_mj: int = 0
    # like a real counter: energy_mj plus the power drawn since the GPU was first read (mW x s = mJ)
    energy_from_power: bool = False
    gpm_supported: bool = True
    sm_activity_percent: float = 0.0
    sm_occupancy_percent: float = 0.0
    lost: bool = False
    # function names that raise NotSupported; ``name:arg`` for one first argument only
    # (``nvmlDeviceGetTotalEccErrors:1``: uncorrected ECC unsupported, corrected still read)
    unsupported: Set[str] = field(default_factory=set)
    # function name -> an NVML return code it fails with (NVML_ERROR_UNKNOWN...), raised as the real
    # module raises it (NVMLError(code) is the matching NVMLError_* subclass)
    errors: Dict[str, int] = field(default_factory=dict)


class FakeNvml:
    """An object with the attributes of the ``pynvml`` module."""

    def __init__(self, gpus: List[FakeGpu], driver_version: str = "550.54.15",
                 library_missing: bool = False) -> None:
        for name in dir(_real):
            if name.startswith(_COPIED_PREFIXES):
                setattr(self, name, getattr(_real, name))
        self.gpus = gpus
        self.driver_version = driver_version
        self.library_missing = library_missing
        self.initialized = 0
        self._lock = threading.Lock()
        self._event_sets: Dict[int, dict] = {}
        self._gpm_samples: Dict[int, tuple] = {}
        self._handles = [ctypes.pointer(_real.struct_c_nvmlDevice_t()) for _ in gpus]
        self.calls: Dict[str, int] = {}
        self._energy_t0: Dict[str, float] = {}

    # -- helpers ------------------------------------------------------------------------
    def _count(self, fn: str) -> None:
        self.calls[fn] = self.calls.get(fn, 0) + 1

    def _check_init(self) -> None:
        if self.initialized <= 0:
            raise _real.NVMLError(_real.NVML_ERROR_UNINITIALIZED)

    def _gpu(self, handle, fn: str, arg=None) -> FakeGpu:
        self._count(fn)
        self._check_init()
        addr = ctypes.addressof(handle.contents)
        for h, g in zip(self._handles, self.gpus):
            if ctypes.addressof(h.contents) == addr:
                if g.lost:
                    raise _real.NVMLError(_real.NVML_ERROR_GPU_IS_LOST)
                if fn in g.unsupported or (arg is not None and f"{fn}:{arg}" in g.unsupported):
                    raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
                if fn in g.errors:
                    raise _real.NVMLError(g.errors[fn])
                return g
        raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)

    def inject_xid(self, index: int, xid: int) -> None:
        """Make GPU ``index`` report an XID critical error event."""
        with self._lock:
            for es in self._event_sets.values():
                if index in es["devices"]:
                    es["queue"].append((index, xid))

    # -- init -----------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self._count("nvmlInit")
        if self.library_missing:
            raise _real.NVMLError(_real.NVML_ERROR_LIBRARY_NOT_FOUND)
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self._check_init()
        self.initialized -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check_init()
        return self.driver_version

    # -- devices --------------------------------------------------------------------------
    def nvmlDeviceGetCount(self) -> int:
        self._check_init()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int):
        self._check_init()
        if not 0 <= index < len(self.gpus):
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        if self.gpus[index].lost:
            raise _real.NVMLError(_real.NVML_ERROR_GPU_IS_LOST)
        return self._handles[index]

    def nvmlDeviceGetIndex(self, handle) -> int:
        g = self._gpu(handle, "nvmlDeviceGetIndex")
        return self.gpus.index(g)

    def nvmlDeviceGetUUID(self, handle) -> str:
        return self._gpu(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetName(self, handle) -> str:
        return self._gpu(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetUtilizationRates(self, handle):
        g = self._gpu(handle, "nvmlDeviceGetUtilizationRates")
        u = _real.c_nvmlUtilization_t()
        u.gpu = int(g.utilization_percent)
        u.memory = int(g.memory_utilization_percent)
        return u

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        g = self._gpu(handle, "nvmlDeviceGetMemoryInfo")
        m = _real.c_nvmlMemory_t()
        m.total = int(g.memory_total)
        m.used = int(g.memory_used)
        m.free = int(g.memory_total - g.memory_used)
        return m

    def nvmlDeviceGetPowerUsage(self, handle) -> int:
        return int(self._gpu(handle, "nvmlDeviceGetPowerUsage").power_mw)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle) -> int:
        return int(self._gpu(handle, "nvmlDeviceGetEnforcedPowerLimit").power_limit_mw)

    def nvmlDeviceGetTemperature(self, handle, sensor) -> int:
        g = self._gpu(handle, "nvmlDeviceGetTemperature")
        if sensor != _real.NVML_TEMPERATURE_GPU:
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        return int(g.temperature_c)

    def nvmlDeviceGetClockInfo(self, handle, type) -> int:  # noqa: A002 - NVML's own name
        g = self._gpu(handle, "nvmlDeviceGetClockInfo")
        if type != _real.NVML_CLOCK_SM:
            return 1593
        return int(g.sm_clock_mhz)

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle) -> int:
        return int(self._gpu(handle, "nvmlDeviceGetCurrentClocksEventReasons").clock_event_reasons)

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle) -> int:
        return int(self._gpu(handle, "nvmlDeviceGetCurrentClocksThrottleReasons").clock_event_reasons)

    def nvmlDeviceGetTotalEccErrors(self, handle, errorType, counterType) -> int:
        g = self._gpu(handle, "nvmlDeviceGetTotalEccErrors", errorType)
        if errorType == _real.NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
            return int(g.ecc_uncorrected)
        return int(g.ecc_corrected)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle) -> int:
        """Millijoules since the driver loaded (NVML: Volta and newer; older GPUs raise NotSupported)."""
        g = self._gpu(handle, "nvmlDeviceGetTotalEnergyConsumption")
        if not g.energy_from_power:
            return int(g.energy_mj)
        now = time.monotonic()
        t0 = self._energy_t0.setdefault(g.uuid, now)
        return int(g.energy_mj + g.power_mw * (now - t0))

    # -- events ---------------------------------------------------------------------------
    def nvmlEventSetCreate(self):
        self._check_init()
        es = _real.c_nvmlEventSet_t(ctypes.pointer(_real.struct_c_nvmlEventSet_t()))
        with self._lock:
            self._event_sets[ctypes.addressof(es.contents)] = {"devices": set(), "queue": []}
        return es

    def nvmlDeviceGetSupportedEventTypes(self, handle) -> int:
        self._gpu(handle, "nvmlDeviceGetSupportedEventTypes")
        return _real.nvmlEventTypeXidCriticalError | _real.nvmlEventTypeSingleBitEccError

    def nvmlDeviceRegisterEvents(self, handle, eventTypes, eventSet) -> None:
        g = self._gpu(handle, "nvmlDeviceRegisterEvents")
        with self._lock:
            self._event_sets[ctypes.addressof(eventSet.contents)]["devices"].add(self.gpus.index(g))

    def nvmlEventSetWait_v2(self, eventSet, timeoutms):
        self._check_init()
        with self._lock:
            q = self._event_sets[ctypes.addressof(eventSet.contents)]["queue"]
            if not q:
                raise _real.NVMLError(_real.NVML_ERROR_TIMEOUT)
            index, xid = q.pop(0)
        data = _real.c_nvmlEventData_t()
        data.device = self._handles[index]
        data.eventType = _real.nvmlEventTypeXidCriticalError
        data.eventData = xid
        return data

    def nvmlEventSetWait(self, eventSet, timeoutms):
        return self.nvmlEventSetWait_v2(eventSet, timeoutms)

    def nvmlEventSetFree(self, eventSet) -> None:
        with self._lock:
            self._event_sets.pop(ctypes.addressof(eventSet.contents), None)

    # -- GPM ------------------------------------------------------------------------------
    def nvmlGpmQueryDeviceSupport(self, device):
        g = self._gpu(device, "nvmlGpmQueryDeviceSupport")
        s = _real.c_nvmlGpmSupport_t()
        s.version = _real.NVML_GPM_SUPPORT_VERSION
        s.isSupportedDevice = 1 if g.gpm_supported else 0
        return s

    def nvmlGpmSampleAlloc(self):
        self._check_init()
        return ctypes.pointer(_real.struct_c_nvmlGpmSample_t())

    def nvmlGpmSampleGet(self, device, gpmSample):
        g = self._gpu(device, "nvmlGpmSampleGet")
        if not g.gpm_supported:
            raise _real.NVMLError(_real.NVML_ERROR_NOT_SUPPORTED)
        self._gpm_samples[ctypes.addressof(gpmSample.contents)] = (
            g.sm_activity_percent,
            g.sm_occupancy_percent,
        )
        return gpmSample

    def nvmlGpmSampleFree(self, gpmSample) -> None:
        self._gpm_samples.pop(ctypes.addressof(gpmSample.contents), None)

    def nvmlGpmMetricsGet(self, metricsGet):
        self._check_init()
        if metricsGet.version != _real.NVML_GPM_METRICS_GET_VERSION:
            raise _real.NVMLError(_real.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        s2 = self._gpm_samples.get(ctypes.addressof(metricsGet.sample2.contents))
        if s2 is None or self._gpm_samples.get(ctypes.addressof(metricsGet.sample1.contents)) is None:
            raise _real.NVMLError(_real.NVML_ERROR_INVALID_ARGUMENT)
        for i in range(metricsGet.numMetrics):
            m = metricsGet.metrics[i]
            if m.metricId == _real.NVML_GPM_METRIC_SM_UTIL:
                m.value, m.nvmlReturn = s2[0], 0
            elif m.metricId == _real.NVML_GPM_METRIC_SM_OCCUPANCY:
                m.value, m.nvmlReturn = s2[1], 0
            else:
                m.nvmlReturn = _real.NVML_ERROR_NOT_SUPPORTED
        return metricsGet


def make_gpus(n: int, name: str = "NVIDIA H100 80GB HBM3") -> List[FakeGpu]:
    return [
        FakeGpu(uuid=f"GPU-{i:08x}-5e1d-4c3a-9f00-{0xabc0 + i:012x}", name=name) for i in range(n)
    ]
