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

    def normal_of(now: str, per_replica_normal: str) -> str:
        """The model's normal for one replica: its fleet history, else the median of its replicas
        now (with enough of them)."""
        history = fleet_normal(c, per_replica_normal, lp["baseline_quantile"])
        peers = f"quantile by ({svc}) (0.5, {now})\nand on ({svc})\ncount by ({svc}) ({now}) >= {min_replicas}"
        return f"{history}\nor\n(\n{indent(peers)}\n)"

    def surge(now: str, per_replica_normal: str, ratio: str) -> str:
        """``now`` above factor x the model's normal for one replica; with nothing to compare
        with (one or two replicas on day one), long prompts at ``floor_share`` of the replica's
        requests."""
        normal = normal_of(now, per_replica_normal)
        compared = f"{now}\n> on ({svc}) group_left ()\n(\n  {lp['surge_factor']} * (\n{indent(normal, 4)}\n  )\n)"
        floor = (f"{now}\nand on ({by})\n({ratio} >= {lp['floor_share']})\n"
                 f"unless on ({svc})\n(\n{indent(normal)}\n)")
        return f"(\n{indent(compared)}\n)\nor\n(\n{indent(floor)}\n)"

    # the sidecar's own window (seconds of resolution) against the sidecars' normal; the rules'
    # rate (a replica without a sidecar, or a slower view) against the rules' normal
    sidecar_now = f"max by ({by}) (vllm_sidecar_long_prompt_requests_per_second{s()})"
    sidecar_ratio = f"max by ({by}) (vllm_sidecar_long_prompt_request_ratio{s()})"
    fast = surge(sidecar_now, c.mrec("vllm_sidecar_long_prompt_requests_per_replica", "avg"), sidecar_ratio)
    slow = surge(lr, c.mrec("vllm_long_prompt_requests_per_replica", "rate"), c.rec("vllm_long_prompt_requests", "ratio_rate"))
    held_avg = c.rec("vllm_requests_held_back", "avg_over_time" + held)
    episode = c.windows["episode"]
    recent = c.windows["episode_recent"]
    held_recent = c.rec("vllm_requests_held_back", "avg_over_time" + recent)
    preempt = c.rec("vllm_preemptions", "increase" + c.windows["preemptions"])
    return [
        # Requests held back by the KV cache (waiting for capacity it cannot give, preempted, or
        # rejected) at nearly every evaluation of the window, or, under chronic overload, at a good
        # share of a longer one: the steady signals (the sidecar's share of its polls where it has
        # it), never the saw-tooth of usage. Usage alone never fires: vLLM fills its cache by design.
        Alert("VLLMKVCacheExhausted",
              f"{held_avg} >= {kv['held_back_share']}\n"
              f"or\n(\n  max_over_time({held_avg}[{episode}]) >= {kv['held_back_share']}\n"
              f"  and on ({by})\n  {held_recent} >= {kv['episode_share']}\n"
              f"  and on ({by})\n  {held_avg} > {kv['episode_gate']}\n)",
              "critical",
              f"vLLM KV cache cannot take the waiting requests on {who} ({c.model})",
              f"Requests have been held back by the KV cache (waiting for capacity while the cache is at "
              f"{kv['warn']:g} or the batch runs below {kv['batch_room']:g} of its ceiling, preempted or rejected) "
              f"at {{{{ $value | humanizePercentage }}}} of the last {c.human(held)} (or of {c.human(episode)} of "
              f"chronic overload). The waiting requests do not fit, whatever the usage gauge reads: new requests "
              f"queue and TTFT climbs. Look for long prompts and lower concurrency."),
        # ... and, under chronic overload, while the cache still holds requests back (now, and at
        # kv_cache.episode_share of windows.episode_recent, as the KV alert's chronic branch: a
        # request waiting a scrape after the overload ended never reopens it) and preemptions came
        # back within windows.episode: one alert per overload, not one per burst
        Alert("VLLMPreemptionsSustained",
              f"(\n  {preempt} >= {c.slo['preemptions']['min_events']}\n  and on ({by})\n"
              f"  {preempt} offset {c.windows['preemptions']} > 0\n)\nor\n(\n"
              f"  sum by ({by}) (increase(vllm:num_preemptions_total{s()}[{episode}])) >= "
              f"{c.slo['preemptions']['episode_events']}\n"
              f"  and on ({by})\n  {held_recent} >= {kv['episode_share']}\n"
              f"  and on ({by})\n  {held_avg} > {kv['episode_gate']}\n)",
              "warning",
              f"vLLM preempting requests on {who} ({c.model})",
              f"vLLM preempted {{{{ $value | humanize }}}} running requests in the last "
              f"{c.human(c.windows['preemptions'])}, and keeps doing so: the KV cache cannot hold the running "
              "batch, work is recomputed and latency suffers."),
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
