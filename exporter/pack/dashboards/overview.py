"""Dashboard: traffic, latency against the SLO, errors and the availability budget."""

from __future__ import annotations

from typing import Any, Dict

from .builder import Builder, Panel, Row, Target

# VLLMErrorBudgetBurn's multiwindow burn rates (rules.py): page at 14.4x the budget rate on 1h and
# 5m, ticket at 6x on 6h and 30m; the windows are fixed there, not SLO settings
PAGE_BURN, TICKET_BURN = 14.4, 6
BURN_LINES = ("5m", "1h", "6h")
PERIOD = "30d"  # the availability objective's period


def overview(b: Builder) -> Dict[str, Any]:
    o = b.slo["objectives"]
    W = b.window
    budget = 1 - o["availability"]
    itl = 1.0 / o["output_tokens_per_second"]
    avail = "vllm_availability_errors"
    items = [
        Row("Traffic"),
        Panel("Requests per second", f"Finished requests per second by model (all finish reasons), over {W}.",
              [Target(f"sum by ({b.by('model_name')}) ({b.replica('vllm_requests_finished', 'rate')})", "{{model_name}}")],
              unit="reqps", w=8),
        Panel("Tokens per second", f"Output (generation) and input (prompt) tokens per second by model, over {W}.",
              [Target(f"sum by ({b.by('model_name')}) ({b.replica('vllm_generation_tokens', 'rate')})", "{{model_name}} out"),
               Target(f"sum by ({b.by('model_name')}) ({b.replica('vllm_prompt_tokens', 'rate')})", "{{model_name}} in")],
              unit="suffix: tok/s", w=8),
        Panel("Error ratio", f"Share of finished requests that ended in error per replica over {W} (client aborts "
              f"excluded); the line is the alert's {b.slo['error_ratio']['max'] * 100:g}%.",
              [Target(b.replica("vllm_request_errors", "ratio_rate"), "{{pod}}")], unit="percentunit", w=8,
              thresholds=((b.slo["error_ratio"]["max"], "red"),), threshold_style="line", min=0,
              runbooks=("VLLMErrorRatioHigh",)),
        Row("Latency against the SLO"),
        Panel("Time to first token", f"TTFT p50/p95/p99 over {W} per replica; the line is the p95 objective "
              f"({o['ttft_p95_seconds']:g} s).",
              b.quantiles("vllm_time_to_first_token_seconds"), unit="s", w=8,
              thresholds=((o["ttft_p95_seconds"], "red"),), threshold_style="line",
              runbooks=("VLLMTTFTHigh", "VLLMTTFTMeanHigh")),
        Panel("Inter-token latency (TPOT)", f"Inter-token latency p50/p95/p99 over {W}; the line is the objective "
              f"(1/{o['output_tokens_per_second']:g} s: {o['output_tokens_per_second']:g} tokens/s per request).",
              b.quantiles("vllm_inter_token_latency_seconds"), unit="s", w=8,
              thresholds=((itl, "red"),), threshold_style="line", runbooks=("VLLMInterTokenLatencyHigh",)),
        Panel("End-to-end latency", f"Whole-request latency p50/p95/p99 over {W} per replica.",
              b.quantiles("vllm_e2e_request_latency_seconds"), unit="s", w=8),
        Panel("TTFT mean", f"Mean time to first token over {W}; the line is the mean objective "
              f"({o['ttft_mean_seconds']:g} s).",
              [Target(b.replica("vllm_time_to_first_token_seconds", "mean"), "{{pod}}")], unit="s", w=8,
              thresholds=((o["ttft_mean_seconds"], "red"),), threshold_style="line", runbooks=("VLLMTTFTMeanHigh",)),
        Panel("SLO attainment", "Share of requests within the TTFT objective and within the generation-speed objective "
              "(the sidecar, over its window).",
              [Target(b.s("vllm_sidecar_ttft_slo_attainment_ratio"), "{{pod}} TTFT"),
               Target(b.s("vllm_sidecar_itl_slo_attainment_ratio"), "{{pod}} speed")],
              unit="percentunit", w=8, min=0, max=1),
        Panel("Queue time p95", f"Time requests waited before scheduling, p95 over {W}: high means load or KV "
              "capacity, not the model, makes TTFT high.",
              [Target(b.replica("vllm_request_queue_time_seconds", "histogram_quantile", 'quantile="0.95"'),
                      "{{pod}}")], unit="s", w=8),
        Row("Availability SLO"),
        Panel("Availability (30 days)", f"Share of requests without a server error, averaged over {PERIOD}; "
              f"objective {o['availability'] * 100:g}%.",
              [Target(f"1 - avg_over_time({b.model(avail, 'ratio_rate', '1h')}[{PERIOD}])", "{{model_name}}")],
              kind="stat", unit="percentunit", w=6, decimals=3, base_color="red",
              thresholds=((o["availability"], "green"),)),
        Panel("Error budget left (30 days)", f"Share of the {PERIOD} error budget "
              f"({budget * 100:.3g}% of requests) not yet spent (1 = untouched, 0 = gone).",
              [Target(f"1 - avg_over_time({b.model(avail, 'ratio_rate', '1h')}[{PERIOD}]) / {budget:.6g}",
                      "{{model_name}}")],
              kind="stat", unit="percentunit", w=6, decimals=1, base_color="red",
              thresholds=((0.25, "orange"), (0.5, "green"))),
        Panel("Burn rate", f"Error ratio over the budget rate (1 = spending exactly the budget); the page fires above "
              f"{PAGE_BURN:g} on 1h and 5m, or above {TICKET_BURN:g} on 6h and 30m.",
              [Target(f"{b.model(avail, 'ratio_rate', w)} / {budget:.6g}", f"{{{{model_name}}}} {w}")
               for w in BURN_LINES],
              unit="short", w=12, thresholds=((TICKET_BURN, "orange"), (PAGE_BURN, "red")), threshold_style="line",
              runbooks=("VLLMErrorBudgetBurn",)),
        Row("Alerts"),
        Panel("Firing alerts", "Alerts of this pack now pending or firing (Grafana's alert list; needs the "
              "Prometheus data source's alerts).", [], kind="alertlist", unit="none", w=24, h=7),
    ]
    return b.dashboard("vllm-overview", "vLLM / Overview",
                       "Traffic, latency against the SLO, errors and the availability budget.", items)
