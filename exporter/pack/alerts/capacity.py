"""Capacity: the KV cache holding requests back, preemptions, a growing queue, long-prompt
surges (what fills the cache)."""

from __future__ import annotations

from typing import List

from ..context import Ctx, le_for
from . import Alert


def alerts(c: Ctx) -> List[Alert]:
    by, s, who, W, S2 = c.by, c.s, c.who, c.W, c.S2
    kv = c.slo["kv_cache"]
    lp = c.slo["long_prompt"]
    waiting = c.rec("vllm_requests_waiting", "sum")
    lr = c.rec("vllm_long_prompt_requests", "rate")
    past = f"avg_over_time({lr}[{lp['surge_baseline']}] offset {lp['surge_baseline_offset']})"
    return [
        # usage alone never fires: vLLM fills its cache by design; requests held back do
        Alert("VLLMKVCacheExhausted",
              f"{c.rec('vllm_kv_cache_usage', 'max')} >= {kv['critical']}\n"
              f"and on ({by})\n(\n"
              f"  {c.rec('vllm_requests_waiting_capacity', 'sum')} > 0\n"
              f"  or {c.rec('vllm_preemptions', 'rate')} > 0\n"
              f"  or {c.rec('vllm_admission_rejections', 'rate')} > 0\n)",
              "critical",
              f"vLLM KV cache full with requests held back on {who} ({c.model})",
              f"KV-cache usage is {{{{ $value | humanizePercentage }}}} (full at {kv['critical']:g}) and requests are "
              f"waiting for KV capacity, being rejected or preempted. Usage alone is normal for vLLM; this is "
              f"not: new requests queue and TTFT climbs. Look for long prompts and lower concurrency."),
        Alert("VLLMPreemptionsSustained",
              f"sum by ({by}) (rate(vllm:num_preemptions_total{s()}[{S2}])) > 0",
              "warning",
              f"vLLM preempting requests on {who} ({c.model})",
              f"vLLM has preempted running requests in every {S2} window for a while "
              "({{ $value | humanize }}/s now): the KV cache cannot hold the running batch, work is "
              "recomputed and latency suffers."),
        Alert("VLLMLongPromptSurge",
              f"(\n  {lr} > on ({by}) ({lp['surge_factor']} * {past})\n  or\n  ({lr} unless on ({by}) {past})\n)\n"
              f"and on ({by})\n{lr} > {lp['min_per_second']}",
              "warning",
              f"Surge of prompts over {lp['tokens']:g} tokens on {who} ({c.model})",
              f"{{{{ $value | humanize }}}} long prompts per second (over {lp['tokens']:g} tokens, vLLM bucket "
              f"le={le_for(lp['tokens'])}), more than {lp['surge_factor']:g}x this replica's usual rate. Long prompts "
              f"fill the KV cache and stall everyone else's first token: find the client, cap prompt length at the "
              f"gateway or route long prompts to a dedicated replica."),
        Alert("VLLMQueueBuildup",
              f"{waiting} >= {c.slo['queue']['min_waiting']}\n"
              f"and on ({by})\nderiv({waiting}[{c.windows['queue_growth']}]) > 0",
              "warning",
              f"vLLM waiting queue growing on {who} ({c.model})",
              "{{ $value | humanize }} requests waiting and the queue keeps growing: arrivals exceed what "
              "the replica serves. Scale out or shed load before TTFT breaks its objective."),
    ]
