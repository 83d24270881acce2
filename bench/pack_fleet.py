"""The simulated fleet of ``bench_pack.py``: ``--pods`` simulated vLLM pods (``SimVllm``, a real
vLLM 0.32.0 page with simulated values) over three models in two namespaces, each beside its
real ``Sidecar`` polling that page in-process (simulated GPUs through the stand-in NVML), every
page served on a port of its own. ``bench_pack.py fleet`` runs it in a process of its own
(``run_fleet``); ``bench_pack`` reads the pods' specs (``fleet_specs``, ``PodSpec``) for its
report."""

from __future__ import annotations

import asyncio
import gzip
import json
import random
import re
import signal
import sys
import threading
import time
import types
from dataclasses import asdict, dataclass
from typing import Dict, List, Tuple

MODELS = (  # (namespace, model, share of the pods)
    ("llm-prod", "llama-3.1-70b-instruct", 0.60),
    ("llm-prod", "qwen2.5-7b-instruct", 0.25),
    ("llm-batch", "mistral-7b-instruct", 0.15),
)


# -- the fleet --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PodSpec:
    index: int
    namespace: str
    pod: str
    model: str
    scenario: str
    arrival_rate: float
    http_error_share: float
    seed: int

    @property
    def load(self) -> str:
        if self.scenario != "normal":
            return self.scenario
        if self.arrival_rate == 0:
            return "idle"
        return "busy" if self.arrival_rate >= 6 else "normal"


def fleet_specs(n: int, seed: int = 1) -> List[PodSpec]:
    """``n`` pods over the models of MODELS (in their shares), with varied load: every tenth pod
    idle, every tenth busy, pod 3 in KV trouble, pod 13 in a long-prompt storm, pods 4 and 14
    failing 2 % of their HTTP requests, the rest at 1 to 3 requests/s."""
    rng = random.Random(seed)
    bounds, acc = [], 0.0
    for ns, model, share in MODELS:
        acc += share
        bounds.append((round(acc * n), ns, model))
    out = []
    for i in range(n):
        ns, model = next((b[1], b[2]) for b in bounds if i < b[0] or b is bounds[-1])
        scenario, rate = "normal", round(rng.uniform(1.0, 3.0), 2)
        if i % 10 == 1:
            rate = 0.0
        elif i % 10 == 2:
            rate = 7.0
        if i == 3:
            scenario = "kv-thrashing"
        elif i == 13:
            scenario = "long-prompt-storm"
        err = 0.02 if i in (4, 14) else 0.0
        out.append(PodSpec(i, ns, f"vllm-{model.split('-')[0]}-{i:03d}", model, scenario, rate, err, seed * 1000 + i))
    return out


HTTP_2XX = re.compile(r'^(http_requests_total\{handler="/v1/completions",method="POST",status="2xx"\}) \S+$', re.M)


class Pod:
    """One simulated vLLM pod and its sidecar, advanced by ``tick``; pages kept as bodies."""

    def __init__(self, spec: PodSpec, tick: float) -> None:
        import logging

        from exporter.harness.fakenvml import FakeNvml, make_gpus
        from exporter.harness.simulate import SimVllm
        from exporter.runtime import config
        from exporter.runtime.app import make_gpu_source
        from exporter.runtime.sidecar import Sidecar

        logging.getLogger("vllm_sidecar").setLevel(logging.ERROR)
        self.spec = spec
        self.gpus = make_gpus(2)
        self.sim = SimVllm(spec.scenario, model=spec.model, gpus=self.gpus, seed=spec.seed,
                           arrival_rate=spec.arrival_rate, onset=0.0 if spec.scenario == "kv-thrashing" else 120.0)
        self.errors = 0.0
        self.last_step = time.monotonic()
        self.text = self._page()
        cfg = config.build({"poll_interval": tick, "window": 60, "gpu": "nvml", "log_level": "error"}, {})
        self.sidecar = Sidecar(cfg, lambda: self.text, make_gpu_source(cfg, {}, nvml=FakeNvml(self.gpus)))
        self.sidecar.poll_once()
        self.version = 0
        self.bodies: Dict[tuple, Tuple[int, bytes, str]] = {}

    def _page(self) -> str:
        """vLLM's page, with its HTTP server's request counter following the finished requests
        (the simulator leaves the template's value) and, on a failing pod, 5xx answers."""
        text = self.sim.page()
        c = self.sim.c
        done = c["stop"] + c["length"]
        share = self.spec.http_error_share
        ok, bad = done * (1 - share), done * share
        text = HTTP_2XX.sub(lambda m: f"{m.group(1)} {ok:.1f}", text)
        if share:
            text = text.replace(
                'http_requests_total{handler="/v1/completions",method="POST",status="2xx"}',
                f'http_requests_total{{handler="/v1/completions",method="POST",status="5xx"}} {bad:.1f}\n'
                'http_requests_total{handler="/v1/completions",method="POST",status="2xx"}', 1)
        return text

    def advance(self) -> None:
        now = time.monotonic()
        dt, self.last_step = now - self.last_step, now
        while dt > 1e-3:
            step = min(1.0, dt)
            self.sim.step(step)
            dt -= step
        self.text = self._page()
        self.sidecar.poll_once()
        self.version += 1

    def body(self, kind: str, accept: str, gz: bool) -> Tuple[bytes, str]:
        from prometheus_client.exposition import choose_encoder

        from exporter.runtime.collectors.listener import CLOSE_REASONS, REJECT_REASONS, ListenerCollector
        from exporter.runtime.listener.bodies import Families

        if kind == "vllm":
            ctype = "text/plain; version=0.0.4; charset=utf-8"  # vLLM answers text whatever is asked
        else:
            encoder, ctype = choose_encoder(accept)
        key = (kind, ctype, gz)
        hit = self.bodies.get(key)
        if hit is not None and hit[0] == self.version:
            return hit[1], hit[2]
        if kind == "vllm":
            raw = self.text.encode()
        else:
            stub = types.SimpleNamespace(open_connections=0, rejected={r: 0 for r in REJECT_REASONS},
                                         closed={r: 0 for r in CLOSE_REASONS},
                                         web=types.SimpleNamespace(enabled=False))
            raw = encoder(Families(self.sidecar.published, _process(), ListenerCollector(stub)))
        out = gzip.compress(raw, 5) if gz else raw
        self.bodies[key] = (self.version, out, ctype)
        return out, ctype


_PROCESS = None


def _process():
    global _PROCESS
    if _PROCESS is None:
        from prometheus_client.process_collector import ProcessCollector

        _PROCESS = ProcessCollector(namespace="vllm_sidecar", registry=None)
    return _PROCESS


class _Http(asyncio.Protocol):
    """HTTP/1.1 keep-alive, GET only: enough for Prometheus' scrapes."""

    def __init__(self, pod: Pod, kind: str) -> None:
        self.pod, self.kind, self.buf, self.t = pod, kind, b"", None

    def connection_made(self, transport) -> None:
        self.t = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while b"\r\n\r\n" in self.buf:
            head, self.buf = self.buf.split(b"\r\n\r\n", 1)
            lines = head.decode("latin-1").split("\r\n")
            headers = {}
            for line in lines[1:]:
                k, _, v = line.partition(":")
                headers[k.strip().lower()] = v.strip()
            gz = "gzip" in headers.get("accept-encoding", "")
            body, ctype = self.pod.body(self.kind, headers.get("accept", ""), gz)
            extra = "Content-Encoding: gzip\r\n" if gz else ""
            self.t.write(f"HTTP/1.1 200 OK\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
                         .encode() + body)


def run_fleet(pods: int, tick: float, seed: int) -> None:
    """The fleet process: prints one JSON line (the pods and their ports), serves until its
    standard input closes (the parent is gone) or SIGTERM."""
    specs = fleet_specs(pods, seed)
    fleet = [Pod(s, tick) for s in specs]
    loop = asyncio.new_event_loop()
    servers, ports = [], []
    for p in fleet:
        pair = []
        for kind in ("vllm", "sidecar"):
            srv = loop.run_until_complete(loop.create_server(lambda p=p, k=kind: _Http(p, k), "127.0.0.1", 0))
            servers.append(srv)
            pair.append(srv.sockets[0].getsockname()[1])
        ports.append(pair)
    stop = threading.Event()

    def ticker() -> None:
        while not stop.wait(max(0.0, tick - (time.monotonic() % tick))):
            for p in fleet:
                p.advance()

    threading.Thread(target=ticker, daemon=True).start()
    threading.Thread(target=lambda: (sys.stdin.read(), loop.call_soon_threadsafe(loop.stop)), daemon=True).start()
    signal.signal(signal.SIGTERM, lambda *_: loop.call_soon_threadsafe(loop.stop))
    print(json.dumps([{**asdict(s), "vllm_port": vp, "sidecar_port": sp} for s, (vp, sp) in zip(specs, ports)]),
          flush=True)
    try:
        loop.run_forever()
    finally:
        stop.set()
        for s in servers:
            s.close()
