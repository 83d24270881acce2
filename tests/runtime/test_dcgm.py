"""The dcgm GPU source on dcgm-exporter's own page format: only this pod's GPUs, never another's."""

import pytest

from conftest import FIXTURES, page
from exporter.harness import pagetransform as pt
from exporter.harness.pageserver import PageServer
from exporter.runtime import config
from exporter.runtime.collectors import build_families
from exporter.runtime.config import ConfigError
from exporter.runtime.dcgm import DcgmSource
from exporter.runtime.gpu import GpuUnavailable
from exporter.runtime.sidecar import Sidecar
from helpers import PageSequence

POD, NS = "vllm-70b-7c9f6d5b8-x2kqp", "llm"
NODE = (FIXTURES / "dcgm" / "node-h100x4.txt").read_text()
OLDER = (FIXTURES / "dcgm" / "node-a100x4-older-format.txt").read_text()


def test_only_this_pods_gpus_in_base_units():
    st = DcgmSource("http://unused", POD, NS).read_page(NODE)
    assert [g.index for g in st.gpus] == [0, 1]
    assert {g.uuid for g in st.gpus} == {"GPU-2b7f1c4e-5a1d-8e2f-0c3b-71d9e2a4f601", "GPU-8c31e0aa-41f2-9b7d-33e1-0fd2c7b59e12"}
    g0 = st.gpus[0]
    assert g0.utilization == 1.0 and st.gpus[1].utilization == 0.99
    assert g0.memory_used_bytes == 75368 * 1024 * 1024
    assert g0.memory_total_bytes == (75368 + 5241 + 510) * 1024 * 1024
    assert g0.power_watts == pytest.approx(612.451)
    assert g0.sm_clock_hertz == 1980e6
    assert g0.energy_joules_total == pytest.approx(918273645.512)
    assert g0.name == "NVIDIA H100 80GB HBM3" and st.driver_version == "550.54.15"
    assert g0.ecc_uncorrected_total is None  # not in dcgm-exporter's default counters: left out


def test_another_pods_gpu_never_leaks():
    other = DcgmSource("http://unused", "finetune-job-0", "batch").read_page(NODE)
    assert [g.index for g in other.gpus] == [2]
    assert other.xid_totals == {(2, "GPU-f04d9a1b-77c3-2e5a-b8d1-4c6e0a9f3d23", 13): 1}
    mine = DcgmSource("http://unused", POD, NS).read_page(NODE)
    assert mine.xid_totals == {}  # GPU 2's XID 13 is not ours
    same_name_other_ns = DcgmSource("http://unused", POD, "batch")
    with pytest.raises(GpuUnavailable) as e:
        same_name_other_ns.read_page(NODE)
    assert e.value.reason == "unmapped"


def test_older_format_and_blank_values():
    page_text = pt.set_values(OLDER, {"DCGM_FI_DEV_GPU_TEMP": 9223372036854775794}, 'gpu="0"')
    st = DcgmSource("http://unused", POD, NS).read_page(page_text)
    assert [g.index for g in st.gpus] == [0, 1]
    assert st.gpus[0].temperature_celsius is None  # DCGM's blank sentinel: unsupported, left out
    assert st.gpus[1].temperature_celsius == 69


def test_last_value_xid_becomes_a_counter_per_code():
    src = DcgmSource("http://unused", POD, NS)
    def with_xid(v):
        return pt.set_values(NODE, {"DCGM_FI_DEV_XID_ERRORS": v}, 'gpu="1"')
    u1 = "GPU-8c31e0aa-41f2-9b7d-33e1-0fd2c7b59e12"
    assert src.read_page(with_xid(0)).xid_totals == {}
    assert src.read_page(with_xid(79)).xid_totals == {(1, u1, 79): 1}
    assert src.read_page(with_xid(79)).xid_totals == {(1, u1, 79): 1}  # the same last value: no new error
    assert src.read_page(with_xid(48)).xid_totals == {(1, u1, 79): 1, (1, u1, 48): 1}
    src.read_page(with_xid(0))
    assert src.read_page(with_xid(79)).xid_totals[(1, u1, 79)] == 2


def test_through_the_sidecar_and_a_real_http_server(clock):
    dcgm = PageServer(lambda: NODE).start()
    cfg = config.build({"gpu": "dcgm", "dcgm_url": dcgm.url + "/metrics", "pod_name": POD, "pod_namespace": NS,
                        "poll_interval": 1, "window": 10}, {})
    from exporter.runtime.app import make_gpu_source

    src = make_gpu_source(cfg, {})
    assert isinstance(src, DcgmSource)
    sc = Sidecar(cfg, PageSequence(clock, page("after_load.txt")), src, clock=clock)
    try:
        pub = sc.poll_once()
        m = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in build_families(pub) for s in f.samples}
        assert m[("vllm_sidecar_target_up", (("target", "gpu"),))] == 1
        gpus = {dict(k[1])["uuid"] for k in m if k[0] == "vllm_sidecar_gpu_utilization_ratio"}
        assert gpus == {"GPU-2b7f1c4e-5a1d-8e2f-0c3b-71d9e2a4f601", "GPU-8c31e0aa-41f2-9b7d-33e1-0fd2c7b59e12"}
        dcgm.stop()  # dcgm-exporter gone
        clock.advance(1)
        pub = sc.poll_once()
        m = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in build_families(pub) for s in f.samples}
        assert m[("vllm_sidecar_target_up", (("target", "gpu"),))] == 0
        assert m[("vllm_sidecar_target_up", (("target", "vllm"),))] == 1
        assert m[("vllm_sidecar_poll_errors_total", (("reason", "refused"), ("target", "gpu")))] >= 1
        assert not any(k[0] == "vllm_sidecar_gpu_utilization_ratio" for k in m)
    finally:
        dcgm.stop()


@pytest.mark.parametrize("missing", ["dcgm_url", "pod_name", "pod_namespace"])
def test_dcgm_needs_url_and_pod_identity(missing):
    flags = {"gpu": "dcgm", "dcgm_url": "http://10.0.0.1:9400/metrics", "pod_name": "p", "pod_namespace": "n"}
    flags[missing] = ""
    with pytest.raises(ConfigError) as e:
        config.build({k: v for k, v in flags.items() if v}, {})
    assert str(e.value).startswith(missing)
