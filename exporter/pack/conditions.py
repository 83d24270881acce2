"""Recording rules that hold each alert's work, so that every alert reads as one sentence over
names that say what they are (``level:metric:operations``, as the kubernetes-mixin names its rules):

    inputs                per-replica inputs the comparisons read (long prompts, uptime, targets
                          seen and down); the GPUs' utilization is read where it is compared
    normals               what a replica of a model and role normally does: learned from the
                          fleet's history, else the median of its peers now
    comparisons           a replica against that normal (a long-prompt surge, few tokens while
                          busy, far from its peers), the chronic-overload hold, targets seen down

Each rule is the subexpression an alert wrote inline before, evaluated in the same group before
the alerts that read it, so an alert reads this evaluation's value: the alerts fire exactly as
they did. Compared within a model *and role*: a decode instance with decode instances, a replica
of role ``both`` (every pod without the sidecar's role series) with the others of role both, a
prefill instance (GPUs busy on prompts, almost no output tokens by design) never on its output.
Each replica's role is ``recording_pd.roles``' rule (``Ctx.role``), evaluated first.
"""

from __future__ import annotations

from typing import List

from ..slo import LOOKBACK_S
from .context import TVLLM, Ctx, indent
from .recorded import Recording


def pod_rec(c: Ctx, metric: str, op: str) -> str:
    """A per-pod (no model) recording rule's name: ``namespace_pod:metric:op``."""
    return "_".join(c.replica) + f":{metric}:{op}"


def target_rec(c: Ctx, metric: str, op: str, *more: str) -> str:
    return "_".join(c.replica + ["target", *more]) + f":{metric}:{op}"


def history_normal(c: Ctx, per_replica_model_rate: str, quantile: float = 0.0) -> str:
    """What one replica of the model (and role) normally does: over the baseline window, the
    fleet's average (or, with ``quantile``, that quantile of it: what the busier moments of a normal
    day look like, for a bursty signal), keyed by the model, so it survives rollouts. Only once the
    history reaches back to the far end of the window (not the first minutes of a new model)."""
    w = c.windows
    far = c.seconds(w["baseline"]) + c.seconds(w["baseline_offset"]) - c.seconds(w["baseline_edge"])
    over = f"[{w['baseline']}] offset {w['baseline_offset']}"
    level = (f"quantile_over_time({quantile:g}, {per_replica_model_rate}{over})" if quantile
             else f"avg_over_time({per_replica_model_rate}{over})")
    # whole seconds as PromQL writes a duration (never 8.07321e+09s: a window of centuries)
    far_text = f"{int(far)}s" if float(far).is_integer() else f"{int(round(far * 1000))}ms"
    return f"{level}\nand\npresent_over_time({per_replica_model_rate}[{w['baseline_edge']}] offset {far_text})"


def names(c: Ctx) -> dict:
    """The names of this module's rules, for the alerts, runbooks and dashboards."""
    sw = c.windows["sidecar"]
    return {
        "uptime": pod_rec(c, "vllm_process_uptime_seconds", "max"),
        "expected_down": target_rec(c, "vllm_sidecar_target_up", "down_expected"),
        "targets_present": target_rec(c, "vllm_scrape_target", "present", "job", "instance"),
        "targets_seen": "job_instance_target:vllm_scrape_target:max_over_time" + c.windows["target_seen"],
        "targets_down": target_rec(c, "up", "down_seen" + c.windows["target_seen"]),
        "sidecar_long": c.rec("vllm_sidecar_long_prompt_requests", "rate", sw),
        "sidecar_long_ratio": c.rec("vllm_sidecar_long_prompt_requests", "ratio_rate", sw),
        "sidecar_long_slow": c.rec("vllm_sidecar_long_prompt_requests", "rate", c.rate_window),
        "sidecar_long_normal": c.mrec("vllm_sidecar_long_prompt_requests_per_replica", "normal_rate" + sw),
        "sidecar_long_slow_normal": c.mrec("vllm_sidecar_long_prompt_requests_per_replica",
                                           "normal_rate" + c.rate_window),
        "long_normal": c.mrec("vllm_long_prompt_requests_per_replica", "normal_rate" + c.rate_window),
        "sidecar_long_surge": c.rec("vllm_sidecar_long_prompt_requests", "above_normal_rate" + sw),
        "sidecar_long_surge_slow": c.rec("vllm_sidecar_long_prompt_requests", "above_normal_rate" + c.rate_window),
        "long_surge": c.rec("vllm_long_prompt_requests", "above_normal_rate" + c.rate_window),
        "busy_normal": c.rec("vllm_generation_tokens_busy_normal", "rate"),
        "busy_normal_model": c.mrec("vllm_generation_tokens_per_busy_replica", "normal_rate" + c.rate_window),
        "speed_vs_peers": c.rec("vllm_generation_tokens_per_running_request", "ratio_to_peer_median"),
        "ttft_vs_peers": c.rec("vllm_time_to_first_token_seconds_p95", "ratio_to_peer_median"),
        "hit_normal": c.mrec("vllm_prefix_cache_hit", "normal_ratio_rate" + c.rate_window),
        "held_chronic": c.rec("vllm_requests_held_back_chronic", "avg_over_time" + c.windows["episode_recent"]),
        "preempt_episode": c.rec("vllm_preemptions", "increase" + c.windows["episode"]),
    }


def gpu_busy(c: Ctx) -> str:
    """The pod's GPUs' mean utilization as the sidecar serves it, one series per pod: read where it
    is compared (``busy_normal``, the busy replicas' throughput), not recorded (its readers ask it at
    the same evaluation)."""
    return f"max by ({c.per_pod}) (vllm_sidecar_gpu_mean_utilization_ratio{c.selector()})"


def by_role(c: Ctx, per_replica: str) -> str:
    """``per_replica`` with its replica's ``role`` label: the series only compared within a model
    and role are recorded with it (joined once: the sidecar's long-prompt inputs here in ``inputs``,
    the raw long-prompt rate and the tokens per running request in ``recording``), every other
    series is joined here."""
    n = names(c)
    labelled = (n["sidecar_long"], n["sidecar_long_slow"], c.rec("vllm_long_prompt_requests", "rate"),
                c.rec("vllm_generation_tokens_per_running_request", "rate"))
    return per_replica if per_replica in labelled else c.with_role(per_replica)


def inputs(c: Ctx) -> List[Recording]:
    """Per-replica inputs the comparisons read: the sidecar's long-prompt figures, the process's
    uptime, which targets were seen."""
    n, s, r = names(c), c.selector, c.per_pod
    read_before = f"max by ({r}) (vllm_sidecar_last_success_timestamp_seconds{s(TVLLM)})"
    sidecar_age = f"time() - max by ({r}) (vllm_sidecar_process_start_time_seconds{s()})"

    def present(series: str, target: str) -> str:
        return (f"label_replace(group by ({c.by_(*c.replica, 'job', 'instance')}) ({series}{s()}), "
                f"\"target\", \"{target}\", \"\", \"\")")

    # each target seen within the window once (a pod's IP and port may have served another pod too)
    seen = f"max by ({c.target}, target) (max_over_time({n['targets_present']}[{c.windows['target_seen']}]))"
    # ... the hour is a baseline (the slow group's, up to slow_interval old: cadence), so the
    # targets seen since its last evaluation are read here, over Prometheus' lookback (longer
    # than any slow_interval the SLO file takes)
    recent = f"max_over_time({n['targets_present']}[{LOOKBACK_S / 60:g}m])"

    return [
        # with the replica's role: every comparison of it is within a model and role
        Recording(n["sidecar_long"],
                  c.with_role(f"max by ({c.per_replica}) (vllm_sidecar_long_prompt_requests_per_second{s()})",
                              known=True)),
        Recording(n["sidecar_long_ratio"], f"max by ({c.per_replica}) (vllm_sidecar_long_prompt_request_ratio{s()})"),
        # ... averaged over windows.rate: a sustained surge too slow for the sidecar's per-minute
        # floor (fewer than long_prompt.min_count a minute) still counts over five minutes (the
        # share is averaged likewise where the slower surge reads it, ``normals``: a plain mean of
        # the 1-minute shares, a quiet minute weighs as much as a busy one; min_per_second bounds
        # what that can do)
        Recording(n["sidecar_long_slow"], f"avg_over_time({n['sidecar_long']}[{c.rate_window}])"),
        Recording(n["uptime"], f"time() - max by ({r}) (process_start_time_seconds{s()} and on ({c.target}) "
                               f"vllm:num_requests_running{s()})"),
        # vLLM down as the sidecar sees it (0), where vLLM is expected to answer this sidecar: it
        # has before, or the startup grace is over (a new pod loading its model is not down). Only
        # the targets down are written. It gates a page, so it is no baseline: a Prometheus just
        # started knows it at its first evaluation
        Recording(n["expected_down"],
                  f"max by ({r}, target) (vllm_sidecar_target_up{s(TVLLM)}) == 0\nand on ({r})\n"
                  f"(\n  {read_before}\n  or\n  ({sidecar_age}) > {c.seconds(c.windows['startup']):g}\n)"),
        # the scrape targets of vLLM and of the sidecar that answer now, one series each, remembered
        # over windows.target_seen by the next rule (a target answering for less than an
        # evaluation interval is not seen): written at the evaluation's pace, so what the rules
        # below read over the hour does not grow with a shorter scrape interval
        Recording(n["targets_present"], f"{present('vllm:num_requests_running', 'vllm')}\nor\n"
                                        f"{present('vllm_sidecar_build_info', 'sidecar')}"),
        Recording(n["targets_seen"], seen, baseline=True),
        # the scrape targets of vLLM and of the sidecar seen within windows.target_seen and down now
        # (up 0 at every endpoint of its kind; only the targets down are written)
        Recording(n["targets_down"], f"max by ({r}, target) (\n  up{s()}\n  * on ({c.target}) group_left (target)\n"
                                   f"  max by ({c.target}, target) ({recent} or {n['targets_seen']})\n) == 0"),
    ]


def normals(c: Ctx) -> List[Recording]:
    """What a replica of the model and role normally does: the long-prompt rates (the fleet's
    history at ``long_prompt.baseline_quantile``, else the median of at least
    ``outlier.min_replicas`` replicas now; the sidecar's and the rules' each against its own kind),
    the busy throughput (the fleet's history: a new pod is compared from its first minute), the
    prefix-cache hit ratio."""
    n, lp = names(c), c.slo["long_prompt"]
    g = c.by_role
    min_replicas = c.slo["outlier"]["min_replicas"]

    def long_normal(now: str, per_replica: str) -> str:
        now = by_role(c, now)
        peers = f"quantile by ({g}) (0.5, {now})\nand on ({g})\ncount by ({g}) ({now}) >= {min_replicas}"
        return f"{history_normal(c, per_replica, lp['baseline_quantile'])}\nor\n(\n{indent(peers)}\n)"

    busy = history_normal(c, c.mrec("vllm_generation_tokens_per_busy_replica", "rate"))
    # every replica with its role (the role rule's series, its labels and role only) ...
    busy_beside = (f"group by ({c.per_replica}, role) ({c.role}) * 0\n"
                   f"+ on ({g}) group_left ()\n{n['busy_normal_model']}")
    return [
        Recording(n["sidecar_long_normal"],
                  long_normal(n["sidecar_long"], c.mrec("vllm_sidecar_long_prompt_requests_per_replica", "avg"))),
        Recording(n["sidecar_long_slow_normal"],
                  long_normal(n["sidecar_long_slow"], c.mrec("vllm_sidecar_long_prompt_requests_per_replica", "rate"))),
        Recording(n["long_normal"],
                  long_normal(c.rec("vllm_long_prompt_requests", "rate"),
                              c.mrec("vllm_long_prompt_requests_per_replica", "rate"))),
        # the busy throughput a replica of its model and role normally makes (a day's history: a
        # baseline, recorded every slow_interval), ...
        Recording(n["busy_normal_model"], busy, baseline=True),
        # ... beside each replica whose GPUs are busy (gpu_busy_low.busy_utilization), at every
        # evaluation (a new pod has it from its first minute): the only replicas the GPU-busy alert
        # compares with it, so the others' are not written
        Recording(n["busy_normal"], f"(\n{indent(busy_beside)}\n)\nand on ({c.per_pod})\n"
                                    f"{gpu_busy(c)} >= {c.slo['gpu_busy_low']['busy_utilization']}"),
        Recording(n["hit_normal"], history_normal(c, c.mrec("vllm_prefix_cache_hit", "ratio_rate"))),
    ]


def comparisons(c: Ctx) -> List[Recording]:
    """A replica against its normal: the long-prompt rate where it surges (above
    ``long_prompt.surge_factor`` x normal; with no normal to compare with, at ``floor_share`` of the
    replica's requests, except on a prefill instance, whose work is prompts), its decoding speed
    and TTFT p95 as a ratio to its peers' median (with at least ``outlier.min_replicas`` of the same
    model and role; a prefill instance's speed is not compared: it makes almost no output tokens by
    design), and the chronic-overload hold."""
    n, lp, kv = names(c), c.slo["long_prompt"], c.slo["kv_cache"]
    g, by = c.by_role, c.per_replica
    speed = by_role(c, c.rec("vllm_generation_tokens_per_running_request", "rate"))
    ttft = c.with_role(f"max without (quantile) ({c.rec('vllm_time_to_first_token_seconds', 'histogram_quantile')}"
                       f"{{quantile=\"0.95\"}})")
    enough = f"count by ({g}) ({speed}) >= {c.slo['outlier']['min_replicas']}"

    def surge(now: str, normal: str, ratio: str) -> str:
        now = by_role(c, now)
        compared = f"{now}\n> on ({g}) group_left ()\n({lp['surge_factor']} * {normal})"
        floor = (f"{now}\nand on ({by})\n({ratio} >= {lp['floor_share']})\nunless on ({g})\n{normal}\n"
                 f"unless on ({c.per_pod})\n{c.prefill()}")
        return f"max without (role) (\n{indent(compared)}\n  or\n{indent(floor)}\n)"

    def vs_peers(x: str) -> str:
        return (f"max without (role) (\n  {x}\n  / on ({g}) group_left ()\n  quantile by ({g}) (0.5, {x})\n"
                f"  and on ({g})\n  {enough}\n)")

    held_avg = c.rec("vllm_requests_held_back", "avg_over_time" + c.windows["held_back"])
    # the firm held-back signal's share of windows.episode_recent, read here only; where the
    # sidecar serves it, its own share made at every poll (as before this counts every wait the
    # sidecar explains by the cache, at the warn level too: the stricter firm reading is the raw
    # path's, which has no per-poll view)
    held_recent = (f"(\n  max by ({by}) (vllm_sidecar_kv_cache_held_back_recent_ratio{c.selector()})\n  or on ({by})\n"
                   f"  avg_over_time({c.rec('vllm_requests_held_back_firm', 'bool')}"
                   f"[{c.windows['episode_recent']}])\n)")
    return [
        Recording(n["sidecar_long_surge"], surge(n["sidecar_long"], n["sidecar_long_normal"], n["sidecar_long_ratio"])),
        # the sidecar's 5-minute average against the normal of its kind (the sidecar's threshold,
        # over the same window)
        Recording(n["sidecar_long_surge_slow"],
                  surge(n["sidecar_long_slow"], n["sidecar_long_slow_normal"],
                        f"avg_over_time({n['sidecar_long_ratio']}[{c.rate_window}])")),
        Recording(n["long_surge"], surge(c.rec("vllm_long_prompt_requests", "rate"), n["long_normal"],
                                         c.rec("vllm_long_prompt_requests", "ratio_rate"))),
        Recording(n["speed_vs_peers"], vs_peers(speed) + f"\nunless on ({c.per_pod})\n{c.prefill()}"),
        Recording(n["ttft_vs_peers"], vs_peers(ttft)),
        # chronic overload: requests still held back now, and at kv_cache.episode_share of
        # windows.episode_recent (what keeps the KV and preemption alerts on between waves)
        Recording(n["held_chronic"],
                  f"{held_recent} >= {kv['episode_share']}\nand on ({by})\n{held_avg} > {kv['episode_gate']}"),
        # the preemptions of the chronic overload's window, where there were any (its reader, the
        # preemption warning, counts a number of them)
        Recording(n["preempt_episode"],
                  f"sum by ({by}) (increase(vllm:num_preemptions_total{c.selector()}[{c.windows['episode']}])) > 0"),
    ]

