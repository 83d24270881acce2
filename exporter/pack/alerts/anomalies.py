"""Anomalies: what no single threshold catches. GPUs busy with few tokens (the sidecar's learned
baseline), a stalled engine, one replica unlike its peers, a prefix cache that stopped hitting.

The comparisons with normal are recording rules (``conditions``), made per model and role: a
healthy prefill instance (GPUs busy on prompts, almost no output tokens) is never "busy with few
tokens" nor slow beside its peers, a decode instance is compared with decode instances only."""

from __future__ import annotations

from typing import List

from .. import conditions, recording_pd
from ..context import Ctx
from .alert import Alert

BUSY_INPUTS = ("vllm_sidecar_gpu_busy_low_throughput", "vllm_sidecar_gpu_mean_utilization_ratio",
               "vllm_sidecar_generation_tokens_per_second", "vllm_sidecar_throughput_baseline_tokens_per_second",
               "vllm_sidecar_throughput_low_threshold_tokens_per_second")
STALL_INPUTS = ("vllm_sidecar_engine_stalled", "vllm:num_requests_running", "vllm:num_requests_waiting",
                "vllm:generation_tokens_total")


def alerts(c: Ctx) -> List[Alert]:
    by, s, who, svc, S2 = c.per_replica, c.selector, c.who, c.per_model, c.sustain_window
    n = conditions.names(c)
    ol = c.slo["outlier"]
    tok = c.rec("vllm_generation_tokens", "rate")
    bl = c.slo["gpu_busy_low"]
    pc = c.slo["prefix_cache"]
    hit = c.rec("vllm_prefix_cache_hit", "ratio_rate")
    speed = c.rec("vllm_generation_tokens_per_running_request", "rate")
    asleep = recording_pd.names(c)["asleep"]  # a sleeping engine is not stalled
    # the raw path reads only pods without the sidecar's target label; with the label off it reads
    # every pod, and where a sidecar serves its stall flag the sidecar decides
    sidecar_decides = "" if c.no_sidecar else f"  unless on ({by}) vllm_sidecar_engine_stalled{s()}\n"
    return [
        Alert("VLLMGPUBusyLowThroughput",
              f"max by ({by}) (vllm_sidecar_gpu_busy_low_throughput{s()}) == 1 unless on ({c.per_pod}) {c.prefill()}\n"
              f"or\n{tok} < on ({by}) {bl['low_throughput_fraction']} * {n['busy_normal']}\n"
              f"unless on ({c.per_pod}) {c.prefill()}",
              "critical",
              f"GPUs busy but few tokens on {who} ({c.model})",
              f"GPUs at {c.show('max(vllm_sidecar_gpu_mean_utilization_ratio{P})', 'humanizePercentage')} utilization, "
              f"{c.show(tok + '{R}')} output tokens/s, where a busy replica of this model and role normally "
              f"makes {c.show(n['busy_normal_model'] + '{M} and on (role) ' + c.role + '{R}')} (the fleet's history; below "
              f"{bl['low_throughput_fraction']:.0%} of it fires), or below the sidecar's learned baseline for this "
              f"pod (inputs: {c.inputs(*BUSY_INPUTS)}). Typical cause: a flood of very long prompts (prefill and "
              f"recomputation), KV thrashing, or a sick GPU. Compare with its peers."),
        Alert("VLLMEngineStalled",
              f"(\n  max by ({by}) (vllm_sidecar_engine_stalled{s()}) == 1\n  or\n"
              f"  {c.running(c.no_sidecar)} > 0\n"
              f"  and on ({by}) sum by ({by}) (rate(vllm:generation_tokens_total{s(c.no_sidecar)}[{S2}])) == 0\n"
              f"{sidecar_decides})\n"
              f"unless on ({by}) {asleep}",
              "critical",
              f"vLLM engine stalled on {who} ({c.model})",
              f"Requests are running ({{{{ $value }}}}: the sidecar's stall flag, or the requests running) but no "
              f"token has been produced for {c.human(S2)} or more (normally tokens flow whenever requests run). "
              "The engine is hung (a stuck collective, a dead worker, a deadlocked scheduler); clients are "
              f"waiting forever. Inputs: {c.inputs(*STALL_INPUTS)}"),
        Alert("VLLMReplicaOutlier",
              f"label_replace({n['speed_vs_peers']} < {ol['throughput_factor']}, "
              f"\"signal\", \"throughput\", \"\", \"\")\nor\n"
              f"label_replace({n['ttft_vs_peers']} > {ol['ttft_factor']}, \"signal\", \"ttft\", \"\", \"\")",
              "warning",
              f"{who} behaves unlike its peers ({{{{ $labels.signal }}}})",
              f"This replica's {{{{ $labels.signal }}}} is {{{{ $value | printf \"%.2f\" }}}}x the median of the other "
              f"replicas of {{{{ $labels.model_name }}}} in its role ({{{{ if eq $labels.signal \"throughput\" }}}}"
              f"tokens per running request, now {c.show(speed + '{R}')}/s: it warns below "
              f"{ol['throughput_factor']:g}x{{{{ else }}}}TTFT p95: it warns above {ol['ttft_factor']:g}x{{{{ end }}}}): "
              "one sick replica hides behind a healthy average. Check its prompts, KV cache and GPUs; "
              "restart or drain it."),
        Alert("VLLMPrefixCacheHitRatioLow",
              f"{hit} < {pc['min_hit_ratio']}\n"
              f"and on ({by}) {hit} < on ({svc}) group_left () {pc['fleet_factor']} * {n['hit_normal']}\n"
              f"and on ({by}) {c.rec('vllm_requests_finished', 'rate')} > 0\n"
              f"and on ({c.per_pod}) {n['uptime']} > {c.seconds(pc['warmup']):g}",
              "info",
              f"Low prefix-cache hit ratio on {who} ({c.model})",
              f"Only {{{{ $value | humanizePercentage }}}} of prompt tokens came from the prefix cache, where this "
              f"model's replicas normally hit {c.show(n['hit_normal'] + '{M}', 'humanizePercentage')} (it fires "
              f"below {pc['fleet_factor']:g}x that and under {pc['min_hit_ratio']:.0%}). With a fixed system "
              "prompt this should be high: check cache-aware routing and the prompt template."),
    ]
