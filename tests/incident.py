"""The user's night as input series (minutes, in promtool's series notation): three replicas of
llama-70b, one of them (``BAD``) flooded with 8,000-token prompts from ``ONSET`` on, or a busy but
healthy day. Shared by the pack's promtool test of the night (pack/test_incident_scenario.py),
the backtest (analysis/test_backtest_cli.py, test_backtest_server.py), two clusters and vmalert."""

from promseries import counter, gauge, histogram, series, sidecar_labels, vllm_labels

HIST = 180  # minutes of normal history before onset (the long-prompt baseline reads it)
ONSET = HIST
AFTER = 30
TOTAL = HIST + AFTER
PODS = ("vllm-0", "vllm-1", "vllm-2")
BAD = "vllm-2"

# minutes after onset at which each alert first fires on the bad replica (and nothing else fires)
EXPECTED_INCIDENT = {
    "VLLMLongPromptSurge": 1,         # rules' 5m rate over 3x the model's normal at +1 (no sidecar rate here), no for
    "VLLMGPUBusyLowThroughput": 5,    # sidecar flags it at +3, 2m for
    "VLLMKVCacheExhausted": 6,        # waits with the cache at the warn level at 3 of every 4 evaluations of 2m, 30s for
    "VLLMPreemptionsSustained": 4,    # preempting from +3: 2 in 5m with some in the 5m before (the normal ones), no for
                                      # (the chronic hold, which fired it at +4, now also needs waits at 0.15 of 10m)
    "VLLMQueueBuildup": 11,           # 10 waiting and growing at +6, 5m for
    "VLLMTTFTHigh": 12,               # p95 over 3 s from +2, 10m for
    "VLLMTTFTMeanHigh": 12,
    "VLLMInterTokenLatencyHigh": 13,
    "VLLMReplicaOutlier": 17,         # below half its peers' tokens/s from +2, 15m for
}
# ... as Prometheus runs the pack (and backtest replays it): the outlier alert is in the slow group
# (every 2 minutes, at even minutes here), so it waits its 15 minutes from its first evaluation after
# +2 and fires at +18; promtool runs every group at every step (+17)
EXPECTED_INCIDENT_BY_GROUPS = {**EXPECTED_INCIDENT, "VLLMReplicaOutlier": 18}


def replica(pod, incident, busy_day=False):
    """Series of one replica; ``incident(m)`` is True from onset on for the bad replica."""
    v = vllm_labels(pod=pod)
    sc = sidecar_labels(pod=pod)
    bad = lambda m: incident and m > ONSET  # noqa: E731 - minutes after onset
    k = lambda m: m - ONSET  # noqa: E731
    out = []
    # requests: 30 a minute (60 on the busy day), prompts of ~500 tokens, one long prompt every 10 minutes
    base_rate = 60 if busy_day else 30
    normal_long = lambda m: 1 if m % 10 == 0 else 0  # noqa: E731
    flood = 20
    total = lambda m: base_rate + (flood if bad(m) else 0)  # noqa: E731
    long_n = lambda m: normal_long(m) + (flood if bad(m) else 0)  # noqa: E731
    out.append(series("vllm:request_prompt_tokens_bucket", {**v, "le": "5000.0"},
                      counter(lambda m: total(m) - long_n(m), TOTAL)))
    out.append(series("vllm:request_prompt_tokens_count", v, counter(total, TOTAL)))
    # KV cache: 0.6 normally (0.90-0.97 on the busy day), fills within 3 minutes of onset
    if busy_day:
        kv = lambda m: (0.90, 0.93, 0.97, 0.95, 0.92)[m % 5]  # noqa: E731
    else:
        kv = lambda m: (min(0.99, 0.6 + 0.13 * k(m)) if bad(m) else 0.6)  # noqa: E731
    out.append(series("vllm:kv_cache_usage_perc", v, gauge(kv, TOTAL)))
    capacity = lambda m: (2 * (k(m) - 1) if bad(m) and k(m) >= 2 else 0)  # noqa: E731
    deferred = lambda m: (1 if busy_day and m % 7 == 0 else 0)  # noqa: E731
    out.append(series("vllm:num_requests_waiting_by_reason", {**v, "reason": "capacity"}, gauge(capacity, TOTAL)))
    out.append(series("vllm:num_requests_waiting_by_reason", {**v, "reason": "deferred"}, gauge(deferred, TOTAL)))
    out.append(series("vllm:num_requests_waiting", v, gauge(lambda m: capacity(m) + deferred(m), TOTAL)))
    out.append(series("vllm:num_requests_running", v, gauge(lambda m: 16 if busy_day else 12, TOTAL)))
    out.append(series("vllm:num_preemptions_total", v, counter(lambda m: 5 if bad(m) and k(m) >= 3 else 0, TOTAL)))
    # tokens: 100/s per replica (160/s on the busy day), 10/s on the bad replica after onset
    tokens = lambda m: (600 if bad(m) and k(m) >= 2 else (9600 if busy_day else 6000))  # noqa: E731
    out.append(series("vllm:generation_tokens_total", v, counter(tokens, TOTAL)))
    out.append(series("vllm:prompt_tokens_total", v, counter(lambda m: total(m) * 500 + long_n(m) * 7500, TOTAL)))
    # latency: TTFT 0.4 s (0.9 s busy), 6 s for everyone on the bad replica once its cache is full
    t_ttft = lambda m: (6.0 if bad(m) and k(m) >= 2 else (0.9 if busy_day else 0.4))  # noqa: E731
    out += histogram("vllm:time_to_first_token_seconds", v, TOTAL, lambda m: [t_ttft(m)] * total(m))
    t_itl = lambda m: (0.08 if bad(m) and k(m) >= 2 else (0.025 if busy_day else 0.02))  # noqa: E731
    out += histogram("vllm:inter_token_latency_seconds", v, TOTAL, lambda m: [t_itl(m)] * 50)
    # finished requests and HTTP answers: no errors tonight (a latency incident)
    out.append(series("vllm:request_success_total", {**v, "finished_reason": "stop"}, counter(total, TOTAL)))
    out.append(series("vllm:request_success_total", {**v, "finished_reason": "error"}, counter(lambda m: 0, TOTAL)))
    h = {"namespace": "llm", "pod": pod, "job": "llm/vllm", "instance": f"{pod}:8000",
         "handler": "/v1/chat/completions", "method": "POST"}
    out.append(series("http_requests_total", {**h, "status": "2xx"}, counter(total, TOTAL)))
    out.append(series("http_requests_total", {**h, "status": "5xx"}, counter(lambda m: 0, TOTAL)))
    # the sidecar: up, reading vLLM, and its own judgement of the replica
    out.append(series("up", sc, gauge(lambda m: 1, TOTAL)))
    out.append(series("vllm_sidecar_build_info", {**sc, "version": "0.1.0"}, gauge(lambda m: 1, TOTAL)))
    out.append(series("vllm_sidecar_target_up", {**sc, "target": "vllm"}, gauge(lambda m: 1, TOTAL)))
    out.append(series("vllm_sidecar_gpu_busy_low_throughput", {**sc, "model_name": "llama-70b"},
                      gauge(lambda m: 1 if bad(m) and k(m) >= 3 else 0, TOTAL)))
    out.append(series("vllm_sidecar_engine_stalled", {**sc, "model_name": "llama-70b"}, gauge(lambda m: 0, TOTAL)))
    return out


def inputs(busy_day=False):
    out = []
    for pod in PODS:
        out += replica(pod, incident=(pod == BAD and not busy_day), busy_day=busy_day)
    return out
