"""Dashboard: KV cache, queue, preemptions, capacity headroom, cost and efficiency, configured capacity and
LoRA adapters per replica."""

from __future__ import annotations

from typing import Any, Dict, List

from ..context import Ctx
from ..recording import capacity_names
from .builder import LEVEL_MAP, Builder, Panel, Row, Target, value_map

# vLLM 0.32 says which adapters have a request running or waiting, not how many
LORA_MAP = value_map(("0", "no requests", "green"), ("1", "requests", "blue"))
NO_LORA = "only where vLLM serves LoRA (--enable-lora) and an adapter has had a request since it started"
NOT_APART = "vLLM 0.32 lists adapters with a request running or waiting under both labels, never apart"


# Grafana's currency units; any other currency is shown as a plain number, named in the title
CURRENCY_UNITS = {"USD": "currencyUSD", "EUR": "currencyEUR", "GBP": "currencyGBP", "JPY": "currencyJPY",
                  "INR": "currencyINR", "KRW": "currencyKRW", "CHF": "currencyCHF"}


def cost_and_efficiency(b: Builder) -> List[Any]:
    """The "Cost and efficiency" row: what the fleet costs at the SLO file's prices, per token and per
    request at the load of the moment, GPU utilization per replica and over the model, output
    tokens per joule."""
    cost = b.slo["cost"]
    cur = cost["currency"]
    unit = CURRENCY_UNITS.get(cur, "short")
    names = capacity_names(Ctx(b.slo))
    per = "GPU-hour" if cost["unit"] == "gpu_hour" else "replica-hour"
    price = (f"{cost['prices'][cost['fleet']]:g} {cur} per {per} ({cost['fleet']}, from the SLO file's cost section"
             + (f"; GPUs per replica as the sidecar counts them, else {cost['gpus_per_replica']:g})"
                if cost["unit"] == "gpu_hour" else ")"))

    def m(key: str) -> str:
        return b.s(names[key], True, False)

    def r(key: str) -> str:
        return b.s(names[key])

    return [
        Row("Cost and efficiency"),
        Panel(f"Fleet cost ({cur})", f"What the model's replicas serving now cost an hour at {price}, and a month "
              f"at that rate ({cost['hours_per_month']:g} hours, without the fixed {cost['monthly_fixed']:g} {cur}). "
              f"`vllm-sidecar-exporter capacity` puts the month against the budget.",
              [Target(m("fleet_cost_per_hour"), "{{model_name}} an hour"),
               Target(f"{m('fleet_cost_per_hour')} * {cost['hours_per_month']:g}", "{{model_name}} a month")],
              unit=unit, w=8, min=0),
        Panel(f"Cost per million output tokens ({cur})", f"The fleet's cost an hour over the output tokens it makes "
              f"an hour, at the load of the moment ({b.window} rate): high when replicas idle. At the sustainable "
              f"load it is lower; `capacity` reports both.",
              [Target(m("cost_per_million_output_tokens"), "{{model_name}}",
                      empty_ok="only while the model generates tokens")], unit=unit, w=8, min=0),
        Panel(f"Cost per thousand requests ({cur})", f"The fleet's cost an hour over the requests it finishes an "
              f"hour ({b.window} rate).",
              [Target(m("cost_per_thousand_requests"), "{{model_name}}",
                      empty_ok="only while requests finish")], unit=unit, w=8, min=0),
        Panel("GPU utilization", "Mean NVML utilization of each replica's GPUs (share of time a kernel ran) and "
              "over the model's replicas: what elastic scaling raises (busy GPUs per replica paid for). A high "
              "figure is not high throughput: see tokens per joule.",
              [Target(r("gpu_utilization"), "{{pod}}"), Target(m("fleet_gpu_utilization"), "{{model_name}} fleet")],
              unit="percentunit", w=12, min=0, max=1),
        Panel("Output tokens per joule", "Output tokens per second over the GPUs' power drawn (the rate of NVML's "
              "total energy counter, Volta and newer), per replica and over the model's replicas with a counter.",
              [Target(r("tokens_per_joule"), "{{pod}}"), Target(m("fleet_tokens_per_joule"), "{{model_name}} fleet")],
              unit="short", w=12, min=0),
    ]


def capacity(b: Builder) -> Dict[str, Any]:
    kv = b.slo["kv_cache"]
    cap = b.slo["capacity"]
    W = b.window
    replica = b.by(*b.slo["replica_labels"], "model_name")  # one series per replica and model
    items = [
        Row("KV cache"),
        Panel("KV-cache usage", f"KV-cache usage per replica (highest engine, either vLLM name). Full is normal for "
              f"vLLM; the lines mark {kv['warn']:g} and {kv['critical']:g}.",
              [Target(b.replica("vllm_kv_cache_usage", "max"), "{{pod}}")], unit="percentunit", w=12, min=0, max=1,
              thresholds=((kv["warn"], "orange"), (kv["critical"], "red")), threshold_style="line",
              runbooks=("VLLMKVCacheExhausted",)),
        Panel("KV pressure level", "The sidecar's judgement: ok, elevated (high usage), saturated (requests wait for "
              "capacity or are rejected), thrashing (preempting).",
              [Target(b.s("vllm_sidecar_kv_cache_pressure_level"), "{{pod}}")], kind="state-timeline",
              unit="none", w=12, mappings=LEVEL_MAP, runbooks=("VLLMKVCacheExhausted",)),
        Panel("Requests running and waiting", "Requests in the running batch and waiting, by the reason vLLM gives "
              "(capacity: no KV room; deferred: LoRA budget, KV transfer).",
              [Target(f"sum by ({b.by('pod')}) ({b.s('vllm:num_requests_running')})", "{{pod}} running"),
               Target(f"sum by ({b.by('pod', 'reason')}) ({b.s('vllm:num_requests_waiting_by_reason')})",
                      "{{pod}} waiting ({{reason}})")],
              unit="short", w=12, runbooks=("VLLMQueueBuildup",)),
        Panel("Preemptions", f"Running requests preempted per second over {W} (their KV is dropped and recomputed); "
              f"VLLMPreemptionsSustained fires when some happen in every {b.sustain} window.",
              [Target(b.replica("vllm_preemptions", "rate"), "{{pod}}")], unit="ops", w=12,
              runbooks=("VLLMPreemptionsSustained",)),
        Panel("Predicted time to full", "Seconds until the KV cache is full at the current trend (the sidecar); "
              "empty while usage is not rising.",
              [Target(b.s("vllm_sidecar_kv_cache_seconds_to_full"), "{{pod}}",
                      empty_ok="only while KV usage is rising")], unit="s", w=8),
        Panel("Admission rejections", "Requests rejected by vLLM's queue limits per second, by reason.",
              [Target(f"sum by ({b.by('pod', 'reason')}) (rate({b.s('vllm:admission_rejections_total')}[$__rate_interval]))",
                      "{{pod}} {{reason}}")], unit="reqps", w=8),
        Panel("Waiting for capacity", "Requests held back for lack of KV capacity, per replica: the sidecar's "
              "count where the pod has one, else the rules' (vLLM's capacity waits where the cache explains them).",
              [Target(f"max by ({replica}) ({b.s('vllm_sidecar_requests_waiting_for_capacity')})\n"
                      f"or on ({replica})\n{b.replica('vllm_requests_waiting_capacity', 'sum')}", "{{pod}}")],
              unit="short", w=8,
              runbooks=("VLLMKVCacheExhausted",)),
        Panel("Capacity headroom", f"What the replicas serving now sustain within every latency objective (the best "
              f"generation tokens/s any replica held for {cap['sustain']} with TTFT p95, TTFT mean and inter-token "
              f"latency all within their objectives, over the last {cap['history']}, times the replicas) against the "
              f"model's peak over the last {cap['peak_window']}, minus 1. Below 0: the peak needs more than the "
              f"replicas sustain; below the amber line: less than the planned {cap['headroom']:.0%} headroom. "
              f"`vllm-sidecar-exporter capacity` reports the same figure with the load-latency curve behind it.",
              [Target(b.model("vllm_generation_tokens_headroom", "ratio"), "{{namespace}} {{model_name}}",
                      empty_ok="only before any replica met every objective for the sustain window under load")],
              unit="percentunit", w=24, h=7, base_color="red",
              thresholds=((0, "orange"), (cap["headroom"], "green")), threshold_style="line"),
        *cost_and_efficiency(b),
        Row("Configured capacity"),
        Panel("KV capacity", "KV-cache size in tokens and blocks, block size and memory share, from "
              "vllm:cache_config_info (labels of an info metric).",
              [Target(f"max by ({b.by('pod')}, kv_cache_size_tokens, num_gpu_blocks, block_size, gpu_memory_utilization, "
                      f"enable_prefix_caching) ({b.s('vllm:cache_config_info', False)})", fmt="table", instant=True)],
              kind="table", unit="none", w=24, h=6,
              transformations=[{"id": "organize", "options": {
                  "excludeByName": {"Time": True, "Value": True},
                  "renameByName": {"kv_cache_size_tokens": "KV tokens", "num_gpu_blocks": "KV blocks",
                                   "block_size": "block size", "gpu_memory_utilization": "GPU memory share",
                                   "enable_prefix_caching": "prefix caching"}}}]),
        Row("LoRA adapters"),
        Panel("LoRA adapters with requests", "Per replica and adapter: has at least one request running or "
              "waiting (vLLM says which adapters, not how many requests, and on vLLM 0.32 not whether they run or "
              "wait); running and waiting rows appear only where vLLM lists them apart. Every adapter that has had "
              "a request since vLLM started has a row.",
              [Target(b.s("vllm_sidecar_lora_adapter_active", False), "{{pod}} {{adapter}}", empty_ok=NO_LORA),
               Target(b.s("vllm_sidecar_lora_adapter_running", False), "{{pod}} {{adapter}} running",
                      empty_ok=NOT_APART),
               Target(b.s("vllm_sidecar_lora_adapter_waiting", False), "{{pod}} {{adapter}} waiting",
                      empty_ok=NOT_APART)],
              kind="state-timeline", unit="none", w=14, mappings=LORA_MAP),
        Panel("LoRA adapters against max_lora", "Adapters with requests (running or waiting) and adapters known "
              "(had a request since vLLM started) per replica, against vLLM's max_lora, the most adapters one "
              "batch holds: above that line some adapters' requests all wait for a slot. Adapters, not requests.",
              [Target(b.s("vllm_sidecar_lora_adapters_active", False), "{{pod}} with requests", empty_ok=NO_LORA),
               Target(b.s("vllm_sidecar_lora_adapters_known", False), "{{pod}} known", empty_ok=NO_LORA),
               Target(b.s("vllm_sidecar_lora_max_adapters", False), "{{pod}} max_lora", empty_ok=NO_LORA)],
              unit="short", w=10, min=0, decimals=0),
    ]
    return b.dashboard("vllm-capacity", "vLLM / Capacity",
                       "KV cache, queue, preemptions, capacity headroom, cost and efficiency, configured capacity "
                       "and LoRA adapters per replica.", items)
