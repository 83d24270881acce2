"""Anomalies: what no single threshold catches. GPUs busy with few tokens (the sidecar's learned
baseline), a stalled engine, one replica unlike its peers, a prefix cache that stopped hitting."""

from __future__ import annotations

from typing import List

from ..context import Ctx
from .alert import Alert
from .capacity import fleet_normal


def alerts(c: Ctx) -> List[Alert]:
    by, s, who, svc, S2 = c.by, c.s, c.who, c.svc, c.S2
    ol = c.slo["outlier"]
    tok = c.rec("vllm_generation_tokens", "rate")
    speed = c.rec("vllm_generation_tokens_per_running_request", "rate")
    ttft95 = f"max without (quantile) ({c.rec('vllm_time_to_first_token_seconds', 'histogram_quantile')}{{quantile=\"0.95\"}})"
    bl = c.slo["gpu_busy_low"]
    pc = c.slo["prefix_cache"]
    busy = f"max by ({c.r}) (vllm_sidecar_gpu_mean_utilization_ratio{s()}) >= {bl['busy_utilization']}"
    # the model's normal busy throughput per replica, from the whole fleet's history: a pod with no
    # history of its own (a new pod, whose sidecar has not learned yet) is still compared
    normal_busy = fleet_normal(c, c.mrec("vllm_generation_tokens_per_busy_replica", "rate"))
    hit = c.rec("vllm_prefix_cache_hit", "ratio_rate")
    hit_normal = fleet_normal(c, c.mrec("vllm_prefix_cache_hit", "ratio_rate"))
    asleep = c.rec("vllm_engine_asleep", "max_over_time" + c.W)  # a sleeping engine is not stalled (recording_pd)
    age = f"time() - max by ({c.r}) (process_start_time_seconds{s()} and on ({c.target}) vllm:num_requests_running{s()})"
    return [
        Alert("VLLMGPUBusyLowThroughput",
              f"max by ({by}) (vllm_sidecar_gpu_busy_low_throughput{s()}) == 1\nor\n(\n"
              f"  {tok}\n  < on ({svc}) group_left ()\n  ({bl['low_throughput_fraction']} * {normal_busy})\n"
              f"  and on ({c.r})\n  {busy}\n)",
              "critical",
              f"GPUs busy but few tokens on {who} ({c.model})",
              "The replica's GPUs are at high utilization but generation throughput is far below normal at that "
              "load: below the sidecar's learned baseline for this pod, or below what the model's replicas "
              "normally make while busy (the fleet's history, which a new pod has from its first minute). "
              "Typical cause: a flood of very long prompts (prefill and recomputation), KV thrashing, or a sick "
              "GPU. Compare with its peers."),
        Alert("VLLMEngineStalled",
              f"(\n  max by ({by}) (vllm_sidecar_engine_stalled{s()}) == 1\n  or\n"
              f"  {c.rec('vllm_requests_running', 'sum')} > 0\n  and on ({by})\n"
              f"  sum by ({by}) (rate(vllm:generation_tokens_total{s()}[{S2}])) == 0\n)\n"
              f"unless on ({by}) {asleep}",
              "critical",
              f"vLLM engine stalled on {who} ({c.model})",
              "Requests are running but no token has been produced for minutes. The engine is hung "
              "(a stuck collective, a dead worker, a deadlocked scheduler); clients are waiting forever."),
        Alert("VLLMReplicaOutlier",
              f"(\n  label_replace(\n    {speed}\n    < on ({svc}) group_left ()\n"
              f"    ({ol['throughput_factor']} * quantile by ({svc}) (0.5, {speed})),\n"
              f"    \"signal\", \"throughput\", \"\", \"\"\n  )\n"
              f"  or\n  label_replace(\n    {ttft95}\n    > on ({svc}) group_left ()\n"
              f"    ({ol['ttft_factor']} * quantile by ({svc}) (0.5, {ttft95})),\n"
              f"    \"signal\", \"ttft\", \"\", \"\"\n  )\n)\n"
              f"and on ({svc})\ncount by ({svc}) ({speed}) >= {ol['min_replicas']}",
              "warning",
              f"{who} behaves unlike its peers ({{{{ $labels.signal }}}})",
              "This replica's {{ $labels.signal }} ({{ $value | humanize }}) is far from the median of the other "
              "replicas of {{ $labels.model_name }}: one sick replica hides behind a healthy average. Check its "
              "prompts, KV cache and GPUs; restart or drain it."),
        Alert("VLLMPrefixCacheHitRatioLow",
              f"{hit} < {pc['min_hit_ratio']}\n"
              f"and on ({by})\n{hit}\n< on ({svc}) group_left ()\n({pc['fleet_factor']} * {hit_normal})\n"
              f"and on ({by})\n{c.rec('vllm_requests_finished', 'rate')} > 0\n"
              f"and on ({c.r})\n({age}) > {c.seconds(pc['warmup']):g}",
              "info",
              f"Low prefix-cache hit ratio on {who} ({c.model})",
              "Only {{ $value | humanizePercentage }} of prompt tokens came from the prefix cache, far below what "
              "this model's replicas normally hit. With a fixed system prompt this should be high: check "
              "cache-aware routing and the prompt template."),
    ]
