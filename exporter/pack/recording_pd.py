"""Recording rules of the disaggregated (prefill/decode) fleet and of speculative decoding: each
replica's role, a sleeping engine, KV-transfer health, the balance of the two sides per model,
and speculative acceptance.

Every signal reads the sidecar's windowed series where the pod has a sidecar and vLLM's own
series otherwise (``vllm:nixl_*``, with the ``vllm:mooncake_*`` family as the same inputs,
``vllm:prompt_tokens_by_source_total``, ``vllm:spec_decode_*_total``,
``vllm:num_requests_kv_fetch_by_stage``, ``vllm:engine_sleep_state``): counters with ``_total`` as
the page writes them. Names follow ``level:metric:operations`` (``names.Names``); the level and
every ``by``/``on`` list come from the SLO's ``replica_labels`` and ``outer_labels``.

The role (``namespace_pod_model:vllm_role:info``) is one series per replica and model that vLLM
serves, ``role`` taken from the sidecar's ``vllm_sidecar_role_info`` and ``both`` where the pod has
no sidecar (no sidecar target label; without the label in the SLO, where the sidecar does not say):
every rule, alert and panel joins on it. Its family runs
first in the group, so a rule that joins on it reads this evaluation's role.
"""

from __future__ import annotations

from typing import Dict, List

from .context import Ctx, indent
from .recorded import Recording

AWAKE, DISCARDED = (f'sleep_state="{x}"' for x in ("awake", "discard_all"))
CAPACITY_WAIT = 'reason="capacity"'
TRANSFER_FAMILIES = ("nixl", "mooncake")  # vLLM's KV connectors whose stats share one shape
SIDES = ("prefill", "decode")


def names(c: Ctx) -> Dict[str, str]:
    """The names of this module's rules, for the alerts, dashboards and runbooks."""
    W, base = c.rate_window, c.windows["baseline"]
    return {
        "role": c.rec("vllm_role", "info"),
        "sleep": c.rec("vllm_engine_sleep_level", "max"),
        "asleep": c.rec("vllm_engine_asleep", "max_over_time" + W),
        "transfers": c.rec("vllm_kv_transfers", "rate"),
        "failures": c.rec("vllm_kv_transfer_failures", "rate"),
        "failure_ratio": c.rec("vllm_kv_transfer_failures", "ratio_rate"),
        "xfer_p95": c.rec("vllm_kv_transfer_seconds", "histogram_quantile"),
        "bytes": c.rec("vllm_kv_transfer_bytes", "rate"),
        "expired": c.rec("vllm_kv_expired_requests", "rate"),
        "expired_share": c.rec("vllm_kv_expired_requests", "ratio_rate"),
        "after_expiry": c.rec("vllm_kv_notifications_after_expiry", "rate"),
        "fetch_waiting": c.rec("vllm_requests_waiting_kv_fetch", "sum"),
        "transferred": c.rec("vllm_prompt_tokens_transferred", "ratio_rate"),
        "recomputed": c.rec("vllm_prompt_tokens_recomputed", "ratio_rate"),
        "side_tokens": c.mrec("vllm_side_tokens_per_instance", "rate"),
        "side_at_saturation": c.mrec("vllm_side_tokens_per_instance_saturated", "rate"),
        "side_capacity": c.mrec("vllm_side_tokens_per_instance_capacity", "max"),
        "side_load": c.mrec("vllm_side_load", "ratio"),
        "side_waiting": c.mrec("vllm_side_requests_waiting_per_instance", "avg"),
        "side_kv": c.mrec("vllm_side_kv_cache_usage", "avg"),
        "side_saturated": c.mrec("vllm_side_saturated", "waiting"),
        "side_room": c.mrec("vllm_side_room", "load"),
        "acceptance": c.rec("vllm_spec_decode_acceptance", "ratio_rate"),
        "accepted_length": c.rec("vllm_spec_decode_mean_accepted_length", "ratio_rate"),
        "m_acceptance": c.mrec("vllm_spec_decode_acceptance", "ratio_rate"),
        "acceptance_normal": c.mrec("vllm_spec_decode_acceptance", "avg_over_time" + base),
    }


def _sidecar_or(c: Ctx, sidecar: str, raw: str, *matchers: str) -> str:
    """The sidecar's series per replica and model where served, else ``raw`` (whose selectors read
    only pods without the sidecar's target label, ``c.no_sidecar``)."""
    return f"max by ({c.per_replica}) ({sidecar}{c.selector(*matchers)})\nor on ({c.per_replica})\n{raw}"


def _raw_rate(c: Ctx, suffix: str, *matchers: str) -> str:
    """``rate`` of one connector counter, NIXL's name else Mooncake's (the same input), on the pods
    without a sidecar."""
    return "\nor\n".join(c.rate(f"vllm:{fam}_{suffix}", "", c.no_sidecar, *matchers) for fam in TRANSFER_FAMILIES)


def roles(c: Ctx) -> List[Recording]:
    """Each replica's role and whether its engine sleeps (awake engines only are judged)."""
    by, r, s, W = c.per_replica, c.per_pod, c.selector, c.rate_window
    n = names(c)
    replicas = f"group by ({by}) (last_over_time(vllm:num_requests_running{s()}[{W}]))"
    # "both" for the pods without the sidecar's target label: a pod with it has its sidecar's role
    # (one whose sidecar said none within the rate window, down or not reading vLLM, has none:
    # no sidecar figure of it is there to join either, and its sidecar's target reads down)
    unlabelled = f"group by ({by}) (last_over_time(vllm:num_requests_running{s(c.no_sidecar)}[{W}]))"
    given = (f"max by ({r}, role) (vllm_sidecar_role_info{s()})\nor on ({r})\n"
             f"max by ({r}, role) (last_over_time(vllm_sidecar_role_info{s()}[{W}]))")
    # asleep (1 - awake) plus one more where all was discarded: level 1 or 2, as the sidecar says
    raw_sleep = (f"1 - min by ({by}) (vllm:engine_sleep_state{s(AWAKE, c.no_sidecar)})\n"
                 f"+ on ({by})\nmax by ({by}) (vllm:engine_sleep_state{s(DISCARDED, c.no_sidecar)})")
    return [
        # 1 per replica and model, with the role its sidecar was given; "both" without one
        Recording(n["role"],
                  f"{replicas}\n* on ({r}) group_left (role)\n(\n{indent(given)}\n)\n"
                  f"or on ({by})\nlabel_replace({unlabelled}, \"role\", \"both\", \"\", \"\")"),
        # 0 awake, 1 weights offloaded, 2 all discarded (1 for a sleep vLLM gives no level)
        Recording(n["sleep"], _sidecar_or(c, "vllm_sidecar_engine_sleep_level", raw_sleep)),
        # asleep at some point of the rate window: its rates and ratios are the sleep's, not a fault's
        Recording(n["asleep"], f"max_over_time({n['sleep']}[{W}]) > 0"),
    ]


def kv_transfer(c: Ctx) -> List[Recording]:
    """KV-transfer health per replica: transfers and failures per second, the failure ratio, the
    transfer time p95, bytes per second, expired leases, requests waiting on a fetch, and the share
    of prompt tokens that arrived by transfer (and, of those not found in the local prefix cache,
    the share computed locally: a decode instance's silent transfer failure)."""
    by, s, W = c.per_replica, c.selector, c.rate_window
    n = names(c)
    src = 'source="{}"'
    ext = c.rate("vllm:prompt_tokens_by_source_total", "", src.format("external_kv_transfer"))
    local = c.rate("vllm:prompt_tokens_by_source_total", "", src.format("local_compute"))
    every = c.rate("vllm:prompt_tokens_by_source_total", "", c.no_sidecar)
    ext_raw = c.rate("vllm:prompt_tokens_by_source_total", "", src.format("external_kv_transfer"), c.no_sidecar)
    buckets = "\nor\n".join(f"sum by ({by}, le) (rate(vllm:{fam}_xfer_time_seconds_bucket{s(c.no_sidecar)}[{W}]))"
                            for fam in TRANSFER_FAMILIES)
    fetch_raw = f"sum by ({by}) (vllm:num_requests_kv_fetch_by_stage{s(c.no_sidecar)})"
    return [
        Recording(n["transfers"], _sidecar_or(c, "vllm_sidecar_kv_transfers_per_second",
                                              _raw_rate(c, "xfer_time_seconds_count"))),
        Recording(n["failures"], _sidecar_or(c, "vllm_sidecar_kv_transfer_failures_per_second",
                                             _raw_rate(c, "num_failed_transfers_total"), 'kind="transfer"')),
        # failed / (failed + completed); only where a transfer was tried
        Recording(n["failure_ratio"],
                  _sidecar_or(c, "vllm_sidecar_kv_transfer_failure_ratio",
                              f"{n['failures']}\n/ on ({by})\n(({n['failures']} + on ({by}) {n['transfers']}) > 0)")),
        Recording(n["xfer_p95"],
                  _sidecar_or(c, "vllm_sidecar_kv_transfer_seconds",
                              f"histogram_quantile(0.95,\n{indent(buckets)}\n)", 'quantile="0.95"'),
                  {"quantile": "0.95"}),
        Recording(n["bytes"], _sidecar_or(c, "vllm_sidecar_kv_transfer_bytes_per_second",
                                          _raw_rate(c, "bytes_transferred_sum"))),
        Recording(n["expired"], _sidecar_or(c, "vllm_sidecar_kv_expired_requests_per_second",
                                            _raw_rate(c, "num_kv_expired_reqs_total"))),
        # per finished request (the prompt-length histogram's count: one series, every finished
        # request): a prefill instance finishes each request at its prefill, and some leases always
        # expire (clients gone before decode read them)
        Recording(n["expired_share"],
                  f"{n['expired']}\n/ on ({by})\n({c.rate('vllm:request_prompt_tokens_count')} > 0)"),
        Recording(n["after_expiry"], _sidecar_or(c, "vllm_sidecar_kv_notifications_after_expiry_per_second",
                                                 c.rate("vllm:nixl_num_notifications_after_expiry_total", "",
                                                        c.no_sidecar))),
        Recording(n["fetch_waiting"],
                  f"sum by ({by}) (vllm_sidecar_requests_waiting_kv_fetch{s()})\nor on ({by})\n{fetch_raw}"),
        Recording(n["transferred"], _sidecar_or(c, "vllm_sidecar_prompt_tokens_transferred_ratio",
                                                f"{ext_raw}\n/ on ({by})\n({every} > 0)")),
        # vLLM's own counter for every pod: no sidecar series tells a local prefix-cache hit (a
        # healthy decode instance's warm cache) from a prompt computed again (a failed transfer).
        # local / (local + transferred), written to read each source once: none computed locally is
        # 0 (1 / +Inf), neither is no share (NaN, which no comparison keeps). Decode instances only:
        # the others compute their prompts by design (their share is written for no reader)
        Recording(n["recomputed"], f"1 / (1 + {ext}\n/ on ({by})\n{local}) >= 0\n"
                                   f"and on ({by})\n{n['role']}{{role=\"decode\"}}"),
    ]


def pd_balance(c: Ctx) -> List[Recording]:
    """Per model and side (role prefill or decode), what one instance of the side carries: its
    tokens per second (prefill: prompt tokens, decode: output tokens) against what one instance
    carries at most (``capacity.<side>_tokens_per_second`` when planned, else learned: the most one
    instance carried while its side was saturated, over ``windows.baseline`` ending
    ``windows.baseline_offset`` ago; unknown until the side has been saturated once), the requests
    waiting for capacity (averaged over the rate window) and the KV-cache usage; then whether the
    side is saturated (requests waiting) or has room (none waiting, the cache below
    ``kv_cache.warn``, the load below ``disaggregation.room_load`` where the capacity is known)."""
    by, svc, s = c.per_replica, c.per_model, c.selector
    n = names(c)
    d, cap, kv = c.slo["disaggregation"], c.slo["capacity"], c.slo["kv_cache"]
    role = n["role"]
    prompt = _sidecar_or(c, "vllm_sidecar_prompt_tokens_per_second", c.rate("vllm:prompt_tokens_total", "", c.no_sidecar))
    output = _sidecar_or(c, "vllm_sidecar_generation_tokens_per_second",
                         c.rate("vllm:generation_tokens_total", "", c.no_sidecar))
    # averaged over the rate window: a busy prefill instance always has a request or two waiting
    # for its next step, a saturated one a queue that stays (read here, its only reader)
    waiting = (f"sum by ({by}) (avg_over_time(vllm:num_requests_waiting_by_reason{s(CAPACITY_WAIT)}[{c.rate_window}]))\n"
               f"or on ({by})\nsum by ({by}) (avg_over_time(vllm:num_requests_waiting{s()}[{c.rate_window}]))")
    usage = _sidecar_or(c, "vllm_sidecar_kv_cache_usage_ratio",
                        f"max by ({by}) (vllm:kv_cache_usage_perc{s(c.no_sidecar)})\nor on ({by})\n"
                        f"max by ({by}) (vllm:gpu_cache_usage_perc{s(c.no_sidecar)})")

    def per_side(expr: str, side: str = "") -> str:
        """``expr`` averaged per model over the awake instances of one side (both sides: ``side`` "")."""
        # both sides: every role but "both" (an equality matcher: the backtest inlines recorded
        # series on a server, which takes = and != only)
        sides = f'role="{side}"' if side else 'role!="both"'
        return (f"avg by ({svc}, role) (\n  (\n{indent(expr, 4)}\n  )\n"
                f"  * on ({by}) group_left (role)\n  ({role}{{{sides}}} unless on ({by}) {n['asleep']})\n)")

    def side_capacity(side: str) -> str:
        planned = cap[f"{side}_tokens_per_second"]
        sel = f"{{role=\"{side}\"}}"
        if planned:
            return f"{n['side_tokens']}{sel} * 0 + {planned:g}"
        return (f"max_over_time({n['side_at_saturation']}{sel}[{c.windows['baseline']}] "
                f"offset {c.windows['baseline_offset']})")

    room = (f"{n['side_load']} < {d['room_load']}\nor on ({svc}, role)\n({n['side_tokens']} * 0 unless on ({svc}, role) "
            f"{n['side_capacity']})")
    return [
        Recording(n["side_tokens"], f"{per_side(prompt, 'prefill')}\nor\n{per_side(output, 'decode')}"),
        # the same figure for both sides, each side's instances averaged
        Recording(n["side_waiting"], per_side(waiting)),
        Recording(n["side_kv"], per_side(usage)),
        # the side's requests waiting per instance, where at least disaggregation.saturated_waiting
        Recording(n["side_saturated"], f"{n['side_waiting']} >= {d['saturated_waiting']}"),
        # what one instance carried while its side was saturated: its capacity, learned
        Recording(n["side_at_saturation"], f"{n['side_tokens']}\nand on ({svc}, role)\n{n['side_saturated']}"),
        Recording(n["side_capacity"], f"{side_capacity('prefill')}\nor\n{side_capacity('decode')}"),
        Recording(n["side_load"], f"{n['side_tokens']}\n/ on ({svc}, role)\n({n['side_capacity']} > 0)"),
        # the side's load (0 where no capacity is known), where it has room for more
        Recording(n["side_room"],
                  f"(\n{indent(room)}\n)\nand on ({svc}, role)\n{n['side_waiting']} < {d['room_waiting']}\n"
                  f"and on ({svc}, role)\n{n['side_kv']} < {kv['warn']}"),
    ]


def speculative(c: Ctx) -> List[Recording]:
    """Speculative decoding per replica: accepted draft tokens over draft tokens, the mean accepted
    length (1 + accepted tokens per draft: tokens per verify step), and the model's acceptance now
    and on average over ``windows.baseline`` ending ``windows.baseline_offset`` ago."""
    by, svc = c.per_replica, c.per_model
    n = names(c)
    w = c.windows
    accepted = c.rate("vllm:spec_decode_num_accepted_tokens_total", "", c.no_sidecar)
    drafted = c.rate("vllm:spec_decode_num_draft_tokens_total", "", c.no_sidecar)
    drafts = c.rate("vllm:spec_decode_num_drafts_total", "", c.no_sidecar)
    return [
        Recording(n["acceptance"],
                  _sidecar_or(c, "vllm_sidecar_spec_decode_acceptance_ratio",
                              f"{accepted}\n/ on ({by})\n({drafted} > 0)")),
        Recording(n["accepted_length"],
                  _sidecar_or(c, "vllm_sidecar_spec_decode_mean_accepted_length",
                              f"1 + {accepted}\n/ on ({by})\n({drafts} > 0)")),
        Recording(n["m_acceptance"], f"avg by ({svc}) ({n['acceptance']})"),
        Recording(n["acceptance_normal"],
                  f"avg_over_time({n['m_acceptance']}[{w['baseline']}] offset {w['baseline_offset']})"),
    ]


FIRST = (roles,)
LAST = (kv_transfer, pd_balance, speculative)
