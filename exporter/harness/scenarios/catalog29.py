"""The shapes issue 29 (item 4) says the pack still misses, as matrix scenarios, and the busy
healthy shape beside them that must stay silent:

- ``decode-flood``: long generations at high concurrency on one replica: preemptions in bursts,
  no request waiting for capacity, TTFT unharmed, e2e p95 up 10x. The first loud alert must come
  no later than the user's naive preemption rule (the matrix's check against the naive rules).
- ``long-prompt-surge``: a surge of long prompts (no KV exhaustion) that begins half a minute
  before a scrape: VLLMLongPromptSurge must warn at the first evaluation after the first scrape
  that shows it (``within`` 0 minutes: at a 60 s scrape, not two scrapes later).
- ``chronic-overload-2d``: one replica overloaded for 42 of 48 hours, requests held back in waves:
  at most 2 episodes a day of any loud alert (the episodes of one overload, not a notification per
  wave).
- ``busy-healthy-long-bursts``: a busy healthy day on which bursts of long prompts take the KV
  cache to 0.98 for seconds every 20 minutes: silent.

Pods of the existing fleets (no role): these are about every replica, P/D or not.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Dict, Tuple

from .catalog import START, Scenario, _fleet, _grid, _h, healthy, overload_waves
from .fleet import Pod, pod_name
from .series import Book
from .shapes import PodState


def decode_flood(history_h: float = 24.0, step: float = 30.0, pods: int = 3) -> Scenario:
    """One client's long generations (2,000 output tokens instead of 200) on the first replica
    for 30 minutes: the batch grows to 48, KV 0.9-0.98 in a saw-tooth, preemptions in bursts of a
    minute every three, nobody waits for capacity, TTFT as before, ITL 30 ms, e2e p95 up 10x."""
    n, onset = _grid(history_h, 1.0, step)
    book = Book(START, step, n)

    def state(i: int, k: int) -> PodState:
        s = healthy(i, step, True, k)
        m = (i - onset) * step / 60.0
        if k or not 0 <= m < 30:
            return s
        burst = (m % 3.0) < 1.0 and m >= 1.0
        return replace(s, output_tokens=2000.0, running=48.0, kv_usage=0.98, kv_saw=0.08,
                       preemptions=0.25 if burst else 0.0, waiting_capacity=0.0, itl=0.03, gpu_util=0.99)

    fleet = [Pod(pod_name("vllm-llama", 4, k), (lambda i, k=k: state(i, k))) for k in range(pods)]
    _fleet(book, onset).render(fleet)
    return Scenario("decode-flood", "A decode-side flood: long generations, preemptions in bursts", book, onset=onset,
                    notes=f"{pods} replica(s); one client's 2,000-token generations on one replica for 30 minutes: "
                          "batch 48, KV 0.90-0.98, preemptions a minute in every three, no request waiting for "
                          "capacity, TTFT unharmed, e2e p95 up 10x", replicas=pods, history_h=history_h)


def long_prompt_surge(history_h: float = 24.0, step: float = 30.0, pods: int = 3) -> Scenario:
    """From half a minute before the onset scrape, 30 prompts of 6,000 tokens a minute reach the
    first replica for 20 minutes on top of its traffic (a fifth to a third of its requests): the
    KV cache climbs to 0.85 and holds; nobody is held back."""
    n, onset = _grid(history_h, 1.0, step)
    book = Book(START, step, n)
    begin = book.t(onset) - 30.0

    def state(i: int, k: int) -> PodState:
        s = healthy(i, step, False, k)
        # the state of step i holds for (t[i-1], t[i]]: surging once that interval reaches ``begin``
        if k or not (book.t(i) > begin and book.t(i) - step < begin + 20 * 60):
            return s
        flood = 30 / 60.0
        req = s.requests + flood
        return replace(s, requests=req, long_share=(s.requests * s.long_share + flood) / req, long_tokens=6000.0,
                       kv_usage=max(s.kv_usage, 0.85), running=s.running + 4, ttft=s.ttft * 1.6, gpu_util=0.95)

    fleet = [Pod(pod_name("vllm-llama", 5, k), (lambda i, k=k: state(i, k))) for k in range(pods)]
    _fleet(book, onset).render(fleet)
    return Scenario("long-prompt-surge", "A long-prompt surge that must warn on the first scrape showing it", book,
                    onset=onset, must_fire=("VLLMLongPromptSurge",), within={"VLLMLongPromptSurge": 0.0},
                    notes=f"{pods} replica(s); 30 prompts of 6,000 tokens a minute on one replica for 20 minutes, "
                          "beginning 30 s before the onset's scrape; KV 0.85, nobody held back; the warning is due at "
                          "the first evaluation after the first scrape that shows it", replicas=pods,
                    history_h=history_h)


def chronic_overload_2d(history_h: float = 0.0, step: float = 30.0, pods: int = 1) -> Scenario:
    """Two days of one replica, overloaded from hour 3 to hour 45: KV 0.85-1.0, requests held
    back in waves of 1-4 minutes every 2-10 minutes, preemptions in some waves, TTFT seconds in the
    waves; a busy healthy replica before and after."""
    n, onset = _grid(history_h + 3.0, 45.0, step)
    book = Book(START, step, n)
    t0 = book.t(onset)
    a, b = t0, t0 + 42 * 3600.0

    def state(i: int, k: int) -> PodState:
        s = healthy(i, step, True, k)
        t = book.t(i)
        if not a <= t < b:
            return s
        held, pos = overload_waves(t, a, b, 101 + k)
        kv = 0.85 + 0.15 * _h(i, k, 3)
        if not held:
            return replace(s, requests=3.0, kv_usage=min(kv, 0.95), running=24.0, ttft=0.9, gpu_util=0.98)
        w = int((t - a) // 60)
        return replace(s, requests=3.0, kv_usage=max(kv, 0.92), running=18.0, waiting_capacity=4.0 + 8 * _h(i, k, 4),
                       preemptions=0.1 if _h(w, k, 5) < 0.4 else 0.0, ttft=3.0 + 3 * pos, queue=2.0, gpu_util=0.99)

    fleet = [Pod(pod_name("vllm-llama", 6, k), (lambda i, k=k: state(i, k))) for k in range(pods)]
    _fleet(book, onset).render(fleet)
    return Scenario("chronic-overload-2d", "Chronic overload for 42 of 48 hours", book, onset=onset,
                    must_fire=("VLLMKVCacheExhausted",), max_per_day=2,
                    notes=f"{pods} replica(s) of a current release with the sidecar, overloaded from hour 3 to hour 45 "
                          "of two days: KV 0.85-1.0, requests held back in waves of 1-4 minutes every 2-10 minutes, "
                          "preemptions in some waves; at most 2 episodes a day of any loud alert",
                    replicas=pods, history_h=history_h)


def busy_healthy_long_bursts(history_h: float = 24.0, step: float = 30.0, pods: int = 3) -> Scenario:
    """The busy healthy day, and every 20 minutes a burst of 3 long prompts (8,000 tokens) within
    10 s that takes the KV cache to 0.98 for seconds (the sidecar's polls see 0.78-0.98 in that
    step), then drains; nobody is held back. Silent."""
    n, onset = _grid(history_h, 1.0, step)
    book = Book(START, step, n)

    def state(i: int, k: int) -> PodState:
        s = healthy(i, step, True, k)
        t = book.t(i)
        # seconds since this replica's last burst began (bursts 5 minutes off the onset, whose first
        # scrape is where a sidecar started with the scenario has read only a few seconds of traffic)
        b = (t - 300.0 - 600.0 * k) % 1200.0
        if b >= step:
            return s
        req = s.requests + 3.0 / step
        return replace(s, requests=req, long_share=(s.requests * s.long_share + 3.0 / step) / req, kv_usage=0.98,
                       kv_saw=0.2)

    fleet = [Pod(pod_name("vllm-llama", 7, k), (lambda i, k=k: state(i, k))) for k in range(pods)]
    _fleet(book, onset).render(fleet)
    return Scenario("busy-healthy-long-bursts", "A busy healthy day with bursts of long prompts (KV 0.98 for seconds)",
                    book, onset=onset, quiet=True,
                    notes=f"{pods} replica(s) of the busy healthy day; every 20 minutes 3 prompts of 8,000 tokens in "
                          "10 s take the KV cache to 0.98 for seconds; nobody held back", replicas=pods,
                    history_h=history_h)


SCENARIOS29: Dict[str, Callable[..., Scenario]] = {
    "decode-flood": decode_flood,
    "long-prompt-surge": long_prompt_surge,
    "chronic-overload-2d": chronic_overload_2d,
    "busy-healthy-long-bursts": busy_healthy_long_bursts,
}
# the cells each is judged at where not the whole matrix: two days of 8 replicas at a 5 s step are
# 550 MB of series a render; the two-day trace is its own history (3 hours before the overload)
CELLS29: Dict[str, Dict[str, Tuple]] = {
    "chronic-overload-2d": {"replicas": (1, 2, 3), "histories": ("none",)},
}
