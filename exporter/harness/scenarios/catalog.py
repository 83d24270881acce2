"""The fleet scenarios every alert is judged on: what a real fleet does on a busy healthy day,
during a rollout, when pods are replaced mid-incident, when errors hide inside streams, under
chronic overload on an old vLLM release, and on the user's night.

Each scenario is a ``Scenario``: a ``Book`` of scraped series (see ``fleet``), the step at which
the trouble starts (``onset``), and what the pack must do: ``quiet`` (no warning or critical
alert at all), ``first_warning`` / ``first_page`` (the latest acceptable minutes after onset),
``must_fire`` (alerts that must fire), ``max_episodes`` (per alert and replica).

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

    @property
    def onset_time(self) -> float:
        return self.book.t(self.onset) if self.book is not None else self.start + self.onset * self.step


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

def busy_healthy_day(history_h: float = 24.0, step: float = 30.0, pods: int = 6) -> Scenario:
    n = _steps(history_h, step)
    book = Book(START, step, n)
    fleet = [Pod(pod_name("vllm-llama", 1, k), (lambda i, k=k: healthy(i, step, True, k))) for k in range(pods)]
    Fleet(book).render(fleet)
    return Scenario("busy-healthy-day", "A busy but healthy day", book, onset=n // 2, quiet=True,
                    notes=f"{pods} replicas at 0.8-3.2 requests/s each, KV usage 0.62-0.97, a request waiting "
                          "for capacity for one scrape now and then, a long prompt every few minutes")


def rolling_deploy(history_h: float = 24.0, step: float = 30.0, pods: int = 6) -> Scenario:
    """A new release rolls out: one pod at a time is replaced by a pod with a new name and no
    history, which loads its model for three minutes (its sidecar already up, vLLM not yet)
    and then takes its share of a busy fleet."""
    n = _steps(history_h + 1.5, step)
    onset = _steps(history_h, step) - 1
    book = Book(START, step, n)
    every = int(300 / step)  # one pod every 5 minutes
    load_steps = int(180 / step)
    fleet: List[Pod] = []
    for k in range(pods):
        swap = onset + k * every
        fleet.append(Pod(pod_name("vllm-llama", 1, k), (lambda i, k=k: healthy(i, step, True, k)), end=swap + load_steps))

        def new_state(i: int, k: int = k, swap: int = swap) -> PodState:
            s = healthy(i, step, True, k)
            if i < swap + load_steps:  # loading the model: the sidecar polls, vLLM is not up yet
                return replace(s, vllm_up=False, requests=0.0, running=0.0, gpu_util=0.1)
            if i < swap + load_steps + 4:  # warming up: cold prefix cache, a slower first minute
                return replace(s, ttft=s.ttft * 1.8, prefix_hit=0.1, kv_usage=0.3)
            return s
        fleet.append(Pod(pod_name("vllm-llama", 2, k), new_state, start=swap))
    Fleet(book).render(fleet)
    return Scenario("rolling-deploy", "A rolling deploy of a busy healthy fleet", book, onset=onset, quiet=True,
                    notes=f"{pods} replicas replaced one every 5 minutes by pods with new names and no history; "
                          "each loads its model for 3 minutes, then serves with a cold prefix cache")


def seed_night(history_h: float = 24.0, step: float = 30.0) -> Scenario:
    """The user's night: three replicas; one client floods one of them with 8,000-token prompts.
    Its long-prompt rate jumps at once, the cache fills within three minutes, requests wait for
    capacity from the second minute, preemptions start, TTFT climbs to seconds, tokens collapse
    while its GPUs stay at 100 % (the sidecar flags it after three minutes). The others carry on.
    It lasts 30 minutes."""
    n = _steps(history_h + 1.0, step)
    onset = _steps(history_h, step) - 1
    book = Book(START, step, n)
    per_min = 60.0 / step

    def bad(i: int) -> PodState:
        s = healthy(i, step, False, 2)
        k = (i - onset) / per_min  # minutes since onset
        if k < 0 or k > 30:
            return s
        flood = 20 / 60.0  # 20 long prompts a minute
        req = s.requests + flood
        return replace(
            s, requests=req, long_share=(s.requests * s.long_share + flood) / req,
            kv_usage=min(0.99, s.kv_usage + 0.15 * (k + 1)), running=16.0,
            waiting_capacity=(2 * (k - 1)) if k >= 2 else 0.0,
            preemptions=0.08 if k >= 3 else 0.0,
            ttft=6.0 if k >= 2 else s.ttft * (1 + k), itl=0.08 if k >= 2 else s.itl,
            queue=3.0 if k >= 2 else s.queue, output_tokens=20.0 if k >= 2 else s.output_tokens,
            gpu_util=1.0, busy_low=k >= 3,
        )

    fleet = [Pod(pod_name("vllm-llama", 1, k), (lambda i, k=k: healthy(i, step, False, k))) for k in range(2)]
    fleet.append(Pod(pod_name("vllm-llama", 1, 2), bad))
    Fleet(book).render(fleet)
    return Scenario("seed-night", "The user's night: one client floods one replica with 8,000-token prompts",
                    book, onset=onset, first_warning=1.0, first_page=5.0,
                    must_fire=("VLLMLongPromptSurge", "VLLMKVCacheExhausted", "VLLMGPUBusyLowThroughput"),
                    notes="3 replicas; the flood (20 prompts of 8,000 tokens a minute) hits one for 30 minutes")


def churn_error_burst(history_h: float = 8.0, step: float = 30.0) -> Scenario:
    """A pod answers half its requests with 5xx for 20 minutes, then is replaced (new name):
    its errors must stay in every burn window after it is gone."""
    n = _steps(history_h + 1.0, step)
    onset = _steps(history_h, step) - 1
    book = Book(START, step, n)
    per_min = 60.0 / step
    bad_for = int(20 * per_min)

    def sick(i: int) -> PodState:
        s = healthy(i, step, False, 0)
        if i >= onset:
            return replace(s, http_failures=s.requests)  # half of all answers fail before the engine
        return s

    fleet = [Pod(pod_name("vllm-llama", 1, 0), sick, end=onset + bad_for)]
    fleet.append(Pod(pod_name("vllm-llama", 2, 0), (lambda i: healthy(i, step, False, 0)), start=onset + bad_for))
    fleet += [Pod(pod_name("vllm-llama", 1, k), (lambda i, k=k: healthy(i, step, False, k))) for k in range(1, 4)]
    Fleet(book).render(fleet)
    return Scenario("churn-error-burst", "A pod serves 50% errors for 20 minutes and is replaced", book,
                    onset=onset, first_page=10.0, must_fire=("VLLMErrorBudgetBurn",),
                    notes="4 replicas; one answers half its requests with HTTP 5xx for 20 minutes, then a new pod "
                          "(new name) takes its place")


def stream_errors(history_h: float = 8.0, step: float = 30.0) -> Scenario:
    """5 % of requests fail inside their streams for 30 minutes: HTTP said 200 before the engine
    failed, so only vLLM's finished_reason="error" counts them."""
    n = _steps(history_h + 1.0, step)
    onset = _steps(history_h, step) - 1
    book = Book(START, step, n)
    per_min = 60.0 / step

    def state(i: int, k: int) -> PodState:
        s = healthy(i, step, False, k)
        if onset <= i < onset + 30 * per_min:
            return replace(s, engine_errors=0.05 * s.requests, stream_share=1.0)
        return s

    fleet = [Pod(pod_name("vllm-llama", 1, k), (lambda i, k=k: state(i, k))) for k in range(4)]
    Fleet(book).render(fleet)
    return Scenario("stream-errors", "5% of requests fail inside HTTP-200 streams for 30 minutes", book,
                    onset=onset, first_page=25.0, must_fire=("VLLMErrorBudgetBurn",),
                    notes="4 replicas; every request is streamed, 5% end with finished_reason=\"error\" after "
                          "the HTTP status (200) was sent")


def chronic_overload_old_release(history_h: float = 24.0, hours: float = 12.0, step: float = 30.0) -> Scenario:
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
             for k in range(2)]
    Fleet(book).render(fleet)
    return Scenario("chronic-overload-old-release", "Chronic overload on an old vLLM release (0.x page)", book,
                    onset=overloads[0][0], must_fire=("VLLMKVCacheExhausted",),
                    max_episodes={"VLLMKVCacheExhausted": 3, "VLLMQueueBuildup": 3, "VLLMTTFTHigh": 3,
                                  "VLLMTTFTMeanHigh": 3},
                    notes="2 replicas of an old release without the sidecar; after a busy day, overloaded three "
                          "times for 2-3 hours")


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
        if not b:
            return replace(base, requests=0.0, running=2.0, kv_usage=0.2)
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
    Fleet(book).render(fleet)
    return Scenario(f"production-trace-{trace}", f"A real production hour (Azure LLM inference trace, {trace})", book,
                    onset=n_hist, no_page=True,
                    notes=f"{pods} replicas; the public Azure LLM inference trace 2023 ({trace}: {len(rows):,} requests in "
                          f"an hour, {share:.0%} of prompts over 4,000 tokens) x{scale:g}, after a day replaying the "
                          "same hour on a daily curve; its bursts of long prompts are this service's normal: a warning "
                          "there is arguable, a page is not")


RECORDINGS = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "recordings"


def recorded(name: str, step: float = 15.0, **expect) -> Scenario:
    """A recording of the real CPU vLLM through a real Prometheus (tests/fixtures/recordings/NAME:
    ``prometheus.om.gz`` and ``meta.json``), evaluated every ``step`` seconds."""
    d = RECORDINGS / name
    meta = json.loads((d / "meta.json").read_text())
    start = math.ceil(meta["start"] / step) * step
    onset = int(round((meta["onset"] - start) / step)) if meta.get("onset") else 0
    title = meta.get("title") or {"long-prompt-flood": "A real long-prompt flood on the CPU vLLM",
                                  "busy-healthy": "A real busy but healthy run of the CPU vLLM",
                                  "busy-overloaded": "A real overload of the CPU vLLM (no flood)"}.get(name, name)
    return Scenario(name=f"recorded-{name}", title=title, book=None, onset=onset, file=str(d / "prometheus.om.gz"),
                    start=start, step=step, end=meta["end"],
                    notes=f"recorded from vLLM {meta.get('vllm_version', '?')} through Prometheus every "
                          f"{meta.get('scrape_interval_s', '?')} s (tests/fixtures/recordings/{name}/PROVENANCE.md)",
                    **expect)


def recorded_flood() -> Scenario:
    # the real flood: requests held back for KV capacity at every scrape while KV usage saw-tooths;
    # it must page within five minutes (the brief's flood measured on the old pack paged never)
    return recorded("long-prompt-flood", first_page=5.0, must_fire=("VLLMKVCacheExhausted",))


def recorded_busy_healthy() -> Scenario:
    return recorded("busy-healthy", quiet=True)


def recorded_busy_overloaded() -> Scenario:
    # no flood, but the server tipped into congestion: what fires is reported, nothing is required
    return recorded("busy-overloaded")


SCENARIOS: Dict[str, Callable[..., Scenario]] = {
    "busy-healthy-day": busy_healthy_day,
    "rolling-deploy": rolling_deploy,
    "seed-night": seed_night,
    "churn-error-burst": churn_error_burst,
    "stream-errors": stream_errors,
    "chronic-overload-old-release": chronic_overload_old_release,
    "production-trace-conv": production_trace,
    "production-trace-code": lambda **kw: production_trace("code", **kw),
    "recorded-long-prompt-flood": recorded_flood,
    "recorded-busy-healthy": recorded_busy_healthy,
    "recorded-busy-overloaded": recorded_busy_overloaded,
}
