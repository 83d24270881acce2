"""Dashboard: KV cache, queue, preemptions and configured capacity per replica."""

from __future__ import annotations

from typing import Any, Dict

from .builder import LEVEL_MAP, SEL, SEL_POD, L, Builder, Panel, Row, Target


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
