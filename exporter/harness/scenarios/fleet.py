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

The sidecar's series are what the sidecar would serve from the same state: its windowed
long-prompt rate, pressure level, busy-low flag, stall flag, target health.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ...runtime.parser import parse
from ..simulate import template_page
from .series import STALE, Book

# vLLM histogram -> its name on old releases (None: the same)
HISTOGRAMS = {
    "vllm:time_to_first_token_seconds": None,
    "vllm:inter_token_latency_seconds": "vllm:time_per_output_token_seconds",
    "vllm:e2e_request_latency_seconds": None,
    "vllm:request_queue_time_seconds": None,
    "vllm:request_prompt_tokens": None,
    "vllm:request_generation_tokens": None,
}


@lru_cache(maxsize=None)
def real_bounds(metric: str) -> Tuple[Tuple[str, float], ...]:
    """The ``le`` strings and values of a vLLM histogram, as the real page writes them."""
    out: List[Tuple[str, float]] = []
    for s in parse(template_page()).samples:
        if s.name == metric + "_bucket":
            le = dict(s.labels)["le"]
            if le not in [x for x, _ in out]:
                out.append((le, math.inf if le == "+Inf" else float(le)))
    if not out:
        raise KeyError(f"{metric} is not a histogram of the real page")
    return tuple(out)


def lognormal_cdf(x: float, median: float, sigma: float) -> float:
    if x <= 0 or median <= 0:
        return 0.0 if x <= 0 else 1.0
    if math.isinf(x):
        return 1.0
    return 0.5 * (1 + math.erf(math.log(x / median) / (sigma * math.sqrt(2))))


@dataclass(frozen=True)
class PodState:
    """What one pod does during one step (rates per second, gauges at the step's end)."""

    requests: float = 2.0              # requests finished by the engine per second
    prompt_tokens: float = 500.0       # median prompt length (tokens)
    long_share: float = 0.002          # share of prompts of ``long_tokens``
    long_tokens: float = 8000.0
    output_tokens: float = 200.0       # mean generated tokens per request
    kv_usage: float = 0.5
    running: float = 12.0
    waiting_capacity: float = 0.0
    waiting_deferred: float = 0.0
    preemptions: float = 0.0           # per second
    rejections: float = 0.0            # admission rejections per second
    ttft: float = 0.35                 # median seconds
    itl: float = 0.022                 # median seconds per token
    queue: float = 0.002               # median seconds in the queue
    engine_errors: float = 0.0         # requests/s finished with finished_reason="error"
    stream_share: float = 0.7          # share of requests streamed (their engine errors answer 200)
    http_failures: float = 0.0         # requests/s failing before the engine (HTTP 5xx, engine never saw them)
    corrupted: float = 0.0
    gpu_util: float = 0.7
    busy_low: bool = False             # the sidecar's verdict
    stalled: bool = False
    vllm_up: bool = True               # vLLM answers its /metrics
    sidecar_up: bool = True
    prefix_hit: float = 0.6            # prefix-cache hit ratio


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
    # running totals (cumulative counters), per series key
    _acc: Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float] = field(default_factory=dict)
    _recent_long: List[float] = field(default_factory=list)

    def alive(self, i: int) -> bool:
        return i >= self.start and (self.end is None or i < self.end)


def _add(pod: Pod, book: Book, i: int, name: str, labels: Dict[str, str], inc: float) -> None:
    key = (name, tuple(sorted(labels.items())))
    v = pod._acc.get(key, 0.0) + max(0.0, inc)
    pod._acc[key] = v
    book.set(name, labels, i, v)


def _hist(pod: Pod, book: Book, i: int, metric: str, labels: Dict[str, str], count: float,
          cdf: Callable[[float], float], mean: float) -> None:
    for le, x in real_bounds(metric if metric != "vllm:time_per_output_token_seconds"
                             else "vllm:inter_token_latency_seconds"):
        _add(pod, book, i, metric + "_bucket", {**labels, "le": le}, count * cdf(x))
    _add(pod, book, i, metric + "_sum", labels, count * mean)
    _add(pod, book, i, metric + "_count", labels, count)


def _mixture(normal_median: float, long_tokens: float, long_share: float) -> Callable[[float], float]:
    def cdf(x: float) -> float:
        return (1 - long_share) * lognormal_cdf(x, normal_median, 0.6) + long_share * lognormal_cdf(x, long_tokens, 0.05)
    return cdf


class Fleet:
    """Pods rendered into one ``Book``: ``Fleet(book).render(pods)``."""

    SIDECAR_WINDOW = 60.0  # the sidecar's sliding window (s)
    LONG_PROMPT_TOKENS = 4000.0

    def __init__(self, book: Book) -> None:
        self.book = book

    def render(self, pods: Sequence[Pod]) -> Book:
        for pod in pods:
            was_up = {"vllm": False, "sidecar": False}
            for i in range(self.book.n):
                if not pod.alive(i):
                    if pod.end is not None and i == pod.end:
                        # the pod is gone: its targets vanish, Prometheus marks every series stale
                        self.book.end(i, {"pod": pod.name})
                    continue
                s = pod.state(i)
                self._step(pod, i, s, was_up)
        return self.book

    # -- one step of one pod --------------------------------------------------------------------
    def _step(self, pod: Pod, i: int, s: PodState, was_up: Dict[str, bool]) -> None:
        book, dt = self.book, self.book.step
        target = {"namespace": pod.namespace, "pod": pod.name}
        vjob = {**target, "job": f"{pod.namespace}/vllm", "instance": f"{pod.name}:8000"}
        sjob = {**target, "job": f"{pod.namespace}/vllm-sidecar", "instance": f"{pod.name}:9181"}
        if pod.with_sidecar:
            book.set("up", sjob, i, 1.0 if s.sidecar_up else 0.0)
        book.set("up", vjob, i, 1.0 if s.vllm_up else 0.0)
        if s.vllm_up:
            self._vllm(pod, i, s, vjob, dt)
        elif was_up["vllm"]:
            self._end_target(i, vjob)
        was_up["vllm"] = s.vllm_up
        if pod.with_sidecar and s.sidecar_up:
            self._sidecar(pod, i, s, sjob, dt)
        elif pod.with_sidecar and was_up["sidecar"]:
            self._end_target(i, sjob)
        was_up["sidecar"] = pod.with_sidecar and s.sidecar_up

    def _end_target(self, i: int, job: Dict[str, str]) -> None:
        # a failed scrape: Prometheus marks the target's series stale (``up`` itself stays)
        for (name, labels), row in self.book.series.items():
            lab = dict(labels)
            if name != "up" and lab.get("job") == job["job"] and lab.get("pod") == job["pod"] and i > 0 \
                    and row[i - 1] not in (None, STALE) and row[i] is None:
                row[i] = STALE

    def _vllm(self, pod: Pod, i: int, s: PodState, job: Dict[str, str], dt: float) -> None:
        book = self.book
        old = pod.old_release
        lab = {**job, "model_name": pod.model}
        if not old:
            lab["engine"] = "0"
        n = s.requests * dt
        gen = s.requests * s.output_tokens * dt
        prompt_mean = (1 - s.long_share) * s.prompt_tokens * math.exp(0.18) + s.long_share * s.long_tokens
        _add(pod, book, i, "vllm:generation_tokens_total", lab, gen)
        _add(pod, book, i, "vllm:prompt_tokens_total", lab, n * prompt_mean)
        err = min(s.engine_errors * dt, n)
        for reason, inc in (("stop", (n - err) * 0.8), ("length", (n - err) * 0.2), ("abort", 0.0), ("error", err)):
            _add(pod, book, i, "vllm:request_success_total", {**lab, "finished_reason": reason}, inc)
        if not old:
            _add(pod, book, i, "vllm:num_preemptions_total", lab, s.preemptions * dt)
            _add(pod, book, i, "vllm:admission_rejections_total", {**lab, "reason": "max_num_queued_reqs"},
                 s.rejections * dt)
        if s.corrupted or ("vllm:corrupted_requests_total", ()) in pod._acc:
            _add(pod, book, i, "vllm:corrupted_requests_total", lab, s.corrupted * dt)
        q = s.requests * dt * (prompt_mean)
        _add(pod, book, i, "vllm:prefix_cache_queries_total" if not old else "vllm:gpu_prefix_cache_queries_total", lab, q)
        _add(pod, book, i, "vllm:prefix_cache_hits_total" if not old else "vllm:gpu_prefix_cache_hits_total", lab,
             q * s.prefix_hit)
        book.set("vllm:kv_cache_usage_perc" if not old else "vllm:gpu_cache_usage_perc", lab, i, s.kv_usage)
        book.set("vllm:num_requests_running", lab, i, s.running)
        book.set("vllm:num_requests_waiting", lab, i, s.waiting_capacity + s.waiting_deferred)
        if not old:
            book.set("vllm:num_requests_waiting_by_reason", {**lab, "reason": "capacity"}, i, s.waiting_capacity)
            book.set("vllm:num_requests_waiting_by_reason", {**lab, "reason": "deferred"}, i, s.waiting_deferred)
        # histograms
        _hist(pod, book, i, "vllm:time_to_first_token_seconds", lab, n,
              lambda x: lognormal_cdf(x, s.ttft, 0.5), s.ttft * math.exp(0.125))
        itl_name = "vllm:inter_token_latency_seconds" if not old else "vllm:time_per_output_token_seconds"
        _hist(pod, book, i, itl_name, lab, gen, lambda x: lognormal_cdf(x, s.itl, 0.3), s.itl * math.exp(0.045))
        e2e = s.ttft + s.itl * s.output_tokens
        _hist(pod, book, i, "vllm:e2e_request_latency_seconds", lab, n, lambda x: lognormal_cdf(x, e2e, 0.5),
              e2e * math.exp(0.125))
        _hist(pod, book, i, "vllm:request_queue_time_seconds", lab, n, lambda x: lognormal_cdf(x, s.queue, 0.8),
              s.queue * math.exp(0.32))
        _hist(pod, book, i, "vllm:request_prompt_tokens", lab, n,
              _mixture(s.prompt_tokens, s.long_tokens, s.long_share), prompt_mean)
        _hist(pod, book, i, "vllm:request_generation_tokens", lab, n,
              lambda x: lognormal_cdf(x, s.output_tokens, 0.5), s.output_tokens)
        # the OpenAI server's HTTP answers: engine errors of streamed requests answered 200 already
        http = {**job, "handler": "/v1/chat/completions", "method": "POST"}
        non_streamed_errors = err * (1 - s.stream_share)
        failures = s.http_failures * dt
        _add(pod, book, i, "http_requests_total", {**http, "status": "2xx"}, n - non_streamed_errors)
        _add(pod, book, i, "http_requests_total", {**http, "status": "5xx"}, non_streamed_errors + failures)
        book.set("process_start_time_seconds", job, i, self._process_start(pod))

    def _process_start(self, pod: Pod) -> float:
        return self.book.t(pod.start) - 90.0  # vLLM starts before it is ready

    def _sidecar(self, pod: Pod, i: int, s: PodState, job: Dict[str, str], dt: float) -> None:
        book = self.book
        lab = {**job, "model_name": pod.model}
        book.set("vllm_sidecar_build_info", {**job, "version": "0.1.0"}, i, 1.0)
        book.set("vllm_sidecar_target_up", {**job, "target": "vllm"}, i, 1.0 if s.vllm_up else 0.0)
        if s.vllm_up:
            book.set("vllm_sidecar_last_success_timestamp_seconds", {**job, "target": "vllm"}, i, book.t(i))
        elif ("vllm_sidecar_last_success_timestamp_seconds", tuple(sorted({**job, "target": "vllm"}.items()))) in book.series:
            row = book.series[("vllm_sidecar_last_success_timestamp_seconds", tuple(sorted({**job, "target": "vllm"}.items())))]
            last = next((v for v in reversed(row[:i]) if v not in (None, STALE)), None)
            if last is not None:
                book.set("vllm_sidecar_last_success_timestamp_seconds", {**job, "target": "vllm"}, i, last)
        if not s.vllm_up:
            return
        # the sidecar's own window over the long-prompt rate
        long_rate = s.requests * (s.long_share * (1 - lognormal_cdf(self.LONG_PROMPT_TOKENS, s.long_tokens, 0.05))
                                  + (1 - s.long_share) * (1 - lognormal_cdf(self.LONG_PROMPT_TOKENS, s.prompt_tokens, 0.6)))
        pod._recent_long.append(long_rate)
        keep = max(1, int(round(self.SIDECAR_WINDOW / dt)))
        del pod._recent_long[:-keep]
        book.set("vllm_sidecar_long_prompt_requests_per_second", lab, i, sum(pod._recent_long) / len(pod._recent_long))
        level = 3 if s.preemptions > 0 else 2 if (s.waiting_capacity > 0 or s.rejections > 0) else 1 if s.kv_usage >= 0.9 else 0
        book.set("vllm_sidecar_kv_cache_pressure_level", lab, i, float(level))
        book.set("vllm_sidecar_kv_cache_usage_ratio", lab, i, s.kv_usage)
        book.set("vllm_sidecar_requests_waiting_for_capacity", lab, i, s.waiting_capacity)
        book.set("vllm_sidecar_generation_tokens_per_second", lab, i, s.requests * s.output_tokens)
        book.set("vllm_sidecar_gpu_busy_low_throughput", lab, i, 1.0 if s.busy_low else 0.0)
        book.set("vllm_sidecar_engine_stalled", lab, i, 1.0 if s.stalled else 0.0)
        book.set("vllm_sidecar_gpu_mean_utilization_ratio", job, i, s.gpu_util)


def pod_name(deployment: str, revision: int, index: int) -> str:
    """Pod names as a Deployment makes them: a revision hash and a random suffix."""
    h = f"{(revision * 2654435761) % (1 << 32):08x}"[:9]
    suffix = "".join("bcdfghjklmnpqrstvwxz2456789"[(index * 7 + revision * 13 + k * 5) % 27] for k in range(5))
    return f"{deployment}-{h}-{suffix}"


def with_changes(base: Callable[[int], PodState], **changes) -> Callable[[int], PodState]:
    return lambda i: replace(base(i), **changes)
