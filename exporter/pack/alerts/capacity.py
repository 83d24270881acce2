"""Capacity: the KV cache holding requests back, preemptions, a growing queue, long-prompt
surges (what fills the cache)."""

from __future__ import annotations

from typing import List

from ..context import Ctx, indent, le_for
from .alert import Alert


def fleet_normal(c: Ctx, per_replica_model_rate: str, quantile: float = 0.0) -> str:
    """What one replica of the model normally does: over the baseline window, the fleet's average
    (or, with ``quantile``, that quantile of it: what the busier moments of a normal day look like,
    for a bursty signal), keyed by the model, so it survives rollouts. Only once the history
    reaches back to the far end of the window (not the first minutes of a new model); callers
    fall back to the replicas' median now, else compare nothing (a new model on ordinary traffic
    never fires)."""
    w = c.windows
    far = c.seconds(w["baseline"]) + c.seconds(w["baseline_offset"]) - c.seconds(w["baseline_edge"])
    over = f"[{w['baseline']}] offset {w['baseline_offset']}"
    level = (f"quantile_over_time({quantile:g}, {per_replica_model_rate}{over})" if quantile
             else f"avg_over_time({per_replica_model_rate}{over})")
    return f"{level}\nand\npresent_over_time({per_replica_model_rate}[{w['baseline_edge']}] offset {far:g}s)"


def alerts(c: Ctx) -> List[Alert]:
    by, s, who, svc = c.by, c.s, c.who, c.svc
    kv = c.slo["kv_cache"]
    lp = c.slo["long_prompt"]
    held = c.windows["held_back"]
    waiting = c.rec("vllm_requests_waiting", "sum")
    lr = c.rec("vllm_long_prompt_requests", "rate")
    min_replicas = c.slo["outlier"]["min_replicas"]

    def surge(now: str, per_replica_normal: str) -> str:
        """``now`` above factor x the model's normal for one replica: its fleet history, else the
        median of its replicas now (with enough of them), else nothing to compare with."""
        history = fleet_normal(c, per_replica_normal, lp["baseline_quantile"])
        peers = f"quantile by ({svc}) (0.5, {now})\nand on ({svc})\ncount by ({svc}) ({now}) >= {min_replicas}"
        normal = f"{history}\nor\n(\n{indent(peers)}\n)"
        return f"{now}\n> on ({svc}) group_left ()\n(\n  {lp['surge_factor']} * (\n{indent(normal, 4)}\n  )\n)"

    # the sidecar's own window (seconds of resolution) against the sidecars' normal; the rules'
    # rate (a replica without a sidecar, or a slower view) against the rules' normal
    sidecar_now = f"max by ({by}) (vllm_sidecar_long_prompt_requests_per_second{s()})"
    fast = surge(sidecar_now, c.mrec("vllm_sidecar_long_prompt_requests_per_replica", "avg"))
    slow = surge(lr, c.mrec("vllm_long_prompt_requests_per_replica", "rate"))
    return [
        # Requests held back for KV capacity (or preempted, or rejected) at every evaluation of
        # the window, with the cache full at least once in it: the steady signals, not the
        # saw-tooth of usage. Usage alone never fires: vLLM fills its cache by design.
        Alert("VLLMKVCacheExhausted",
              f"avg_over_time({c.rec('vllm_requests_held_back', 'bool')}[{held}]) >= {kv['held_back_share']}\n"
              f"and on ({by})\nmax_over_time({c.rec('vllm_kv_cache_usage', 'max')}[{held}]) >= {kv['critical']}",
              "critical",
              f"vLLM KV cache full with requests held back on {who} ({c.model})",
              f"The KV cache reached {kv['critical']:g} and requests have been held back for KV capacity "
              f"(waiting, preempted or rejected) at {{{{ $value | humanizePercentage }}}} of the evaluations of the "
              f"last {c.human(held)}. Usage alone is normal for vLLM; this is not: new requests queue and TTFT "
              f"climbs. Look for long prompts and lower concurrency."),
        Alert("VLLMPreemptionsSustained",
              f"{c.rec('vllm_preemptions', 'rate', c.S2)} > 0",
              "warning",
              f"vLLM preempting requests on {who} ({c.model})",
              f"vLLM has preempted running requests in every {c.S2} window for a while "
              "({{ $value | humanize }}/s now): the KV cache cannot hold the running batch, work is "
              "recomputed and latency suffers."),
        Alert("VLLMLongPromptSurge",
              f"(\n  (\n{indent(fast, 4)}\n  )\n  or\n  (\n{indent(slow, 4)}\n  )\n)\n> {lp['min_per_second']}",
              "warning",
              f"Surge of prompts over {lp['tokens']:g} tokens on {who} ({c.model})",
              f"{{{{ $value | humanize }}}} long prompts per second (over {lp['tokens']:g} tokens, vLLM bucket "
              f"le={le_for(lp['tokens'])}), more than {lp['surge_factor']:g}x what a replica of this model "
              f"normally gets. Long prompts fill the KV cache and stall everyone else's first token: find the "
              f"client, cap prompt length at the gateway or route long prompts to a dedicated replica."),
        # built up and not draining: steady while the overload lasts (one alert per overload),
        # or still growing
        Alert("VLLMQueueBuildup",
              f"min_over_time({waiting}[{c.windows['queue_growth']}]) >= {c.slo['queue']['min_waiting']}\n"
              f"or\n(\n  {waiting} >= {c.slo['queue']['min_waiting']}\n"
              f"  and on ({by})\n  deriv({waiting}[{c.windows['queue_growth']}]) > 0\n)",
              "warning",
              f"vLLM waiting queue building up on {who} ({c.model})",
              f"{{{{ $value | humanize }}}} requests waiting, and the queue has not drained (or kept growing) over "
              f"the last {c.human(c.windows['queue_growth'])}: arrivals exceed what the replica serves. Scale out "
              f"or shed load before TTFT breaks its objective."),
    ]
