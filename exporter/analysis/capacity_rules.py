"""Which of the pack's recording rules and raw series the capacity model reads over history, and
the whole-range figures it evaluates once at the end of the range (PromQL), for the local path
(raw samples read here) and the server path (``server_for``: a ``remote.RuleServer``).
"""

from __future__ import annotations

from typing import Dict, List, Tuple

from ..pack import views
from ..pack.context import Ctx
from ..pack.longreads import exact
from ..pack.recording import capacity as capacity_family
from ..pack.recording import capacity_names, recording_rules
from .promql.durations import format_duration
from .promql.parser import parse
from .rulefile import Group, groups_from_data


def ctx_for(opts) -> Ctx:
    """The pack's context for ``opts`` (a ``capacity.Options``): its SLO, narrowed to ``opts.model``."""
    slo = exact(opts.slo)  # the long reads sample by sample, as backtest evaluates them
    if opts.model:
        slo = dict(slo)
        esc = opts.model.replace("\\", "\\\\").replace('"', '\\"')
        slo["selector"] = ", ".join(x for x in (slo["selector"].strip().strip(","), f'model_name="{esc}"') if x)
    return Ctx(slo)


def rule_groups(c: Ctx) -> Tuple[List[Group], Dict[str, str]]:
    """The pack's recording rules the model needs over history: the per-replica within-SLO and
    sustained series, the best sustained per model, the per-model request and token rates, and
    what they read; in the pack's
    order. The rules over the long windows (sustainable, peak, capacity, headroom) are evaluated
    once, at the end, by ``rules_at_end``."""
    names = capacity_names(c)
    wanted = {names["within"], names["sustained"], names["sustained_best"], c.mrec("vllm_requests_finished", "rate"),
              c.mrec("vllm_generation_tokens", "rate"), c.rec("vllm_prompt_tokens", "rate"),
              c.rec("vllm_requests_finished", "rate"), c.rec("vllm_requests_waiting", "sum")}
    at_end = {names[k] for k in ("sustainable", "peak", "capacity", "headroom")}
    rules = [r for r in recording_rules(c) if r.record not in at_end]
    wanted = views.needed(rules, wanted)
    chosen = [r.as_rule() for r in rules if r.record in wanted]
    return groups_from_data([{"name": "capacity", "rules": chosen}], "<the pack's capacity rules>"), names


def range_exprs(c: Ctx, range_ms: int) -> Dict[str, str]:
    """Whole-range figures per model, as PromQL evaluated once at the end of the range."""
    svc, s, r = c.per_model, c.selector(), format_duration(max(range_ms, 1))

    def inc(metric: str) -> str:
        return f"sum by ({svc}) (increase({metric}{s}[{r}]))"

    def ratio(num: str, den: str) -> str:
        return f"{inc(num)}\n/\n({inc(den)} > 0)"

    out: Dict[str, str] = {}
    for key, hist in (("prompt", "vllm:request_prompt_tokens"), ("output", "vllm:request_generation_tokens")):
        out[f"{key}_mean"] = ratio(hist + "_sum", hist + "_count")
        for q in ("0.5", "0.95"):
            out[f"{key}_p{q[2:].ljust(2, '0')}"] = \
                f"histogram_quantile({q}, sum by ({svc}, le) (increase({hist}_bucket{s}[{r}])))"
    out["prefix_cache_hit_ratio"] = (f"(\n{ratio('vllm:prefix_cache_hits_total', 'vllm:prefix_cache_queries_total')}\n)"
                                     "\nor\n(\n"
                                     f"{ratio('vllm:gpu_prefix_cache_hits_total', 'vllm:gpu_prefix_cache_queries_total')}\n)")
    out["spec_decode_acceptance"] = ratio("vllm:spec_decode_num_accepted_tokens_total",
                                          "vllm:spec_decode_num_draft_tokens_total")
    # what the range served, for its cost per token and per request
    out["output_total"] = inc("vllm:generation_tokens_total")
    out["requests_total"] = inc("vllm:request_success_total")
    # efficiency over the range, for the replicas serving at its end (the sidecar's GPU series carry
    # no model_name: joined on the replica labels): mean GPU utilization (each replica's GPUs
    # averaged, then the replicas), and output tokens per joule where the GPUs count energy
    model_of = f"* on ({c.per_pod}) group_left (model_name)\n  group by ({c.per_pod}, model_name) (vllm:num_requests_running{s})"
    energy = f"sum by ({c.per_pod}) (increase(vllm_sidecar_gpu_energy_joules_total{s}[{r}]))"
    out["gpu_utilization"] = (f"avg by ({svc}) (\n  avg by ({c.per_pod}) "
                              f"(avg_over_time(vllm_sidecar_gpu_utilization_ratio{s}[{r}]))"
                              f"\n  {model_of}\n)")
    out["tokens_per_joule"] = (f"sum by ({svc}) (\n  sum by ({c.per_replica}) (increase(vllm:generation_tokens_total{s}[{r}]))\n"
                               f"  and on ({c.per_pod})\n  ({energy} > 0)\n)\n/\n"
                               f"(sum by ({svc}) (\n  {energy}\n  {model_of}\n) > 0)")
    # GPUs per replica as the sidecars count them (the most any replica of the model has)
    out["gpus_per_replica"] = (f"max by ({svc}) (\n  count by ({c.per_pod}) (vllm_sidecar_gpu_info{s})\n"
                               f"  * on ({c.per_pod}) group_left (model_name)\n"
                               f"  group by ({c.per_pod}, model_name) (vllm:num_requests_running{s})\n)")
    return out


END_RULES = ("sustainable", "peak", "capacity", "headroom")


def end_groups(c: Ctx) -> List[Group]:
    """The headroom rules over the long windows, run once at the end (after ``rule_groups``)."""
    names = capacity_names(c)
    chosen = [r.as_rule() for r in capacity_family(c) if r.record in {names[k] for k in END_RULES}]
    return groups_from_data([{"name": "capacity-at-end", "rules": chosen}], "<the pack's capacity rules>")


def server_for(opts, url: str, chunk_ms: int = 6 * 3600_000, session=None):
    """The ``remote.RuleServer`` for ``compute(Store(), opts, server)``: the model's rules
    evaluated by the Prometheus at ``url`` where they read raw series."""
    from .remote import RuleServer

    return RuleServer(rule_groups(ctx_for(opts))[0], url, opts.step_ms, chunk_ms, session=session)


def selectors(opts) -> Tuple[List[Tuple[str, int]], List[str]]:
    """The raw selectors to read and from when (ms), and the names the rules record (to drop)."""
    from .backtest import raw_selectors

    c = ctx_for(opts)
    groups, _ = rule_groups(c)
    # the rules run from the start, the whole-range figures once at the end
    by_rules, recorded = raw_selectors(groups, [], opts.lookback_ms)
    rng = opts.end_ms - opts.start_ms
    extra = [parse(e) for e in [*range_exprs(c, rng).values(), *side_exprs(c, rng).values(), role_expr(c, rng),
                                *opencost_exprs(rng).values()]]
    at_end, _ = raw_selectors([], extra, opts.lookback_ms)
    frm = {sel: opts.start_ms - ms for sel, ms in by_rules.items()}
    for sel, ms in at_end.items():
        frm[sel] = min(frm.get(sel, opts.end_ms), opts.end_ms - ms)
    return sorted(frm.items()), recorded



def side_exprs(c: Ctx, range_ms: int) -> Dict[str, str]:
    """Whole-range figures per replica (and model) for sizing prefill and decode apart
    (``capacity_sides``), evaluated once at the end: token sums and counts of the requests, prefix
    cache hits and queries, speculative drafts and accepted tokens (and the sidecar's mean accepted
    length, where vLLM's counters are not scraped)."""
    s, r = c.selector(), format_duration(max(range_ms, 1))

    def inc(metric: str) -> str:
        return f"sum by ({c.per_replica}) (increase({metric}{s}[{r}]))"

    return {
        "prompt_sum": inc("vllm:request_prompt_tokens_sum"), "prompt_count": inc("vllm:request_prompt_tokens_count"),
        "output_sum": inc("vllm:request_generation_tokens_sum"),
        "output_count": inc("vllm:request_generation_tokens_count"),
        "hits": f"{inc('vllm:prefix_cache_hits_total')}\nor\n{inc('vllm:gpu_prefix_cache_hits_total')}",
        "queries": f"{inc('vllm:prefix_cache_queries_total')}\nor\n{inc('vllm:gpu_prefix_cache_queries_total')}",
        "accepted": inc("vllm:spec_decode_num_accepted_tokens_total"),
        "drafts": inc("vllm:spec_decode_num_drafts_total"),
        "sidecar_accepted_length": f"avg by ({c.per_replica}) (avg_over_time("
                                   f"vllm_sidecar_spec_decode_mean_accepted_length{s}[{r}]))",
    }


def role_expr(c: Ctx, range_ms: int) -> str:
    """Each replica's role as its sidecar last said it in the range (pod-level, no model_name)."""
    window = format_duration(max(range_ms, 1))
    return f"max by ({c.per_pod}, role) (last_over_time(vllm_sidecar_role_info{c.selector()}[{window}]))"


def opencost_exprs(range_ms: int) -> Dict[str, str]:
    """What a GPU-hour costs where the cluster runs OpenCost, averaged over the range, over every
    GPU node the Prometheus sees (OpenCost's node series carry no vLLM label: no selector):
    ``gpu_hour``, the GPUs' own price (``node_gpu_hourly_cost``, per GPU, weighted by the nodes'
    ``node_gpu_count``), and ``node_total_per_gpu_hour``, the GPU nodes' whole price
    (``node_total_hourly_cost``: GPUs, CPUs and memory) over their GPUs."""
    r = format_duration(max(range_ms, 1))
    gpus = f"avg_over_time(node_gpu_count[{r}])"
    per = f"(sum({gpus}) > 0)"
    return {
        "gpu_hour": f"sum(avg_over_time(node_gpu_hourly_cost[{r}]) * on (node) {gpus})\n/\n{per}",
        "node_total_per_gpu_hour": f"sum(avg_over_time(node_total_hourly_cost[{r}]) and on (node) ({gpus} > 0))"
                                   f"\n/\n{per}",
    }
