"""Dashboard: Traffic, latency against the SLO, errors and the availability budget."""

from __future__ import annotations

from typing import Any, Dict

from .builder import SEL, L, Builder, Panel, Row, Target, quantiles


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
