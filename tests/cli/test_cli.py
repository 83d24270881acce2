"""The command line, configuration precedence, probes, logs and clean shutdown."""

import json
import os
import signal
import subprocess
import sys
import urllib.request

import pytest

from conftest import ROOT, page
from exporter.harness.localstack import free_port
from exporter.harness.pageserver import PageServer
from exporter.runtime import config
from exporter.runtime.config import ConfigError
from shared import poll_until, run_cli


def test_precedence_flags_over_env_over_file(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("poll_interval: 5\nwindow: 120\nlong_prompt_tokens: 8000\nstall_seconds: 45\n")
    env = {"VLLM_SIDECAR_WINDOW": "90", "VLLM_SIDECAR_STALL_SECONDS": "50"}
    c = config.build({"config": str(f), "stall_seconds": "60"}, env)
    assert c.poll_interval == 5.0  # file
    assert c.window == 90.0  # env over file
    assert c.stall_seconds == 60.0  # flag over env
    assert c.long_prompt_tokens == 8000.0
    assert c.vllm_timeout == pytest.approx(4.0)  # default: 80% of the poll interval
    c2 = config.build({}, {"VLLM_SIDECAR_CONFIG": str(f)})
    assert c2.window == 120.0


@pytest.mark.parametrize("flags,env,needle", [
    ({"poll_interval": "fast"}, {}, "poll_interval"),
    ({"kv_warn_threshold": "1.5"}, {}, "kv_warn_threshold"),
    ({}, {"VLLM_SIDECAR_GPU": "cuda"}, "gpu"),
    ({"poll_interval": "5", "vllm_timeout": "6"}, {}, "vllm_timeout"),
    ({"vllm_url": "ftp://x"}, {}, "vllm_url"),
    ({"listen": "nonsense"}, {}, "listen"),
    ({"window": "1", "poll_interval": "2"}, {}, "window"),
    ({"kv_critical_threshold": "0.95"}, {}, "kv_critical_threshold: moved to the SLO file as kv_cache.critical"),
    ({}, {"VLLM_SIDECAR_SLO_TTFT_MEAN_SECONDS": "2"}, "slo_ttft_mean_seconds: moved to the SLO file"),
    ({"slo": "/nonexistent/slo.yaml"}, {}, "slo: cannot read"),
])
def test_bad_values_name_the_key(flags, env, needle):
    with pytest.raises(ConfigError) as e:
        config.build(flags, env)
    assert str(e.value).startswith(needle)
    assert "\n" not in str(e.value)


def test_thresholds_come_from_the_slo_file_and_flags_override_them(tmp_path):
    """The sidecar reads the same SLO file as the pack; a flag overrides one value for this
    sidecar only; without --slo the built-in defaults (the pack's defaults) apply."""
    from exporter.slo import load_slo

    d = config.build({}, {})
    builtin = load_slo(None)
    assert d.kv_warn_threshold == builtin["kv_cache"]["warn"]
    assert d.window == 60.0 and builtin["windows"]["sidecar"] == "1m"
    f = tmp_path / "slo.yaml"
    f.write_text("kv_cache: {warn: 0.8, critical: 0.9}\nwindows: {sidecar: 90s}\nstall: {after: 1m}\n"
                 "gpu_busy_low: {baseline_horizon: 2h, busy_utilization: 0.7}\nlong_prompt: {tokens: 8000}\n")
    c = config.build({"slo": str(f)}, {})
    assert (c.kv_warn_threshold, c.window, c.stall_seconds, c.baseline_horizon, c.busy_utilization,
            c.long_prompt_tokens) == (0.8, 90.0, 60.0, 7200.0, 0.7, 8000.0)
    env = {"VLLM_SIDECAR_SLO": str(f), "VLLM_SIDECAR_KV_WARN_THRESHOLD": "0.85"}
    c = config.build({"stall_seconds": "15"}, env)
    assert (c.kv_warn_threshold, c.stall_seconds, c.window) == (0.85, 15.0, 90.0)
    f.write_text("kv_cache: {warn: 2}\n")
    with pytest.raises(ConfigError, match="kv_cache.warn"):
        config.build({"slo": str(f)}, {})


def test_bad_file(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("bogus_key: 1\n")
    with pytest.raises(ConfigError, match="bogus_key: unknown key"):
        config.build({"config": str(f)}, {})
    f.write_text("window: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        config.build({"config": str(f)}, {})
    with pytest.raises(ConfigError, match="cannot read"):
        config.build({"config": str(tmp_path / "absent.yaml")}, {})


@pytest.mark.parametrize("args,needle", [
    (["--poll-interval", "x"], "poll_interval"),
    (["--gpu", "tpu"], "gpu"),
    (["--no-such-flag"], "unrecognized arguments"),
    (["--config", "/nonexistent.yaml"], "config"),
])
def test_cli_bad_input_exits_2_with_one_line(args, needle):
    r = run_cli(*args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], r.stderr


def test_url_gets_metrics_path():
    assert config.metrics_url("http://127.0.0.1:8000") == "http://127.0.0.1:8000/metrics"
    assert config.metrics_url("http://h:8000/custom/metrics") == "http://h:8000/custom/metrics"
    assert config.redact_url("http://user:pw@h:8000/metrics") == "http://<redacted>@h:8000/metrics"


def _get(url):
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""
    except OSError:
        return None, ""


def _poll_errors(page: str) -> float:
    """The failed reads of vLLM the sidecar's page counts, every reason together."""
    return sum(float(line.rsplit(" ", 1)[1]) for line in page.splitlines()
               if line.startswith('vllm_sidecar_poll_errors_total{') and 'target="vllm"' in line)


def test_probes_logs_and_sigterm():
    vllm = PageServer(lambda: page("after_load.txt")).start()
    port = free_port()
    e = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "exporter", "--vllm-url", f"http://user:hunter2@127.0.0.1:{vllm.port}",
         "--listen", f"127.0.0.1:{port}", "--poll-interval", "1", "--vllm-timeout", "0.95", "--window", "2",
         "--gpu", "none",
         "--log-format", "json", "--vllm-bearer-token", "SECRET-TOKEN-123"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e, cwd=ROOT)
    try:
        base = f"http://127.0.0.1:{port}"
        assert poll_until(lambda: _get(base + "/readyz")[0] == 200, "/readyz 200")
        assert poll_until(lambda: 'vllm_sidecar_target_up{target="vllm"} 1.0' in _get(base + "/metrics")[1], "vLLM up")
        vllm.stop()  # vLLM dies: the probes stay green, target_up says it
        assert poll_until(lambda: 'vllm_sidecar_target_up{target="vllm"} 0.0' in _get(base + "/metrics")[1], "vLLM down")
        # several failed polls (a poll a second, each read given 0.95 s: a loaded machine's slow read of
        # the local page must not count as a change of state): three more failed reads counted
        failed = _poll_errors(_get(base + "/metrics")[1])
        assert poll_until(lambda: _poll_errors(_get(base + "/metrics")[1]) >= failed + 3, "three more failed reads")
        assert _get(base + "/healthz")[0] == 200
        assert _get(base + "/readyz")[0] == 200
        vllm.start()
        assert poll_until(lambda: 'vllm_sidecar_target_up{target="vllm"} 1.0' in _get(base + "/metrics")[1],
                          "vLLM up again")
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=20)  # it stops by itself (how fast is measured in bench/, not asserted)
    finally:
        if proc.poll() is None:
            proc.kill()
        vllm.stop()
    err = proc.stderr.read()
    assert rc == 0
    records = [json.loads(line) for line in err.splitlines() if line.strip()]
    assert all({"ts", "level", "msg"} <= set(r) for r in records)
    down = [r for r in records if "unreachable" in r["msg"]]
    up = [r for r in records if r["msg"] == "vllm reachable"]
    # one line per change of state, not per poll: going down once, then a line only where the
    # reason changes (a kept-alive connection reset, then refused, on a loaded machine)
    assert len([r for r in down if not r["msg"].startswith("vllm still unreachable")]) == 1, down
    reasons = [r["reason"] for r in down]
    assert all(a != b for a, b in zip(reasons, reasons[1:])), down
    assert len(up) == 2
    assert down[0]["reason"] in ("refused", "connection")  # a kept-alive connection may be reset first
    assert "SECRET-TOKEN-123" not in err and "hunter2" not in err
