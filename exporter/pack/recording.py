"""Recording rules: every rate, ratio, quantile and sum the alerts and dashboards read, per
replica (``<replica labels>_model:...``) and per model across replicas (``<model labels>:...``).

Every selector matches what real vLLM serves: ``_total`` counters, ``le`` bounds as vLLM writes
them (``"5000.0"``), and every name vLLM has used, joined with ``or`` so that one replica on an old
release and one on a new release both match (``kv_cache_usage_perc`` / ``gpu_cache_usage_perc``,
``prefix_cache_*`` / ``gpu_prefix_cache_*``, ``inter_token_latency_seconds`` /
``time_per_output_token_seconds``).
"""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

from . import conditions, longreads, recording_pd
from .context import CAPACITY, ERR, NOT4XX, NOT_ABORT, S5XX, Ctx, indent, le_for
from .names import LATENCY_HISTOGRAMS
from .recorded import Recording

__all__ = ["Recording", "capacity", "capacity_names", "recording_rules"]


MEAN_HISTOGRAMS = LATENCY_HISTOGRAMS[:2]
# The quantiles recorded per replica, of the histograms whose quantile a rule reads: TTFT's p95 (the
# SLO's objective, objectives.ttft_p95_seconds). Dashboards take the others from vLLM's buckets.
RECORDED_QUANTILES: Dict[str, Tuple[str, ...]] = {"vllm_time_to_first_token_seconds": ("0.95",)}
# ... and the sidecar's summary of the same histogram: where a pod has a sidecar, its quantile is
# the sidecar's (over the sidecar's window, from every 2 s poll), and vLLM's buckets are read only for
# pods without one
SIDECAR_SUMMARIES: Dict[str, str] = {"vllm_time_to_first_token_seconds": "vllm_sidecar_ttft_seconds"}


def finished(c: Ctx, kind: str = "") -> str:
    """Finished requests per second of each replica and model: all of them (``kind`` "": the
    record, in the slow group: its readers are the prefix-cache ticket and the views), or all but
    the clients' aborts (``"valid"``, for the engine's error ratio: vLLM's counter read there, every
    finished reason but abort, and not recorded)."""
    if not kind:
        return c.rec("vllm_requests_finished", "rate")
    return c.rate("vllm:request_success_total", "", NOT_ABORT)


def error_ratio(c: Ctx) -> str:
    """The engine's failed requests over all but the clients' aborts, per replica: a view, both
    read from vLLM's counter at its own evaluation (not from the alerting group's records, written
    up to one interval before: errors of now over requests of then could exceed 1). vLLM creates
    labelled series lazily on some releases: no "error" series means no error yet, a 0 for each
    replica the slow group's finished requests name (a value of 0 whatever its age; the
    requests below decide which replicas have a ratio)."""
    by = c.per_replica
    errors = c.rate("vllm:request_success_total", "", ERR)
    valid = finished(c, "valid")
    return f"({errors} or on ({by}) {finished(c)} * 0)\n/ on ({by})\n({valid} > 0)"


def throughput(c: Ctx) -> List[Recording]:
    """Tokens and finished requests per second, errors, preemptions and rejections."""
    return [
        Recording(c.rec("vllm_generation_tokens", "rate"), c.rate("vllm:generation_tokens_total")),
        Recording(c.rec("vllm_prompt_tokens", "rate"), c.rate("vllm:prompt_tokens_total")),
        # finished requests, all of them: the prompt-length histogram's count, which vLLM's stat
        # logger observes once for every finished request, from the same list it counts
        # request_success_total by reason from (one series a replica where the counter has one per
        # reason; the real 0.32 pages agree); the errors and the clients' aborts the counts below
        # need are read from vLLM's counter where they are needed: ``finished``, ``error_ratio``,
        # ``availability_errors``
        Recording(c.rec("vllm_requests_finished", "rate"), c.rate("vllm:request_prompt_tokens_count")),
        Recording(c.rec("vllm_request_errors", "ratio_rate"), error_ratio(c)),
        Recording(c.rec("vllm_preemptions", "rate"), c.rate("vllm:num_preemptions_total")),
        # preemptions counted over a window of many scrapes (60 s scrapes included), so bursts a few
        # minutes apart never read as zero in between; only the replicas that preempted are written
        # (the alert compares it, a panel plots the rate above)
        Recording(c.rec("vllm_preemptions", "increase" + c.windows["preemptions"]),
                  f"sum by ({c.per_replica}) "
                  f"(increase(vllm:num_preemptions_total{c.selector()}[{c.windows['preemptions']}])) > 0"),
    ]


def kv_and_queue(c: Ctx) -> List[Recording]:
    """KV-cache usage (the fullest engine), the running and waiting requests, and the requests
    held back by the KV cache.

    Requests waiting for scheduling capacity are vLLM's ``num_requests_waiting_by_reason{reason=
    "capacity"}`` (an older release does not give the reason: every waiting request). They are the
    cache's doing (``vllm_requests_waiting_capacity``) when the cache reached the warn level in the
    ``windows.held_back`` window, or when the batch runs below ``kv_cache.batch_room`` of the model's
    batch ceiling: the batch has room, so the next request does not fit in the cache, whatever the
    usage gauge reads. Behind a batch at its ceiling they wait for the batch, not for KV.

    The ceiling is ``kv_cache.max_num_seqs`` when given, else the highest batch any replica of the
    model ran while nothing waited for capacity (uncontended: a flood's small KV-bound batch is never
    taken for the ceiling) over ``windows.batch_peak``, read from one per-model series. Without
    either (a model with no uncontended history), only the usage explains.

    What keeps a chronic overload's alerts firing between its waves (``vllm_requests_held_back_firm``,
    averaged over ``windows.episode_recent``) counts stricter evidence from raw series: where a
    ceiling is known, only waits with the batch below ``kv_cache.batch_room`` of it (a busy
    replica at its ceiling after an overload, one request waiting a scrape now and then, is not
    the overload going on).

    Where the sidecar serves ``vllm_sidecar_kv_cache_held_back_ratio`` (the same held-back signal
    made at every 2 s poll from its share of polls with requests held back by the cache, the same
    explanation, and averaged over the same window: what a 15-60 s scrape of a saw-toothing gauge
    cannot sample), the KV alert's share is that series, and the chronic overload's is
    ``vllm_sidecar_kv_cache_held_back_recent_ratio``; every record of this path below is made for
    pods without the sidecar only."""
    by, s, svc, kv = c.per_replica, c.selector, c.per_model, c.slo["kv_cache"]
    waiting = c.rec("vllm_requests_waiting", "sum")
    reason = c.rec("vllm_requests_waiting_capacity_reason", "sum")
    m_uncontended = c.mrec("vllm_requests_running_uncontended", "max")
    ceiling = c.mrec("vllm_batch_ceiling", "max")
    cap = c.rec("vllm_requests_waiting_capacity", "sum")
    usage = c.rec("vllm_kv_cache_usage", "max")
    ns = c.no_sidecar
    by_reason = f"sum by ({by}) (vllm:num_requests_waiting_by_reason{s(CAPACITY, ns)})"
    # the raw path's own read of the cache (pods without a sidecar only)
    usage_raw = (f"max by ({by}) (max_over_time(vllm:kv_cache_usage_perc{s(ns)}[{c.windows['held_back']}]))\n"
                 f"    or\n    max by ({by}) (max_over_time(vllm:gpu_cache_usage_perc{s(ns)}[{c.windows['held_back']}]))")
    running_raw = c.running(ns)  # the raw path's batch (pods without a sidecar only)
    if kv["max_num_seqs"]:
        ceiling_expr = f"count by ({svc}) ({c.running()}) * 0 + {kv['max_num_seqs']}"
    else:
        ceiling_expr = f"max_over_time({m_uncontended}[{c.windows['batch_peak']}])"
    held = c.rec("vllm_requests_held_back", "bool")
    wait_share = c.rec("vllm_requests_waiting_capacity", "share")

    extra = c.rec("vllm_requests_preempted_or_rejected", "bool")

    def held_back_bool(share: str) -> str:
        # the waits' share, 1 where preempting or rejecting as well (the flag is written only
        # where it is 1: elsewhere the waits' share times 0 stands in, on the same replicas as
        # either share)
        return f"clamp_max(\n  {share}\n  + on ({by})\n  ({extra} or on ({by}) {wait_share} * 0),\n  1\n)"

    # 1 (else absent) where preempting (over the sustain window: "preempting at every evaluation")
    # while the waits reached kv_cache.held_back_share in windows.held_back, or rejecting requests:
    # what both held-back signals count as held back whatever their waits (vLLM's counters read
    # here, their only reader)
    preempting = c.rate("vllm:num_preemptions_total", c.sustain_window, ns)
    rejecting = c.rate("vllm:admission_rejections_total", "", ns)
    extra_expr = (f"sgn({preempting} > 0)\nand on ({by})\n"
                  f"max_over_time({wait_share}[{c.windows['held_back']}]) >= {kv['held_back_share']}\n"
                  f"or on ({by})\nsgn({rejecting} > 0)")
    # ... the waits only the batch's room explains: where a ceiling is known, a wait with the batch
    # at it is the batch's, whatever the usage gauge reads (what keeps a chronic overload's alerts
    # firing between waves counts only these: a busy replica at its ceiling after an overload, one
    # request waiting a scrape now and then, never reopens it); read by the firm signal only
    cap_firm = (f"(\n  {reason} > 0\n  and on ({by})\n  (\n"
                f"    {running_raw} < on ({svc}) group_left () ({kv['batch_room']} * {ceiling})\n    or on ({by})\n"
                f"    (({usage_raw}) >= {kv['warn']} unless on ({svc}) {ceiling})\n"
                f"  )\n)\n"
                f"or\n{reason} * 0")
    return [
        Recording(usage,
                  f"max by ({by}) (vllm:kv_cache_usage_perc{s()})\nor\nmax by ({by}) (vllm:gpu_cache_usage_perc{s()})"),
        Recording(waiting, f"sum by ({by}) (vllm:num_requests_waiting{s()})"),
        # per running request: what a replica's decoding speed is, whatever share of the traffic it gets
        # (a replica with less traffic has fewer running requests, not slower ones)
        # (with the replica's role: it is compared with its peers of the same model and role only)
        Recording(c.rec("vllm_generation_tokens_per_running_request", "rate"),
                  c.with_role(f"{c.rec('vllm_generation_tokens', 'rate')}\n/ on ({c.per_replica})\n"
                              f"(sum by ({by}) (avg_over_time(vllm:num_requests_running{s()}[{c.rate_window}])) > 0)",
                              known=True)),
        # waiting for scheduling capacity, KV or batch: vLLM's reason, else (old releases) every waiting
        # request. Pods without a sidecar only, as the rest of this raw path (the batch ceiling, the
        # waits the cache explains): where the sidecar serves its share of polls with requests held
        # back, that share is the signal and this path is not read.
        Recording(reason, f"{by_reason}\nor\nsum by ({by}) (vllm:num_requests_waiting{s(ns)})"),
        # the batch while nothing waits for capacity: what the traffic asked for, never a held-back
        # batch (the largest of the model's replicas)
        Recording(m_uncontended, f"max by ({svc}) (\n  {running_raw}\n  and on ({by})\n  ({reason} == 0)\n)"),
        Recording(ceiling, ceiling_expr),
        Recording(cap,
                  f"(\n  {reason} > 0\n  and on ({by})\n  (\n"
                  f"    ({usage_raw}) >= {kv['warn']}\n    or on ({by})\n"
                  f"    {running_raw} < on ({svc}) group_left () ({kv['batch_room']} * {ceiling})\n  )\n)\n"
                  f"or\n{reason} * 0"),
        # requests waiting for capacity the cache cannot give: 1 while the raw series show KV-bound
        # waiters (the sidecar makes its own share at every poll)
        Recording(wait_share, f"{cap} > bool 0"),
        # at each evaluation, how much requests are held back by the cache (0-1): those waits, and
        # preempting or rejecting (the KV alert averages it over a window). Preemptions count only
        # where the waits reached kv_cache.held_back_share within windows.held_back: between the
        # polls and waves of a sustained hold-back they fill in, but a burst of them on a busy
        # replica whose waits are brief spells (the sidecar: a few % of its polls) pages nothing:
        # that is the preemption warning's business
        Recording(extra, extra_expr),
        Recording(c.rec("vllm_requests_held_back", "bool"), held_back_bool(wait_share)),
        # the same from the waits only the batch's room explains
        Recording(c.rec("vllm_requests_held_back_firm", "bool"),
                  held_back_bool(f"((\n{indent(cap_firm, 2)}\n) > bool 0)")),
        *held_back_shares(c, held),
    ]


def held_back_shares(c: Ctx, held: str) -> List[Recording]:
    """The held-back signal (``held``, at each evaluation) as a share of the KV alert's window (the
    firm signal's share of the chronic overload's window is read where it is needed, by
    ``conditions.comparisons``)."""
    by, s, kv = c.per_replica, c.selector, c.slo["kv_cache"]
    return [
        # its share over the held-back window, recorded so that the KV alert can ask whether it was
        # reached at some point of a longer window (a chronic overload is one episode)
        # (only once the replica has a whole window of it: a pod's first sample is no share)
        # The sidecar serves it made at every poll (once its polls span the window). Sustained
        # means many samples: read from raw vLLM series scraped sparsely (fewer than
        # kv_cache.held_back_scrapes in the window, e.g. every 60 s), the share is taken over
        # windows.held_back_sparse instead.
        Recording(c.rec("vllm_requests_held_back", "avg_over_time" + c.windows["held_back"]),
                  f"max by ({by}) (vllm_sidecar_kv_cache_held_back_ratio{s()})\n"
                  f"or on ({by})\n"
                  f"(\n  avg_over_time({held}[{c.windows['held_back']}])\n"
                  f"  and on ({by})\n  {held} offset {c.windows['held_back']}\n"
                  f"  and on ({by})\n"
                  f"  max by ({by}) (count_over_time(vllm:num_requests_running{s(c.no_sidecar)}[{c.windows['held_back']}]))"
                  f" >= {kv['held_back_scrapes']}\n)\n"
                  f"or on ({by})\n"
                  f"(\n  avg_over_time({held}[{c.windows['held_back_sparse']}])\n"
                  f"  and on ({by})\n  {held} offset {c.windows['held_back_sparse']}\n)"),
    ]


def prompts_and_cache(c: Ctx) -> List[Recording]:
    """Long prompts (from vLLM's prompt-length histogram) and the prefix-cache hit ratio."""
    by = c.per_replica
    le_matcher = 'le="' + le_for(c.slo["long_prompt"]["tokens"]) + '"'
    long_rate = c.rec("vllm_long_prompt_requests", "rate")
    return [
        # the raw path of the long-prompt rate: pods without a sidecar (the sidecar serves its own,
        # conditions.inputs, read over its 1-minute window and averaged over windows.rate), with the
        # replica's role as the sidecar's (joined once, here: its readers compare it within a model
        # and role; a pod whose target lacks the label may still have a sidecar that says its role)
        Recording(long_rate, c.with_role(f"{c.rate('vllm:request_prompt_tokens_count', '', c.no_sidecar)}\n-\n"
                                         f"{c.rate('vllm:request_prompt_tokens_bucket', '', le_matcher, c.no_sidecar)}",
                                         known=True)),
        Recording(c.rec("vllm_long_prompt_requests", "ratio_rate"),
                  f"{long_rate}\n/ on ({by})\n({c.rate('vllm:request_prompt_tokens_count', '', c.no_sidecar)} > 0)"),
        Recording(c.rec("vllm_prefix_cache_hit", "ratio_rate"),
                  f"(\n  {c.rate('vllm:prefix_cache_hits_total')}\n  /\n"
                  f"  ({c.rate('vllm:prefix_cache_queries_total')} > 0)\n)\nor\n"
                  f"(\n  {c.rate('vllm:gpu_prefix_cache_hits_total')}\n  /\n"
                  f"  ({c.rate('vllm:gpu_prefix_cache_queries_total')} > 0)\n)"),
    ]


def fleet_normal(c: Ctx) -> List[Recording]:
    """Per model and role, what one of its replicas does: the model-level series the "compared with
    normal" alerts take their baseline from (``conditions.normals``). Keyed by the model and role,
    never the pod, so the history survives rollouts and replaced pods, and a decode instance's
    normal is learned from decode instances only."""
    svc, s, g = c.per_model, c.selector, c.by_role
    n = conditions.names(c)

    def model_rate(new: str, old: str) -> str:
        return f"sum by ({svc}) (rate({new}{s()}[{c.rate_window}]))\nor\nsum by ({svc}) (rate({old}{s()}[{c.rate_window}]))"

    busy = c.slo["gpu_busy_low"]["busy_utilization"]
    return [
        Recording(c.mrec("vllm_long_prompt_requests_per_replica", "rate"),
                  f"avg by ({g}) ({conditions.by_role(c, c.rec('vllm_long_prompt_requests', 'rate'))})"),
        # the same from the sidecars' own windows (their threshold is long_prompt.tokens exactly,
        # the rules' is vLLM's bucket bound at or above it: each is compared with its own kind)
        Recording(c.mrec("vllm_sidecar_long_prompt_requests_per_replica", "avg"),
                  f"avg by ({g}) ({conditions.by_role(c, n['sidecar_long'])})"),
        # ... and its 5-minute average (the slower path's normal)
        Recording(c.mrec("vllm_sidecar_long_prompt_requests_per_replica", "rate"),
                  f"avg by ({g}) ({conditions.by_role(c, n['sidecar_long_slow'])})"),
        Recording(c.mrec("vllm_generation_tokens_per_busy_replica", "rate"),
                  f"avg by ({g}) (\n  {c.with_role(c.rec('vllm_generation_tokens', 'rate'))}\n"
                  f"  and on ({c.per_pod})\n"
                  f"  ({conditions.gpu_busy(c)} >= {busy})\n)"),
        Recording(c.mrec("vllm_prefix_cache_hit", "ratio_rate"),
                  f"(\n{indent(model_rate('vllm:prefix_cache_hits_total', 'vllm:gpu_prefix_cache_hits_total'))}\n)\n/\n"
                  f"(\n{indent(model_rate('vllm:prefix_cache_queries_total', 'vllm:gpu_prefix_cache_queries_total'))}\n) > 0"),
    ]


def latency(c: Ctx) -> List[Recording]:
    """The latency quantile the rules read, over the rate window, and the means of TTFT and ITL.

    The TTFT p95 per replica (``RECORDED_QUANTILES``: the SLO's TTFT objective is a p95, read by the
    alerts, the peer comparison, ``capacity`` and ``backtest``) is the sidecar's where the pod has
    one (its summary over the sidecar's window, ``SIDECAR_SUMMARIES``, the last one within the rate
    window: a minute without a finished request has none), else taken straight from
    vLLM's buckets of the pods without a sidecar (``Ctx.no_sidecar``). Nothing else reads a latency
    quantile at every evaluation: the dashboards take theirs (p50, p95, p99 of TTFT, ITL, end-to-end
    latency and queue time) from the same buckets when they are looked at, so a Prometheus does not
    record some 90 bucket rates and 15 quantiles of every replica at every evaluation for panels
    nobody may open (docs/performance.md, "The pack at fleet scale"). A second recorded quantile of
    one histogram would read its buckets twice: record the bucket rate once then, and take both
    quantiles from it."""
    out = []
    for rname, names in LATENCY_HISTOGRAMS:
        buckets = "\nor\n".join(f"sum by ({c.per_replica}, le) (rate({n}_bucket{c.selector(c.no_sidecar)}[{c.rate_window}]))"
                                 for n in names)
        for q in RECORDED_QUANTILES.get(rname, ()):
            raw = f"histogram_quantile({q},\n{indent(buckets)}\n)"
            quantile = f'quantile="{q}"'
            # the sidecar's last figure within the rate window: it serves none for a window without a
            # finished request, and an idle minute of a quiet replica is not the end of a slow spell
            sidecar = (f"max by ({c.per_replica}) (last_over_time({SIDECAR_SUMMARIES[rname]}{c.selector(quantile)}"
                       f"[{c.rate_window}]))")
            out.append(Recording(c.rec(rname, "histogram_quantile"), f"{sidecar}\nor on ({c.per_replica})\n{raw}",
                                 {"quantile": q}))
    for rname, names in MEAN_HISTOGRAMS:
        mean = "\nor\n".join(f"{c.rate(n + '_sum')}\n/\n({c.rate(n + '_count')} > 0)" for n in names)
        out.append(Recording(c.rec(rname, "mean"), mean))
    return out


def per_model(c: Ctx) -> List[Recording]:
    """Per model across its replicas: what the overview, the capacity rules and the SLO read."""
    svc = c.per_model
    return [
        Recording(c.mrec(m, "rate"), f"sum by ({svc}) ({c.rec(m, 'rate')})")
        for m in ("vllm_generation_tokens", "vllm_requests_finished")
    ]


def burn_windows(slo) -> List[str]:
    """Every window a burn-rate alert reads, shortest first."""
    from ..slo import seconds

    ws = {w for kind in ("page", "ticket") for pair in slo["burn_rates"][kind] for w in (pair["long"], pair["short"])}
    return sorted(ws, key=seconds)


def _model_of(c: Ctx) -> str:
    """Which model each replica serves, for series without model_name (the sidecar's GPUs); kept
    for a rate window after the replica is gone, so its last answers still count."""
    return c.replicas


def _raw_model_of(c: Ctx) -> str:
    """Which model each replica without a sidecar serves, for the HTTP server's series (no
    model_name): vLLM's own series within the rate window, so a replica's last answers still
    count after it is gone."""
    return (f"group by ({c.per_replica}) "
            f"(last_over_time(vllm:num_requests_running{c.selector(c.no_sidecar)}[{c.rate_window}]))")


def _http(c: Ctx, status: str) -> str:
    handler = 'handler=~"' + c.slo["http_handlers"] + '"'
    return (f"sum by ({c.per_pod}) (rate(http_requests_total{c.selector(handler, status, c.no_sidecar)}"
            f"[{c.rate_window}]))\n* on ({c.per_pod}) group_left (model_name)\n{_raw_model_of(c)}")


def _sidecar(c: Ctx, counter: str) -> str:
    """The rate of one of the sidecar's availability counters: what the raw path below counts,
    counted by the sidecar at every poll (``vllm_sidecar_availability_*_total``, the same SLI from
    the same SLO file), one series per replica (the errors' larger source: a request counted by
    both vLLM and the HTTP server counts once)."""
    return f"max by ({c.per_replica}) (rate({counter}{c.selector()}[{c.rate_window}]))"


def availability_errors(c: Ctx) -> str:
    """Failed requests per second of one replica, per the SLO's availability SLI: the sidecar's
    count where it serves one, else from vLLM's series (pods without a sidecar only)."""
    engine = c.rate("vllm:request_success_total", "", ERR, c.no_sidecar)
    # no error series yet: no error yet, for each replica the raw path reads (vLLM creates
    # labelled series lazily on some releases; the sidecar's counter is there from its first page)
    zero = f"{_raw_model_of(c)} * 0"
    sli = c.slo["availability_sli"]
    if sli == "engine":
        raw = engine
    elif sli == "http":
        raw = f"(\n{indent(_http(c, S5XX))}\n)"
    else:  # combined: the larger of the two counts, so a request vLLM records twice counts once
        raw = (f"max by ({c.per_replica}) (\n"
               f"  label_replace(\n{indent(engine, 4)},\n    \"source\", \"engine\", \"\", \"\"\n  )\n  or\n"
               f"  label_replace(\n{indent(_http(c, S5XX), 4)},\n    \"source\", \"http\", \"\", \"\"\n  )\n)")
    return (f"{_sidecar(c, 'vllm_sidecar_availability_errors_total')}\nor on ({c.per_replica})\n{raw}\n"
            f"or on ({c.per_replica})\n{zero}")


def availability_requests(c: Ctx) -> str:
    """Valid requests per second of one replica: HTTP answers except 4xx (aborts and the
    clients' own mistakes are not the service's), else the engine's finished requests except
    aborts; the sidecar's count where it serves one, else from vLLM's series (pods without a
    sidecar only)."""
    engine = c.rate("vllm:request_success_total", "", NOT_ABORT, c.no_sidecar)
    raw = engine if c.slo["availability_sli"] == "engine" else \
        f"(\n{indent(_http(c, NOT4XX))}\n)\nor on ({c.per_replica})\n{engine}"
    return f"{_sidecar(c, 'vllm_sidecar_availability_requests_total')}\nor on ({c.per_replica})\n{raw}"


def availability(c: Ctx) -> List[Recording]:
    """The availability SLI: failed and valid requests per replica, summed per model at every
    evaluation; every longer window is the sum over time of those model-level rates, so a
    replica's errors stay in the budget after the replica is gone."""
    from ..slo import seconds

    errors, requests = c.rec("vllm_availability_errors", "rate"), c.rec("vllm_availability_requests", "rate")
    m_errors, m_requests = c.mrec("vllm_availability_errors", "rate"), c.mrec("vllm_availability_requests", "rate")
    out = [
        Recording(requests, availability_requests(c)),
        Recording(errors, availability_errors(c)),
        # (only where the replica failed requests: its readers, the error-ratio alerts, compare it
        # with a share above 0)
        Recording(c.rec("vllm_availability_errors", "ratio_rate"),
                  f"{errors}\n/ on ({c.per_replica})\n({requests} > 0)\n> 0"),
        Recording(m_errors, f"sum by ({c.per_model}) ({errors})"),
        Recording(m_requests, f"sum by ({c.per_model}) ({requests})"),
    ]
    for w in burn_windows(c.slo):
        name = c.mrec("vllm_availability_errors", "ratio_rate", w)
        if seconds(w) <= seconds(c.rate_window):  # the rate window itself (shorter ones read it too)
            expr = f"{m_errors}\n/ on ({c.per_model})\n({m_requests} > 0)"
        else:
            expr = f"sum_over_time({m_errors}[{w}])\n/ on ({c.per_model})\n(sum_over_time({m_requests}[{w}]) > 0)"
        out.append(Recording(name, expr))
    return out


def capacity_names(c: Ctx) -> Dict[str, str]:
    """The names of the capacity family's rules (``capacity`` below), for the dashboards and for
    ``vllm-sidecar-exporter capacity``, which evaluates the same rules over history."""
    cap = c.slo["capacity"]
    return {
        "within": c.rec("vllm_generation_tokens_within_slo", "rate"),
        "sustained": c.rec("vllm_generation_tokens_within_slo", "min_over_time" + cap["sustain"]),
        "sustained_best": c.mrec("vllm_generation_tokens_sustained_per_replica", "max"),
        "sustainable": c.mrec("vllm_generation_tokens_sustainable_per_replica", "max_over_time" + cap["history"]),
        "peak": c.mrec("vllm_generation_tokens", "max_over_time" + cap["peak_window"]),
        "capacity": c.mrec("vllm_generation_tokens_capacity", "sum"),
        "headroom": c.mrec("vllm_generation_tokens_headroom", "ratio"),
        # cost and efficiency
        "gpus": c.rec("vllm_sidecar_gpus", "count"),
        "gpu_utilization": c.rec("vllm_sidecar_gpu_utilization", "avg"),
        "fleet_gpu_utilization": c.mrec("vllm_sidecar_gpu_utilization", "avg"),
        "power": c.rec("vllm_sidecar_gpu_energy_joules", "rate"),
        "tokens_per_joule": c.rec("vllm_generation_tokens_per_joule", "ratio_rate"),
        "fleet_tokens_per_joule": c.mrec("vllm_generation_tokens_per_joule", "ratio_rate"),
        "cost_per_hour": c.rec("vllm_cost_per_hour", "sum"),
        "fleet_cost_per_hour": c.mrec("vllm_cost_per_hour", "sum"),
        "cost_per_million_output_tokens": c.mrec("vllm_cost_per_million_output_tokens", "ratio_rate"),
        "cost_per_thousand_requests": c.mrec("vllm_cost_per_thousand_requests", "ratio_rate"),
    }


def capacity(c: Ctx) -> List[Recording]:
    """Capacity headroom, watched: the generation throughput one replica sustains within every
    latency objective (the three latency alerts' conditions, all false) held for
    ``capacity.sustain``, its best over ``capacity.history`` across the model's replicas, times
    the replicas serving now, against the model's peak over ``capacity.peak_window``.

    The best across replicas is recorded per model at each evaluation and the history read from
    that one series: the maximum over time of the maximum over replicas is the same number as
    the other way round, read from one series per model instead of one per replica that lived in
    the last ``capacity.history`` (14 days of samples for each, at every evaluation)."""
    by, svc, o = c.per_replica, c.per_model, c.slo["objectives"]
    n = capacity_names(c)
    gen = c.rec("vllm_generation_tokens", "rate")
    ttft = c.rec("vllm_time_to_first_token_seconds", "histogram_quantile")
    return [
        # tokens/s of a replica at an evaluation where every latency objective holds, else 0
        Recording(n["within"],
                  f"{gen}\nand on ({by})\n({ttft}{{quantile=\"0.95\"}} <= {o['ttft_p95_seconds']})\n"
                  f"and on ({by})\n({c.rec('vllm_time_to_first_token_seconds', 'mean')} <= {o['ttft_mean_seconds']})\n"
                  f"and on ({by})\n({c.rec('vllm_inter_token_latency_seconds', 'mean')} <= "
                  f"{1.0 / o['output_tokens_per_second']:.6g})\nor\n{gen} * 0"),
        # the level held throughout the sustain window (the replica served for all of it)
        Recording(n["sustained"],
                  f"min_over_time({n['within']}[{c.slo['capacity']['sustain']}])\n"
                  f"and on ({by})\n({n['within']} offset {c.slo['capacity']['sustain']})"),
        Recording(n["sustained_best"], f"max by ({svc}) ({n['sustained']})"),
        Recording(n["sustainable"], f"max_over_time({n['sustained_best']}[{c.slo['capacity']['history']}])"),
        Recording(n["peak"],
                  f"max_over_time({c.mrec('vllm_generation_tokens', 'rate')}[{c.slo['capacity']['peak_window']}])"),
        Recording(n["capacity"], f"{n['sustainable']}\n* on ({svc})\ncount by ({svc}) ({gen})"),
        # 0.25: the replicas serving now sustain 25% more than the peak; below 0: fewer than it needs
        Recording(n["headroom"], f"{n['capacity']}\n/ on ({svc})\n({n['peak']} > 0)\n- 1"),
    ] + cost_and_efficiency(c)


def cost_and_efficiency(c: Ctx) -> List[Recording]:
    """What the fleet costs and how well it uses its GPUs. GPUs per replica: the sidecar's count of
    the pod's GPUs, else the SLO's ``cost.gpus_per_replica``; a replica-hour at the price of how the
    fleet is bought (``cost.fleet``), per GPU or per replica (``cost.unit``); per million output
    tokens and per thousand requests at the load of the moment. GPU utilization averaged per
    replica and over the model's replicas; output tokens per joule from the GPUs' energy counters
    (NVML's total energy, Volta and newer), only over replicas whose GPUs have one."""
    n = capacity_names(c)
    by, svc, s, r = c.per_replica, c.per_model, c.selector(), c.per_pod
    cost = c.slo["cost"]
    price = cost["prices"][cost["fleet"]]
    model_of = _model_of(c)
    gen = c.rec("vllm_generation_tokens", "rate")
    per_hour = f"{n['gpus']} * {price:g}" if cost["unit"] == "gpu_hour" else f"{n['gpus']} * 0 + {price:g}"
    return [
        Recording(n["gpus"],
                  f"count by ({r}) (vllm_sidecar_gpu_info{s})\n* on ({r}) group_left (model_name)\n{model_of}\n"
                  f"or\n{model_of} * 0 + {cost['gpus_per_replica']:g}"),
        Recording(n["cost_per_hour"], per_hour),
        Recording(n["fleet_cost_per_hour"], f"sum by ({svc}) ({n['cost_per_hour']})"),
        Recording(n["cost_per_million_output_tokens"],
                  f"{n['fleet_cost_per_hour']} / 3600\n/ on ({svc})\n"
                  f"({c.mrec('vllm_generation_tokens', 'rate')} > 0)\n* 1e6"),
        Recording(n["cost_per_thousand_requests"],
                  f"{n['fleet_cost_per_hour']} / 3600\n/ on ({svc})\n"
                  f"({c.mrec('vllm_requests_finished', 'rate')} > 0)\n* 1e3"),
        Recording(n["gpu_utilization"],
                  f"avg by ({r}) (vllm_sidecar_gpu_utilization_ratio{s})\n* on ({r}) group_left (model_name)\n{model_of}"),
        Recording(n["fleet_gpu_utilization"], f"avg by ({svc}) ({n['gpu_utilization']})"),
        Recording(n["power"],
                  f"sum by ({r}) (rate(vllm_sidecar_gpu_energy_joules_total{s}[{c.rate_window}]))\n"
                  f"* on ({r}) group_left (model_name)\n{model_of}"),
        Recording(n["tokens_per_joule"], f"{gen}\n/ on ({by})\n({n['power']} > 0)"),
        Recording(n["fleet_tokens_per_joule"],
                  f"sum by ({svc}) ({gen} and on ({by}) ({n['power']} > 0))\n/ on ({svc})\n"
                  f"(sum by ({svc}) ({n['power']}) > 0)"),
    ]


# the roles first, so that every rule joining on the role reads this evaluation's; the P/D and
# speculative families last
FAMILIES = (*recording_pd.FIRST, throughput, kv_and_queue, prompts_and_cache, latency, per_model,
            conditions.inputs, fleet_normal, conditions.normals, conditions.comparisons, availability, capacity,
            *recording_pd.LAST)


def recording_rules(c: Ctx, families: Sequence = FAMILIES) -> List[Recording]:
    out: List[Recording] = []
    for fam in families:
        out += fam(c)
    # every read over days of a recorded series, from its hourly aggregates (longreads)
    return longreads.coarsen(out, c.windows)
