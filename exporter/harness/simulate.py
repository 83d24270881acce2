"""A simulated vLLM and its GPUs, for the demo and for tests: no hardware, no model.

``SimVllm`` is a small discrete-time model of vLLM's scheduler: requests arrive, wait, are
admitted while the KV cache has room and the batch is below ``max_num_seqs``, prefill at a
shared token budget, decode at an inter-token latency that grows with the batch, are preempted
(and recomputed) when their growing KV no longer fits, and finish. It counts what vLLM counts.

Its ``/metrics`` page is a real vLLM 0.32.0 page (``data/vllm-0.32.0-metrics.txt``, captured
from a real server, see tests/fixtures/vllm/PROVENANCE.md) with the simulated values written
into the series vLLM has, so names, labels, bucket bounds, ``_created`` series and the rest are
exactly a real page's. The GPU side updates ``FakeGpu`` objects of ``fakenvml``.

Scenarios (``SCENARIOS``): a normal day, the long-prompt storm of the user's incident, KV
thrashing, a stalled engine, GPU busy with tokens low, a vLLM restart, and a vLLM upgrade that
renames metrics.
"""

from __future__ import annotations

import math
import random
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, replace
from importlib import resources
from typing import Deque, Dict, List, Optional, Tuple

from ..runtime.exposition import parse
from . import pagetransform as pt
from .fakenvml import FakeGpu

TEMPLATE_NAME = "vllm-0.32.0-metrics.txt"


def template_page() -> str:
    return resources.files("exporter.harness").joinpath("data", TEMPLATE_NAME).read_text()


@dataclass
class Scenario:
    name: str
    doc: str
    onset: float = 30.0  # seconds after start when the trouble begins


SCENARIOS: Dict[str, Scenario] = {s.name: s for s in (
    Scenario("normal", "a normal busy day: steady chat traffic, the KV cache comfortably used"),
    Scenario("long-prompt-storm", "the user's night: one client floods the replica with 8,000-token prompts"),
    Scenario("kv-thrashing", "long generations at high concurrency: the KV cache overflows, vLLM preempts"),
    Scenario("stall", "the engine hangs: requests stay running, no token comes out"),
    Scenario("gpu-busy-low", "the GPUs stay at 100% but tokens collapse (a sick GPU, throttled clocks)"),
    Scenario("restart", "vLLM crashes and restarts: the page goes away, counters start again from zero"),
    Scenario("upgrade", "vLLM is upgraded from a release with the old metric names to the new ones"),
)}


@dataclass
class _Req:
    arrival: float
    prompt: int
    max_out: int
    generated: int = 0
    prefilled: int = 0
    scheduled: Optional[float] = None
    first_token: Optional[float] = None
    last_token: Optional[float] = None
    preemptions: int = 0
    itl_sum: float = 0.0


class _Hist:
    def __init__(self, bounds: List[float]) -> None:
        self.bounds = bounds
        self.counts = [0.0] * len(bounds)
        self.sum = 0.0
        self.count = 0.0

    def observe(self, v: float, n: float = 1.0) -> None:
        for i, b in enumerate(self.bounds):
            if v <= b:
                self.counts[i] += n
        self.sum += v * n
        self.count += n


HISTS = {  # simulated histogram -> vLLM name
    "ttft": "vllm:time_to_first_token_seconds",
    "itl": "vllm:inter_token_latency_seconds",
    "tpot": "vllm:request_time_per_output_token_seconds",
    "e2e": "vllm:e2e_request_latency_seconds",
    "queue": "vllm:request_queue_time_seconds",
    "prefill": "vllm:request_prefill_time_seconds",
    "decode": "vllm:request_decode_time_seconds",
    "inference": "vllm:request_inference_time_seconds",
    "prompt": "vllm:request_prompt_tokens",
    "gen": "vllm:request_generation_tokens",
    "max_tokens": "vllm:request_params_max_tokens",
    "max_gen": "vllm:request_max_num_generation_tokens",
    "preempt": "vllm:request_num_preemptions",
    "n": "vllm:request_params_n",
    "prefill_kv": "vllm:request_prefill_kv_computed_tokens",
    "iteration": "vllm:iteration_tokens_total",
}


class SimVllm:
    """One vLLM server (one engine, one model) and its GPUs, advanced by ``step``."""

    def __init__(self, scenario: str = "normal", model: str = "llama-3.1-70b-instruct", gpus: Optional[List[FakeGpu]] = None,
                 seed: int = 7, start: Optional[float] = None, kv_tokens: int = 24_000, max_num_seqs: int = 32,
                 arrival_rate: float = 3.0, onset: Optional[float] = None) -> None:
        if scenario not in SCENARIOS:
            raise ValueError(f"unknown scenario {scenario!r}; choose from {', '.join(SCENARIOS)}")
        # a copy: setting this instance's onset must not change the table or other instances
        self.scenario = replace(SCENARIOS[scenario])
        if onset is not None:
            self.scenario.onset = onset
        self.model = model
        self.gpus = gpus or []
        self.rng = random.Random(seed)
        self.kv_tokens = kv_tokens
        self.max_num_seqs = max_num_seqs
        self.arrival_rate = arrival_rate
        self.prefill_tokens_per_s = 8_000.0
        self.overhead = 0.12  # tokenization, scheduling, the first decode step
        self.itl_base = 0.012
        self.lock = threading.Lock()
        self.template = template_page()
        self._bounds = self._template_bounds()
        self.t0 = start if start is not None else time.time()
        self.now = self.t0
        self.up = True
        self.legacy_names = scenario == "upgrade"
        self._reset_process(self.t0)
        self._restart_at: Optional[float] = None
        self._energy_mj = 0.0

    # -- process state -----------------------------------------------------------------------
    def _template_bounds(self) -> Dict[str, List[float]]:
        out: Dict[str, List[float]] = {}
        for s in parse(self.template).samples:
            if s.name.endswith("_bucket"):
                le = dict(s.labels)["le"]
                out.setdefault(s.name[: -len("_bucket")], []).append(math.inf if le == "+Inf" else float(le))
        return out

    def _reset_process(self, now: float) -> None:
        self.process_start = now
        self.waiting: Deque[_Req] = deque()
        self.running: List[_Req] = []
        self.c: Dict[str, float] = {k: 0.0 for k in (
            "gen", "prompt", "preempt", "stop", "length", "abort", "error", "prefix_q", "prefix_h",
            "rejections", "prompt_cached")}
        self.h = {k: _Hist(self._bounds[v]) for k, v in HISTS.items()}

    @property
    def elapsed(self) -> float:
        return self.now - self.t0

    def in_trouble(self) -> bool:
        return self.elapsed >= self.scenario.onset

    def phase(self) -> str:
        if self.scenario.name == "normal":
            return "normal"
        return f"{self.scenario.name} (since {self.elapsed - self.scenario.onset:.0f}s)" if self.in_trouble() \
            else f"normal, {self.scenario.name} in {self.scenario.onset - self.elapsed:.0f}s"

    # -- the model -------------------------------------------------------------------------------
    def _arrivals(self, dt: float) -> List[_Req]:
        out = []
        sc = self.scenario.name
        rate = self.arrival_rate
        if sc == "kv-thrashing" and self.in_trouble():
            rate *= 2.0
        n = self._poisson(rate * dt)
        for _ in range(n):
            prompt = int(min(7000, max(20, self.rng.lognormvariate(math.log(450), 0.6))))
            max_out = int(min(2000, max(8, self.rng.lognormvariate(math.log(180), 0.5))))
            if sc == "kv-thrashing" and self.in_trouble():
                max_out = int(self.rng.uniform(1500, 3000))
            out.append(_Req(self.now - self.rng.uniform(0, dt), prompt, max_out))
        if sc == "long-prompt-storm" and self.in_trouble():
            for _ in range(self._poisson(2.0 * dt)):
                out.append(_Req(self.now - self.rng.uniform(0, dt), int(self.rng.uniform(7800, 8400)),
                                int(self.rng.uniform(100, 400))))
        return out

    def _poisson(self, lam: float) -> int:
        if lam <= 0:
            return 0
        limit, k, p = math.exp(-lam), 0, 1.0
        while True:
            p *= self.rng.random()
            if p <= limit:
                return k
            k += 1

    def kv_used(self) -> int:
        return sum(r.prefilled + r.generated for r in self.running)

    def step(self, dt: float) -> None:
        with self.lock:
            self._step(dt)

    def _step(self, dt: float) -> None:
        self.now += dt
        sc = self.scenario.name
        if sc == "restart" and self.in_trouble() and self._restart_at is None:
            self._restart_at = self.now
            self.up = False
        if self._restart_at is not None and not self.up and self.now - self._restart_at >= 8.0:
            self.up = True
            self._reset_process(self.now)
        if sc == "upgrade" and self.in_trouble() and self.legacy_names:
            # the upgrade restarts the server with the new release's names
            self.legacy_names = False
            self._reset_process(self.now)
        if not self.up:
            self._update_gpus(0.0, dt)
            return
        stalled = sc == "stall" and self.in_trouble()
        slow = 0.06 if sc == "gpu-busy-low" and self.in_trouble() else 1.0
        self.waiting.extend(self._arrivals(dt))
        # admit while the batch and the KV cache have room
        used = self.kv_used()
        while self.waiting and len(self.running) < self.max_num_seqs and not stalled:
            r = self.waiting[0]
            need = r.prompt + 16
            if used + need > self.kv_tokens:
                break
            self.waiting.popleft()
            if r.scheduled is None:
                r.scheduled = self.now
                self.h["queue"].observe(self.now - r.arrival)
                q = r.prompt
                hit = int(q * 0.35) if r.prompt < 4000 else 0  # the shared system prompt
                self.c["prefix_q"] += q
                self.c["prefix_h"] += hit
                self.c["prompt_cached"] += hit
                r.prefilled = hit
            self.running.append(r)
            used += need
        if stalled:
            self._update_gpus(0.97, dt)
            return
        # prefill: a shared token budget, oldest first
        budget = self.prefill_tokens_per_s * dt * slow
        prefill_work = 0.0
        for r in self.running:
            if r.prefilled < r.prompt and budget > 0:
                take = min(budget, r.prompt - r.prefilled)
                r.prefilled += int(take)
                budget -= take
                prefill_work += take
                self.c["prompt"] += int(take)
                if r.prefilled >= r.prompt and r.first_token is None:
                    r.first_token = self.now
                    r.last_token = self.now
                    self.h["ttft"].observe(self.now - r.arrival + self.overhead)
        # decode: every request past prefill makes tokens; prefill steals time from decode
        decoding = [r for r in self.running if r.prefilled >= r.prompt]
        prefill_share = min(0.97, prefill_work / max(1.0, self.prefill_tokens_per_s * dt))
        itl = self.itl_base * (1 + len(decoding) / 24.0) / max(0.05, (1 - prefill_share)) / slow
        gen_tokens = 0
        finished = []
        for r in decoding:
            n = int(dt / itl) + (1 if self.rng.random() < (dt / itl) % 1 else 0)
            n = min(n, r.max_out - r.generated)
            if n <= 0:
                continue
            r.generated += n
            gen_tokens += n
            r.itl_sum += itl * n
            self.h["itl"].observe(itl, n)
            r.last_token = self.now
            if r.generated >= r.max_out:
                finished.append(r)
        self.c["gen"] += gen_tokens
        if gen_tokens or prefill_work:
            self.h["iteration"].observe(gen_tokens + prefill_work, max(1, int(dt / max(itl, 1e-3))))
        # requests that finished in this step leave the batch first and free their cache; then, if
        # the cache still overflows as sequences grow, the newest are preempted (recomputed later)
        for r in finished:
            self.running.remove(r)
            self._finish(r, "length" if self.rng.random() < 0.3 else "stop")
        while self.kv_used() > self.kv_tokens and len(self.running) > 1:
            victim = self.running.pop()
            victim.preemptions += 1
            victim.prefilled = 0
            self.c["preempt"] += 1
            self.waiting.appendleft(victim)
        busy = min(1.0, 0.62 + 0.5 * len(self.running) / 16 + prefill_share)
        if slow < 1.0 or (sc == "long-prompt-storm" and self.in_trouble()):
            busy = max(busy, 0.99)
        self._update_gpus(busy, dt)

    def _finish(self, r: _Req, reason: str) -> None:
        self.c[reason] += 1
        e2e = self.now - r.arrival
        self.h["e2e"].observe(e2e)
        self.h["prompt"].observe(r.prompt)
        self.h["gen"].observe(r.generated)
        self.h["max_tokens"].observe(r.max_out)
        self.h["max_gen"].observe(r.max_out)
        self.h["n"].observe(1)
        self.h["preempt"].observe(r.preemptions)
        self.h["prefill_kv"].observe(r.prompt)
        if r.first_token is not None and r.scheduled is not None:
            self.h["prefill"].observe(r.first_token - r.scheduled)
            self.h["decode"].observe(self.now - r.first_token)
            self.h["inference"].observe(self.now - r.scheduled)
            if r.generated > 1:
                self.h["tpot"].observe((self.now - r.first_token) / (r.generated - 1))

    def _update_gpus(self, busy: float, dt: float) -> None:
        for g in self.gpus:
            jitter = self.rng.uniform(-0.02, 0.02)
            g.utilization_percent = int(max(0, min(100, round((busy + jitter) * 100))))
            g.sm_activity_percent = max(0.0, min(100.0, (busy * 0.8 + jitter) * 100))
            g.sm_occupancy_percent = g.sm_activity_percent * 0.6
            g.memory_used = int(g.memory_total * (0.92 if self.up else 0.02))
            g.power_mw = int(90_000 + busy * 560_000)
            g.temperature_c = int(38 + busy * 35)
            g.energy_mj += int(g.power_mw * dt)
            throttled = self.scenario.name == "gpu-busy-low" and self.in_trouble()
            g.clock_event_reasons = 0x40 if throttled else (0x1 if busy < 0.05 else 0)
            g.sm_clock_mhz = 900 if throttled else 1980

    # -- the page --------------------------------------------------------------------------------
    def page(self) -> str:
        """The /metrics page as vLLM serves it now. Raises ConnectionError while vLLM is down."""
        with self.lock:
            if not self.up:
                raise ConnectionError("vLLM is down")
            return self._render()

    def _render(self) -> str:
        c, h = self.c, self.h
        by_name: Dict[str, float] = {
            "vllm:generation_tokens_total": c["gen"],
            "vllm:prompt_tokens_total": c["prompt"],
            "vllm:num_preemptions_total": c["preempt"],
            "vllm:prefix_cache_queries_total": c["prefix_q"],
            "vllm:prefix_cache_hits_total": c["prefix_h"],
            "vllm:prompt_tokens_cached_total": c["prompt_cached"],
            "vllm:num_requests_running": float(len(self.running)),
            "vllm:num_requests_waiting": float(len(self.waiting)),
            "vllm:kv_cache_usage_perc": min(1.0, self.kv_used() / self.kv_tokens),
            "process_start_time_seconds": self.process_start,
        }
        capacity_waits = float(len(self.waiting)) if self.waiting else 0.0
        by_label: Dict[Tuple[str, str], float] = {
            ("vllm:request_success_total", "stop"): c["stop"],
            ("vllm:request_success_total", "length"): c["length"],
            ("vllm:request_success_total", "abort"): c["abort"],
            ("vllm:request_success_total", "error"): c["error"],
            ("vllm:request_success_total", "repetition"): 0.0,
            ("vllm:num_requests_waiting_by_reason", "capacity"): capacity_waits,
            ("vllm:num_requests_waiting_by_reason", "deferred"): 0.0,
            ("vllm:prompt_tokens_by_source_total", "local_compute"): c["prompt"],
            ("vllm:prompt_tokens_by_source_total", "local_cache_hit"): c["prompt_cached"],
            ("vllm:prompt_tokens_cached_by_source_total", "device"): c["prompt_cached"],
            ("vllm:admission_rejections_total", "max_num_queued_reqs"): c["rejections"],
        }
        hist_by_name = {v: h[k] for k, v in HISTS.items()}
        start = self.process_start
        label_re = re.compile(r'(finished_reason|reason|source)="([^"]*)"')
        le_re = re.compile(r'le="([^"]*)"')

        def fn(name: str, labels: str, value: float):
            if name in by_name:
                return [(name, labels, by_name[name])]
            if name.endswith("_created"):
                return [(name, labels, start)]
            m = label_re.search(labels)
            if m and (name, m.group(2)) in by_label:
                return [(name, labels, by_label[(name, m.group(2))])]
            for suffix in ("_bucket", "_sum", "_count"):
                if name.endswith(suffix) and name[: -len(suffix)] in hist_by_name:
                    hh = hist_by_name[name[: -len(suffix)]]
                    if suffix == "_sum":
                        return [(name, labels, hh.sum)]
                    if suffix == "_count":
                        return [(name, labels, hh.count)]
                    le = le_re.search(labels).group(1)
                    b = math.inf if le == "+Inf" else float(le)
                    return [(name, labels, hh.counts[hh.bounds.index(b)])]
            if name.startswith("vllm:") and (name.endswith("_total") or name.endswith(("_sum", "_count", "_bucket"))):
                return [(name, labels, 0.0)]  # counters the simulation does not model start at zero
            return None

        text = pt.map_samples(self.template, fn)
        text = pt.rename_model(text, self.model)
        text = re.sub(r'kv_cache_size_tokens="\d+"', f'kv_cache_size_tokens="{self.kv_tokens}"', text)
        text = re.sub(r'num_gpu_blocks="\d+"', f'num_gpu_blocks="{self.kv_tokens // 16}"', text)
        if self.legacy_names:
            text = pt.legacy_names(text)
        return text


class SimRunner:
    """Steps a SimVllm in real time (times ``speed``) on a background thread."""

    def __init__(self, sim: SimVllm, tick: float = 0.1, speed: float = 1.0) -> None:
        self.sim = sim
        self.tick = tick
        self.speed = speed
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="sim", daemon=True)

    def _run(self) -> None:
        last = time.monotonic()
        while not self.stop.wait(self.tick):
            now = time.monotonic()
            self.sim.step((now - last) * self.speed)
            last = now

    def start(self) -> "SimRunner":
        self.thread.start()
        return self

    def close(self) -> None:
        self.stop.set()
        self.thread.join(2)
