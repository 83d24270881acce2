"""Grafana dashboards as code, rendered from the SLO file so thresholds and runbook links match
the rules pack.

``vllm-sidecar-exporter dashboards --slo rules/slo.yaml --out-dir dashboards`` writes one JSON per
dashboard: overview, capacity, prompts and cache, GPU, anomalies. They import into Grafana 10 and
11: a ``${datasource}`` variable instead of fixed datasource UIDs, stable UIDs, shared tags and
links between them, variables for namespace, model_name and pod.

A small builder of our own rather than grafana-foundation-sdk: the dashboards use six panel
types and a handful of options, the builder is one page, has no dependency to pin, and the JSON
it writes is plain Grafana schema that a reviewer can read in the diff.

Every panel has a one-line description and a unit; each target may carry ``empty_ok``, the
written reason why the panel may legitimately show nothing (the live test accepts an empty
answer only for those).
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence


DS = {"type": "prometheus", "uid": "${datasource}"}
TAG = "vllm-sidecar-exporter"
SEL = 'namespace=~"$namespace", model_name=~"$model_name", pod=~"$pod"'
SEL_POD = 'namespace=~"$namespace", pod=~"$pod"'
L = "namespace_pod_model"


@dataclass
class Target:
    expr: str
    legend: str = ""
    empty_ok: str = ""  # why this query may return nothing on a healthy system
    fmt: str = "time_series"
    instant: bool = False


@dataclass
class Panel:
    title: str
    description: str
    targets: List[Target]
    kind: str = "timeseries"
    unit: str = "short"
    w: int = 12
    h: int = 8
    thresholds: Sequence[tuple] = ()  # (value, color)
    threshold_style: str = "off"  # off | line | area
    runbooks: Sequence[str] = ()
    mappings: Sequence[dict] = ()
    min: Optional[float] = None
    max: Optional[float] = None
    stack: bool = False
    extra: Dict[str, Any] = field(default_factory=dict)


@dataclass
class Row:
    title: str


class Builder:
    def __init__(self, slo: Mapping[str, Any]) -> None:
        self.slo = slo
        self.base = slo["runbook_base_url"].rstrip("/")

    def dashboard(self, uid: str, title: str, description: str, items: Sequence[Any]) -> Dict[str, Any]:
        panels: List[Dict[str, Any]] = []
        x = y = row_h = 0
        pid = 1
        for it in items:
            if isinstance(it, Row):
                if x:
                    y += row_h
                    x = row_h = 0
                panels.append({"id": pid, "type": "row", "title": it.title, "collapsed": False,
                               "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
                pid += 1
                y += 1
                continue
            if x + it.w > 24:
                y += row_h
                x = row_h = 0
            panels.append(self.panel(it, pid, {"h": it.h, "w": it.w, "x": x, "y": y}))
            pid += 1
            x += it.w
            row_h = max(row_h, it.h)
        return {
            "uid": uid,
            "title": title,
            "description": description,
            "tags": [TAG, "vllm"],
            "timezone": "browser",
            "editable": True,
            "graphTooltip": 1,
            "schemaVersion": 39,
            "version": 1,
            "refresh": "30s",
            "time": {"from": "now-3h", "to": "now"},
            "links": [{"title": "vLLM dashboards", "type": "dashboards", "tags": [TAG], "asDropdown": True,
                       "includeVars": True, "keepTime": True, "icon": "external link", "targetBlank": False}],
            "annotations": {"list": [{"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                                      "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
                                      "name": "Annotations & Alerts", "type": "dashboard"}]},
            "templating": {"list": self.variables()},
            "panels": panels,
        }

    def variables(self) -> List[Dict[str, Any]]:
        def query_var(name: str, label: str, q: str) -> Dict[str, Any]:
            return {"type": "query", "name": name, "label": label, "datasource": DS,
                    "definition": q, "query": {"query": q, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
                    "includeAll": True, "multi": True, "allValue": ".*", "refresh": 2, "sort": 1,
                    "current": {"selected": True, "text": ["All"], "value": ["$__all"]}, "hide": 0}

        return [
            {"type": "datasource", "name": "datasource", "label": "Data source", "query": "prometheus",
             "current": {}, "hide": 0, "refresh": 1, "regex": "", "includeAll": False, "multi": False},
            query_var("namespace", "Namespace", "label_values(vllm:num_requests_running, namespace)"),
            query_var("model_name", "Model", 'label_values(vllm:num_requests_running{namespace=~"$namespace"}, model_name)'),
            query_var("pod", "Pod", 'label_values(vllm:num_requests_running{namespace=~"$namespace", model_name=~"$model_name"}, pod)'),
        ]

    def panel(self, p: Panel, pid: int, grid: Dict[str, int]) -> Dict[str, Any]:
        targets = []
        for i, t in enumerate(p.targets):
            # recording rules are named after the SLO file's rate window (default 5m)
            expr = re.sub(r":(rate|ratio_rate|histogram_quantile|mean)5m\b", r":\g<1>" + self.slo["windows"]["rate"], t.expr)
            d = {"refId": chr(ord("A") + i), "datasource": DS, "expr": expr, "legendFormat": t.legend or "__auto",
                 "format": t.fmt, "instant": t.instant, "range": not t.instant, "editorMode": "code"}
            if t.empty_ok:
                d["vllmSidecarEmptyOk"] = t.empty_ok  # read by the tests; Grafana ignores unknown keys
            targets.append(d)
        steps = [{"color": "green", "value": None}] + [{"color": c, "value": v} for v, c in p.thresholds]
        defaults: Dict[str, Any] = {"unit": p.unit, "thresholds": {"mode": "absolute", "steps": steps}}
        if p.min is not None:
            defaults["min"] = p.min
        if p.max is not None:
            defaults["max"] = p.max
        if p.mappings:
            defaults["mappings"] = list(p.mappings)
        if p.kind == "timeseries":
            defaults["custom"] = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10, "showPoints": "never",
                                  "spanNulls": False, "thresholdsStyle": {"mode": p.threshold_style},
                                  "stacking": {"mode": "normal" if p.stack else "none", "group": "A"}}
        out: Dict[str, Any] = {
            "id": pid, "type": p.kind, "title": p.title, "description": p.description, "datasource": DS,
            "gridPos": grid, "targets": targets,
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": self.options(p),
        }
        if p.runbooks:
            out["links"] = [{"title": f"Runbook: {a}", "url": f"{self.base}/{a}.md", "targetBlank": True}
                            for a in p.runbooks]
        out.update(p.extra)
        return out

    @staticmethod
    def options(p: Panel) -> Dict[str, Any]:
        if p.kind == "timeseries":
            return {"legend": {"displayMode": "table", "placement": "bottom", "showLegend": True,
                               "calcs": ["lastNotNull", "max"]}, "tooltip": {"mode": "multi", "sort": "desc"}}
        if p.kind == "stat":
            return {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                    "colorMode": "value", "graphMode": "area", "textMode": "auto", "orientation": "auto"}
        if p.kind == "state-timeline":
            return {"showValue": "auto", "mergeValues": True, "rowHeight": 0.9, "alignValue": "left",
                    "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True}}
        if p.kind == "heatmap":
            return {"calculate": False, "yAxis": {"unit": p.unit, "axisPlacement": "left"},
                    "cellGap": 1, "color": {"mode": "scheme", "scheme": "Oranges", "steps": 64},
                    "rowsFrame": {"layout": "auto"}, "tooltip": {"show": True, "yHistogram": True},
                    "legend": {"show": True}}
        if p.kind == "table":
            return {"showHeader": True, "cellHeight": "sm", "footer": {"show": False}}
        if p.kind == "alertlist":
            return {"alertListOptions": {}, "viewMode": "list", "groupMode": "default", "maxItems": 20,
                    "sortOrder": 1, "dashboardAlerts": False, "alertName": "", "alertInstanceLabelFilter": "",
                    "stateFilter": {"firing": True, "pending": True, "noData": False, "normal": False, "error": True}}
        return {}


LEVEL_MAP = [{"type": "value", "options": {
    "0": {"text": "ok", "color": "green", "index": 0}, "1": {"text": "elevated", "color": "yellow", "index": 1},
    "2": {"text": "saturated", "color": "orange", "index": 2}, "3": {"text": "thrashing", "color": "red", "index": 3}}}]
FLAG_MAP = [{"type": "value", "options": {"0": {"text": "no", "color": "green", "index": 0},
                                          "1": {"text": "YES", "color": "red", "index": 1}}}]
UP_MAP = [{"type": "value", "options": {"0": {"text": "down", "color": "red", "index": 0},
                                        "1": {"text": "up", "color": "green", "index": 1}}}]


def quantiles(record: str, legend_prefix: str) -> List[Target]:
    return [Target(f'{L}:{record}:histogram_quantile5m{{{SEL}, quantile="{q}"}}', f"{{{{pod}}}} p{int(float(q) * 100)}")
            for q in ("0.5", "0.95", "0.99")]


def overview(b: Builder) -> Dict[str, Any]:
    o = b.slo["objectives"]
    budget = 1 - o["availability"]
    itl = 1.0 / o["output_tokens_per_second"]
    items = [
        Row("Traffic"),
        Panel("Requests per second", "Finished requests per second by model (all finish reasons).",
              [Target(f"sum by (model_name) ({L}:vllm_requests_finished:rate5m{{{SEL}}})", "{{model_name}}")], unit="reqps", w=8),
        Panel("Tokens per second", "Output (generation) and input (prompt) tokens per second by model.",
              [Target(f"sum by (model_name) ({L}:vllm_generation_tokens:rate5m{{{SEL}}})", "{{model_name}} out"),
               Target(f"sum by (model_name) ({L}:vllm_prompt_tokens:rate5m{{{SEL}}})", "{{model_name}} in")],
              unit="suffix: tok/s", w=8),
        Panel("Error ratio", "Share of finished requests that ended in error per replica (client aborts excluded).",
              [Target(f"{L}:vllm_request_errors:ratio_rate5m{{{SEL}}}", "{{pod}}")], unit="percentunit", w=8,
              thresholds=((b.slo["error_ratio"]["max"], "red"),), threshold_style="line", min=0,
              runbooks=("VLLMErrorRatioHigh",)),
        Row("Latency against the SLO"),
        Panel("Time to first token", f"TTFT p50/p95/p99 over 5m per replica; the line is the p95 objective ({o['ttft_p95_seconds']:g} s).",
              quantiles("vllm_time_to_first_token_seconds", "ttft"), unit="s", w=8,
              thresholds=((o["ttft_p95_seconds"], "red"),), threshold_style="line",
              runbooks=("VLLMTTFTHigh", "VLLMTTFTMeanHigh")),
        Panel("Inter-token latency (TPOT)", f"Inter-token latency p50/p95/p99 over 5m; the line is the objective "
              f"(1/{o['output_tokens_per_second']:g} s: {o['output_tokens_per_second']:g} tokens/s per request).",
              quantiles("vllm_inter_token_latency_seconds", "itl"), unit="s", w=8,
              thresholds=((itl, "red"),), threshold_style="line", runbooks=("VLLMInterTokenLatencyHigh",)),
        Panel("End-to-end latency", "Whole-request latency p50/p95/p99 over 5m per replica.",
              quantiles("vllm_e2e_request_latency_seconds", "e2e"), unit="s", w=8),
        Panel("TTFT mean", f"Mean time to first token over 5m; the line is the mean objective ({o['ttft_mean_seconds']:g} s).",
              [Target(f"{L}:vllm_time_to_first_token_seconds:mean5m{{{SEL}}}", "{{pod}}")], unit="s", w=8,
              thresholds=((o["ttft_mean_seconds"], "red"),), threshold_style="line", runbooks=("VLLMTTFTMeanHigh",)),
        Panel("SLO attainment", "Share of requests within the TTFT objective and within the generation-speed objective "
              "(the sidecar, over its window).",
              [Target(f"vllm_sidecar_ttft_slo_attainment_ratio{{{SEL}}}", "{{pod}} TTFT"),
               Target(f"vllm_sidecar_itl_slo_attainment_ratio{{{SEL}}}", "{{pod}} speed")],
              unit="percentunit", w=8, min=0, max=1),
        Panel("Queue time p95", "Time requests waited before scheduling, p95 over 5m: high means load or KV capacity, "
              "not the model, makes TTFT high.",
              [Target(f'{L}:vllm_request_queue_time_seconds:histogram_quantile5m{{{SEL}, quantile="0.95"}}', "{{pod}}")],
              unit="s", w=8),
        Row("Availability SLO"),
        Panel("Availability (30 days)", f"Share of requests without a server error, averaged over 30 days; objective "
              f"{o['availability'] * 100:g}%.",
              [Target('1 - avg_over_time(namespace_model:vllm_availability_errors:ratio_rate1h{namespace=~"$namespace", '
                      'model_name=~"$model_name"}[30d])', "{{model_name}}")],
              kind="stat", unit="percentunit", w=6, thresholds=((o["availability"], "green"),),
              extra={"fieldConfig": {"defaults": {"unit": "percentunit", "decimals": 3, "thresholds": {
                  "mode": "absolute", "steps": [{"color": "red", "value": None}, {"color": "green", "value": o["availability"]}]}},
                  "overrides": []}}),
        Panel("Error budget left (30 days)", "Share of the 30-day error budget not yet spent (1 = untouched, 0 = gone).",
              [Target(f'1 - avg_over_time(namespace_model:vllm_availability_errors:ratio_rate1h{{namespace=~"$namespace", '
                      f'model_name=~"$model_name"}}[30d]) / {budget:.6g}', "{{model_name}}")],
              kind="stat", unit="percentunit", w=6,
              extra={"fieldConfig": {"defaults": {"unit": "percentunit", "decimals": 1, "thresholds": {
                  "mode": "absolute", "steps": [{"color": "red", "value": None}, {"color": "orange", "value": 0.25},
                                                {"color": "green", "value": 0.5}]}}, "overrides": []}}),
        Panel("Burn rate", "Error ratio over the budget rate (1 = spending exactly the budget); the page fires above "
              "14.4 on 1h and 5m, or above 6 on 6h and 30m.",
              [Target(f'namespace_model:vllm_availability_errors:ratio_rate{w}{{namespace=~"$namespace", '
                      f'model_name=~"$model_name"}} / {budget:.6g}', f"{{{{model_name}}}} {w}")
               for w in ("5m", "1h", "6h")],
              unit="short", w=12, thresholds=((6, "orange"), (14.4, "red")), threshold_style="line",
              runbooks=("VLLMErrorBudgetBurn",)),
        Row("Alerts"),
        Panel("Firing alerts", "Alerts of this pack now pending or firing (Grafana's alert list; needs the "
              "Prometheus data source's alerts).", [], kind="alertlist", unit="none", w=24, h=7),
    ]
    return b.dashboard("vllm-overview", "vLLM / Overview",
                       "Traffic, latency against the SLO, errors and the availability budget.", items)


def capacity(b: Builder) -> Dict[str, Any]:
    kv = b.slo["kv_cache"]
    items = [
        Row("KV cache"),
        Panel("KV-cache usage", f"KV-cache usage per replica (highest engine, either vLLM name). Full is normal for vLLM; "
              f"the lines mark {kv['warn']:g} and {kv['critical']:g}.",
              [Target(f"{L}:vllm_kv_cache_usage:max{{{SEL}}}", "{{pod}}")], unit="percentunit", w=12, min=0, max=1,
              thresholds=((kv["warn"], "orange"), (kv["critical"], "red")), threshold_style="line",
              runbooks=("VLLMKVCacheExhausted",)),
        Panel("KV pressure level", "The sidecar's judgement: ok, elevated (high usage), saturated (requests wait for "
              "capacity or are rejected), thrashing (preempting).",
              [Target(f"vllm_sidecar_kv_cache_pressure_level{{{SEL}}}", "{{pod}}")], kind="state-timeline",
              unit="none", w=12, mappings=LEVEL_MAP, runbooks=("VLLMKVCacheExhausted",)),
        Panel("Requests running and waiting", "Requests in the running batch and waiting, by the reason vLLM gives "
              "(capacity: no KV room; deferred: LoRA budget, KV transfer).",
              [Target(f"sum by (pod) (vllm:num_requests_running{{{SEL}}})", "{{pod}} running"),
               Target(f"sum by (pod, reason) (vllm:num_requests_waiting_by_reason{{{SEL}}})", "{{pod}} waiting ({{reason}})")],
              unit="short", w=12, runbooks=("VLLMQueueBuildup",)),
        Panel("Preemptions", "Running requests preempted per second (their KV is dropped and recomputed).",
              [Target(f"{L}:vllm_preemptions:rate5m{{{SEL}}}", "{{pod}}")], unit="ops", w=12,
              runbooks=("VLLMPreemptionsSustained",)),
        Panel("Predicted time to full", "Seconds until the KV cache is full at the current trend (the sidecar); "
              "empty while usage is not rising.",
              [Target(f"vllm_sidecar_kv_cache_seconds_to_full{{{SEL}}}", "{{pod}}",
                      empty_ok="only while KV usage is rising")], unit="s", w=8),
        Panel("Admission rejections", "Requests rejected by vLLM's queue limits per second, by reason.",
              [Target(f"sum by (pod, reason) (rate(vllm:admission_rejections_total{{{SEL}}}[$__rate_interval]))",
                      "{{pod}} {{reason}}")], unit="reqps", w=8),
        Panel("Waiting for capacity", "Requests held back for lack of KV capacity, per replica.",
              [Target(f"{L}:vllm_requests_waiting_capacity:sum{{{SEL}}}", "{{pod}}")], unit="short", w=8,
              runbooks=("VLLMKVCacheExhausted",)),
        Row("Configured capacity"),
        Panel("KV capacity", "KV-cache size in tokens and blocks, block size and memory share, from "
              "vllm:cache_config_info (labels of an info metric).",
              [Target(f"max by (pod, kv_cache_size_tokens, num_gpu_blocks, block_size, gpu_memory_utilization, "
                      f"enable_prefix_caching) (vllm:cache_config_info{{{SEL_POD}}})", fmt="table", instant=True)],
              kind="table", unit="none", w=24, h=6,
              extra={"transformations": [{"id": "organize", "options": {
                  "excludeByName": {"Time": True, "Value": True},
                  "renameByName": {"kv_cache_size_tokens": "KV tokens", "num_gpu_blocks": "KV blocks",
                                   "block_size": "block size", "gpu_memory_utilization": "GPU memory share",
                                   "enable_prefix_caching": "prefix caching"}}}]}),
    ]
    return b.dashboard("vllm-capacity", "vLLM / Capacity",
                       "KV cache, queue, preemptions and configured capacity per replica.", items)


def prompts_cache(b: Builder) -> Dict[str, Any]:
    lp = b.slo["long_prompt"]
    items = [
        Row("Prompt and output lengths"),
        Panel("Prompt length distribution", "Finished requests by prompt length (vLLM's buckets), per interval.",
              [Target(f"sum by (le) (increase(vllm:request_prompt_tokens_bucket{{{SEL}}}[$__rate_interval]))",
                      "{{le}}", fmt="heatmap")], kind="heatmap", unit="short", w=12),
        Panel("Output length distribution", "Finished requests by generated length (vLLM's buckets), per interval.",
              [Target(f"sum by (le) (increase(vllm:request_generation_tokens_bucket{{{SEL}}}[$__rate_interval]))",
                      "{{le}}", fmt="heatmap")], kind="heatmap", unit="short", w=12),
        Panel("Long prompts", f"Finished requests per second with prompts over {lp['tokens']:g} tokens, per replica.",
              [Target(f"{L}:vllm_long_prompt_requests:rate5m{{{SEL}}}", "{{pod}}")], unit="reqps", w=8,
              thresholds=((lp["min_per_second"], "orange"),), threshold_style="line", runbooks=("VLLMLongPromptSurge",)),
        Panel("Long-prompt share", f"Share of finished requests with prompts over {lp['tokens']:g} tokens.",
              [Target(f"{L}:vllm_long_prompt_requests:ratio_rate5m{{{SEL}}}", "{{pod}}")], unit="percentunit", w=8,
              min=0, runbooks=("VLLMLongPromptSurge",)),
        Panel("Prompt length quantiles", "Prompt length p50/p95/p99 over the sidecar's window.",
              [Target(f"vllm_sidecar_prompt_length_tokens{{{SEL}}}", "{{pod}} p{{quantile}}")], unit="short", w=8),
        Row("Caches and speculative decoding"),
        Panel("Prefix-cache hit ratio", "Prompt tokens served from the prefix cache over prompt tokens queried.",
              [Target(f"{L}:vllm_prefix_cache_hit:ratio_rate5m{{{SEL}}}", "{{pod}}",
                      empty_ok="prefix caching disabled or no traffic")], unit="percentunit", w=12, min=0, max=1,
              thresholds=((b.slo["prefix_cache"]["min_hit_ratio"], "orange"),), threshold_style="line",
              runbooks=("VLLMPrefixCacheHitRatioLow",)),
        Panel("Speculative decoding acceptance", "Accepted over drafted speculative tokens (the sidecar).",
              [Target(f"vllm_sidecar_spec_decode_acceptance_ratio{{{SEL}}}", "{{pod}}",
                      empty_ok="speculative decoding is off (no --speculative-config)")],
              unit="percentunit", w=12, min=0, max=1),
    ]
    return b.dashboard("vllm-prompts-cache", "vLLM / Prompts and cache",
                       "Prompt and output lengths, long prompts, prefix cache and speculative decoding.", items)


def gpu(b: Builder) -> Dict[str, Any]:
    g = f"{{{SEL_POD}}}"
    legend = "{{pod}} GPU {{gpu}}"
    items = [
        Row("Load"),
        Panel("GPU utilization", "Share of time a kernel ran (NVML utilization.gpu), per GPU. 100% can still mean "
              "little work: compare SM activity.",
              [Target(f"vllm_sidecar_gpu_utilization_ratio{g}", legend)], unit="percentunit", w=12, min=0, max=1),
        Panel("SM activity", "Share of SMs busy (NVML GPM, Hopper and newer); empty on older GPUs.",
              [Target(f"vllm_sidecar_gpu_sm_activity_ratio{g}", legend, empty_ok="GPUs without GPM (before Hopper)")],
              unit="percentunit", w=12, min=0, max=1),
        Panel("GPU memory", "Memory used and installed per GPU.",
              [Target(f"vllm_sidecar_gpu_memory_used_bytes{g}", legend + " used"),
               Target(f"vllm_sidecar_gpu_memory_total_bytes{g}", legend + " total")], unit="bytes", w=12),
        Panel("Power", "Power draw and enforced limit per GPU.",
              [Target(f"vllm_sidecar_gpu_power_watts{g}", legend),
               Target(f"vllm_sidecar_gpu_power_limit_watts{g}", legend + " limit")], unit="watt", w=12),
        Row("Health"),
        Panel("Temperature", "GPU core temperature.", [Target(f"vllm_sidecar_gpu_temperature_celsius{g}", legend)],
              unit="celsius", w=8, thresholds=((83, "orange"), (90, "red")), threshold_style="line",
              runbooks=("GPUThermalThrottling",)),
        Panel("SM clock", "Current SM clock; drops when throttled.",
              [Target(f"vllm_sidecar_gpu_sm_clock_hertz{g}", legend)], unit="hertz", w=8),
        Panel("Clock throttle reasons", "Clock event (throttle) reasons in force per GPU.",
              [Target(f'vllm_sidecar_gpu_clock_throttle_active{{{SEL_POD}, reason!="gpu_idle"}} == 1',
                      legend + " {{reason}}", empty_ok="nothing throttles the clocks")],
              kind="state-timeline", unit="none", w=8, mappings=FLAG_MAP, runbooks=("GPUThermalThrottling",)),
        Panel("XID errors", "XID errors reported through NVML events since the sidecar started, per XID code: a step "
              "is a new error (the counter, not its increase, so the first error of a code shows too).",
              [Target(f"sum by (pod, gpu, xid) (vllm_sidecar_gpu_xid_errors_total{g})",
                      "{{pod}} GPU {{gpu}} XID {{xid}}", empty_ok="no XID error since the sidecar started")],
              unit="short", w=12, runbooks=("GPUXidErrors",)),
        Panel("ECC errors", "ECC memory errors per interval, corrected and uncorrected.",
              [Target(f"sum by (pod, gpu, type) (increase(vllm_sidecar_gpu_ecc_errors_total{g}[$__rate_interval]))",
                      "{{pod}} GPU {{gpu}} {{type}}")], unit="short", w=12, runbooks=("GPUUncorrectableECCErrors",)),
        Panel("GPU inventory", "GPUs the sidecars see, with model and driver.",
              [Target(f"vllm_sidecar_gpu_info{g}", fmt="table", instant=True)], kind="table", unit="none", w=24, h=6,
              extra={"transformations": [{"id": "organize", "options": {
                  "excludeByName": {"Time": True, "Value": True, "__name__": True, "job": True, "instance": True}}}]}),
    ]
    return b.dashboard("vllm-gpu", "vLLM / GPU", "Utilization, SM activity, memory, power, temperature, clocks, "
                       "throttling, XID and ECC errors, per replica and GPU.", items)


def anomalies(b: Builder) -> Dict[str, Any]:
    med_tok = (f"{L}:vllm_generation_tokens:rate5m{{{SEL}}} / on (namespace, model_name) group_left () "
               f"quantile by (namespace, model_name) (0.5, {L}:vllm_generation_tokens:rate5m{{namespace=~\"$namespace\", "
               f"model_name=~\"$model_name\"}})")
    ttft95 = f'max without (quantile) ({L}:vllm_time_to_first_token_seconds:histogram_quantile5m{{{{SELQ}}, quantile="0.95"}})'
    med_ttft = (ttft95.replace("{SELQ}", SEL) + " / on (namespace, model_name) group_left () quantile by (namespace, model_name) (0.5, "
                + ttft95.replace("{SELQ}", 'namespace=~"$namespace", model_name=~"$model_name"') + ")")
    items = [
        Row("GPU busy, tokens low"),
        Panel("Busy GPUs, few tokens", "1 while the replica's GPUs are busy and its tokens/s are far below its own "
              "learned normal (the incident's signature).",
              [Target(f"vllm_sidecar_gpu_busy_low_throughput{{{SEL}}}", "{{pod}}")], kind="state-timeline",
              unit="none", w=12, mappings=FLAG_MAP, runbooks=("VLLMGPUBusyLowThroughput",)),
        Panel("Tokens against the learned baseline", "Generation tokens/s, the learned busy-time baseline and the "
              "threshold under which a busy replica is flagged.",
              [Target(f"vllm_sidecar_generation_tokens_per_second{{{SEL}}}", "{{pod}} tokens/s"),
               Target(f"vllm_sidecar_throughput_baseline_tokens_per_second{{{SEL}}}", "{{pod}} baseline",
                      empty_ok="the baseline needs baseline_min_seconds of busy history"),
               Target(f"vllm_sidecar_throughput_low_threshold_tokens_per_second{{{SEL}}}", "{{pod}} threshold")],
              unit="suffix: tok/s", w=12, runbooks=("VLLMGPUBusyLowThroughput",)),
        Panel("Mean GPU utilization", "Mean utilization of each replica's GPUs over the sidecar's window.",
              [Target(f"vllm_sidecar_gpu_mean_utilization_ratio{{{SEL_POD}}}", "{{pod}}")], unit="percentunit", w=12,
              min=0, max=1),
        Panel("Engine stalled", "1 while requests run and no token has come out for the stall time.",
              [Target(f"vllm_sidecar_engine_stalled{{{SEL}}}", "{{pod}}")], kind="state-timeline", unit="none", w=12,
              mappings=FLAG_MAP, runbooks=("VLLMEngineStalled",)),
        Row("Each replica against its peers"),
        Panel("Tokens/s against the peers' median", "Each replica's tokens/s over the median of all replicas of its "
              "model: one sick replica stands out while the average looks fine.",
              [Target(med_tok, "{{pod}}")], unit="percentunit", w=12,
              thresholds=((b.slo["outlier"]["throughput_factor"], "red"),), threshold_style="line",
              runbooks=("VLLMReplicaOutlier",)),
        Panel("TTFT p95 against the peers' median", "Each replica's TTFT p95 over the median of its model's replicas.",
              [Target(med_ttft, "{{pod}}")], unit="percentunit", w=12,
              thresholds=((b.slo["outlier"]["ttft_factor"], "red"),), threshold_style="line",
              runbooks=("VLLMReplicaOutlier",)),
        Panel("Long prompts per replica", "Long prompts per second per replica (the sidecar, over its window).",
              [Target(f"vllm_sidecar_long_prompt_requests_per_second{{{SEL}}}", "{{pod}}")], unit="reqps", w=12,
              runbooks=("VLLMLongPromptSurge",)),
        Row("The sidecar itself"),
        Panel("Targets up", "Whether each sidecar reads vLLM and the GPUs.",
              [Target(f"vllm_sidecar_target_up{{{SEL_POD}}}", "{{pod}} {{target}}")], kind="state-timeline",
              unit="none", w=12, mappings=UP_MAP, runbooks=("VLLMTargetDown",)),
        Panel("Read errors", "Failed reads per second, by target and reason.",
              [Target(f"sum by (pod, target, reason) (rate(vllm_sidecar_poll_errors_total{{{SEL_POD}}}[$__rate_interval]))",
                      "{{pod}} {{target}} {{reason}}", empty_ok="no read has failed")], unit="ops", w=12,
              runbooks=("VLLMTargetDown",)),
        Panel("Inputs missing", "vLLM metrics the sidecar needs and cannot find under any known name.",
              [Target(f"vllm_sidecar_input_missing{{{SEL_POD}}} == 1", "{{pod}} {{metric}}",
                      empty_ok="every input present")], kind="state-timeline", unit="none", w=24, h=5,
              mappings=FLAG_MAP, runbooks=("VLLMSidecarInputMissing",)),
    ]
    return b.dashboard("vllm-anomalies", "vLLM / Anomalies", "GPU busy with few tokens, stalled engines, each replica "
                       "against its peers, and the sidecar's own health.", items)


DASHBOARDS = {"vllm-overview": overview, "vllm-capacity": capacity, "vllm-prompts-cache": prompts_cache,
              "vllm-gpu": gpu, "vllm-anomalies": anomalies}


def render_all(slo: Mapping[str, Any]) -> Dict[str, str]:
    b = Builder(slo)
    return {f"{name}.json": json.dumps(fn(b), indent=2, sort_keys=False) + "\n" for name, fn in DASHBOARDS.items()}


K8S_PATH = os.path.join("deploy", "kubernetes", "base", "grafana-dashboards.yaml")


def render_configmaps(rendered: Mapping[str, str]) -> str:
    """The dashboards as ConfigMaps labelled for Grafana's dashboard sidecar (grafana_dashboard=1)."""
    import yaml

    from .rules import _Dumper

    docs = []
    for name, text in rendered.items():
        docs.append({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name[: -len(".json")] + "-dashboard",
                         "labels": {"grafana_dashboard": "1", "app.kubernetes.io/name": "vllm-sidecar-exporter"},
                         "annotations": {"grafana_folder": "vLLM"}},
            "data": {name: text},
        })
    header = ("# Rendered by `vllm-sidecar-exporter dashboards --slo rules/slo.yaml --k8s-out " + K8S_PATH + "`\n"
              "# from the same code as dashboards/*.json. Do not edit by hand.\n")
    return header + "---\n".join(yaml.dump(d, Dumper=_Dumper, sort_keys=False, width=1000) for d in docs)
