"""The README documents every flag and every metric the sidecar can serve."""

from conftest import ROOT
from exporter.runtime.collectors import DERIVED, GPU_COUNTERS, GPU_GAUGES, POD_DERIVED
from exporter.runtime.config import FIELDS, env_name, flag_name

README = (ROOT / "README.md").read_text()


def test_every_flag_and_env_is_documented():
    for f in FIELDS:
        assert f"`{flag_name(f.key)}`" in README, f.key
        assert f"`{env_name(f.key)}`" in README, f.key


def test_every_metric_is_documented():
    names = [f"vllm_sidecar_{n}" for n in list(DERIVED) + list(POD_DERIVED)]
    names += [f"vllm_sidecar_{n}" for _, n, _ in GPU_GAUGES] + [f"vllm_sidecar_{n}_total" for _, n, _ in GPU_COUNTERS]
    names += ["vllm_sidecar_target_up", "vllm_sidecar_poll_errors_total", "vllm_sidecar_input_missing",
              "vllm_sidecar_inputs_missing", "vllm_sidecar_gpu_thermal_throttle_active",
              "vllm_sidecar_gpu_xid_errors_total", "vllm_sidecar_gpu_ecc_errors_total", "vllm_sidecar_gpu_info",
              "vllm_sidecar_parse_malformed_lines_total", "vllm_sidecar_input_dropped_samples_total",
              "vllm_sidecar_input_over_cap", "vllm_sidecar_vllm_multiple_processes",
              "vllm_sidecar_quantile_resolution_limited"]
    for n in names:
        assert f"`{n}`" in README, n


def test_the_two_commands():
    assert "make run" in README and "make test" in README
    assert "make test" in (ROOT / ".ci" / "run").read_text()
