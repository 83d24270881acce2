"""The poll loop with a controlled clock: inputs missing, restarts, GPUs, the learned baseline."""

import pytest

from exporter.harness import pagetransform as pt
from exporter.harness.fakenvml import FakeNvml, make_gpus
from exporter.runtime.collectors import DERIVED, POD_DERIVED, RESOLUTION, build_families
from exporter.runtime.fetch import FetchError
from exporter.runtime.nvml import NvmlSource
from helpers import cfg, names, points, sample_value, scraped, sidecar_with, value

M = "tiny-llama"



def test_input_missing_is_reported_per_metric(clock, after_load):
    no_kv = pt.map_samples(after_load, lambda n, _labels, v: [] if n == "vllm:kv_cache_usage_perc" else None)
    sc, seq = sidecar_with(clock, cfg(poll_interval=1, window=10), no_kv)
    for _ in range(3):
        pub = sc.poll_once()
        clock.advance(1)
    m = scraped(pub)
    assert m[("vllm_sidecar_input_missing", (("metric", "vllm:kv_cache_usage_perc"),))] == 1
    assert m[("vllm_sidecar_input_missing", (("metric", "vllm:generation_tokens_total"),))] == 0
    assert m[("vllm_sidecar_inputs_missing", ())] == 1  # the count the alert reads, one series
    assert not any(k[0] == "vllm_sidecar_kv_cache_usage_ratio" for k in m)
    seq.text = after_load  # input back
    pub = sc.poll_once()
    assert scraped(pub)[("vllm_sidecar_input_missing", (("metric", "vllm:kv_cache_usage_perc"),))] == 0
    assert scraped(pub)[("vllm_sidecar_inputs_missing", ())] == 0
    seq.error = FetchError("refused", "vLLM gone")  # unknown while vLLM does not answer: no count, not 0
    assert not any(k[0] == "vllm_sidecar_inputs_missing" for k in scraped(sc.poll_once()))
    assert scraped(pub)[("vllm_sidecar_input_resolved", (("input", "kv_usage"), ("metric", "vllm:kv_cache_usage_perc")))] == 1


def test_restart_is_counted_and_rates_never_go_negative(clock, after_load, after_pressure):
    sc, seq = sidecar_with(clock, cfg(poll_interval=1, window=10), after_load)
    for i in range(5):
        seq.text = pt.scale_counters(after_load, 1 + i * 0.01)
        sc.poll_once()
        clock.advance(1)
    seq.error = FetchError("refused", "vLLM restarting")
    for _ in range(3):
        pub = sc.poll_once()
        clock.advance(1)
    assert value(pub, "generation_tokens_per_second", model_name=M) is None  # stale, not wrong
    seq.error = None
    seq.text = after_pressure
    pub = sc.poll_once()
    assert pub.vllm_restarts_total == 1
    rates = [p for p in points(pub) if p.name.endswith("_per_second")]
    assert rates and all(p.value >= 0 for p in rates)
    m = scraped(pub)
    assert m[("vllm_sidecar_vllm_restarts_total", ())] == 1
    assert m[("vllm_sidecar_poll_errors_total", (("reason", "refused"), ("target", "vllm")))] == 3


def test_every_derived_signal_is_documented(clock, idle, after_load):
    gpus = make_gpus(1)
    gpus[0].utilization_percent = 95
    sc, seq = sidecar_with(clock, cfg(poll_interval=1, window=10), idle, gpu=NvmlSource(FakeNvml(gpus)))
    sc.poll_once()
    clock.advance(5)
    seq.text = after_load
    pub = sc.poll_once()
    assert names(pub) <= set(DERIVED) | set(POD_DERIVED) | {RESOLUTION[0]}
    build_families(pub)  # raises on an undocumented signal


def _busy_run(clock, sc, seq, base, seconds, tokens_per_s, gpus, util):
    for g in gpus:
        g.utilization_percent = util
    gen0 = sample_value(base, "vllm:generation_tokens_total")
    pub = None
    for _ in range(seconds):
        seq.state += tokens_per_s
        seq.text = pt.set_values(base, {"vllm:generation_tokens_total": gen0 + seq.state,
                                        "vllm:num_requests_running": 8})
        pub = sc.poll_once()
        clock.advance(1)
    return pub


def test_gpu_busy_low_throughput_learns_then_flags_the_incident(clock, after_load):
    gpus = make_gpus(2)
    c = cfg(poll_interval=1, window=10, baseline_min_seconds=60, low_throughput_fraction=0.3,
            throughput_floor=10, busy_utilization=0.9)
    sc, seq = sidecar_with(clock, c, after_load, gpu=NvmlSource(FakeNvml(gpus)))
    seq.state = 0.0
    sc.baseline.spacing = 1.0
    pub = _busy_run(clock, sc, seq, after_load, 90, 1000, gpus, 97)  # a healthy busy pod
    assert value(pub, "gpu_busy_low_throughput", model_name=M) == 0.0
    assert value(pub, "throughput_baseline_tokens_per_second", model_name=M) == pytest.approx(1000)
    pub = _busy_run(clock, sc, seq, after_load, 20, 50, gpus, 100)  # the night: busy, few tokens
    assert value(pub, "gpu_busy_low_throughput", model_name=M) == 1.0
    # the bad minutes did not drag the baseline down
    assert value(pub, "throughput_baseline_tokens_per_second", model_name=M) == pytest.approx(1000)
    pub = _busy_run(clock, sc, seq, after_load, 20, 50, gpus, 20)  # quiet hours: low tokens, idle GPU
    assert value(pub, "gpu_busy_low_throughput", model_name=M) == 0.0


def test_one_gpu_lost_keeps_the_other_and_marks_the_target(clock, after_load):
    gpus = make_gpus(2)
    sc, seq = sidecar_with(clock, cfg(poll_interval=1, window=10), after_load, gpu=NvmlSource(FakeNvml(gpus)))
    sc.poll_once()
    gpus[1].lost = True
    clock.advance(1)
    m = scraped(sc.poll_once())
    assert m[("vllm_sidecar_target_up", (("target", "gpu"),))] == 0
    assert m[("vllm_sidecar_poll_errors_total", (("reason", "gpu_lost"), ("target", "gpu")))] == 1
    assert ("vllm_sidecar_gpu_utilization_ratio", (("gpu", "0"), ("uuid", gpus[0].uuid))) in m
    assert ("vllm_sidecar_gpu_utilization_ratio", (("gpu", "1"), ("uuid", gpus[1].uuid))) not in m


def test_nvml_mode_without_library_reports_gpu_down(clock, after_load):
    src = NvmlSource(FakeNvml(make_gpus(1), library_missing=True))
    sc, _ = sidecar_with(clock, cfg(poll_interval=1, window=10, gpu="nvml"), after_load, gpu=src)
    m = scraped(sc.poll_once())
    assert m[("vllm_sidecar_target_up", (("target", "gpu"),))] == 0
    assert m[("vllm_sidecar_target_up", (("target", "vllm"),))] == 1
    assert m[("vllm_sidecar_poll_errors_total", (("reason", "nvml_init"), ("target", "gpu")))] == 1


def test_healthz_reports_a_wedged_poll_loop(clock, after_load):
    mono = [100.0]
    from exporter.runtime.sidecar import Sidecar
    from helpers import PageSequence
    sc = Sidecar(cfg(poll_interval=1, window=10), PageSequence(clock, after_load), None, clock=clock,
                 monotonic=lambda: mono[0])
    sc.poll_once()
    assert sc.healthy()
    mono[0] += 5
    assert sc.healthy()  # between polls
    mono[0] += 60  # no progress for a minute: wedged
    assert not sc.healthy()
    sc.poll_once()
    assert sc.healthy()
