"""Dashboard: KV cache, queue, preemptions, capacity headroom, configured capacity and LoRA adapters per
replica."""

from __future__ import annotations

from typing import Any, Dict

from .builder import LEVEL_MAP, Builder, Panel, Row, Target, value_map

# vLLM 0.32 says which adapters have a request running or waiting, not how many
LORA_MAP = value_map(("0", "no requests", "green"), ("1", "requests", "blue"))
NO_LORA = "only where vLLM serves LoRA (--enable-lora) and an adapter has had a request since it started"
NOT_APART = "vLLM 0.32 lists adapters with a request running or waiting under both labels, never apart"


def capacity(b: Builder) -> Dict[str, Any]:
    kv = b.slo["kv_cache"]
    cap = b.slo["capacity"]
    W = b.window
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
        Panel("Waiting for capacity", "Requests held back for lack of KV capacity, per replica.",
              [Target(b.replica("vllm_requests_waiting_capacity", "sum"), "{{pod}}")], unit="short", w=8,
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
                       "KV cache, queue, preemptions, configured capacity and LoRA adapters per replica.", items)
