"""The P/D fleet scenarios of issue 28: the user's design B, prefill instances and TP2 decode
instances with the KV cache moved between them (NIXL), speculative decoding (EAGLE-3, 4 draft
tokens) on the decode side, and a plain replica of role ``both`` among them (``pd`` writes their
series).

A fleet is laid out by replica slot, the affected instance in slot 0 (the matrix cuts the first
slots): ``layout(first)``. Per instance, not per fleet, so that a cut keeps each pod's load:
- a prefill instance: 6 requests/s at the day's peak, prompts of ~1,450 tokens (half from its own
  prefix cache), one output token each, GPU 0.75-0.95 busy, KV held until the decode side reads it;
- a decode instance (TP2): 2.8 requests/s at the peak, 250 output tokens each (~700 tokens/s, the
  user's plan per TP2 replica), 30 % of the prompt from its local prefix cache and 98.5 % of the
  rest read over NIXL (~330 MB a transfer for a 70B), 1-3 requests waiting on a KV fetch at any
  time, speculative acceptance 0.78 at the first draft position falling by 0.8 per position (mean
  accepted length 3.3). vLLM 0.33's scheduler counts a fetch not yet started (``waiting_to_start``,
  still in the waiting queue) as waiting for capacity, and a fetch in progress or loaded but not
  yet running (``WAITING_FOR_REMOTE_KVS``, a blocked status) as deferred: so do these pods.

Each scenario says what the pack must do (``catalog.Scenario``); ``never`` and ``within`` match
alert labels too (the balance alert's ``scale_side``).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable, Dict, List, Tuple

from .catalog import START, Scenario, _fleet, _grid, diurnal, healthy
from .fleet import Pod, pod_name
from .series import Book
from .shapes import PodState

SPEC_TOKENS = 4
# the roles of slots 1-7 after the affected instance: the user's 8 GPUs hold two prefill
# instances and three TP2 decode instances; the matrix's 8 replicas add a plain replica
OTHERS = {"prefill": ("decode", "decode", "prefill", "decode", "both", "decode", "prefill"),
          "decode": ("prefill", "decode", "decode", "prefill", "both", "decode", "prefill"),
          "both": ("prefill", "decode", "decode", "prefill", "decode", "decode", "prefill")}


def layout(first: str, pods: int) -> List[str]:
    return [first, *OTHERS[first]][:pods]


def load(i: int, step: float, busy: bool = True) -> float:
    return diurnal(i, step, 1.0 if busy else 0.7, 0.35)


def prefill_state(i: int, step: float, k: int, busy: bool = True) -> PodState:
    x = load(i, step, busy)
    wob = 0.03 * math.sin(i * 0.7 + k)
    return PodState(requests=6.0 * x, prompt_tokens=1200.0, long_share=0.01, output_tokens=1.0,
                    kv_usage=min(0.8, 0.25 + 0.3 * x + wob), running=2.0 + 4.0 * x,
                    waiting_deferred=1.0 if (i + k) % 23 == 0 else 0.0, ttft=0.22 + 0.2 * x, itl=0.05,
                    queue=0.01, gpu_util=min(0.97, 0.72 + 0.25 * x), prefix_hit=0.5)


def decode_state(i: int, step: float, k: int, busy: bool = True) -> PodState:
    x = load(i, step, busy)
    wob = 0.03 * math.sin(i * 0.9 + k)
    req = 0.3 + 2.5 * x
    fetch = (1.0 if (i + k) % 7 == 0 else 0.0, 1.0 + round(1.5 * x), 1.0 if (i + k) % 5 == 0 else 0.0)
    return PodState(requests=req, prompt_tokens=1200.0, long_share=0.01, output_tokens=250.0,
                    kv_usage=min(0.92, 0.5 + 0.35 * x + wob), running=16.0 + 36.0 * x,
                    waiting_capacity=fetch[0], waiting_deferred=fetch[1] + fetch[2], ttft=0.42 + 0.25 * x,
                    itl=0.018 + 0.004 * x, queue=0.02,
                    gpu_util=min(0.95, 0.6 + 0.3 * x), prefix_hit=0.3, external_hit=0.985,
                    kv_transfers=req, kv_xfer_time=0.03, kv_post_time=0.002, kv_bytes=3.3e8,
                    kv_descriptors=4000.0, kv_fetch_waiting=fetch[0], kv_fetch_in_progress=fetch[1],
                    kv_fetch_completed=fetch[2], spec_accept=0.78, spec_decay=0.8)


def both_state(i: int, step: float, k: int, busy: bool = True) -> PodState:
    return replace(healthy(i, step, busy, k), spec_accept=0.78, spec_decay=0.8)


STATES: Dict[str, Callable[..., PodState]] = {"prefill": prefill_state, "decode": decode_state, "both": both_state}


def pd_fleet(book: Book, onset: int, step: float, pods: int, first: str,
             change: Callable[[str, int, int, PodState], PodState] = lambda role, k, i, s: s,
             busy: bool = True) -> List[Pod]:
    """The fleet, ``change(role, slot, step index, healthy state)`` giving each pod's state."""
    fleet = []
    for k, role in enumerate(layout(first, pods)):
        def state(i: int, k: int = k, role: str = role) -> PodState:
            return change(role, k, i, STATES[role](i, step, k, busy))
        fleet.append(Pod(pod_name(f"vllm-{role}", 1, k), state, role=role,
                         spec_tokens=SPEC_TOKENS if role != "prefill" else 0))
    _fleet(book, onset).render(fleet)
    return fleet


def _scenario(name: str, title: str, first: str, history_h: float, step: float, pods: int, notes: str,
              change=lambda role, k, i, s: s, after_h: float = 0.75, busy: bool = True, **expect) -> Scenario:
    n, onset = _grid(history_h, after_h, step)
    book = Book(START, step, n)
    pd_fleet(book, onset, step, pods, first, change, busy)
    roles = layout(first, pods)
    fleet_text = ", ".join(f"{roles.count(r)} {r}" for r in ("prefill", "decode", "both") if roles.count(r))
    return Scenario(name, title, book, onset=onset, replicas=pods, history_h=history_h,
                    notes=f"a P/D fleet of {fleet_text} (slot 0: {first}); {notes}", **expect)


def after(onset: int, step: float, minutes: float):
    """Step index -> whether it falls in the ``minutes`` after the onset."""
    return lambda i: onset <= i < onset + int(round(minutes * 60 / step))


def pd_prefill_busy(history_h: float = 24.0, step: float = 30.0, pods: int = 8) -> Scenario:
    """The prefill instances at their busiest (the day's peak held for the hour after the onset):
    GPUs 0.97 busy, ~10,000 prompt tokens/s and 6 output tokens/s each. Healthy: nothing loud."""
    _n, onset = _grid(history_h, 0.75, step)

    def change(role, k, i, s):
        if role == "prefill" and i >= onset:
            return replace(s, requests=7.0, running=7.0, kv_usage=0.62, gpu_util=0.97, ttft=0.45)
        return s
    return _scenario("pd-prefill-busy-healthy", "P/D: a busy healthy prefill instance", "prefill", history_h, step,
                     pods, "from the onset the prefill instances run at 7 requests/s of ~1,450-token prompts, GPU 0.97 "
                           "busy, one output token per request: healthy", change, quiet=True)


def pd_decode_healthy(history_h: float = 24.0, step: float = 30.0, pods: int = 8) -> Scenario:
    return _scenario("pd-decode-healthy", "P/D: a healthy decode instance", "decode", history_h, step, pods,
                     "a normal busy day; the decode instance's prompts arrive by KV transfer, 1-3 requests wait "
                     "on a KV fetch at any time (vLLM counts them as waiting for capacity), speculative decoding "
                     "accepts 0.78 at the first position", quiet=True)


def pd_transfer_failing(history_h: float = 24.0, step: float = 30.0, pods: int = 8) -> Scenario:
    """From the onset 40 % of the KV reads of the decode instance in slot 0 fail (NIXL counts them):
    those requests are recomputed locally (vLLM's recompute policy), so their prompts stop
    arriving by transfer and TTFT climbs to seconds."""
    _n, onset = _grid(history_h, 0.75, step)

    def change(role, k, i, s):
        if k == 0 and onset <= i < onset + int(30 * 60 / step):
            fail = 0.4
            return replace(s, kv_transfers=s.kv_transfers * (1 - fail), kv_transfer_failures=s.requests * fail,
                           external_hit=s.external_hit * (1 - fail), ttft=2.5, gpu_util=0.97,
                           kv_fetch_in_progress=s.kv_fetch_in_progress + 2, waiting_deferred=s.waiting_deferred + 2)
        return s
    return _scenario("pd-transfer-failing", "P/D: KV transfers failing on a decode instance", "decode", history_h,
                     step, pods, "for 30 minutes 40 % of one decode instance's KV reads fail "
                                 "(vllm:nixl_num_failed_transfers) and are recomputed locally, TTFT p50 2.5 s", change,
                     first_page=5.0, must_fire=('VLLMKVTransferFailing{severity="critical"}',),
                     within={'VLLMKVTransferFailing{severity="critical"}': 5.0})


def pd_transfer_silent(history_h: float = 24.0, step: float = 30.0, pods: int = 8) -> Scenario:
    """The silent failure: no transfer fails, but the decode instance in slot 0 stops finding the
    prefill side's KV (a misrouted proxy, a connector that lost its peer) and recomputes every
    prompt itself: prompt_tokens_by_source moves from external_kv_transfer to local_compute."""
    _n, onset = _grid(history_h, 0.75, step)

    def change(role, k, i, s):
        if k == 0 and onset <= i < onset + int(30 * 60 / step):
            return replace(s, kv_transfers=0.0, external_hit=0.0, ttft=1.8, gpu_util=0.97, kv_fetch_waiting=0.0,
                           kv_fetch_in_progress=0.0, kv_fetch_completed=0.0, waiting_capacity=0.0, waiting_deferred=0.0)
        return s
    return _scenario("pd-transfer-silent", "P/D: a decode instance recomputing its prompts (silent transfer failure)",
                     "decode", history_h, step, pods, "for 30 minutes one decode instance reads no KV and recomputes "
                                                      "every prompt locally; no transfer is counted as failed", change,
                     first_page=5.0, must_fire=('VLLMKVTransferFailing{severity="critical"}',),
                     within={'VLLMKVTransferFailing{severity="critical"}': 5.0})


def pd_prefill_flooded(history_h: float = 24.0, step: float = 30.0, pods: int = 8) -> Scenario:
    """Long prompts flood the prefill side (every prefill instance: the proxy spreads them): 40 %
    of prompts of 8,000 tokens, its KV full, 6-12 requests held back, TTFT 4-8 s, GPUs at 1.0. The
    decode side has room: half the requests reach it, KV 0.45, no fetch queue."""
    _n, onset = _grid(history_h, 0.75, step)
    inside = after(onset, step, 30)

    def change(role, k, i, s):
        if not inside(i):
            return s
        m = (i - onset) * step / 60.0
        if role == "prefill":
            return replace(s, requests=4.0, long_share=0.4, kv_usage=min(0.99, 0.7 + 0.1 * m), running=3.0,
                           waiting_capacity=min(12.0, 2.0 + 2.0 * m), ttft=4.0 + 4.0 * min(1.0, m / 5), queue=3.0,
                           gpu_util=1.0)
        if role == "decode":
            return replace(s, requests=s.requests * 0.5, kv_transfers=s.kv_transfers * 0.5, kv_usage=0.45,
                           running=s.running * 0.5, ttft=4.5, kv_fetch_waiting=0.0, kv_fetch_completed=0.0,
                           kv_fetch_in_progress=1.0, waiting_capacity=0.0, waiting_deferred=1.0, gpu_util=0.5)
        return s
    return _scenario("pd-prefill-flooded", "P/D: the prefill side flooded with long prompts", "prefill", history_h,
                     step, pods, "for 30 minutes 40 % of prompts are 8,000 tokens long: the prefill instances' KV fills, "
                                 "6-12 requests held back, TTFT 4-8 s; the decode instances idle at KV 0.45", change,
                     must_fire=('VLLMDisaggregationImbalance{scale_side="prefill"}',),
                     within={'VLLMDisaggregationImbalance{scale_side="prefill"}': 15.0},
                     never=('VLLMDisaggregationImbalance{scale_side="decode"}',))


def pd_decode_saturated(history_h: float = 24.0, step: float = 30.0, pods: int = 8) -> Scenario:
    """The decode side saturated (long generations): KV 0.97-0.99, the batch at its ceiling (64),
    6-12 arriving requests whose KV fetch cannot start while every slot is taken (waiting for
    capacity, as vLLM counts them), loaded KV waiting for a slot, preemptions now and then, ITL
    60 ms; the prefill side has room: half the requests reach it (the clients wait on the slow
    decodes), GPUs at 0.5, nobody waiting."""
    _n, onset = _grid(history_h, 0.75, step)
    inside = after(onset, step, 30)

    def change(role, k, i, s):
        if not inside(i):
            return s
        j = (i + k) % 4
        if role == "decode":
            return replace(s, output_tokens=900.0, kv_usage=0.97 + 0.005 * j, running=64.0, kv_fetch_waiting=6.0 + 2 * j,
                           kv_fetch_in_progress=1.0, kv_fetch_completed=3.0, waiting_capacity=6.0 + 2 * j,
                           waiting_deferred=4.0, preemptions=0.05 if j == 0 else 0.0, itl=0.06, ttft=2.5, queue=1.5,
                           gpu_util=0.99)
        if role == "prefill":
            return replace(s, requests=s.requests * 0.5, kv_usage=0.7, gpu_util=0.5, running=1.0)
        return s
    return _scenario("pd-decode-saturated", "P/D: the decode side saturated", "decode", history_h, step, pods,
                     "for 30 minutes generations run to 900 tokens: the decode instances' KV at 0.97-0.99, batch at 64, "
                     "6-12 KV fetches that cannot start, ITL 60 ms; half the requests reach the prefill instances (GPUs 0.5)",
                     change, must_fire=('VLLMDisaggregationImbalance{scale_side="decode"}',),
                     within={'VLLMDisaggregationImbalance{scale_side="decode"}': 15.0},
                     never=('VLLMDisaggregationImbalance{scale_side="prefill"}',))


def pd_spec_halved(history_h: float = 24.0, step: float = 30.0, pods: int = 8) -> Scenario:
    """The draft model's acceptance halves on the decode instance in slot 0 (a drifted draft
    model, a new prompt mix): 0.39 at the first position instead of 0.78; fewer tokens per verify
    step (mean accepted length 3.3 -> 2.0), generation tokens/s down a third at the same batch."""
    _n, onset = _grid(history_h, 0.75, step)

    def change(role, k, i, s):
        if k == 0 and i >= onset:
            return replace(s, spec_accept=s.spec_accept / 2, itl=s.itl * 1.5)
        return s
    return _scenario("pd-spec-acceptance-halved", "P/D: speculative acceptance halved on a decode instance", "decode",
                     history_h, step, pods, "from the onset the draft acceptance of one decode instance halves (0.78 -> "
                                            "0.39 at the first of 4 positions; mean accepted length 3.3 -> 2.0)", change,
                     must_fire=('VLLMSpecDecodeAcceptanceLow{severity="warning"}',),
                     within={'VLLMSpecDecodeAcceptanceLow{severity="warning"}': 20.0})


def pd_sleeping(history_h: float = 24.0, step: float = 30.0, pods: int = 8) -> Scenario:
    """vLLM's sleep mode (level 1, weights offloaded) on the decode instance in slot 0 for 30
    minutes: nothing running or waiting, no token, KV empty, GPU idle, /metrics answering. Not a
    stall, not down, nothing to page about."""
    _n, onset = _grid(history_h, 0.75, step)
    inside = after(onset, step, 30)

    def change(role, k, i, s):
        if k == 0 and inside(i):
            return replace(s, requests=0.0, running=0.0, waiting_capacity=0.0, waiting_deferred=0.0, kv_usage=0.0,
                           kv_transfers=0.0, kv_fetch_waiting=0.0, kv_fetch_in_progress=0.0, kv_fetch_completed=0.0,
                           gpu_util=0.0, sleep_level=1)
        return s
    return _scenario("pd-engine-sleeping", "P/D: an engine put to sleep", "decode", history_h, step, pods,
                     "one decode instance sleeps (vllm:engine_sleep_state weights_offloaded) for 30 minutes, then wakes",
                     change, quiet=True)


def pd_wedged(history_h: float = 24.0, step: float = 30.0, pods: int = 8) -> Scenario:
    """A wedged engine with nothing running: the engine core hangs between two steps, vLLM's
    /health and /metrics still answer (vLLM issues 39863 and 36451), its gauges frozen at 6
    requests waiting and none running, no token, no engine step, the GPU idle."""
    _n, onset = _grid(history_h, 0.75, step)
    inside = after(onset, step, 30)

    def change(role, k, i, s):
        if k == 0 and inside(i):
            return replace(s, requests=0.0, running=0.0, waiting_capacity=6.0, waiting_deferred=0.0, kv_transfers=0.0,
                           kv_fetch_waiting=0.0, kv_fetch_in_progress=0.0, kv_fetch_completed=0.0, gpu_util=0.02)
        return s
    return _scenario("pd-engine-wedged", "P/D: a wedged engine with nothing running", "decode", history_h, step, pods,
                     "one decode instance's engine hangs for 30 minutes: 6 requests waiting, none running, no token "
                     "and no engine step, /health 200", change,
                     first_page=5.0, must_fire=('VLLMEngineStalled{severity="critical"}',),
                     within={'VLLMEngineStalled{severity="critical"}': 5.0})


# name -> builder(history_h, step, pods), and the replica counts each is judged at where not
# the matrix's: the balance alert compares the two sides, so its cells hold at least one of each
PD_SCENARIOS: Dict[str, Callable[..., Scenario]] = {
    "pd-prefill-busy-healthy": pd_prefill_busy,
    "pd-decode-healthy": pd_decode_healthy,
    "pd-transfer-failing": pd_transfer_failing,
    "pd-transfer-silent": pd_transfer_silent,
    "pd-prefill-flooded": pd_prefill_flooded,
    "pd-decode-saturated": pd_decode_saturated,
    "pd-spec-acceptance-halved": pd_spec_halved,
    "pd-engine-sleeping": pd_sleeping,
    "pd-engine-wedged": pd_wedged,
}
PD_REPLICAS: Dict[str, Tuple[int, ...]] = {"pd-prefill-flooded": (2, 3, 8), "pd-decode-saturated": (2, 3, 8)}
