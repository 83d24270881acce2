"""Dashboard: traffic, latency against the SLO, errors and the availability budget."""

from __future__ import annotations

from typing import Any, Dict

from ...slo import seconds
from .builder import Builder, Panel, Row, Target

PERIOD = "30d"  # the availability objective's period


def burn_panel_parts(slo: Dict[str, Any]):
    """The burn-rate panel's lines and thresholds, from the SLO's ``burn_rates`` (the pairs
    VLLMErrorBudgetBurn pages and tickets on): one line per window of a page pair (shortest
    first), a red line at the highest page factor and an orange one at each other, and the
    sentence that says when it pages and when it tickets."""
    pages, tickets = slo["burn_rates"]["page"], slo["burn_rates"].get("ticket", [])
    windows = sorted({w for p in pages for w in (p["short"], p["long"])}, key=seconds)
    factors = sorted({p["factor"] for p in pages})
    thresholds = tuple((f, "orange") for f in factors[:-1]) + ((factors[-1], "red"),)

    def pairs(ps):
        return ", or ".join(f"above {p['factor']:g} on {p['long']} and {p['short']}" for p in ps)

    when = f"it pages {pairs(pages)}" + (f"; it opens a ticket {pairs(tickets)}" if tickets else "")
    return windows, thresholds, when


def overview(b: Builder) -> Dict[str, Any]:
    o = b.slo["objectives"]
    W = b.window
    budget = 1 - o["availability"]
    itl = 1.0 / o["output_tokens_per_second"]
    avail = "vllm_availability_errors"
    burn_windows, burn_thresholds, burn_when = burn_panel_parts(b.slo)
    # the 30-day figures average a ratio the pack records: the first page pair's long window
    long_w = b.slo["burn_rates"]["page"][0]["long"]
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
              [Target(b.quantile("vllm_request_queue_time_seconds", "0.95"),
                      "{{pod}}")], unit="s", w=8),
        Row("Availability SLO"),
        Panel("Availability (30 days)", f"Share of requests without a server error, averaged over {PERIOD}; "
              f"objective {o['availability'] * 100:g}%.",
              [Target(f"1 - avg_over_time({b.model(avail, 'ratio_rate', long_w)}[{PERIOD}])", "{{model_name}}")],
              kind="stat", unit="percentunit", w=6, decimals=3, base_color="red",
              thresholds=((o["availability"], "green"),)),
        Panel("Error budget left (30 days)", f"Share of the {PERIOD} error budget "
              f"({budget * 100:.3g}% of requests) not yet spent (1 = untouched, 0 = gone).",
              [Target(f"1 - avg_over_time({b.model(avail, 'ratio_rate', long_w)}[{PERIOD}]) / {budget:.6g}",
                      "{{model_name}}")],
              kind="stat", unit="percentunit", w=6, decimals=1, base_color="red",
              thresholds=((0.25, "orange"), (0.5, "green"))),
        Panel("Burn rate", f"Error ratio over the budget rate (1 = spending exactly the budget); {burn_when}.",
              [Target(f"{b.model(avail, 'ratio_rate', w)} / {budget:.6g}", f"{{{{model_name}}}} {w}")
               for w in burn_windows],
              unit="short", w=12, thresholds=burn_thresholds, threshold_style="line",
              runbooks=("VLLMErrorBudgetBurn",)),
        Row("Alerts"),
        Panel("Firing alerts", "Alerts of this pack now pending or firing (Grafana's alert list; needs the "
              "Prometheus data source's alerts).", [], kind="alertlist", unit="none", w=24, h=7),
    ]
    return b.dashboard("vllm-overview", "vLLM / Overview",
                       "Traffic, latency against the SLO, errors and the availability budget.", items)
