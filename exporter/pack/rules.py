"""The alerting pack: recording and alerting rules rendered from one SLO file.

``vllm-sidecar-exporter rules --slo FILE [--out-dir DIR]`` writes:

- ``DIR/rules/vllm.rules.yml``: Prometheus' plain rule-file format;
- ``DIR/deploy/kubernetes/base/prometheusrule.yaml``: the same groups as a PrometheusRule.

Without ``--out-dir`` it prints the plain rule file. Every selector is written against vLLM's
real series (``_total`` counters, ``le`` bounds as vLLM writes them: ``"5000.0"``) and against
every name vLLM has used (``kv_cache_usage_perc`` or ``gpu_cache_usage_perc``…), joined with
``or`` so one replica on an old release and one on a new release both match. Only PromQL that
Prometheus 2.42 and 3.x both run, and that Thanos and Mimir rulers run, is used.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import yaml


QUANTILES = ("0.5", "0.95", "0.99")
BURN_WINDOWS = ("5m", "30m", "1h", "6h", "3d")
FATAL_XIDS = "48|63|64|74|79|92|94|95"
ERR = 'finished_reason="error"'
NOABORT = 'finished_reason!="abort"'
CAPACITY = 'reason="capacity"'
S5XX = 'status="5xx"'
NOT4XX = 'status!~"4xx"'
TVLLM = 'target="vllm"'
XID_FATAL = 'xid=~"' + FATAL_XIDS + '"'
XID_OTHER = 'xid!~"' + FATAL_XIDS + '"'
THERMAL = 'reason=~"hw_thermal_slowdown|sw_thermal_slowdown|hw_power_brake_slowdown"'
UNCORRECTED = 'type="uncorrected"'

PLAIN_PATH = os.path.join("rules", "vllm.rules.yml")
OPERATOR_PATH = os.path.join("deploy", "kubernetes", "base", "prometheusrule.yaml")


def le_for(tokens: float) -> str:
    """vLLM's prompt-length bucket bound at or above ``tokens`` (vLLM uses 1-2-5 buckets), written
    as vLLM writes it (``5000.0``)."""
    mag = 1
    while True:
        for m in (1, 2, 5):
            if m * mag >= tokens:
                return repr(float(m * mag))
        mag *= 10


# -- rendering -------------------------------------------------------------------------------

class _Ctx:
    def __init__(self, slo: Dict[str, Any]) -> None:
        self.slo = slo
        self.sel = slo["selector"].strip().strip(",")
        self.replica = list(slo["replica_labels"])
        self.r = ", ".join(self.replica)
        self.by = ", ".join(self.replica + ["model_name"])
        self.svc_labels = [x for x in self.replica if x not in ("pod", "instance")] + ["model_name"]
        self.svc = ", ".join(self.svc_labels)
        who = [f"{{{{ $labels.{x} }}}}" for x in self.replica]
        self.who = "/".join(who)

    def s(self, *matchers: str) -> str:
        parts = [m for m in matchers if m] + ([self.sel] if self.sel else [])
        return "{" + ", ".join(parts) + "}" if parts else ""


def recording_rules(slo: Dict[str, Any]) -> List[Dict[str, Any]]:
    c = _Ctx(slo)
    by, s = c.by, c.s
    W = slo["windows"]["rate"]
    L = "namespace_pod_model"
    rules: List[Dict[str, Any]] = []

    def rec(name: str, expr: str, labels: Optional[Dict[str, str]] = None) -> None:
        r: Dict[str, Any] = {"record": name, "expr": expr}
        if labels:
            r["labels"] = labels
        rules.append(r)

    def rate(metric: str, window: str = W, *m: str) -> str:
        return f"sum by ({by}) (rate({metric}{s(*m)}[{window}]))"

    rec(f"{L}:vllm_generation_tokens:rate{W}", rate("vllm:generation_tokens_total"))
    rec(f"{L}:vllm_prompt_tokens:rate{W}", rate("vllm:prompt_tokens_total"))
    rec(f"{L}:vllm_requests_finished:rate{W}", rate("vllm:request_success_total"))
    rec(f"{L}:vllm_requests_failed:rate{W}", rate("vllm:request_success_total", W, ERR))
    # vLLM creates labelled series lazily on some releases: no "error" series means no error yet
    rec(f"{L}:vllm_request_errors:ratio_rate{W}",
        f"(\n  {rate('vllm:request_success_total', W, ERR)}\n  or\n  {rate('vllm:request_success_total')} * 0\n)\n"
        f"/\n({rate('vllm:request_success_total', W, NOABORT)} > 0)")
    rec(f"{L}:vllm_preemptions:rate{W}", rate("vllm:num_preemptions_total"))
    rec(f"{L}:vllm_admission_rejections:rate{W}", rate("vllm:admission_rejections_total"))
    rec(f"{L}:vllm_kv_cache_usage:max",
        f"max by ({by}) (vllm:kv_cache_usage_perc{s()})\nor\nmax by ({by}) (vllm:gpu_cache_usage_perc{s()})")
    rec(f"{L}:vllm_requests_running:sum", f"sum by ({by}) (vllm:num_requests_running{s()})")
    rec(f"{L}:vllm_requests_waiting:sum", f"sum by ({by}) (vllm:num_requests_waiting{s()})")
    rec(f"{L}:vllm_requests_waiting_capacity:sum",
        f"sum by ({by}) (vllm:num_requests_waiting_by_reason{s(CAPACITY)})\n"
        f"or\nsum by ({by}) (vllm:num_requests_waiting{s()})")
    le = le_for(slo["long_prompt"]["tokens"])
    le_matcher = 'le="' + le + '"'
    long_rate = (f"{rate('vllm:request_prompt_tokens_count')}\n-\n"
                 f"{rate('vllm:request_prompt_tokens_bucket', W, le_matcher)}")
    rec(f"{L}:vllm_long_prompt_requests:rate{W}", long_rate)
    rec(f"{L}:vllm_long_prompt_requests:ratio_rate{W}",
        f"{L}:vllm_long_prompt_requests:rate{W}\n/ on ({by})\n({rate('vllm:request_prompt_tokens_count')} > 0)")
    rec(f"{L}:vllm_prefix_cache_hit:ratio_rate{W}",
        f"(\n  {rate('vllm:prefix_cache_hits_total')}\n  /\n  ({rate('vllm:prefix_cache_queries_total')} > 0)\n)\nor\n"
        f"(\n  {rate('vllm:gpu_prefix_cache_hits_total')}\n  /\n  ({rate('vllm:gpu_prefix_cache_queries_total')} > 0)\n)")

    hists = (
        ("vllm_time_to_first_token_seconds", ("vllm:time_to_first_token_seconds",)),
        ("vllm_inter_token_latency_seconds", ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")),
        ("vllm_e2e_request_latency_seconds", ("vllm:e2e_request_latency_seconds",)),
        ("vllm_request_queue_time_seconds", ("vllm:request_queue_time_seconds",)),
    )
    for rname, names in hists:
        buckets = "\nor\n".join(f"sum by ({by}, le) (rate({n}_bucket{s()}[{W}]))" for n in names)
        for q in QUANTILES:
            rec(f"{L}:{rname}:histogram_quantile{W}", f"histogram_quantile({q},\n{_indent(buckets)}\n)",
                {"quantile": q})
    for rname, names in hists[:2]:
        mean = "\nor\n".join(
            f"{rate(n + '_sum')}\n/\n({rate(n + '_count')} > 0)" for n in names)
        rec(f"{L}:{rname}:mean{W}", mean)

    # per model (all replicas): what the overview and the SLO read
    svc = c.svc
    M = "namespace_model"
    rec(f"{M}:vllm_generation_tokens:rate{W}", f"sum by ({svc}) ({L}:vllm_generation_tokens:rate{W})")
    rec(f"{M}:vllm_prompt_tokens:rate{W}", f"sum by ({svc}) ({L}:vllm_prompt_tokens:rate{W})")
    rec(f"{M}:vllm_requests_finished:rate{W}", f"sum by ({svc}) ({L}:vllm_requests_finished:rate{W})")
    for q in QUANTILES:
        rec(f"{M}:vllm_time_to_first_token_seconds:histogram_quantile{W}",
            f"histogram_quantile({q}, sum by ({svc}, le) (rate(vllm:time_to_first_token_seconds_bucket{s()}[{W}])))",
            {"quantile": q})
    for w in BURN_WINDOWS:
        rec(f"{M}:vllm_availability_errors:ratio_rate{w}", availability_ratio(c, w))
    return rules


def availability_ratio(c: _Ctx, w: str) -> str:
    s, svc, r = c.s, c.svc, c.r
    if c.slo["availability_sli"] == "engine":
        return (f"(\n  sum by ({svc}) (rate(vllm:request_success_total{s(ERR)}[{w}]))\n  or\n"
                f"  sum by ({svc}) (rate(vllm:request_success_total{s()}[{w}])) * 0\n)\n/\n"
                f"(sum by ({svc}) (rate(vllm:request_success_total{s(NOABORT)}[{w}])) > 0)")
    h = c.slo["http_handlers"]
    model_of = f"group by ({r}, model_name) (vllm:num_requests_running{s()})"

    handler = 'handler=~"' + h + '"'

    def per_pod(status: str) -> str:
        return f"sum by ({r}) (rate(http_requests_total{s(handler, status)}[{w}]))"

    def by_model(expr: str) -> str:
        return f"sum by ({svc}) (\n  {expr}\n  * on ({r}) group_left (model_name)\n  {model_of}\n)"
    # the instrumentation creates the status="5xx" series only at the first 5xx: none yet is 0
    errors = f"(\n    {per_pod(S5XX)}\n    or\n    {per_pod('')} * 0\n  )"
    return f"{by_model(errors)}\n/\n({by_model(per_pod(NOT4XX))} > 0)"


def _indent(text: str, n: int = 2) -> str:
    return "\n".join(" " * n + line for line in text.splitlines())


def alert_rules(slo: Dict[str, Any]) -> List[Dict[str, Any]]:
    c = _Ctx(slo)
    by, s, who, svc, r = c.by, c.s, c.who, c.svc, c.r
    W, S2 = slo["windows"]["rate"], slo["windows"]["sustain"]
    L = "namespace_pod_model"
    o = slo["objectives"]
    base = slo["runbook_base_url"].rstrip("/")
    fr = slo["for"]
    rules: List[Dict[str, Any]] = []

    def alert(name: str, expr: str, severity: str, summary: str, description: str,
              for_key: Optional[str] = None, extra_labels: Optional[Dict[str, str]] = None) -> None:
        labels = {"severity": severity}
        labels.update(extra_labels or {})
        rules.append({
            "alert": name,
            "expr": expr,
            "for": fr[for_key or name],
            "labels": labels,
            "annotations": {
                "summary": summary,
                "description": description,
                "runbook_url": f"{base}/{name}.md",
            },
        })

    kv = slo["kv_cache"]
    alert("VLLMKVCacheExhausted",
          f"{L}:vllm_kv_cache_usage:max >= {kv['critical']}\n"
          f"and on ({by})\n(\n"
          f"  {L}:vllm_requests_waiting_capacity:sum > 0\n"
          f"  or {L}:vllm_preemptions:rate{W} > 0\n"
          f"  or {L}:vllm_admission_rejections:rate{W} > 0\n)",
          "critical",
          f"vLLM KV cache full with requests held back on {who} ({{{{ $labels.model_name }}}})",
          f"KV-cache usage is {{{{ $value | humanizePercentage }}}} (full at {kv['critical']:g}) and requests are "
          f"waiting for KV capacity, being rejected or preempted. Usage alone is normal for vLLM; this is "
          f"not: new requests queue and TTFT climbs. Look for long prompts and lower concurrency.")
    alert("VLLMPreemptionsSustained",
          f"sum by ({by}) (rate(vllm:num_preemptions_total{s()}[{S2}])) > 0",
          "warning",
          f"vLLM preempting requests on {who} ({{{{ $labels.model_name }}}})",
          f"vLLM has preempted running requests in every {S2} window for a while "
          "({{ $value | humanize }}/s now): the KV cache cannot hold the running batch, work is "
          "recomputed and latency suffers.")
    alert("VLLMTTFTHigh",
          f"{L}:vllm_time_to_first_token_seconds:histogram_quantile{W}{{quantile=\"0.95\"}} > {o['ttft_p95_seconds']}",
          "warning",
          f"TTFT p95 above {o['ttft_p95_seconds']:g}s on {who} ({{{{ $labels.model_name }}}})",
          f"Time to first token p95 over {W} is {{{{ $value | humanizeDuration }}}}, above the "
          f"{o['ttft_p95_seconds']:g}s objective.")
    alert("VLLMTTFTMeanHigh",
          f"{L}:vllm_time_to_first_token_seconds:mean{W} > {o['ttft_mean_seconds']}",
          "warning",
          f"TTFT mean above {o['ttft_mean_seconds']:g}s on {who} ({{{{ $labels.model_name }}}})",
          f"Mean time to first token over {W} is {{{{ $value | humanizeDuration }}}}, above the "
          f"{o['ttft_mean_seconds']:g}s objective.")
    itl = 1.0 / o["output_tokens_per_second"]
    alert("VLLMInterTokenLatencyHigh",
          f"{L}:vllm_inter_token_latency_seconds:mean{W} > {itl:.6g}",
          "warning",
          f"Generation slower than {o['output_tokens_per_second']:g} tokens/s per request on {who}",
          f"Mean inter-token latency over {W} is {{{{ $value | humanizeDuration }}}} (objective "
          f"{itl * 1000:.1f}ms, i.e. {o['output_tokens_per_second']:g} tokens/s per request). The batch is too "
          f"large for the GPUs or decoding is starved by prefills.")
    alert("VLLMGPUBusyLowThroughput",
          f"max by ({by}) (vllm_sidecar_gpu_busy_low_throughput{s()}) == 1",
          "critical",
          f"GPUs busy but few tokens on {who} ({{{{ $labels.model_name }}}})",
          "The replica's GPUs are at high utilization but generation throughput is far below what this "
          "replica normally does at that load (the sidecar's learned baseline). Typical cause: a flood of "
          "very long prompts (prefill and recomputation), KV thrashing, or a sick GPU. Compare with its peers.")
    alert("VLLMEngineStalled",
          f"max by ({by}) (vllm_sidecar_engine_stalled{s()}) == 1\nor\n"
          f"(\n  {L}:vllm_requests_running:sum > 0\n  and on ({by})\n"
          f"  sum by ({by}) (rate(vllm:generation_tokens_total{s()}[{S2}])) == 0\n)",
          "critical",
          f"vLLM engine stalled on {who} ({{{{ $labels.model_name }}}})",
          "Requests are running but no token has been produced for minutes. The engine is hung "
          "(a stuck collective, a dead worker, a deadlocked scheduler); clients are waiting forever.")
    lp = slo["long_prompt"]
    lr = f"{L}:vllm_long_prompt_requests:rate{W}"
    past = f"avg_over_time({lr}[1d] offset 15m)"
    alert("VLLMLongPromptSurge",
          f"(\n  {lr} > on ({by}) ({lp['surge_factor']} * {past})\n  or\n  ({lr} unless on ({by}) {past})\n)\n"
          f"and on ({by})\n{lr} > {lp['min_per_second']}",
          "warning",
          f"Surge of prompts over {lp['tokens']:g} tokens on {who} ({{{{ $labels.model_name }}}})",
          f"{{{{ $value | humanize }}}} long prompts per second (over {lp['tokens']:g} tokens, vLLM bucket "
          f"le={le_for(lp['tokens'])}), more than {lp['surge_factor']:g}x this replica's usual rate. Long prompts "
          f"fill the KV cache and stall everyone else's first token: find the client, cap prompt length at the "
          f"gateway or route long prompts to a dedicated replica.")
    alert("VLLMQueueBuildup",
          f"{L}:vllm_requests_waiting:sum >= {slo['queue']['min_waiting']}\n"
          f"and on ({by})\nderiv({L}:vllm_requests_waiting:sum[10m]) > 0",
          "warning",
          f"vLLM waiting queue growing on {who} ({{{{ $labels.model_name }}}})",
          "{{ $value | humanize }} requests waiting and the queue keeps growing: arrivals exceed what "
          "the replica serves. Scale out or shed load before TTFT breaks its objective.")
    alert("VLLMCorruptedRequests",
          f"sum by ({by}) (increase(vllm:corrupted_requests_total{s()}[{W}])) > 0",
          "critical",
          f"vLLM produced corrupted (NaN) outputs on {who} ({{{{ $labels.model_name }}}})",
          "{{ $value | humanize }} requests had NaN logits in the last 5 minutes: answers are garbage. "
          "Suspect the GPU (check XID and ECC), the weights or a bad kernel; take the replica out.")
    budget = 1 - o["availability"]
    rr = "namespace_model:vllm_availability_errors:ratio_rate"
    alert("VLLMErrorBudgetBurn",
          f"(\n  {rr}1h > {14.4 * budget:.6g}\n  and on ({svc})\n  {rr}5m > {14.4 * budget:.6g}\n)\nor\n"
          f"(\n  {rr}6h > {6 * budget:.6g}\n  and on ({svc})\n  {rr}30m > {6 * budget:.6g}\n)",
          "critical",
          f"{{{{ $labels.model_name }}}} burning its {o['availability'] * 100:g}% availability budget fast",
          f"Errors are {{{{ $value | humanizePercentage }}}} of requests: at this pace the 30-day error budget "
          f"({budget * 100:.3g}%) is gone in days (1h/5m over 14.4x or 6h/30m over 6x the budget rate).",
          for_key="VLLMErrorBudgetBurnPage", extra_labels={"window": "fast"})
    alert("VLLMErrorBudgetBurn",
          f"{rr}3d > {budget:.6g}\nand on ({svc})\n{rr}6h > {budget:.6g}",
          "warning",
          f"{{{{ $labels.model_name }}}} spending its availability budget faster than it earns it",
          f"Errors are {{{{ $value | humanizePercentage }}}} of requests over 3 days, above the {budget * 100:.3g}% "
          f"budget rate: the SLO will be missed this month if nothing changes.",
          for_key="VLLMErrorBudgetBurnTicket", extra_labels={"window": "slow"})
    alert("VLLMErrorRatioHigh",
          f"{L}:vllm_request_errors:ratio_rate{W} > {slo['error_ratio']['max']}",
          "warning",
          f"vLLM requests failing on {who} ({{{{ $labels.model_name }}}})",
          f"{{{{ $value | humanizePercentage }}}} of finished requests ended with an error on this replica "
          f"(client aborts not counted).")
    alert("VLLMTargetDown",
          f"max by ({r}, target) (vllm_sidecar_target_up{s(TVLLM)}) == 0\nor\n"
          f"label_replace(\n  max by ({r}) (up{s()} and on (job, instance) max_over_time(vllm:num_requests_running{s()}[1h])) == 0,\n"
          f"  \"target\", \"vllm\", \"\", \"\"\n)\nor\n"
          f"label_replace(\n  max by ({r}) (up{s()} and on (job, instance) max_over_time(vllm_sidecar_build_info{s()}[1h])) == 0,\n"
          f"  \"target\", \"sidecar\", \"\", \"\"\n)",
          "critical",
          f"{{{{ $labels.target }}}} unreachable on {who}",
          "target=vllm: the sidecar (or Prometheus) cannot read vLLM's /metrics: the server is down, "
          "restarting or wedged. target=sidecar: the sidecar itself is gone, so the pod is not watched.")
    alert("VLLMSidecarInputMissing",
          f"max by ({r}, metric) (vllm_sidecar_input_missing{s()}) == 1",
          "warning",
          f"vLLM metric {{{{ $labels.metric }}}} missing on {who}",
          "The sidecar needs {{ $labels.metric }} and vLLM serves it under no known name: a vLLM upgrade "
          "renamed or removed it. The signals that depend on it are left out until the alias table knows "
          "the new name.")
    ol = slo["outlier"]
    tok = f"{L}:vllm_generation_tokens:rate{W}"
    ttft95 = f"max without (quantile) ({L}:vllm_time_to_first_token_seconds:histogram_quantile{W}{{quantile=\"0.95\"}})"
    alert("VLLMReplicaOutlier",
          f"(\n  label_replace(\n    {tok}\n    < on ({svc}) group_left ()\n"
          f"    ({ol['throughput_factor']} * quantile by ({svc}) (0.5, {tok}))\n"
          f"    and on ({by}) {L}:vllm_requests_running:sum > 0,\n    \"signal\", \"throughput\", \"\", \"\"\n  )\n"
          f"  or\n  label_replace(\n    {ttft95}\n    > on ({svc}) group_left ()\n"
          f"    ({ol['ttft_factor']} * quantile by ({svc}) (0.5, {ttft95})),\n"
          f"    \"signal\", \"ttft\", \"\", \"\"\n  )\n)\n"
          f"and on ({svc})\ncount by ({svc}) ({tok}) >= {ol['min_replicas']}",
          "warning",
          f"{who} behaves unlike its peers ({{{{ $labels.signal }}}})",
          "This replica's {{ $labels.signal }} ({{ $value | humanize }}) is far from the median of the other "
          "replicas of {{ $labels.model_name }}: one sick replica hides behind a healthy average. Check its "
          "prompts, KV cache and GPUs; restart or drain it.")
    alert("VLLMPrefixCacheHitRatioLow",
          f"{L}:vllm_prefix_cache_hit:ratio_rate{W} < {slo['prefix_cache']['min_hit_ratio']}\n"
          f"and on ({by})\n{L}:vllm_requests_finished:rate{W} > 0",
          "info",
          f"Low prefix-cache hit ratio on {who} ({{{{ $labels.model_name }}}})",
          "Only {{ $value | humanizePercentage }} of prompt tokens came from the prefix cache. With a fixed "
          "system prompt this should be high: check cache-aware routing and the prompt template.")
    gl = f"{r}, gpu, uuid"
    xid_new = (f"sum by ({gl}, xid) (increase(vllm_sidecar_gpu_xid_errors_total{{XSEL}}[10m])) > 0\nor\n"
               f"sum by ({gl}, xid) (vllm_sidecar_gpu_xid_errors_total{{XSEL}} unless vllm_sidecar_gpu_xid_errors_total{{XSEL}} offset 10m)")
    alert("GPUXidErrors", xid_new.replace("{XSEL}", s(XID_FATAL)),
          "critical",
          f"GPU {{{{ $labels.gpu }}}} reported fatal XID {{{{ $labels.xid }}}} on {who}",
          "NVIDIA XID {{ $labels.xid }} is a hardware or driver fault (fallen off the bus, double-bit ECC, "
          "NVLink, row-remap failure): the GPU needs a reset or replacement. Drain the node.")
    alert("GPUXidErrors", xid_new.replace("{XSEL}", s(XID_OTHER)),
          "warning",
          f"GPU {{{{ $labels.gpu }}}} reported XID {{{{ $labels.xid }}}} on {who}",
          "NVIDIA XID {{ $labels.xid }}: often an application fault (illegal memory access, page fault). "
          "Check vLLM's log at that time.")
    alert("GPUThermalThrottling",
          f"max by ({gl}) (max_over_time(vllm_sidecar_gpu_clock_throttle_active"
          f"{s(THERMAL)}[{W}])) == 1",
          "warning",
          f"GPU {{{{ $labels.gpu }}}} thermally throttled on {who}",
          "The GPU's clocks are held down by temperature or power brake: throughput per GPU drops. Check "
          "cooling and the node's power.")
    alert("GPUUncorrectableECCErrors",
          f"sum by ({gl}) (increase(vllm_sidecar_gpu_ecc_errors_total{s(UNCORRECTED)}[10m])) > 0",
          "critical",
          f"GPU {{{{ $labels.gpu }}}} has uncorrectable ECC errors on {who}",
          "Uncorrectable memory errors corrupt computation: results may be wrong. Drain the node and have "
          "the GPU checked.")
    return rules


def render_groups(slo: Dict[str, Any]) -> List[Dict[str, Any]]:
    """One group: recording rules first, then the alerts that read them. Rules of a group are
    evaluated in order at the same timestamp, so an alert always reads this evaluation's recorded
    values; across two groups it could read the previous interval's (and promtool's results would
    depend on which group ran first)."""
    return [{"name": "vllm-sidecar-exporter", "rules": recording_rules(slo) + alert_rules(slo)}]


class _Dumper(yaml.SafeDumper):
    pass


def _str_repr(dumper: yaml.SafeDumper, data: str):
    if "\n" in data:
        return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", data)


_Dumper.add_representer(str, _str_repr)

HEADER = ("# Rendered by `vllm-sidecar-exporter rules --slo rules/slo.yaml --out-dir .` from the SLO file.\n"
          "# Do not edit by hand: change the SLO file and render again.\n")


def dump(obj: Any) -> str:
    return yaml.dump(obj, Dumper=_Dumper, sort_keys=False, width=1000, default_flow_style=False)


def render_plain(slo: Dict[str, Any]) -> str:
    return HEADER + dump({"groups": render_groups(slo)})


def render_operator(slo: Dict[str, Any]) -> str:
    obj = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "vllm-sidecar-exporter",
            "labels": {
                "app.kubernetes.io/name": "vllm-sidecar-exporter",
                "app.kubernetes.io/component": "alerting",
                "role": "alert-rules",
            },
        },
        "spec": {"groups": render_groups(slo)},
    }
    return HEADER + dump(obj)


def write_all(slo: Dict[str, Any], out_dir: str) -> List[str]:
    written = []
    for rel, text in ((PLAIN_PATH, render_plain(slo)), (OPERATOR_PATH, render_operator(slo))):
        path = os.path.join(out_dir, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
        written.append(path)
    return written
