"""`promtool test rules` on the committed rule file: a firing case and a quiet case per alert,
with input series shaped exactly like real vLLM and sidecar output."""

import pytest

from promseries import (
    counter,
    expect,
    gauge,
    histogram,
    prompts_series,
    rules_by_alert,
    run_promtool,
    series,
    sidecar_labels,
    vllm_labels,
)

pytestmark = pytest.mark.prometheus

V = vllm_labels()
W = {"namespace": "llm", "pod": "vllm-0", "model_name": "llama-70b"}  # what alerts carry
S = sidecar_labels()
N = 40  # minutes of input


def case(series_list, evals, interval="1m", evaluation_interval="1m"):
    return {"interval": interval, "input_series": series_list, "alert_rule_test": evals,
            "_evaluation_interval": evaluation_interval}


def at(minute, alert, *alerts):
    return {"eval_time": f"{minute}m", "alertname": alert, "exp_alerts": list(alerts)}


def quiet(minute, alert):
    return at(minute, alert)


def kv_series(usage, capacity=0, deferred=0, preempt_per_min=0, rejections_per_min=0, labels=V):
    return [
        series("vllm:kv_cache_usage_perc", labels, gauge(lambda m: usage, N)),
        series("vllm:num_requests_waiting", labels, gauge(lambda m: capacity + deferred, N)),
        series("vllm:num_requests_waiting_by_reason", {**labels, "reason": "capacity"}, gauge(lambda m: capacity, N)),
        series("vllm:num_requests_waiting_by_reason", {**labels, "reason": "deferred"}, gauge(lambda m: deferred, N)),
        series("vllm:num_preemptions_total", labels, counter(lambda m: preempt_per_min, N)),
        series("vllm:admission_rejections_total",
               {k: v for k, v in labels.items() if k != "engine"} | {"reason": "max_num_queued_reqs"},
               counter(lambda m: rejections_per_min, N)),
    ]


CASES = {}

def sawtooth(m):
    """KV usage as real vLLM shows it under a long-prompt flood: 0.2 to 0.97 from one scrape to the next."""
    return (0.21, 0.97, 0.55, 0.33, 0.9, 0.4)[m % 6]


OLD = vllm_labels(engine=None)


def old_release(usage, waiting, running):
    """An older vLLM: gpu_cache_usage_perc, no engine label, no waiting_by_reason, no preemption counter."""
    return [series("vllm:gpu_cache_usage_perc", OLD, gauge(usage, N)),
            series("vllm:num_requests_waiting", OLD, gauge(waiting, N)),
            series("vllm:num_requests_running", OLD, gauge(running, N))]


CASES["VLLMKVCacheExhausted"] = [
    # full cache with requests waiting for capacity at every evaluation (the value: the share of
    # the window's evaluations holding requests back); these series hold a sample a minute, fewer
    # than kv_cache.held_back_scrapes in windows.held_back, so the share is read over
    # windows.held_back_sparse (3m) once the series is that old: pending at 3, firing 30s later
    case(kv_series(0.97, capacity=3), [quiet(0, "VLLMKVCacheExhausted"), quiet(3, "VLLMKVCacheExhausted"),
                                         at(4, "VLLMKVCacheExhausted", expect("VLLMKVCacheExhausted", W, "100%"))]),
    # full cache and preempting with nobody seen waiting: the preemption warning's business
    # (VLLMPreemptionsSustained, the user's P2), not a page: preemptions count as held back only
    # where the waits reached the held-back share in the window (a busy replica's burst of them
    # must not page)
    case(kv_series(0.98, preempt_per_min=2), [quiet(m, "VLLMKVCacheExhausted") for m in (5, 10, 20)]),
    # ... but between the waits of a sustained hold-back they fill in: requests wait every other
    # minute (half the evaluations: no page on the waits alone) while vLLM preempts every minute
    case([series("vllm:kv_cache_usage_perc", V, gauge(lambda m: 0.97, N)),
          series("vllm:num_requests_waiting_by_reason", {**V, "reason": "capacity"}, gauge(lambda m: 3 * (m % 2 == 0), N)),
          series("vllm:num_preemptions_total", V, counter(lambda m: 2, N))],
         [at(8, "VLLMKVCacheExhausted", expect("VLLMKVCacheExhausted", W, "100%"))]),
    case([series("vllm:kv_cache_usage_perc", V, gauge(lambda m: 0.97, N)),
          series("vllm:num_requests_waiting_by_reason", {**V, "reason": "capacity"}, gauge(lambda m: 3 * (m % 2 == 0), N)),
          series("vllm:num_preemptions_total", V, counter(lambda m: 0, N))],
         [quiet(m, "VLLMKVCacheExhausted") for m in (8, 15, 25)]),
    # the real saw-tooth: usage never stays above 0.95, the capacity waits are steady: fires
    case([series("vllm:kv_cache_usage_perc", V, gauge(sawtooth, N)),
          series("vllm:num_requests_waiting_by_reason", {**V, "reason": "capacity"}, gauge(lambda m: 7 + m % 5, N))],
         [at(6, "VLLMKVCacheExhausted", expect("VLLMKVCacheExhausted", W, "100%"))]),
    # busy but healthy: full cache, nobody waiting for capacity, no preemptions or rejections
    case(kv_series(0.97, deferred=2), [quiet(20, "VLLMKVCacheExhausted")]),
    # one scrape with a request waiting for capacity is not "held back": quiet
    case([series("vllm:kv_cache_usage_perc", V, gauge(lambda m: 0.96, N)),
          series("vllm:num_requests_waiting_by_reason", {**V, "reason": "capacity"}, gauge(lambda m: 1 if m % 7 == 0 else 0, N))],
         [quiet(m, "VLLMKVCacheExhausted") for m in (7, 8, 14, 15, 21)]),
    # requests waiting for capacity, but the cache never filled
    case(kv_series(0.80, capacity=5), [quiet(20, "VLLMKVCacheExhausted")]),
    # older vLLM: the batch ran 32 while nothing waited (its ceiling), then requests wait while it
    # runs 20 at moderate usage: the batch has room, so only the cache holds them
    case(old_release(lambda m: 0.6, lambda m: 0 if m < 10 else 4, lambda m: 32 if m < 10 else 20),
         [quiet(10, "VLLMKVCacheExhausted"), at(14, "VLLMKVCacheExhausted", expect("VLLMKVCacheExhausted", W, "100%"))]),
    # older vLLM: requests wait behind a batch at its ceiling with the cache half used: a queue, not the cache
    case(old_release(lambda m: 0.6, lambda m: 0 if m < 10 else 4, lambda m: 32),
         [quiet(m, "VLLMKVCacheExhausted") for m in (10, 20, 30)]),
    # the capacity-bound flood: 9 held back at 0.62 usage with 4 of a 20-request ceiling running
    case([
        series("vllm:kv_cache_usage_perc", V, gauge(lambda m: 0.62, N)),
        series("vllm:num_requests_running", V, gauge(lambda m: 18 if m < 10 else 4, N)),
        series("vllm:num_requests_waiting_by_reason", {**V, "reason": "capacity"}, gauge(lambda m: 0 if m < 10 else 9, N))],
         [quiet(10, "VLLMKVCacheExhausted"), at(14, "VLLMKVCacheExhausted", expect("VLLMKVCacheExhausted", W, "100%"))]),
]

CASES["VLLMPreemptionsSustained"] = [
    case([series("vllm:num_preemptions_total", V, counter(lambda m: 6, N))],
         [quiet(5, "VLLMPreemptionsSustained"),
          at(10, "VLLMPreemptionsSustained", expect("VLLMPreemptionsSustained", W, "30"))]),
    # one burst of preemptions is not sustained
    case([series("vllm:num_preemptions_total", V, counter(lambda m: 20 if m == 3 else 0, N))],
         [quiet(m, "VLLMPreemptionsSustained") for m in (4, 6, 8, 10, 15)]),
]


def ttft(seconds, per_min=60, labels=V, before=None):
    """Every request at ``seconds``; with ``before``, at ``before`` seconds for the first 10 minutes."""
    return histogram("vllm:time_to_first_token_seconds", labels, N,
                     lambda m: [before if before is not None and m <= 10 else seconds] * per_min)


CASES["VLLMTTFTHigh"] = [
    # 0.3 s for 10 minutes, then every request at 4 s: p95 lands in vLLM's (2.5, 5.0] bucket,
    # 2.5 + 2.5 * 0.95 = 4.875 s once the 5m window holds only slow requests; fires 10m later
    case(ttft(4.0, before=0.3),
         [quiet(20, "VLLMTTFTHigh"),
          at(23, "VLLMTTFTHigh", expect("VLLMTTFTHigh", {**W, "quantile": "0.95"}, "4.875s"))]),
    case(ttft(0.3), [quiet(30, "VLLMTTFTHigh")]),
]
CASES["VLLMTTFTMeanHigh"] = [
    case(ttft(2.0), [at(16, "VLLMTTFTMeanHigh", expect("VLLMTTFTMeanHigh", W, "2s"))]),
    case(ttft(1.0), [quiet(30, "VLLMTTFTMeanHigh")]),
]


def itl(seconds, per_min=600, name="vllm:inter_token_latency_seconds", labels=V):
    return histogram(name, labels, N, lambda m: [seconds] * per_min)


CASES["VLLMInterTokenLatencyHigh"] = [
    case(itl(0.05), [at(16, "VLLMInterTokenLatencyHigh", expect("VLLMInterTokenLatencyHigh", W, "50ms"))]),
    case(itl(0.05, name="vllm:time_per_output_token_seconds", labels=vllm_labels(engine=None)),
         [at(16, "VLLMInterTokenLatencyHigh", expect("VLLMInterTokenLatencyHigh", W, "50ms"))]),
    case(itl(0.02), [quiet(30, "VLLMInterTokenLatencyHigh")]),
]

DAY_B = 24 * 60


def busy_fleet(new_pod_tokens_per_min, minutes=DAY_B + 30):
    """Three busy replicas making 1,000 tokens/s for a day (GPUs at 97%); at DAY_B a new pod joins."""
    out = []
    for i in range(4):
        pod = f"vllm-{i}"
        new = i == 3
        v, s = vllm_labels(pod=pod), sidecar_labels(pod=pod)
        alive = (lambda m: m >= DAY_B) if new else (lambda m: True)
        out += [series("vllm:num_requests_running", v, gauge(lambda m, a=alive: 8 if a(m) else None, minutes)),
                series("vllm:generation_tokens_total", v,
                       [x if alive(m) else None for m, x in enumerate(counter(
                           lambda m, new=new, alive=alive: (new_pod_tokens_per_min if new else 60000) if alive(m) else 0,
                           minutes))]),
                series("vllm_sidecar_gpu_mean_utilization_ratio", s, gauge(lambda m, a=alive: 0.97 if a(m) else None, minutes)),
                series("vllm_sidecar_gpu_busy_low_throughput", {**s, "model_name": "llama-70b"},
                       gauge(lambda m, a=alive: 0 if a(m) else None, minutes))]
    return out


CASES["VLLMGPUBusyLowThroughput"] = [
    case([series("vllm_sidecar_gpu_busy_low_throughput", {**S, "model_name": "llama-70b"},
                 gauge(lambda m: 1 if m >= 5 else 0, N))],
         [quiet(6, "VLLMGPUBusyLowThroughput"),
          at(8, "VLLMGPUBusyLowThroughput", expect("VLLMGPUBusyLowThroughput", W, "1", evidence=["none"] * 3))]),
    case([series("vllm_sidecar_gpu_busy_low_throughput", {**S, "model_name": "llama-70b"}, gauge(lambda m: 0, N))],
         [quiet(30, "VLLMGPUBusyLowThroughput")]),
    # a new pod (a rollout: its sidecar has not learned a baseline yet, so it does not flag) is busy
    # with few tokens: the fleet's history of what a busy replica makes catches it
    case(busy_fleet(new_pod_tokens_per_min=3000),
         [quiet(DAY_B + 1, "VLLMGPUBusyLowThroughput"),
          at(DAY_B + 8, "VLLMGPUBusyLowThroughput", expect("VLLMGPUBusyLowThroughput", {**W, "pod": "vllm-3"}, "50",
                                                  evidence=["97%", "50", "998.6"]))]),
    # ... and a new pod making its share of tokens is quiet
    case(busy_fleet(new_pod_tokens_per_min=60000), [quiet(m, "VLLMGPUBusyLowThroughput") for m in (DAY_B + 4, DAY_B + 20)]),
]

CASES["VLLMEngineStalled"] = [
    # the sidecar's signal
    case([series("vllm_sidecar_engine_stalled", {**S, "model_name": "llama-70b"}, gauge(lambda m: 1 if m >= 5 else 0, N)),
          series("vllm:num_requests_running", V, gauge(lambda m: 4, N)),
          series("vllm:generation_tokens_total", V, counter(lambda m: 600 if m < 5 else 0, N))],
         [at(8, "VLLMEngineStalled", expect("VLLMEngineStalled", W, "1"))]),
    # vLLM alone (no sidecar): requests running, the token counter flat
    case([series("vllm:num_requests_running", V, gauge(lambda m: 4, N)),
          series("vllm:generation_tokens_total", V, counter(lambda m: 600 if m < 10 else 0, N))],
         [quiet(10, "VLLMEngineStalled"), at(16, "VLLMEngineStalled", expect("VLLMEngineStalled", W, "4"))]),
    # idle: nothing running, nothing produced
    case([series("vllm:num_requests_running", V, gauge(lambda m: 0, N)),
          series("vllm:generation_tokens_total", V, counter(lambda m: 0, N))], [quiet(30, "VLLMEngineStalled")]),
    case([series("vllm:num_requests_running", V, gauge(lambda m: 4, N)),
          series("vllm:generation_tokens_total", V, counter(lambda m: 600, N))], [quiet(30, "VLLMEngineStalled")]),
]


DAY = 24 * 60
# vLLM's running requests, on every page that has its counters and histograms: the role rule reads
# them (and a replica's rates join its role without a second read)
RUNNING_DAY = [series("vllm:num_requests_running", V, gauge(lambda m: 4, DAY + 40))]
CASES["VLLMLongPromptSurge"] = [
    # a day of normal traffic (one long prompt every 10 minutes), then a client floods 8,000-token prompts
    case(RUNNING_DAY + prompts_series(DAY + 40, lambda m: 30 if m <= DAY else 60,
                                      lambda m: (1 if m % 10 == 0 else 0) if m <= DAY else 30, V),
         [quiet(DAY, "VLLMLongPromptSurge"),
          at(DAY + 8, "VLLMLongPromptSurge", expect("VLLMLongPromptSurge", W, "500m", evidence=["50%", "3.333m"]))]),
    # the same steady day continues: quiet
    case(RUNNING_DAY + prompts_series(DAY + 40, lambda m: 30, lambda m: 1 if m % 10 == 0 else 0, V),
         [quiet(DAY + 30, "VLLMLongPromptSurge")]),
    # a replica whose normal traffic is full of long prompts (a document service) stays quiet
    case(RUNNING_DAY + prompts_series(DAY + 40, lambda m: 30, lambda m: 12, V), [quiet(DAY + 30, "VLLMLongPromptSurge")]),
]

CASES["VLLMQueueBuildup"] = [
    # growing: at least 10 waiting and rising from minute 5, fires 5 minutes later
    case([series("vllm:num_requests_waiting", V, gauge(lambda m: 2 * m, N))],
         [quiet(8, "VLLMQueueBuildup"), at(14, "VLLMQueueBuildup", expect("VLLMQueueBuildup", W, "28"))]),
    # steady: 15 waiting that never drain is a built-up queue (one alert while it lasts)
    case([series("vllm:num_requests_waiting", V, gauge(lambda m: 15 + (m % 3), N))],
         [at(20, "VLLMQueueBuildup", expect("VLLMQueueBuildup", W, "15"))]),
    # a queue that drains every few minutes is a busy replica, not a build-up
    case([series("vllm:num_requests_waiting", V, gauge(lambda m: 15 if m % 6 < 4 else 0, N))],
         [quiet(m, "VLLMQueueBuildup") for m in (12, 20, 30)]),
    case([series("vllm:num_requests_waiting", V, gauge(lambda m: min(m, 8), N))], [quiet(30, "VLLMQueueBuildup")]),
]

CASES["VLLMCorruptedRequests"] = [
    case([series("vllm:corrupted_requests_total", V, counter(lambda m: 1 if m == 5 else 0, N))],
         [quiet(4, "VLLMCorruptedRequests"), at(6, "VLLMCorruptedRequests", expect("VLLMCorruptedRequests", W, "1"))]),
    case([series("vllm:corrupted_requests_total", V, counter(lambda m: 0, N))], [quiet(30, "VLLMCorruptedRequests")]),
]


def http(minutes, ok_per_min, err_per_min, client_err_per_min=lambda m: 0):
    h = {"namespace": "llm", "pod": "vllm-0", "job": "llm/vllm", "instance": "vllm-0:8000",
         "handler": "/v1/chat/completions", "method": "POST"}
    return [
        series("http_requests_total", {**h, "status": "2xx"}, counter(ok_per_min, minutes)),
        series("http_requests_total", {**h, "status": "5xx"}, counter(err_per_min, minutes)),
        series("http_requests_total", {**h, "status": "4xx"}, counter(client_err_per_min, minutes)),
        series("vllm:num_requests_running", V, gauge(lambda m: 8, minutes)),
    ]


M = {"namespace": "llm", "model_name": "llama-70b"}
CASES["VLLMErrorBudgetBurn"] = [
    # 5% of requests fail: burns the 0.1% budget 50x: the fast (page) alert
    case(http(120, lambda m: 950, lambda m: 50 if m > 20 else 0),
         [quiet(20, "VLLMErrorBudgetBurn"),
          # the 1h window is the mean of the per-minute 5m rates recorded over it: errors at 5% for 40 of
          # its 60 minutes, 5% x 40 / 60 = 3.333%
          at(60, "VLLMErrorBudgetBurn", expect("VLLMErrorBudgetBurn", {**M, "window": "fast"}, "3.333%", severity="critical"))]),
    # 0.3% for four days: too slow to page, enough for a ticket. 5-minute series steps and 4-minute
    # evaluations keep promtool quick (the slow alert reads only the 3d and 6h windows); both must
    # stay within the 5-minute lookback, or the gauge the SLI joins on goes missing between samples
    case(http(4 * DAY // 5, lambda m: 4985, lambda m: 15),
         [at(4 * DAY, "VLLMErrorBudgetBurn", expect("VLLMErrorBudgetBurn", {**M, "window": "slow"}, "0.3%", severity="warning"))],
         interval="5m", evaluation_interval="4m"),
    # client errors (4xx) and a healthy 0.05% of 5xx: quiet
    case(http(180, lambda m: 900, lambda m: 0.5, lambda m: 100), [quiet(170, "VLLMErrorBudgetBurn")]),
]

CASES["VLLMErrorRatioHigh"] = [
    case([series("vllm:request_success_total", {**V, "finished_reason": "stop"}, counter(lambda m: 90, N)),
          series("vllm:request_success_total", {**V, "finished_reason": "error"}, counter(lambda m: 10, N)),
          series("vllm:request_success_total", {**V, "finished_reason": "abort"}, counter(lambda m: 50, N))],
         [at(16, "VLLMErrorRatioHigh", expect("VLLMErrorRatioHigh", W, "10%", severity="warning"))]),
    # half of a busy replica's requests fail: the page tier after its 2 minutes, the warning after 10
    case([series("vllm:request_success_total", {**V, "finished_reason": "stop"}, counter(lambda m: 30, N)),
          series("vllm:request_success_total", {**V, "finished_reason": "error"}, counter(lambda m: 30, N))],
         [quiet(2, "VLLMErrorRatioHigh"),
          at(6, "VLLMErrorRatioHigh", expect("VLLMErrorRatioHigh", W, "50%", severity="critical")),
          at(16, "VLLMErrorRatioHigh", expect("VLLMErrorRatioHigh", W, "50%", severity="warning"),
             expect("VLLMErrorRatioHigh", W, "50%", severity="critical"))]),
    # the same share on a replica with hardly any traffic (one error a minute): a warning, never a page
    case([series("vllm:request_success_total", {**V, "finished_reason": "stop"}, counter(lambda m: 1, N)),
          series("vllm:request_success_total", {**V, "finished_reason": "error"}, counter(lambda m: 1, N))],
         [at(30, "VLLMErrorRatioHigh", expect("VLLMErrorRatioHigh", W, "50%", severity="warning"))]),
    # aborts are the clients' doing, not errors
    case([series("vllm:request_success_total", {**V, "finished_reason": "stop"}, counter(lambda m: 90, N)),
          series("vllm:request_success_total", {**V, "finished_reason": "error"}, counter(lambda m: 0, N)),
          series("vllm:request_success_total", {**V, "finished_reason": "abort"}, counter(lambda m: 50, N))],
         [quiet(30, "VLLMErrorRatioHigh")]),
]

T = {"namespace": "llm", "pod": "vllm-0"}
CASES["VLLMTargetDown"] = [
    # the sidecar read vLLM, then cannot
    case([series("vllm_sidecar_target_up", {**S, "target": "vllm"}, gauge(lambda m: 0 if m >= 5 else 1, N)),
          series("vllm_sidecar_last_success_timestamp_seconds", {**S, "target": "vllm"},
                 gauge(lambda m: 60 * min(m, 4), N)),
          series("up", S, gauge(lambda m: 1, N))],
         [quiet(6, "VLLMTargetDown"), at(8, "VLLMTargetDown", expect("VLLMTargetDown", {**T, "target": "vllm"}, "0"))]),
    # a new pod loading its model: vLLM has never answered this sidecar, started 5 minutes ago: quiet
    case([series("vllm_sidecar_target_up", {**S, "target": "vllm"}, gauge(lambda m: 0, N)),
          series("vllm_sidecar_process_start_time_seconds", S, gauge(lambda m: 0, N)),
          series("up", S, gauge(lambda m: 1, N))],
         [quiet(m, "VLLMTargetDown") for m in (3, 8, 14)]),
    # ... but a model load that never ends (15 minutes of the sidecar's life) is a target down
    case([series("vllm_sidecar_target_up", {**S, "target": "vllm"}, gauge(lambda m: 0, N)),
          series("vllm_sidecar_process_start_time_seconds", S, gauge(lambda m: 0, N)),
          series("up", S, gauge(lambda m: 1, N))],
         [at(18, "VLLMTargetDown", expect("VLLMTargetDown", {**T, "target": "vllm"}, "0"))]),
    # the sidecar itself is gone: its series stop, Prometheus' up says 0
    case([series("vllm_sidecar_build_info", {**S, "version": "0.1.0"}, gauge(lambda m: 1 if m < 5 else None, N)),
          series("up", S, gauge(lambda m: 1 if m < 5 else 0, N))],
         [at(8, "VLLMTargetDown", expect("VLLMTargetDown", {**T, "target": "sidecar"}, "0"))]),
    # no sidecar at all: Prometheus scrapes vLLM directly and it went down
    case([series("vllm:num_requests_running", V, gauge(lambda m: 2 if m < 5 else None, N)),
          series("up", {k: v for k, v in V.items() if k not in ("model_name", "engine")}, gauge(lambda m: 1 if m < 5 else 0, N))],
         [at(8, "VLLMTargetDown", expect("VLLMTargetDown", {**T, "target": "vllm"}, "0"))]),
    case([series("vllm_sidecar_target_up", {**S, "target": "vllm"}, gauge(lambda m: 1, N)),
          series("vllm_sidecar_build_info", {**S, "version": "0.1.0"}, gauge(lambda m: 1, N)),
          series("up", S, gauge(lambda m: 1, N))], [quiet(30, "VLLMTargetDown")]),
]

def inputs_page(missing):
    """The sidecar's two input series as its health collector serves them: one per input
    (``missing``: input -> 0/1) and the count the alert reads."""
    return ([series("vllm_sidecar_input_missing", {**S, "metric": m}, gauge(lambda _, v=v: v, N))
             for m, v in missing.items()]
            + [series("vllm_sidecar_inputs_missing", S, gauge(lambda _: sum(missing.values()), N))])


CASES["VLLMSidecarInputMissing"] = [
    # the count fires, once a pod; the description names the missing input, asked when it fires
    case(inputs_page({"vllm:kv_cache_usage_perc": 1, "vllm:generation_tokens_total": 0}),
         [at(12, "VLLMSidecarInputMissing",
             expect("VLLMSidecarInputMissing", T, "1", evidence=["vllm:kv_cache_usage_perc "]))]),
    case(inputs_page({"vllm:kv_cache_usage_perc": 1, "vllm:generation_tokens_total": 1}),
         [at(12, "VLLMSidecarInputMissing",
             expect("VLLMSidecarInputMissing", T, "2",
                    evidence=["vllm:generation_tokens_total vllm:kv_cache_usage_perc "]))]),
    case(inputs_page({"vllm:kv_cache_usage_perc": 0}), [quiet(30, "VLLMSidecarInputMissing")]),
]


def replicas(tokens_per_min, running=lambda pod: 8):
    out = []
    for i, tpm in enumerate(tokens_per_min):
        lab = vllm_labels(pod=f"vllm-{i}")
        out.append(series("vllm:generation_tokens_total", lab, counter(lambda m, t=tpm: t, N)))
        out.append(series("vllm:num_requests_running", lab, gauge(lambda m, i=i: running(i), N)))
    return out


CASES["VLLMReplicaOutlier"] = [
    # the same load, one replica decoding at a fifth of the speed: 200 tokens/s over 8 running requests
    case(replicas([60000, 60000, 60000, 12000]),
         [at(25, "VLLMReplicaOutlier", expect("VLLMReplicaOutlier", {**W, "pod": "vllm-3", "signal": "throughput"}, "0.20",
                                                   evidence=["25"]))]),
    # a replica with a third of the traffic (the router sends it less): fewer running requests at the
    # same speed, not an outlier
    case(replicas([60000, 60000, 60000, 20000], running=lambda i: 3 if i == 3 else 8), [quiet(30, "VLLMReplicaOutlier")]),
    case(replicas([60000, 55000, 62000, 58000]), [quiet(30, "VLLMReplicaOutlier")]),
    # an idle replica makes few tokens because it has no work: not an outlier
    case(replicas([60000, 60000, 60000, 0], running=lambda i: 0 if i == 3 else 8), [quiet(30, "VLLMReplicaOutlier")]),
    # too few replicas to compare
    case(replicas([60000, 12000]), [quiet(30, "VLLMReplicaOutlier")]),
]

def prefix_fleet(hits_per_min, minutes=DAY + 60, started=lambda pod: -3600, old=False):
    """Three replicas hitting 70% of their prompt tokens for a day; ``hits_per_min(pod, m)`` per 10,000."""
    out = []
    for i in range(3):
        pod = f"vllm-{i}"
        lab = vllm_labels(pod=pod, engine=None) if old else vllm_labels(pod=pod)
        pre = "vllm:gpu_prefix_cache" if old else "vllm:prefix_cache"
        out += [series(f"{pre}_queries_total", lab, counter(lambda m: 10000, minutes)),
                series(f"{pre}_hits_total", lab, counter(lambda m, p=pod: hits_per_min(p, m), minutes)),
                series("vllm:request_success_total", {**lab, "finished_reason": "stop"}, counter(lambda m: 20, minutes)),
                # vLLM observes the prompt-length histogram once for every finished request, too
                series("vllm:request_prompt_tokens_count", lab, counter(lambda m: 20, minutes)),
                series("vllm:num_requests_running", lab, gauge(lambda m: 8, minutes)),
                series("process_start_time_seconds", {k: v for k, v in lab.items() if k not in ("model_name", "engine")},
                       gauge(lambda m, p=pod: started(p), minutes))]
    return out


CASES["VLLMPrefixCacheHitRatioLow"] = [
    # one replica's hits fall from 70% to 10% (its routing broke) while the fleet's normal is 70%
    # (69.63%: the day to the offset holds 30 minutes of the drop, the last of them counted twice by
    # the hourly reads, windows.history_step; every sample once: 69.61%)
    case(prefix_fleet(lambda pod, m: 1000 if pod == "vllm-2" and m > DAY else 7000),
         [quiet(DAY + 20, "VLLMPrefixCacheHitRatioLow"),
          at(DAY + 45, "VLLMPrefixCacheHitRatioLow", expect("VLLMPrefixCacheHitRatioLow", {**W, "pod": "vllm-2"}, "10%",
                                                                evidence=["69.63%"]))]),
    # the same on an older release's names
    case(prefix_fleet(lambda pod, m: 1000 if pod == "vllm-2" and m > DAY else 7000, old=True),
         [at(DAY + 45, "VLLMPrefixCacheHitRatioLow", expect("VLLMPrefixCacheHitRatioLow", {**W, "pod": "vllm-2"}, "10%",
                                                                evidence=["69.63%"]))]),
    # a model whose replicas all hit little (no shared prefix in its traffic) is normal for it: quiet
    case(prefix_fleet(lambda pod, m: 1000), [quiet(DAY + 50, "VLLMPrefixCacheHitRatioLow")]),
    # a new pod (a rollout) warms its cache: quiet while younger than the warm-up
    case(prefix_fleet(lambda pod, m: 1000 if pod == "vllm-2" and m > DAY else 7000,
                      started=lambda pod: 60 * (DAY + 1) if pod == "vllm-2" else -3600),
         [quiet(DAY + 25, "VLLMPrefixCacheHitRatioLow")]),
]

G = {**S, "gpu": "1", "uuid": "GPU-5e1d"}
GA = {"namespace": "llm", "pod": "vllm-0", "gpu": "1", "uuid": "GPU-5e1d"}
CASES["GPUXidErrors"] = [
    # the first XID 79 creates the series at 1: a counter that appears counts as new errors
    case([series("vllm_sidecar_gpu_xid_errors_total", {**G, "xid": "79"}, gauge(lambda m: 1 if m >= 5 else None, N))],
         [quiet(4, "GPUXidErrors"),
          at(5, "GPUXidErrors", expect("GPUXidErrors", {**GA, "xid": "79"}, "1", severity="critical"))]),
    case([series("vllm_sidecar_gpu_xid_errors_total", {**G, "xid": "13"}, gauge(lambda m: 1 if m < 10 else 2, N))],
         [at(12, "GPUXidErrors", expect("GPUXidErrors", {**GA, "xid": "13"}, "1.25", severity="warning")),
          quiet(25, "GPUXidErrors")]),
    case([series("vllm_sidecar_gpu_xid_errors_total", {**G, "xid": "13"}, gauge(lambda m: 3, N))], [quiet(20, "GPUXidErrors")]),
]

CASES["GPUThermalThrottling"] = [
    case([series("vllm_sidecar_gpu_thermal_throttle_active", G, gauge(lambda m: 1 if m >= 2 else 0, N))],
         [quiet(8, "GPUThermalThrottling"), at(14, "GPUThermalThrottling", expect("GPUThermalThrottling", GA, "1"))]),
    # two minutes throttled: held 5 minutes by the window, short of the 10 minutes it must last
    case([series("vllm_sidecar_gpu_thermal_throttle_active", G, gauge(lambda m: 1 if 3 <= m < 5 else 0, N))],
         [quiet(9, "GPUThermalThrottling"), quiet(14, "GPUThermalThrottling")]),
    case([series("vllm_sidecar_gpu_thermal_throttle_active", G, gauge(lambda m: 0, N))],
         [quiet(30, "GPUThermalThrottling")]),
]

CASES["GPUUncorrectableECCErrors"] = [
    case([series("vllm_sidecar_gpu_ecc_errors_total", {**G, "type": "uncorrected"}, gauge(lambda m: 0 if m < 5 else 2, N)),
          series("vllm_sidecar_gpu_ecc_errors_total", {**G, "type": "corrected"}, counter(lambda m: 5, N))],
         [at(6, "GPUUncorrectableECCErrors", expect("GPUUncorrectableECCErrors", GA, "2.5"))]),
    case([series("vllm_sidecar_gpu_ecc_errors_total", {**G, "type": "uncorrected"}, gauge(lambda m: 0, N)),
          series("vllm_sidecar_gpu_ecc_errors_total", {**G, "type": "corrected"}, counter(lambda m: 5, N))],
         [quiet(30, "GPUUncorrectableECCErrors")]),
]


def test_every_alert_has_cases():
    from test_rules_disagg import CASES as PD_CASES  # the P/D and speculative alerts' cases

    assert set(rules_by_alert()) == set(CASES) | set(PD_CASES)


@pytest.mark.parametrize("alert", sorted(CASES))
def test_alert_fires_and_stays_quiet(alert, tmp_path):
    tests = CASES[alert]
    assert any(e["exp_alerts"] for t in tests for e in t["alert_rule_test"]), "needs a firing case"
    assert any(not e["exp_alerts"] for t in tests for e in t["alert_rule_test"]), "needs a quiet case"
    by_interval = {}
    for t in tests:
        t = dict(t)
        by_interval.setdefault(t.pop("_evaluation_interval"), []).append(t)
    for interval, group in by_interval.items():
        r = run_promtool(tmp_path, group, evaluation_interval=interval, alerts=[alert])
        assert r.returncode == 0, r.stdout + r.stderr


def test_the_cut_rule_file_keeps_everything_an_alert_reads():
    """The cases above run promtool over the rule file cut to their alert (``rules_for``): the cut
    must hold every recording rule any kept rule reads, in the file's order, and nothing else."""
    import re

    import yaml

    from promseries import RULES, rules_for

    full = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    records = {r["record"] for r in full if "record" in r}
    for alert in sorted({r["alert"] for r in full if "alert" in r}):
        kept = [r for g in rules_for([alert])["groups"] for r in g["rules"]]
        assert [r for r in full if r in kept] == kept, f"{alert}: the cut reorders the file"
        kept_records = {r["record"] for r in kept if "record" in r}
        read = {n for r in kept for n in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", r["expr"])} & records
        assert read <= kept_records, f"{alert}: the cut lacks {sorted(read - kept_records)}"
        # nothing kept that no kept rule reads, but the alert itself
        assert kept_records <= read, f"{alert}: the cut keeps unread rules {sorted(kept_records - read)}"
        assert {r.get("alert") for r in kept} - {None} == {alert}
    surge = [r for g in rules_for(["VLLMLongPromptSurge"])["groups"] for r in g["rules"]]
    assert len(surge) < len(full) / 3
