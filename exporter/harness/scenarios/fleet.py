"""A fleet of vLLM pods as Prometheus would have scraped them: vLLM's own series, its HTTP
server's, the sidecar's, and ``up``, step by step.

Every name, label and histogram bound comes from a real vLLM 0.32.0 page (the simulator's
template, ``harness/data``); an old-release pod is the same page through
``pagetransform.legacy_names``' renames, without the series old releases lack
(``num_requests_waiting_by_reason``, ``admission_rejections``, and here also the preemption
counter, as on the 0.x page of the chronic-overload trace). Pods come and go (rollouts, crashes,
replacements: new names, no history), and what each pod does at each step is a ``PodState``
that a scenario computes: a metric-level model, not a request-level one, so a week of a
20-pod fleet renders in seconds. Histogram observations are spread over the real buckets by a
lognormal's CDF (deterministic, no sampling noise), counters accumulate rates times the step.

The sidecar's derived series are measured: the runtime's own derivations run over pages made
from the same states at the sidecar's poll interval (``sidecar_sim``); its self-health series
(target health, last success, build info) are written from whether vLLM answered.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable, Dict, Optional, Sequence

import numpy as np

from . import pd
from .series import Book
from .shapes import HISTOGRAMS, HTTP_LABELS, PodState, http_answers, kv_at, lognormal_cdf, real_bounds  # noqa: F401 - read from here too


@dataclass
class Pod:
    """One pod's life on the grid: from ``start`` to ``end`` (step indices, end exclusive)."""

    name: str
    state: Callable[[int], PodState]   # step index -> what the pod does
    start: int = 0
    end: Optional[int] = None
    model: str = "llama-3.1-70b"
    namespace: str = "llm"
    old_release: bool = False
    with_sidecar: bool = True
    # a vLLM 0.33 pod of a P/D fleet (``pd``): prefill, decode or both; "" for the pods of the
    # older scenarios (none of the role, connector, sleep or speculative series)
    role: str = ""
    spec_tokens: int = 0  # speculative decoding: draft tokens per step (0: off)

    def alive(self, i: int) -> bool:
        return i >= self.start and (self.end is None or i < self.end)


class Fleet:
    """Pods rendered into one ``Book``: ``Fleet(book).render(pods)``. Each pod's states are taken
    for every step first, then every series of the pod is computed over all steps at once."""

    def __init__(self, book: Book, full_from: float = -math.inf, sidecar_cfg=None) -> None:
        """``full_from``: the time from which the sidecar polls at its own interval (before it: at
        the scrape step, see ``sidecar_sim``)."""
        self.book = book
        self.full_from = full_from
        self.sidecar_cfg = sidecar_cfg

    def render(self, pods: Sequence[Pod]) -> Book:
        for pod in pods:
            self._pod(pod)
        return self.book

    def _pod(self, pod: Pod) -> None:
        book, n = self.book, self.book.n
        idx = np.arange(n)
        alive = (idx >= pod.start) & ((idx < pod.end) if pod.end is not None else True)
        if not alive.any():
            return
        states = [pod.state(int(i)) if alive[i] else None for i in range(n)]
        base = PodState()

        def col(name: str) -> np.ndarray:
            return np.array([getattr(s or base, name) for s in states], dtype=float)

        S = {f: col(f) for f in PodState.__dataclass_fields__}
        vup = alive & (S["vllm_up"] > 0)
        sup = alive & (S["sidecar_up"] > 0) & pod.with_sidecar
        target = {"namespace": pod.namespace, "pod": pod.name}
        vjob = {**target, "job": f"{pod.namespace}/vllm", "instance": f"{pod.name}:8000"}
        sjob = {**target, "job": f"{pod.namespace}/vllm-sidecar", "instance": f"{pod.name}:9181"}
        book.put("up", vjob, alive, vup.astype(float))
        if pod.with_sidecar:
            book.put("up", sjob, alive, sup.astype(float))
        self._vllm(pod, S, vup, vjob)
        if pod.with_sidecar:
            self._sidecar(pod, S, sup, vup, sjob)
        # a failed scrape or a target gone: Prometheus marks the target's series stale
        for job, up in ((vjob, vup), (sjob, sup)):
            down = np.zeros(n, dtype=bool)
            down[1:] = up[:-1] & ~up[1:]
            book.end_where(lambda name: True, lambda lab, job=job: lab.get("job") == job["job"] and lab.get("pod") == pod.name,
                           down)
        if pod.end is not None and pod.end < n:
            gone = np.zeros(n, dtype=bool)
            gone[pod.end] = True
            book.end_where(lambda name: name == "up", lambda lab: lab.get("pod") == pod.name, gone)

    # -- series ---------------------------------------------------------------------------------
    def _counter(self, name: str, labels: Dict[str, str], rate: np.ndarray, where: np.ndarray) -> None:
        inc = np.where(where, np.maximum(rate, 0.0) * self.book.step, 0.0)
        self.book.put(name, labels, where, np.cumsum(inc))

    def _hist(self, metric: str, labels: Dict[str, str], count_rate: np.ndarray, cdf, mean: np.ndarray,
              where: np.ndarray, bounds_of: str = "") -> None:
        for le, x in real_bounds(bounds_of or metric):
            self._counter(metric + "_bucket", {**labels, "le": le}, count_rate * cdf(x), where)
        self._counter(metric + "_sum", labels, count_rate * mean, where)
        self._counter(metric + "_count", labels, count_rate, where)

    def _vllm(self, pod: Pod, S: Dict[str, np.ndarray], up: np.ndarray, job: Dict[str, str]) -> None:
        book = self.book
        old = pod.old_release
        lab = {**job, "model_name": pod.model}
        if not old:
            lab["engine"] = "0"
        req, share, ptok, ltok = S["requests"], S["long_share"], S["prompt_tokens"], S["long_tokens"]
        prompt_mean = (1 - share) * ptok * math.exp(0.18) + share * ltok
        gen = req * S["output_tokens"]
        self._counter("vllm:generation_tokens_total", lab, gen, up)
        self._counter("vllm:prompt_tokens_total", lab, req * prompt_mean, up)
        err = np.minimum(S["engine_errors"], req)
        ok = req - err
        for reason, rate in (("stop", ok * 0.8), ("length", ok * 0.2), ("abort", 0 * req), ("error", err)):
            self._counter("vllm:request_success_total", {**lab, "finished_reason": reason}, rate, up)
        if not old:
            self._counter("vllm:num_preemptions_total", lab, S["preemptions"], up)
            self._counter("vllm:admission_rejections_total", {**lab, "reason": "max_num_queued_reqs"}, S["rejections"], up)
        if S["corrupted"].any():
            self._counter("vllm:corrupted_requests_total", lab, S["corrupted"], up)
        queries = req * prompt_mean
        pre = "vllm:prefix_cache" if not old else "vllm:gpu_prefix_cache"
        self._counter(f"{pre}_queries_total", lab, queries, up)
        self._counter(f"{pre}_hits_total", lab, queries * S["prefix_hit"], up)
        t = np.array([book.t(i) for i in range(book.n)])
        kv = np.array([kv_at(ti, u, w) for ti, u, w in zip(t, S["kv_usage"], S["kv_saw"])])
        book.put("vllm:kv_cache_usage_perc" if not old else "vllm:gpu_cache_usage_perc", lab, up, kv)
        book.put("vllm:num_requests_running", lab, up, S["running"])
        book.put("vllm:num_requests_waiting", lab, up, S["waiting_capacity"] + S["waiting_deferred"])
        if not old:
            book.put("vllm:num_requests_waiting_by_reason", {**lab, "reason": "capacity"}, up, S["waiting_capacity"])
            book.put("vllm:num_requests_waiting_by_reason", {**lab, "reason": "deferred"}, up, S["waiting_deferred"])
        ttft, itl, q = S["ttft"], S["itl"], S["queue"]
        self._hist("vllm:time_to_first_token_seconds", lab, req, lambda x: lognormal_cdf(x, ttft, 0.5),
                   ttft * math.exp(0.125), up)
        itl_name = "vllm:inter_token_latency_seconds" if not old else "vllm:time_per_output_token_seconds"
        # one gap between each two tokens: a role pod (0.33 page) counts them as vLLM does, so a prefill
        # instance's single output token makes none (the older scenarios keep one per token)
        gaps = gen if not pod.role else req * np.maximum(S["output_tokens"] - 1.0, 0.0)
        self._hist(itl_name, lab, gaps, lambda x: lognormal_cdf(x, itl, 0.3), itl * math.exp(0.045), up,
                   bounds_of="vllm:inter_token_latency_seconds")
        e2e = ttft + itl * S["output_tokens"]
        self._hist("vllm:e2e_request_latency_seconds", lab, req, lambda x: lognormal_cdf(x, e2e, 0.5),
                   e2e * math.exp(0.125), up)
        self._hist("vllm:request_queue_time_seconds", lab, req, lambda x: lognormal_cdf(x, q, 0.8),
                   q * math.exp(0.32), up)
        self._hist("vllm:request_prompt_tokens", lab, req,
                   lambda x: (1 - share) * lognormal_cdf(x, ptok, 0.6) + share * lognormal_cdf(x, ltok, 0.05),
                   prompt_mean, up)
        self._hist("vllm:request_generation_tokens", lab, req, lambda x: lognormal_cdf(x, S["output_tokens"], 0.5),
                   S["output_tokens"], up)
        http = {**job, **HTTP_LABELS}
        answered, failed = http_answers(S, req, err)
        self._counter("http_requests_total", {**http, "status": "2xx"}, answered, up)
        self._counter("http_requests_total", {**http, "status": "5xx"}, failed, up)
        book.put("process_start_time_seconds", job, up, book.t(pod.start) - 90.0)
        if pod.role:
            pd.write_vllm(self, pod, S, up, lab)

    def _sidecar(self, pod: Pod, S: Dict[str, np.ndarray], up: np.ndarray, vup: np.ndarray, job: Dict[str, str]) -> None:
        book, n = self.book, self.book.n
        book.put("vllm_sidecar_build_info", {**job, "version": "0.1.0"}, up, 1.0)
        book.put("vllm_sidecar_process_start_time_seconds", job, up, book.t(pod.start) - 5.0)
        book.put("vllm_sidecar_target_up", {**job, "target": "vllm"}, up, vup.astype(float))
        # when vLLM was last read: known once it answered once
        t = np.array([book.t(i) for i in range(n)])
        last = np.where(vup & up, t, np.nan)
        seen = np.maximum.accumulate(np.where(np.isnan(last), -np.inf, last))
        book.put("vllm_sidecar_last_success_timestamp_seconds", {**job, "target": "vllm"}, up & np.isfinite(seen), seen)
        on = up & vup
        # every derived series: the runtime's own derivations over pages at the sidecar's poll interval
        from .sidecar_sim import SidecarSim, sidecar_config

        cfg = self.sidecar_cfg or sidecar_config()
        if pod.role:  # the sidecar is given the pod's role (--role), as deployed
            cfg = replace(cfg, role=pod.role)
        sim = SidecarSim(cfg)
        derived = sim.run(pod, S, t, on, full_from=self.full_from)
        if pod.role:  # issue 28's series, where the runtime does not serve the name itself
            served = {name for name, _labels in derived}
            for key, row in pd.sidecar_series(pod, S, book.step, sim.cfg.window).items():
                if "vllm_sidecar_" + key[0] not in served:
                    derived[("vllm_sidecar_" + key[0], key[1])] = row
        for (name, labels), row in derived.items():
            where = on & ~np.isnan(row)
            if where.any():
                book.put(name, {**job, **dict(labels)}, where, row)


REPLICA_INDEX: Dict[str, int] = {}  # pod name -> the replica slot it fills (pod_name's index)


def pod_name(deployment: str, revision: int, index: int) -> str:
    """Pod names as a Deployment makes them: a revision hash and a random suffix."""
    h = f"{(revision * 2654435761) % (1 << 32):08x}"[:9]
    suffix = "".join("bcdfghjklmnpqrstvwxz2456789"[(index * 7 + revision * 13 + k * 5) % 27] for k in range(5))
    name = f"{deployment}-{h}-{suffix}"
    REPLICA_INDEX[name] = index
    return name

