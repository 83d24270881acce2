"""What a simulated vLLM page is made of, shared by the fleet (``fleet``) and the sidecar it
measures (``sidecar_sim``): the real page's histograms and their ``le`` bounds, a lognormal CDF
to fill them, and the KV-usage saw-tooth a pod shows from one engine step to the next, and a pod's state at a step
(``PodState``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import List, Tuple

import numpy as np

from ...runtime.exposition import parse
from ..simulate import template_page

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


def _erf(x: np.ndarray) -> np.ndarray:
    """erf for arrays (Abramowitz and Stegun 7.1.26, absolute error under 1.5e-7)."""
    sign = np.sign(x)
    a = np.abs(x)
    k = 1.0 / (1.0 + 0.3275911 * a)
    y = 1.0 - (((((1.061405429 * k - 1.453152027) * k) + 1.421413741) * k - 0.284496736) * k + 0.254829592) * k * np.exp(-a * a)
    return sign * y


def lognormal_cdf(x, median, sigma: float):
    """P(X <= x) for a lognormal with that median (arrays broadcast); 1 at +Inf, 0 at x <= 0."""
    x = np.asarray(x, dtype=float)
    median = np.asarray(median, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.log(np.where(x > 0, x, 1.0) / np.where(median > 0, median, 1.0)) / (sigma * math.sqrt(2))
        out = 0.5 * (1 + _erf(np.where(np.isfinite(z), z, 0.0)))
    out = np.where(np.isinf(x), 1.0, out)
    return np.where(x <= 0, 0.0, out)


# the OpenAI server's answers on a simulated pod: one handler, POST
HTTP_LABELS = {"handler": "/v1/chat/completions", "method": "POST"}


def http_answers(S, req, err):
    """The OpenAI server's answers per second, (2xx, 5xx), from a pod's state columns, its
    requests and engine errors: an engine error of a streamed request was answered 200 already;
    a request failing before the engine (``http_failures``) is a 5xx the engine never saw."""
    non_streamed = err * (1 - S["stream_share"])
    return req - non_streamed, non_streamed + S["http_failures"]


def kv_at(t: float, usage: float, saw: float) -> float:
    """KV usage at time ``t`` (seconds): ``usage`` less a saw-tooth of depth ``saw`` that changes
    from one engine step to the next (deterministic in ``t``), as real vLLM's gauge does under
    pressure: a scrape every 15-60 s samples it where it lands, the sidecar every 2 s."""
    if not saw:
        return usage
    frac = (math.sin(t * 12.9898) * 43758.5453) % 1.0
    return max(0.0, usage - saw * frac)


@dataclass(frozen=True)
class PodState:
    """What one pod does during one step (rates per second, gauges at the step's end)."""

    requests: float = 2.0              # requests finished by the engine per second
    prompt_tokens: float = 500.0       # median prompt length (tokens)
    long_share: float = 0.002          # share of prompts of ``long_tokens``
    long_tokens: float = 8000.0
    output_tokens: float = 200.0       # mean generated tokens per request
    kv_usage: float = 0.5
    kv_saw: float = 0.0                # usage saw-tooths below kv_usage by up to this much, poll by poll (kv_at)
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
    # prefill/decode disaggregation (``pd``; only pods with a KV connector write these series)
    kv_transfers: float = 0.0          # KV transfers completed per second (read by the decode side)
    kv_transfer_failures: float = 0.0  # failed transfers per second (vLLM counts handshakes and notifications in)
    kv_notification_failures: float = 0.0  # failed notifications per second (also in the failures above)
    kv_expired: float = 0.0            # requests per second whose KV lease expired (prefill side)
    kv_notifications_after_expiry: float = 0.0  # per second (prefill side)
    kv_xfer_time: float = 0.04         # median seconds per transfer
    kv_post_time: float = 0.002        # median seconds to post a transfer
    kv_bytes: float = 0.0              # mean bytes per transfer
    kv_descriptors: float = 120.0      # mean descriptors per transfer
    kv_fetch_waiting: float = 0.0      # requests whose KV load has not started (decode side)
    kv_fetch_in_progress: float = 0.0
    kv_fetch_completed: float = 0.0    # loaded, not running yet
    transferred_share: float = 0.0     # share of prompt tokens that arrived by KV transfer (decode side)
    external_hit: float = 0.0          # connector prefix-cache hits / queries (decode side)
    # speculative decoding (pods with ``spec_tokens``): the share of drafts whose first token is
    # accepted, and how that share falls from one draft position to the next
    spec_accept: float = 0.0
    spec_decay: float = 0.8
    sleep_level: int = 0               # 0 awake, 1 weights offloaded, 2 discard all (vLLM's sleep mode)
