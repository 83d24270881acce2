"""The sidecar's own output is lint-clean: the windowed quantiles are summaries (quantile samples
plus _sum and _count), never gauges with a quantile label, and every name follows Prometheus'
conventions. The text format passes `promtool check metrics` (promtool 2.42 lints only the text
format); the OpenMetrics format passes prometheus_client's strict OpenMetrics parser, and its
samples are the text format's."""

import shutil
import subprocess

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from conftest import page
from exporter.harness.fakenvml import FakeNvml, make_gpus
from exporter.runtime.collectors import SidecarCollector
from exporter.runtime.nvml import NvmlSource
from helpers import cfg, sidecar_with

pytestmark = pytest.mark.prometheus


def _registry(clock, idle, after_load):
    gpus = make_gpus(2)
    for g in gpus:
        g.utilization_percent = 95
    sc, seq = sidecar_with(clock, cfg(poll_interval=1, window=60), idle, gpu=NvmlSource(FakeNvml(gpus)))
    sc.poll_once()
    clock.advance(30)
    seq.text = after_load
    sc.poll_once()
    reg = CollectorRegistry(auto_describe=False)
    reg.register(SidecarCollector(lambda: sc.published))
    return reg


def test_promtool_check_metrics_passes_on_the_text_format(clock, idle, after_load):
    if not shutil.which("promtool"):
        pytest.fail("promtool is not installed (make test installs it)")
    body = generate_latest(_registry(clock, idle, after_load))
    text = body.decode()
    assert "# TYPE vllm_sidecar_ttft_seconds summary" in text
    assert 'vllm_sidecar_ttft_seconds{model_name="tiny-llama",quantile="0.95"}' in text
    assert 'vllm_sidecar_ttft_seconds_count{model_name="tiny-llama"}' in text
    r = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True)
    assert r.returncode == 0, (r.stdout + r.stderr).decode()[:3000]


def test_openmetrics_format_is_valid_and_says_the_same(clock, idle, after_load):
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_om
    from prometheus_client.parser import text_string_to_metric_families as parse_text

    reg = _registry(clock, idle, after_load)
    om = {(s.name, tuple(sorted(s.labels.items()))): s.value
          for f in parse_om(generate_openmetrics(reg).decode()) for s in f.samples}  # raises on invalid
    text = {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in parse_text(generate_latest(reg).decode()) for s in f.samples}
    assert om.keys() == text.keys() and len(om) > 100
    assert om[("vllm_sidecar_ttft_seconds_count", (("model_name", "tiny-llama"),))] > 0


def test_promtool_check_metrics_passes_with_lora(clock):
    """Every LoRA series, running and waiting apart included: the real running page, its newest
    series relabelled as a vLLM that lists waiting adapters apart would write it."""
    if not shutil.which("promtool"):
        pytest.fail("promtool is not installed (make test installs it)")
    text = page("lora_running.txt")
    both = 'running_lora_adapters="tiny-lora,tiny-lora-b",waiting_lora_adapters="tiny-lora,tiny-lora-b"'
    assert both in text
    text = text.replace(both, 'running_lora_adapters="tiny-lora,tiny-lora-b",waiting_lora_adapters="tiny-lora-b"')
    sc, _ = sidecar_with(clock, cfg(poll_interval=1, window=60), text)
    sc.poll_once()
    reg = CollectorRegistry(auto_describe=False)
    reg.register(SidecarCollector(lambda: sc.published))
    body = generate_latest(reg)
    served = {line.split("{")[0].split(" ")[0] for line in body.decode().splitlines() if line.startswith("vllm_sidecar_lora")}
    assert served == {"vllm_sidecar_lora_" + n for n in (
        "adapter_active", "adapter_running", "adapter_waiting", "adapters_active", "adapters_running",
        "adapters_waiting", "adapters_known", "max_adapters")}
    r = subprocess.run(["promtool", "check", "metrics"], input=body, capture_output=True)
    assert r.returncode == 0, (r.stdout + r.stderr).decode()[:3000]
