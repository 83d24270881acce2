"""Capacity: the KV cache holding requests back, preemptions, a growing queue, long-prompt
surges (what fills the cache)."""

from __future__ import annotations

from typing import List

from .. import conditions
from ..context import Ctx, le_for
from .alert import Alert


def alerts(c: Ctx) -> List[Alert]:
    by, who = c.per_replica, c.who
    kv = c.slo["kv_cache"]
    lp = c.slo["long_prompt"]
    held = c.windows["held_back"]
    waiting = c.rec("vllm_requests_waiting", "sum")
    n = conditions.names(c)

    held_avg = c.rec("vllm_requests_held_back", "avg_over_time" + held)
    episode = c.windows["episode"]
    recent = c.windows["episode_recent"]
    chronic = n["held_chronic"]
    ratio = f"{n['sidecar_long_ratio']}{{R}} or {c.rec('vllm_long_prompt_requests', 'ratio_rate')}{{R}}"
    both = 'label_replace(vector(1), "role", "both", "", "")'
    normal = f"({n['sidecar_long_normal']}{{M}} or {n['long_normal']}{{M}}) and on (role) ({c.role}{{P}} or on () {both})"

    def floor(window: str) -> float:
        """The least long-prompt rate a surge has over ``window``: min_per_second, and min_count in it."""
        return max(lp["min_per_second"], lp["min_count"] / c.seconds(window))

    preempt = c.rec("vllm_preemptions", "increase" + c.windows["preemptions"])
    return [
        # Requests held back by the KV cache (waiting for capacity it cannot give, preempted, or
        # rejected) at nearly every evaluation of the window, or, under chronic overload, at a good
        # share of a longer one: the steady signals (the sidecar's share of its polls where it has
        # it), never the saw-tooth of usage. Usage alone never fires: vLLM fills its cache by design.
        Alert("VLLMKVCacheExhausted",
              f"{held_avg} >= {kv['held_back_share']}\n"
              f"or\nmax_over_time({held_avg}[{episode}]) >= {kv['held_back_share']}\nand on ({by})\n{chronic}",
              "critical",
              f"vLLM KV cache cannot take the waiting requests on {who} ({c.model})",
              f"Requests have been held back by the KV cache (waiting for capacity while the cache is at "
              f"{kv['warn']:g} or the batch runs below {kv['batch_room']:g} of its ceiling, preempted or rejected) "
              f"at {{{{ $value | humanizePercentage }}}} of the last {c.human(held)} (it fires at "
              f"{kv['held_back_share']:.0%}; in a chronic overload, at that share within {c.human(episode)} and "
              f"{kv['episode_share']:.0%} of the last {c.human(recent)}). The waiting requests do not fit, "
              f"whatever the usage gauge reads: new requests queue and TTFT climbs. Look for long prompts and "
              f"lower concurrency."),
        # ... and, under chronic overload, while the cache still holds requests back (now, and at
        # kv_cache.episode_share of windows.episode_recent, as the KV alert's chronic branch: a
        # request waiting a scrape after the overload ended never reopens it) and preemptions came
        # back within windows.episode: one alert per overload, not one per burst
        Alert("VLLMPreemptionsSustained",
              f"{preempt} >= {c.slo['preemptions']['min_events']}\nand on ({by})\n"
              f"{preempt} offset {c.windows['preemptions']} > 0\nor\n"
              f"{n['preempt_episode']} >= {c.slo['preemptions']['episode_events']}\nand on ({by})\n{chronic}",
              "warning",
              f"vLLM preempting requests on {who} ({c.model})",
              f"vLLM preempted {{{{ $value | humanize }}}} running requests in the last "
              f"{c.human(c.windows['preemptions'])} (it warns at {c.slo['preemptions']['min_events']:g} with more in "
              f"the {c.human(c.windows['preemptions'])} before, or at {c.slo['preemptions']['episode_events']:g} in "
              f"{c.human(episode)} of chronic overload), and keeps doing so: the KV cache cannot hold the running "
              "batch, work is recomputed and latency suffers."),
        Alert("VLLMLongPromptSurge",
              f"{n['sidecar_long_surge']} > {floor(c.windows['sidecar']):g}\nor\n"
              f"{n['sidecar_long_surge_slow']} > {floor(c.rate_window):g}\nor\n"
              f"{n['long_surge']} > {floor(c.rate_window):g}",
              "warning",
              f"Surge of prompts over {lp['tokens']:g} tokens on {who} ({c.model})",
              f"{{{{ $value | humanize }}}} long prompts per second (over {lp['tokens']:g} tokens; vLLM's bucket "
              f"le={le_for(lp['tokens'])} on a pod without the sidecar), {c.show(ratio, 'humanizePercentage')} "
              f"of its requests; a replica of "
              f"this model and role normally gets {c.show(normal)} per second. It warns above "
              f"{lp['surge_factor']:g}x that (with nothing to compare with yet, at {lp['floor_share']:.0%} of the "
              f"requests). Long prompts fill the KV cache and stall everyone else's first token: find the "
              f"client, cap prompt length at the gateway or route long prompts to a dedicated replica."),
        # built up and not draining: steady while the overload lasts (one alert per overload),
        # or still growing
        Alert("VLLMQueueBuildup",
              f"min_over_time({waiting}[{c.windows['queue_growth']}]) >= {c.slo['queue']['min_waiting']}\n"
              f"or\n(\n  {waiting} >= {c.slo['queue']['min_waiting']}\n"
              f"  and on ({by})\n  deriv({waiting}[{c.windows['queue_growth']}]) > 0\n)",
              "warning",
              f"vLLM waiting queue building up on {who} ({c.model})",
              f"{{{{ $value | humanize }}}} requests waiting (it warns at {c.slo['queue']['min_waiting']:g}), and the "
              f"queue has not drained (or kept growing) over the last {c.human(c.windows['queue_growth'])}: "
              f"arrivals exceed what the replica serves. Scale out "
              f"or shed load before TTFT breaks its objective."),
    ]
