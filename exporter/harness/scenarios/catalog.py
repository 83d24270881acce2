"""The fleet scenarios every alert is judged on: what a real fleet does on a busy healthy day,
during a rollout, when pods are replaced mid-incident, when errors hide inside streams, under
chronic overload on an old vLLM release, and on the user's night.

Each scenario is a ``Scenario``: a ``Book`` of scraped series (see ``fleet``), the step at which
the trouble starts (``onset``), and what the pack must do: ``quiet`` (no warning or critical
alert at all), ``first_warning`` / ``first_page`` (the latest acceptable minutes after onset),
``must_fire`` (alerts that must fire), ``max_episodes`` (per alert and replica), ``within`` and
``never`` (alerts matched by labels too, e.g. ``scale_side``), ``max_per_day``.

``history`` is how much normal traffic precedes the onset. The defaults are what the checked
claims are made on (a day, so that every baseline window is full); tests may pass less to run
faster, with a matching SLO (``scenario_slo``), as long as they say so.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from .fleet import Fleet, Pod, PodState, pod_name
from .series import Book

START = 1_800_000_000.0  # a fixed time, so renders are reproducible
EVAL_STEP = 30.0  # rules are evaluated every 30 s (kube-prometheus-stack's default), whatever the scrape
FULL_RES_BEFORE = 600.0  # the sidecar polls at its own 2 s from this long before the onset (sidecar_sim)


def _fleet(book: Book, onset: int) -> Fleet:
    return Fleet(book, full_from=book.t(onset) - FULL_RES_BEFORE)


@dataclass
class Scenario:
    name: str
    title: str
    book: Optional[Book]  # None for a recording (``file``)
    onset: int  # step index at which the trouble starts (or the event, for quiet scenarios)
    quiet: bool = False  # nothing warning or critical may fire
    no_page: bool = False  # nothing critical may fire
    first_warning: Optional[float] = None  # minutes after onset, at the latest
    first_page: Optional[float] = None
    must_fire: Tuple[str, ...] = ()
    max_episodes: Dict[str, int] = field(default_factory=dict)  # alert -> most episodes per replica
    notes: str = ""
    file: Optional[str] = None  # a recording: OpenMetrics with timestamps, what a real Prometheus stored
    start: float = 0.0  # a recording: the first evaluation (unix s)
    step: float = 30.0  # a recording: the evaluation interval (s)
    end: float = 0.0
    eval_step: float = EVAL_STEP  # the rules' evaluation interval (s), whatever the scrape interval
    scrape: float = 0.0  # a recording: keep only the samples on this grid (s); 0: as recorded
    replicas: int = 0  # the matrix's coordinates, for the reports
    history_h: float = 0.0
    expect_episodes: Dict[str, int] = field(default_factory=dict)  # alert -> exactly this many episodes (all replicas)
    # alert selectors (``judge.selector``: a name, or ``Name{label="value",...}``) -> the latest
    # minutes after onset of its first firing, rounded up to the next evaluation (0: the first
    # evaluation at or after the onset's scrape)
    within: Dict[str, float] = field(default_factory=dict)
    never: Tuple[str, ...] = ()  # alert selectors that must never fire
    max_per_day: Optional[float] = None  # loud episodes a day per alert and replica, at most

    @property
    def origin(self) -> float:
        return self.book.start if self.book is not None else self.start

    @property
    def onset_time(self) -> float:
        return self.book.t(self.onset) if self.book is not None else self.start + self.onset * self.step

    @property
    def onset_s(self) -> float:
        """Seconds from the first evaluation to the onset."""
        return self.onset_time - self.origin

    @property
    def scrape_interval(self) -> float:
        return self.book.step if self.book is not None else (self.scrape or self.step)


def diurnal(i: int, step: float, peak: float, trough: float) -> float:
    """Traffic over the day: lowest at 04:00, highest at 14:00 (a smooth curve)."""
    hour = ((START + i * step) / 3600.0) % 24
    x = 0.5 - 0.5 * math.cos((hour - 4) / 24 * 2 * math.pi)
    return trough + (peak - trough) * x


def healthy(i: int, step: float, busy: bool, pod_index: int = 0) -> PodState:
    """A replica on a normal (or busy) day: the cache well used, an occasional long prompt, a
    request now and then waiting a scrape for capacity on the busy day."""
    load = diurnal(i, step, 3.2 if busy else 2.0, 0.8)
    wobble = 0.03 * math.sin(i * 0.7 + pod_index)
    kv = min(0.97, (0.62 if busy else 0.45) + 0.3 * (load / 3.2) + wobble)
    blip = busy and (i + 3 * pod_index) % 41 == 0  # one scrape with a request waiting for capacity
    return PodState(
        requests=load,
        long_share=0.004,
        kv_usage=kv,
        running=min(32.0, 6 + 8 * load),
        waiting_capacity=1.0 if blip else 0.0,
        waiting_deferred=1.0 if (i + pod_index) % 17 == 0 else 0.0,
        ttft=0.35 + 0.15 * load / 3.2,
        itl=0.020 + 0.004 * load / 3.2,
        gpu_util=min(0.99, 0.55 + 0.14 * load),
        prefix_hit=0.62,
    )


def _steps(hours: float, step: float) -> int:
    return int(round(hours * 3600 / step)) + 1


# -- the scenarios ------------------------------------------------------------------------------

def _grid(history_h: float, after_h: float, step: float) -> Tuple[int, int]:
    """(steps in all, onset step) for ``history_h`` hours before the onset and ``after_h`` after."""
    onset = int(round(history_h * 3600 / step))
    return onset + int(round(after_h * 3600 / step)) + 1, onset


def busy_healthy_day(history_h: float = 24.0, step: float = 30.0, pods: int = 6, after_h: float = 1.0) -> Scenario:
    n, onset = _grid(history_h, after_h, step)
    book = Book(START, step, n)
    fleet = [Pod(pod_name("vllm-llama", 1, k), (lambda i, k=k: healthy(i, step, True, k))) for k in range(pods)]
    _fleet(book, onset).render(fleet)
    return Scenario("busy-healthy-day", "A busy but healthy day", book, onset=onset, quiet=True,
                    notes=f"{pods} replicas at 0.8-3.2 requests/s each, KV usage 0.62-0.97, a request waiting "
                          "for capacity for one scrape now and then, a long prompt every few minutes",
                    replicas=pods, history_h=history_h)


def rolling_deploy(history_h: float = 24.0, step: float = 30.0, pods: int = 6) -> Scenario:
    """A new release rolls out: one pod at a time is replaced by a pod with a new name and no
    history, which loads its model for three minutes (its sidecar already up, vLLM not yet)
    and then takes its share of a busy fleet."""
    n, onset = _grid(history_h, 1.5, step)
    book = Book(START, step, n)
    every = int(300 / step)  # one pod every 5 minutes
    load_steps = int(180 / step)
    warm_steps = max(1, int(120 / step))
    fleet: List[Pod] = []
    for k in range(pods):
        swap = onset + k * every
        fleet.append(Pod(pod_name("vllm-llama", 1, k), (lambda i, k=k: healthy(i, step, True, k)), end=swap + load_steps))

        def new_state(i: int, k: int = k, swap: int = swap) -> PodState:
            s = healthy(i, step, True, k)
            if i < swap + load_steps:  # loading the model: the sidecar polls, vLLM is not up yet
                return replace(s, vllm_up=False, requests=0.0, running=0.0, gpu_util=0.1)
            if i < swap + load_steps + warm_steps:  # warming up: cold prefix cache, a slower first minutes
                return replace(s, ttft=s.ttft * 1.8, prefix_hit=0.1, kv_usage=0.3)
            return s
        fleet.append(Pod(pod_name("vllm-llama", 2, k), new_state, start=swap))
    _fleet(book, onset).render(fleet)
    return Scenario("rolling-deploy", "A rolling deploy of a busy healthy fleet", book, onset=onset, quiet=True,
                    notes=f"{pods} replicas replaced one every 5 minutes by pods with new names and no history; "
                          "each loads its model for 3 minutes, then serves with a cold prefix cache",
                    replicas=pods, history_h=history_h)


def flooded(i: int, step: float, onset: int, pod_index: int = 0, minutes: float = 30.0) -> PodState:
    """The user's night on one replica: 20 prompts of 8,000 tokens a minute on top of its traffic
    for ``minutes``: the cache fills within three minutes, requests wait for capacity from the
    second minute, preemptions start, TTFT climbs to seconds, tokens collapse, GPUs at 100 %."""
    s = healthy(i, step, False, pod_index)
    k = (i - onset) * step / 60.0  # minutes since onset
    if k < 0 or k > minutes:
        return s
    flood = 20 / 60.0
    req = s.requests + flood
    return replace(
        s, requests=req, long_share=(s.requests * s.long_share + flood) / req,
        kv_usage=min(0.99, s.kv_usage + 0.15 * (k + 1)), running=16.0,
        waiting_capacity=(2 * (k - 1)) if k >= 2 else 0.0,
        preemptions=0.08 if k >= 3 else 0.0,
        ttft=6.0 if k >= 2 else s.ttft * (1 + k), itl=0.08 if k >= 2 else s.itl,
        queue=3.0 if k >= 2 else s.queue, output_tokens=20.0 if k >= 2 else s.output_tokens,
        gpu_util=1.0,
    )


def seed_night(history_h: float = 24.0, step: float = 30.0, pods: int = 3) -> Scenario:
    """The user's night: one client floods one replica (the first) with 8,000-token prompts for 30
    minutes (``flooded``); the others carry on."""
    n, onset = _grid(history_h, 1.0, step)
    book = Book(START, step, n)
    fleet = [Pod(pod_name("vllm-llama", 1, 0), (lambda i: flooded(i, step, onset, 0)))]
    fleet += [Pod(pod_name("vllm-llama", 1, k), (lambda i, k=k: healthy(i, step, False, k))) for k in range(1, pods)]
    _fleet(book, onset).render(fleet)
    return Scenario("seed-night", "The user's night: one client floods one replica with 8,000-token prompts",
                    book, onset=onset, first_warning=1.0, first_page=5.0,
                    must_fire=("VLLMLongPromptSurge", "VLLMKVCacheExhausted"),
                    notes=f"{pods} replica(s); the flood (20 prompts of 8,000 tokens a minute) hits one for 30 minutes",
                    replicas=pods, history_h=history_h)


def capacity_bound(i: int, step: float, onset: int, pod_index: int = 0, minutes: float = 8.0) -> PodState:
    """The capacity-bound flood recorded on the real CPU vLLM (``--max-num-seqs 20``, prompts of
    6,000-7,000 tokens): 8-11 requests held back for capacity at every poll while KV usage stays
    at 0.55-0.68 (the next long prompt does not fit) and 4 or fewer of 20 sequences run, no
    preemption, TTFT p95 to 2.5 s, tokens -60 %."""
    s = healthy(i, step, True, pod_index)
    s = replace(s, running=min(20.0, s.running), kv_usage=min(0.6, s.kv_usage))
    k = (i - onset) * step / 60.0
    if k < 0 or k > minutes:
        return s
    flood = 9 / 60.0
    req = 0.4 * s.requests + flood
    return replace(s, requests=req, long_share=flood / req, long_tokens=6500.0, kv_usage=0.68, kv_saw=0.13,
                   running=4.0, waiting_capacity=8.0 + (i % 4), ttft=2.0, queue=1.5, output_tokens=80.0,
                   gpu_util=0.97)


def capacity_bound_flood(history_h: float = 1.0, step: float = 15.0, pods: int = 1) -> Scenario:
    n, onset = _grid(history_h, 0.5, step)
    book = Book(START, step, n)
    fleet = [Pod(pod_name("vllm-cpu", 1, 0), (lambda i: capacity_bound(i, step, onset, 0)))]
    fleet += [Pod(pod_name("vllm-cpu", 1, k), (lambda i, k=k: replace(healthy(i, step, True, k), running=min(
        20.0, healthy(i, step, True, k).running)))) for k in range(1, pods)]
    _fleet(book, onset).render(fleet)
    return Scenario("capacity-bound-flood", "Requests held back at moderate KV usage: the prompts no longer fit",
                    book, onset=onset, first_page=5.0, must_fire=("VLLMKVCacheExhausted",),
                    notes=f"{pods} replica(s), batch ceiling 20; 8 minutes of 6,500-token prompts: 8-11 requests held "
                          "back for capacity, KV usage 0.55-0.68, 4 of 20 running, no preemption",
                    replicas=pods, history_h=history_h)


def churn_error_burst(history_h: float = 8.0, step: float = 30.0, pods: int = 4) -> Scenario:
    """A pod answers half its requests with 5xx for 20 minutes, then is replaced (new name):
    its errors must stay in every burn window after it is gone."""
    n, onset = _grid(history_h, 1.0, step)
    book = Book(START, step, n)
    bad_for = int(20 * 60 / step)

    def sick(i: int) -> PodState:
        s = healthy(i, step, False, 0)
        if i >= onset:
            return replace(s, http_failures=s.requests)  # half of all answers fail before the engine
        return s

    fleet = [Pod(pod_name("vllm-llama", 1, 0), sick, end=onset + bad_for)]
    fleet.append(Pod(pod_name("vllm-llama", 2, 0), (lambda i: healthy(i, step, False, 0)), start=onset + bad_for))
    fleet += [Pod(pod_name("vllm-llama", 1, k), (lambda i, k=k: healthy(i, step, False, k))) for k in range(1, pods)]
    _fleet(book, onset).render(fleet)
    return Scenario("churn-error-burst", "A pod serves 50% errors for 20 minutes and is replaced", book,
                    onset=onset, first_page=10.0, must_fire=("VLLMErrorBudgetBurn",),
                    notes=f"{pods} replica(s); one answers half its requests with HTTP 5xx for 20 minutes, then a new "
                          "pod (new name) takes its place", replicas=pods, history_h=history_h)


def stream_errors(history_h: float = 8.0, step: float = 30.0, pods: int = 4) -> Scenario:
    """5 % of requests fail inside their streams for 30 minutes: HTTP said 200 before the engine
    failed, so only vLLM's finished_reason="error" counts them."""
    n, onset = _grid(history_h, 1.0, step)
    book = Book(START, step, n)
    per_min = 60.0 / step

    def state(i: int, k: int) -> PodState:
        s = healthy(i, step, False, k)
        if onset <= i < onset + 30 * per_min:
            return replace(s, engine_errors=0.05 * s.requests, stream_share=1.0)
        return s

    fleet = [Pod(pod_name("vllm-llama", 1, k), (lambda i, k=k: state(i, k))) for k in range(pods)]
    _fleet(book, onset).render(fleet)
    return Scenario("stream-errors", "5% of requests fail inside HTTP-200 streams for 30 minutes", book,
                    onset=onset, first_page=25.0, must_fire=("VLLMErrorBudgetBurn",),
                    notes=f"{pods} replica(s); every request is streamed, 5% end with finished_reason=\"error\" after "
                          "the HTTP status (200) was sent", replicas=pods, history_h=history_h)


def _h(*xs: int) -> float:
    """A deterministic pseudo-random number in [0, 1) from integers."""
    v = 0
    for x in xs:
        v = (v * 1_000_003 + x * 7919 + 104_729) % 2_147_483_647
    return ((v * 48_271) % 2_147_483_647) / 2_147_483_647


def overload_waves(t: float, a: float, b: float, seed: int) -> Tuple[bool, float]:
    """Inside the overload ``[a, b)`` (seconds): (held back now?, position in the wave 0-1). Waves
    of requests held back for 1-4 minutes return after 2-10 minutes of calm, for the whole overload."""
    if not a <= t < b:
        return False, 0.0
    x, w = a, 0
    while True:
        on = 60.0 * (1 + 3 * _h(seed, w, 1))
        off = 60.0 * (2 + 8 * _h(seed, w, 2))
        if t < x + on:
            return True, (t - x) / on
        if t < x + on + off:
            return False, 0.0
        x += on + off
        w += 1


def chronic_overload(history_h: float = 1.0, step: float = 30.0, pods: int = 1, hours: float = 3.0,
                     gap_h: float = 1.0) -> Scenario:
    """A current vLLM with the sidecar, overloaded twice for ``hours`` with ``gap_h`` of calm in
    between: KV usage 0.85-1.0 throughout, requests held back for capacity in waves of 1-4 minutes
    returning after 2-10 minutes, preemptions in some waves, TTFT seconds in the waves. Each
    overload must be one episode of each loud alert, and the two stay two."""
    n, onset = _grid(history_h, 2 * hours + gap_h + 1.0, step)
    book = Book(START, step, n)
    t0 = book.t(onset)
    spans = [(t0, t0 + hours * 3600), (t0 + (hours + gap_h) * 3600, t0 + (2 * hours + gap_h) * 3600)]

    def state(i: int, k: int) -> PodState:
        s = healthy(i, step, True, k)
        t = book.t(i)
        for j, (a, b) in enumerate(spans):
            if a <= t < b:
                held, pos = overload_waves(t, a, b, 17 * j + k)
                kv = 0.85 + 0.15 * _h(i, k, 3)
                if not held:
                    return replace(s, requests=3.0, kv_usage=min(kv, 0.95), running=24.0, ttft=0.9, gpu_util=0.98)
                w = int((t - a) // 60)
                return replace(s, requests=3.0, kv_usage=max(kv, 0.92), running=18.0,
                               waiting_capacity=4.0 + 8 * _h(i, k, 4), preemptions=0.1 if _h(w, k, 5) < 0.4 else 0.0,
                               ttft=3.0 + 3 * pos, queue=2.0, gpu_util=0.99)
        return s

    fleet = [Pod(pod_name("vllm-llama", 3, k), (lambda i, k=k: state(i, k))) for k in range(pods)]
    _fleet(book, onset).render(fleet)
    loud = ("VLLMKVCacheExhausted", "VLLMPreemptionsSustained", "VLLMQueueBuildup", "VLLMTTFTHigh", "VLLMTTFTMeanHigh",
            "VLLMInterTokenLatencyHigh", "VLLMLongPromptSurge", "VLLMGPUBusyLowThroughput")
    return Scenario("chronic-overload", "Chronic overload with flickering symptoms, twice, an hour apart", book,
                    onset=onset, must_fire=("VLLMKVCacheExhausted",), max_per_day=2,
                    max_episodes={a: 2 for a in loud}, expect_episodes={"VLLMKVCacheExhausted": 2 * pods},
                    notes=f"{pods} replica(s) of a current release with the sidecar; two overloads of {hours:g} h, "
                          f"{gap_h:g} h apart: KV usage 0.85-1.0, requests held back in waves of 1-4 minutes every "
                          "2-10 minutes, preemptions in some waves", replicas=pods, history_h=history_h)


def chronic_overload_old_release(history_h: float = 24.0, hours: float = 12.0, step: float = 30.0,
                                 pods: int = 2) -> Scenario:
    """An older vLLM (0.x names, no waiting-by-reason, no preemption counter) overloaded for
    hours at a time after a normal busy day: the KV cache saw-tooths between 0.55 and 0.99 from
    one scrape to the next, the queue never drains, and the batch runs KV-limited, well below the
    batch size it reached in the busy hours of the day before. Three overloads; each must be one
    episode per alert, not one per minute."""
    n = _steps(history_h + hours, step)
    book = Book(START, step, n)
    per_h = 3600.0 / step
    h0 = int(history_h * per_h)
    overloads = [(h0 + int(1 * per_h), h0 + int(4 * per_h)), (h0 + int(5.5 * per_h), h0 + int(7.5 * per_h)),
                 (h0 + int(9 * per_h), h0 + int(11.5 * per_h))]

    def state(i: int, k: int) -> PodState:
        s = healthy(i, step, True, k)
        for a, b in overloads:
            if a <= i < b:
                saw = (i * 7 + k * 3) % 11 / 10.0  # 0.0 .. 1.0, jumping around
                waiting = 14 + 10 * ((i * 5 + k) % 7) / 6.0
                return replace(s, requests=3.0, kv_usage=0.55 + 0.44 * saw, waiting_capacity=0.0,
                               waiting_deferred=waiting, running=14.0 + 8 * ((i * 3 + k) % 5) / 4.0,
                               ttft=2.5 + 1.5 * saw, queue=2.0, gpu_util=0.98)
        return s

    fleet = [Pod(pod_name("vllm-legacy", 1, k), (lambda i, k=k: state(i, k)), old_release=True, with_sidecar=False)
             for k in range(pods)]
    Fleet(book).render(fleet)
    return Scenario("chronic-overload-old-release", "Chronic overload on an old vLLM release (0.x page)", book,
                    onset=overloads[0][0], must_fire=("VLLMKVCacheExhausted",),
                    max_episodes={"VLLMKVCacheExhausted": 3, "VLLMQueueBuildup": 3, "VLLMTTFTHigh": 3,
                                  "VLLMTTFTMeanHigh": 3},
                    notes=f"{pods} replicas of an old release without the sidecar; after a busy day, overloaded three "
                          "times for 2-3 hours", replicas=pods, history_h=history_h)


TRACES = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "traces"


def production_trace(trace: str = "conv", history_h: float = 24.0, step: float = 30.0, pods: int = 4,
                     scale: float = 1.6) -> Scenario:
    """A real production hour: Azure's public LLM inference trace (tests/fixtures/traces, the chat
    service by default) drives the fleet, step by step: its arrivals (times ``scale``, spread over
    the replicas), its prompt lengths (the share over 4,000 tokens is the long share) and its
    output lengths. The day before follows the same traffic's averages on a daily curve, so the
    fleet's normal is this service's normal. Real traffic is bursty (1.2 to 9 requests/s from one
    30 s step to the next in ``conv``) and one request in twelve has a prompt over 4,000 tokens:
    nothing of that may page."""
    from ..traces import load_trace

    rows = list(load_trace(TRACES / f"AzureLLMInferenceTrace_{trace}.csv.gz"))
    long_tokens = 4000
    longs = [p for _, p, _ in rows if p > long_tokens]
    shorts = sorted(p for _, p, _ in rows if p <= long_tokens)
    share = len(longs) / len(rows)
    prompt_median = shorts[len(shorts) // 2]
    rate = len(rows) / rows[-1][0] * scale / pods
    n_hist = _steps(history_h, step)
    trace_steps = int(rows[-1][0] // step) + 1
    n = n_hist + trace_steps
    book = Book(START, step, n)
    buckets: List[List[Tuple[int, int]]] = [[] for _ in range(trace_steps)]
    for off, p_tok, o_tok in rows:
        buckets[int(off // step)].append((p_tok, o_tok))

    def from_bucket(base: PodState, b, mult: float) -> PodState:
        if not b:  # nothing arrived in this step: an idle engine (nothing running, nothing to stall)
            return replace(base, requests=0.0, running=0.0, kv_usage=0.2)
        req = len(b) / step * scale / pods * mult
        lg = [p for p, _ in b if p > long_tokens]
        sh = sorted(p for p, _ in b if p <= long_tokens) or [prompt_median]
        return replace(base, requests=req, long_share=len(lg) / len(b), prompt_tokens=sh[len(sh) // 2],
                       long_tokens=(sum(lg) / len(lg)) if lg else 8000.0, output_tokens=sum(o for _, o in b) / len(b),
                       kv_usage=min(0.97, 0.4 + 0.45 * req / (rate * 1.6)), running=min(32.0, 6 + 6 * req),
                       ttft=0.3 + 0.1 * req / rate, gpu_util=min(0.99, 0.5 + 0.15 * req / rate))

    def state(i: int, k: int) -> PodState:
        base = healthy(i, step, False, k)
        if i < n_hist:  # the day before: the same hour of traffic over and over, on a daily curve
            return from_bucket(base, buckets[i % trace_steps], diurnal(i, step, 1.2, 0.4))
        return from_bucket(base, buckets[i - n_hist], 1.0)

    fleet = [Pod(pod_name("vllm-chat", 1, k), (lambda i, k=k: state(i, k))) for k in range(pods)]
    _fleet(book, n_hist).render(fleet)
    return Scenario(f"production-trace-{trace}", f"A real production hour (Azure LLM inference trace, {trace})", book,
                    onset=n_hist, no_page=True,
                    notes=f"{pods} replicas; the public Azure LLM inference trace 2023 ({trace}: {len(rows):,} requests in "
                          f"an hour, {share:.0%} of prompts over 4,000 tokens) x{scale:g}, after a day replaying the "
                          "same hour on a daily curve; its bursts of long prompts are this service's normal: a warning "
                          "there is arguable, a page is not", replicas=pods, history_h=history_h)


RECORDINGS = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "recordings"


def recorded(name: str, step: float = 15.0, scrape: float = 0.0, **expect) -> Scenario:
    """A recording of the real CPU vLLM through a real Prometheus (tests/fixtures/recordings/NAME:
    ``prometheus.om.gz`` and ``meta.json``), evaluated every ``step`` seconds.

    A recording made at real intervals holds one export per Prometheus (``prometheus-<n>s.om.gz``):
    ``scrape`` n reads that file as stored, and a multiple of one of them (60 from 30) thins the
    longest that divides it; an interval no server scraped at, or finer, is refused (ValueError):
    it is not thinned from a coarser one."""
    d = RECORDINGS / name
    meta = json.loads((d / "meta.json").read_text())
    start = math.ceil(meta["start"] / step) * step
    onset = int(round((meta["onset"] - start) / step)) if meta.get("onset") else 0
    title = meta.get("title") or {"long-prompt-flood": "A real long-prompt flood on the CPU vLLM",
                                  "busy-healthy": "A real busy but healthy run of the CPU vLLM",
                                  "busy-overloaded": "A real overload of the CPU vLLM (no flood)",
                                  "fill-flood": "A real flood that fills the cache and preempts, at real intervals",
                                  "capacity-bound-flood": "A real capacity-bound flood (prompts no longer fit), "
                                                          "at real intervals",
                                  "steady-busy": "A real busy healthy run, at real intervals"}.get(name, name)
    ivs = meta.get("scrape_intervals_s")
    if ivs:
        base = [i for i in ivs if scrape and scrape % i == 0]
        if scrape and not base:
            raise ValueError(f"{name} was scraped every {ivs} s: no {scrape:g} s view of it")
        iv = max(base) if base else min(ivs)
        file = d / meta["prometheus"][str(iv)]["file"]
        thin_to = 0.0 if not scrape or scrape == iv else scrape
        how = (f"through Prometheus servers scraping every {' s and every '.join(str(i) for i in ivs)} s in one run "
               f"(each cell reads the server at its interval, a longer one thinned from the longest that divides it; "
               f"the sidecar at its default poll, vLLM's page kept every {meta.get('page_interval_s', '?'):g} s)")
    else:
        file, thin_to = d / "prometheus.om.gz", scrape
        how = f"through Prometheus every {meta.get('scrape_interval_s', '?')} s"
    return Scenario(name=f"recorded-{name}", title=title, book=None, onset=onset, file=str(file),
                    start=start, step=step, end=meta["end"], scrape=thin_to, replicas=1,
                    notes=f"recorded from vLLM {meta.get('vllm_version', '?')} {how} "
                          f"(tests/fixtures/recordings/{name}/PROVENANCE.md)",
                    **expect)


def recorded_flood(scrape: float = 0.0) -> Scenario:
    # the real flood: requests held back for KV capacity at every scrape while KV usage saw-tooths;
    # it must page within five minutes (the brief's flood measured on the old pack paged never)
    return recorded("long-prompt-flood", scrape=scrape, first_page=5.0, must_fire=("VLLMKVCacheExhausted",))


def recorded_busy_healthy(scrape: float = 0.0) -> Scenario:
    return recorded("busy-healthy", scrape=scrape, quiet=True)


def recorded_busy_overloaded(scrape: float = 0.0) -> Scenario:
    # no flood, but the server tipped into congestion: what fires is reported, nothing is required
    return recorded("busy-overloaded", scrape=scrape)


# Recorded at real intervals (15 and 30 s in one run, issue 17), evaluated every 30 s as the matrix
# evaluates every cell. The floods must warn and page; the busy run stays silent.
def recorded_fill_flood(scrape: float = 15.0) -> Scenario:
    return recorded("fill-flood", step=EVAL_STEP, scrape=scrape, first_warning=5.0, first_page=5.0,
                    must_fire=("VLLMKVCacheExhausted",))


def recorded_capacity_bound_flood(scrape: float = 15.0) -> Scenario:
    return recorded("capacity-bound-flood", step=EVAL_STEP, scrape=scrape, first_warning=5.0, first_page=5.0,
                    must_fire=("VLLMKVCacheExhausted",))


def recorded_steady_busy(scrape: float = 15.0) -> Scenario:
    # busy and within the SLOs (TTFT p95 1.75 s), but vLLM preempted 9 requests in two bursts a few
    # minutes apart: the preemption warning is the user's own P2 rule ("sustained preemptions"), so
    # a warning may fire; nothing may page
    return recorded("steady-busy", step=EVAL_STEP, scrape=scrape, no_page=True)


SCENARIOS: Dict[str, Callable[..., Scenario]] = {
    "busy-healthy-day": busy_healthy_day,
    "rolling-deploy": rolling_deploy,
    "seed-night": seed_night,
    "churn-error-burst": churn_error_burst,
    "stream-errors": stream_errors,
    "chronic-overload-old-release": chronic_overload_old_release,
    "chronic-overload": chronic_overload,
    "capacity-bound-flood": capacity_bound_flood,
    "production-trace-conv": production_trace,
    "production-trace-code": lambda **kw: production_trace("code", **kw),
    "recorded-long-prompt-flood": recorded_flood,
    "recorded-busy-healthy": recorded_busy_healthy,
    "recorded-busy-overloaded": recorded_busy_overloaded,
    "recorded-fill-flood": recorded_fill_flood,
    "recorded-capacity-bound-flood": recorded_capacity_bound_flood,
    "recorded-steady-busy": recorded_steady_busy,
}
