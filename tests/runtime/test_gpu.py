"""NVML reading against the stand-in built from the real pynvml module."""

import pynvml
import pytest

from exporter.harness.fakenvml import FakeNvml, make_gpus
from exporter.runtime.app import make_gpu_source
from exporter.runtime.collectors import build_families
from exporter.runtime.gpu import GpuUnavailable
from exporter.runtime.nvml import NvmlSource, visible_devices_from_env
from exporter.runtime.state import Published
from helpers import cfg


def fams(state):
    out = {}
    for f in build_families(Published(t=0, gpu=state)):
        for s in f.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_stand_in_uses_the_real_exception_classes_and_structs():
    nv = FakeNvml(make_gpus(1), library_missing=True)
    assert nv.NVMLError_GpuIsLost is pynvml.NVMLError_GpuIsLost
    assert nv.c_nvmlMemory_t is pynvml.c_nvmlMemory_t
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        nv.nvmlInit()


def test_units_are_converted_to_base_units():
    g = make_gpus(1)
    g[0].utilization_percent = 97
    g[0].memory_used = 60 * 1024**3
    g[0].power_mw = 512_345
    g[0].power_limit_mw = 700_000
    g[0].temperature_c = 71
    g[0].sm_clock_mhz = 1755
    g[0].energy_mj = 123_456_789
    g[0].ecc_uncorrected = 2
    g[0].clock_event_reasons = 0x40 | 0x4  # hw thermal slowdown + sw power cap
    src = NvmlSource(FakeNvml(g))
    st = src.read()
    r = st.gpus[0]
    assert r.utilization == 0.97
    assert r.memory_used_bytes == 60 * 1024**3
    assert r.power_watts == pytest.approx(512.345)
    assert r.power_limit_watts == 700.0
    assert r.sm_clock_hertz == 1755e6
    assert r.energy_joules_total == pytest.approx(123_456.789)
    f = fams(st)
    lab = (("gpu", "0"), ("uuid", g[0].uuid))
    assert f[("vllm_sidecar_gpu_utilization_ratio", lab)] == 0.97
    assert f[("vllm_sidecar_gpu_temperature_celsius", lab)] == 71
    assert f[("vllm_sidecar_gpu_ecc_errors_total", (("gpu", "0"), ("type", "uncorrected"), ("uuid", g[0].uuid)))] == 2
    throttle = ("vllm_sidecar_gpu_clock_throttle_active", (("gpu", "0"), ("reason", "hw_thermal_slowdown"), ("uuid", g[0].uuid)))
    assert f[throttle] == 1
    assert f[("vllm_sidecar_gpu_clock_throttle_active", (("gpu", "0"), ("reason", "gpu_idle"), ("uuid", g[0].uuid)))] == 0
    # the one series a GPU the alert reads: any thermal or power-brake reason, not the power cap alone
    assert f[("vllm_sidecar_gpu_thermal_throttle_active", lab)] == 1
    info = ("vllm_sidecar_gpu_info", (("driver_version", "550.54.15"), ("gpu", "0"), ("name", g[0].name), ("uuid", g[0].uuid)))
    assert f[info] == 1


def test_unsupported_values_are_left_out_and_not_asked_again():
    g = make_gpus(2)
    g[1].unsupported = {"nvmlDeviceGetPowerUsage", "nvmlDeviceGetTotalEccErrors"}
    nv = FakeNvml(g)
    src = NvmlSource(nv)
    st = src.read()
    assert st.ok
    assert st.gpus[1].power_watts is None and st.gpus[1].ecc_corrected_total is None
    assert st.gpus[0].power_watts is not None
    f = fams(st)
    assert not any(k[0] == "vllm_sidecar_gpu_power_watts" and ("gpu", "1") in k[1] for k in f)
    before = nv.calls["nvmlDeviceGetPowerUsage"]
    src.read()
    assert nv.calls["nvmlDeviceGetPowerUsage"] == before + 1  # only GPU 0 asked again


def test_a_lost_gpu_leaves_the_others_reporting():
    g = make_gpus(2)
    src = NvmlSource(FakeNvml(g))
    assert len(src.read().gpus) == 2
    g[0].lost = True
    st = src.read()
    assert not st.ok
    assert [r.index for r in st.gpus] == [1]
    assert st.errors[0][0] == "gpu_lost"
    g[0].lost = False
    st = src.read()
    assert st.ok and len(st.gpus) == 2


def test_xid_errors_are_counted_per_code_from_nvml_events():
    g = make_gpus(2)
    nv = FakeNvml(g)
    src = NvmlSource(nv)
    src.read()
    nv.inject_xid(1, 79)
    nv.inject_xid(1, 79)
    nv.inject_xid(0, 48)
    st = src.read()
    assert st.xid_totals == {(1, g[1].uuid, 79): 2, (0, g[0].uuid, 48): 1}
    nv.inject_xid(1, 79)
    st = src.read()
    assert st.xid_totals[(1, g[1].uuid, 79)] == 3  # a counter, not a last value
    f = fams(st)
    assert f[("vllm_sidecar_gpu_xid_errors_total", (("gpu", "1"), ("uuid", g[1].uuid), ("xid", "79")))] == 3


def test_sm_activity_from_gpm_where_supported():
    g = make_gpus(2)
    g[1].gpm_supported = False
    g[0].sm_activity_percent = 42.5
    g[0].sm_occupancy_percent = 30.0
    src = NvmlSource(FakeNvml(g))
    first = src.read()
    assert first.gpus[0].sm_activity is None  # GPM needs two samples
    st = src.read()
    assert st.gpus[0].sm_activity == pytest.approx(0.425)
    assert st.gpus[0].sm_occupancy == pytest.approx(0.30)
    assert st.gpus[1].sm_activity is None


def test_only_the_visible_gpus():
    g = make_gpus(4)
    src = NvmlSource(FakeNvml(g), devices=[g[2].uuid, "3"])
    assert [r.index for r in src.read().gpus] == [2, 3]
    assert visible_devices_from_env({"NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b"}) == ["GPU-a", "GPU-b"]
    assert visible_devices_from_env({"NVIDIA_VISIBLE_DEVICES": "all"}) is None


def test_auto_without_nvml_runs_without_gpu_series_and_nvml_mode_reports():
    missing = FakeNvml(make_gpus(1), library_missing=True)
    assert make_gpu_source(cfg(gpu="auto"), {}, nvml=missing) is None
    src = make_gpu_source(cfg(gpu="nvml"), {}, nvml=missing)
    with pytest.raises(GpuUnavailable) as e:
        src.read()
    assert e.value.reason == "nvml_init"
    assert make_gpu_source(cfg(gpu="none"), {}, nvml=FakeNvml(make_gpus(1))) is None


def test_real_pynvml_without_a_gpu_fails_as_library_not_found():
    src = NvmlSource(pynvml)
    with pytest.raises(GpuUnavailable):
        src.open()


def test_uncorrected_ecc_unsupported_keeps_corrected_counted():
    """The two ECC reads are separate values: a GPU that cannot count uncorrected errors (NVML
    NotSupported on errorType 1) keeps reporting corrected ones, on every read."""
    gpus = make_gpus(1)
    gpus[0].ecc_corrected = 5
    gpus[0].unsupported.add("nvmlDeviceGetTotalEccErrors:1")
    src = NvmlSource(FakeNvml(gpus))
    for expected in (5.0, 7.0):
        st = src.read()
        assert st.gpus[0].ecc_corrected_total == expected
        assert st.gpus[0].ecc_uncorrected_total is None
        gpus[0].ecc_corrected = 7


def test_energy_counter_where_the_gpu_has_one_and_its_errors():
    # NVML's total energy (millijoules) -> vllm_sidecar_gpu_energy_joules_total; a pre-Volta GPU raises
    # NotSupported: left out for that GPU only, for good, not an error; any other NVML error fails that
    # GPU's read and is counted, like every other NVML read
    g = make_gpus(3)
    g[0].energy_mj = 5_000_000
    g[1].unsupported = {"nvmlDeviceGetTotalEnergyConsumption"}
    g[2].errors = {"nvmlDeviceGetTotalEnergyConsumption": pynvml.NVML_ERROR_UNKNOWN}
    nv = FakeNvml(g)
    src = NvmlSource(nv)
    st = src.read()
    assert [r.index for r in st.gpus] == [0, 1]
    assert st.gpus[0].energy_joules_total == pytest.approx(5000) and st.gpus[1].energy_joules_total is None
    assert st.gpus[1].power_watts is not None  # the rest of GPU 1 still reads
    assert [reason for reason, _ in st.errors] == ["nvml"] and "GPU 2" in st.errors[0][1]
    f = fams(st)
    energy = {dict(k[1])["gpu"]: v for k, v in f.items() if k[0] == "vllm_sidecar_gpu_energy_joules_total"}
    assert energy == {"0": pytest.approx(5000)}
    asked = nv.calls["nvmlDeviceGetTotalEnergyConsumption"]
    g[2].errors = {}
    st = src.read()
    assert [r.index for r in st.gpus] == [0, 1, 2] and not st.errors  # tried again, reads again
    assert nv.calls["nvmlDeviceGetTotalEnergyConsumption"] == asked + 2  # GPU 1 not asked again


def test_the_stand_ins_energy_counter_follows_the_power_drawn():
    g = make_gpus(1)
    g[0].power_mw, g[0].energy_from_power = 400_000, True
    nv = FakeNvml(g)
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    first = nv.nvmlDeviceGetTotalEnergyConsumption(h)
    import time

    time.sleep(0.05)
    later = nv.nvmlDeviceGetTotalEnergyConsumption(h)
    assert later > first  # 400 W for at least 50 ms: at least 20,000 mJ
    assert later - first >= 400_000 * 0.05 - 1


@pytest.mark.parametrize("bits, thermal", [(0x0, 0), (0x4, 0), (0x1 | 0x8 | 0x100, 0), (0x20, 1), (0x40, 1), (0x80, 1),
                                           (0x4 | 0x80, 1)])
def test_thermal_series_is_the_thermal_reasons_of_the_per_reason_series(bits, thermal):
    g = make_gpus(1)
    g[0].clock_event_reasons = bits
    f = fams(NvmlSource(FakeNvml(g)).read())
    lab = (("gpu", "0"), ("uuid", g[0].uuid))
    per_reason = {k[1][1][1]: v for k, v in f.items() if k[0] == "vllm_sidecar_gpu_clock_throttle_active"}
    assert f[("vllm_sidecar_gpu_thermal_throttle_active", lab)] == thermal
    assert thermal == max(per_reason[r] for r in ("sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"))
