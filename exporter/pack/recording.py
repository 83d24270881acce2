"""Recording rules: every rate, ratio, quantile and sum the alerts and dashboards read, per
replica (``<replica labels>_model:...``) and per model across replicas (``<model labels>:...``).

Every selector matches what real vLLM serves: ``_total`` counters, ``le`` bounds as vLLM writes
them (``"5000.0"``), and every name vLLM has used, joined with ``or`` so that one replica on an old
release and one on a new release both match (``kv_cache_usage_perc`` / ``gpu_cache_usage_perc``,
``prefix_cache_*`` / ``gpu_prefix_cache_*``, ``inter_token_latency_seconds`` /
``time_per_output_token_seconds``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Sequence, Tuple

from .context import CAPACITY, ERR, NOABORT, NOT4XX, QUANTILES, S5XX, Ctx, indent, le_for


@dataclass(frozen=True)
class Recording:
    record: str
    expr: str
    labels: Dict[str, str] = field(default_factory=dict)

    def as_rule(self) -> Dict[str, object]:
        r: Dict[str, object] = {"record": self.record, "expr": self.expr}
        if self.labels:
            r["labels"] = dict(self.labels)
        return r


# (recording-rule metric, vLLM histogram names newest first)
LATENCY_HISTOGRAMS: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("vllm_time_to_first_token_seconds", ("vllm:time_to_first_token_seconds",)),
    ("vllm_inter_token_latency_seconds", ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")),
    ("vllm_e2e_request_latency_seconds", ("vllm:e2e_request_latency_seconds",)),
    ("vllm_request_queue_time_seconds", ("vllm:request_queue_time_seconds",)),
)
MEAN_HISTOGRAMS = LATENCY_HISTOGRAMS[:2]


def throughput(c: Ctx) -> List[Recording]:
    """Tokens and finished requests per second, errors, preemptions and rejections."""
    return [
        Recording(c.rec("vllm_generation_tokens", "rate"), c.rate("vllm:generation_tokens_total")),
        Recording(c.rec("vllm_prompt_tokens", "rate"), c.rate("vllm:prompt_tokens_total")),
        Recording(c.rec("vllm_requests_finished", "rate"), c.rate("vllm:request_success_total")),
        Recording(c.rec("vllm_requests_failed", "rate"), c.rate("vllm:request_success_total", "", ERR)),
        # vLLM creates labelled series lazily on some releases: no "error" series means no error yet
        Recording(c.rec("vllm_request_errors", "ratio_rate"),
                  f"(\n  {c.rate('vllm:request_success_total', '', ERR)}\n  or\n"
                  f"  {c.rate('vllm:request_success_total')} * 0\n)\n"
                  f"/\n({c.rate('vllm:request_success_total', '', NOABORT)} > 0)"),
        Recording(c.rec("vllm_preemptions", "rate"), c.rate("vllm:num_preemptions_total")),
        Recording(c.rec("vllm_admission_rejections", "rate"), c.rate("vllm:admission_rejections_total")),
    ]


def kv_and_queue(c: Ctx) -> List[Recording]:
    """KV-cache usage (the fullest engine) and the running and waiting requests."""
    by, s = c.by, c.s
    return [
        Recording(c.rec("vllm_kv_cache_usage", "max"),
                  f"max by ({by}) (vllm:kv_cache_usage_perc{s()})\nor\nmax by ({by}) (vllm:gpu_cache_usage_perc{s()})"),
        Recording(c.rec("vllm_requests_running", "sum"), f"sum by ({by}) (vllm:num_requests_running{s()})"),
        Recording(c.rec("vllm_requests_waiting", "sum"), f"sum by ({by}) (vllm:num_requests_waiting{s()})"),
        Recording(c.rec("vllm_requests_waiting_capacity", "sum"),
                  f"sum by ({by}) (vllm:num_requests_waiting_by_reason{s(CAPACITY)})\n"
                  f"or\nsum by ({by}) (vllm:num_requests_waiting{s()})"),
    ]


def prompts_and_cache(c: Ctx) -> List[Recording]:
    """Long prompts (from vLLM's prompt-length histogram) and the prefix-cache hit ratio."""
    by = c.by
    le_matcher = 'le="' + le_for(c.slo["long_prompt"]["tokens"]) + '"'
    long_rate = c.rec("vllm_long_prompt_requests", "rate")
    return [
        Recording(long_rate, f"{c.rate('vllm:request_prompt_tokens_count')}\n-\n"
                             f"{c.rate('vllm:request_prompt_tokens_bucket', '', le_matcher)}"),
        Recording(c.rec("vllm_long_prompt_requests", "ratio_rate"),
                  f"{long_rate}\n/ on ({by})\n({c.rate('vllm:request_prompt_tokens_count')} > 0)"),
        Recording(c.rec("vllm_prefix_cache_hit", "ratio_rate"),
                  f"(\n  {c.rate('vllm:prefix_cache_hits_total')}\n  /\n  ({c.rate('vllm:prefix_cache_queries_total')} > 0)\n)\nor\n"
                  f"(\n  {c.rate('vllm:gpu_prefix_cache_hits_total')}\n  /\n  ({c.rate('vllm:gpu_prefix_cache_queries_total')} > 0)\n)"),
    ]


def latency(c: Ctx) -> List[Recording]:
    """Quantiles of the latency histograms over the rate window, and the means of TTFT and ITL."""
    out = []
    for rname, names in LATENCY_HISTOGRAMS:
        buckets = "\nor\n".join(f"sum by ({c.by}, le) (rate({n}_bucket{c.s()}[{c.W}]))" for n in names)
        for q in QUANTILES:
            out.append(Recording(c.rec(rname, "histogram_quantile"),
                                 f"histogram_quantile({q},\n{indent(buckets)}\n)", {"quantile": q}))
    for rname, names in MEAN_HISTOGRAMS:
        mean = "\nor\n".join(f"{c.rate(n + '_sum')}\n/\n({c.rate(n + '_count')} > 0)" for n in names)
        out.append(Recording(c.rec(rname, "mean"), mean))
    return out


def per_model(c: Ctx) -> List[Recording]:
    """Per model across its replicas: what the overview and the SLO read."""
    svc = c.svc
    out = [
        Recording(c.mrec(m, "rate"), f"sum by ({svc}) ({c.rec(m, 'rate')})")
        for m in ("vllm_generation_tokens", "vllm_prompt_tokens", "vllm_requests_finished")
    ]
    for q in QUANTILES:
        out.append(Recording(
            c.mrec("vllm_time_to_first_token_seconds", "histogram_quantile"),
            f"histogram_quantile({q}, sum by ({svc}, le) (rate(vllm:time_to_first_token_seconds_bucket{c.s()}[{c.W}])))",
            {"quantile": q}))
    return out


def burn_windows(slo) -> List[str]:
    """Every window a burn-rate alert reads, shortest first."""
    from ..slo import seconds

    ws = {w for kind in ("page", "ticket") for pair in slo["burn_rates"][kind] for w in (pair["long"], pair["short"])}
    return sorted(ws, key=seconds)


def availability(c: Ctx) -> List[Recording]:
    """The availability SLI's error ratio per model over every burn-rate window."""
    return [Recording(c.mrec("vllm_availability_errors", "ratio_rate", w), availability_ratio(c, w))
            for w in burn_windows(c.slo)]


def availability_ratio(c: Ctx, w: str) -> str:
    s, svc, r = c.s, c.svc, c.r
    if c.slo["availability_sli"] == "engine":
        return (f"(\n  sum by ({svc}) (rate(vllm:request_success_total{s(ERR)}[{w}]))\n  or\n"
                f"  sum by ({svc}) (rate(vllm:request_success_total{s()}[{w}])) * 0\n)\n/\n"
                f"(sum by ({svc}) (rate(vllm:request_success_total{s(NOABORT)}[{w}])) > 0)")
    model_of = f"group by ({r}, model_name) (vllm:num_requests_running{s()})"
    handler = 'handler=~"' + c.slo["http_handlers"] + '"'

    def per_pod(status: str) -> str:
        return f"sum by ({r}) (rate(http_requests_total{s(handler, status)}[{w}]))"

    def by_model(expr: str) -> str:
        return f"sum by ({svc}) (\n  {expr}\n  * on ({r}) group_left (model_name)\n  {model_of}\n)"
    # the instrumentation creates the status="5xx" series only at the first 5xx: none yet is 0
    errors = f"(\n    {per_pod(S5XX)}\n    or\n    {per_pod('')} * 0\n  )"
    return f"{by_model(errors)}\n/\n({by_model(per_pod(NOT4XX))} > 0)"


FAMILIES = (throughput, kv_and_queue, prompts_and_cache, latency, per_model, availability)


def recording_rules(c: Ctx, families: Sequence = FAMILIES) -> List[Recording]:
    out: List[Recording] = []
    for fam in families:
        out += fam(c)
    return out
