"""Dashboard: prompt and output lengths, long prompts, prefix cache and speculative decoding."""

from __future__ import annotations

from typing import Any, Dict

from .builder import Builder, Panel, Row, Target


def prompts_cache(b: Builder) -> Dict[str, Any]:
    lp = b.slo["long_prompt"]
    W, sw = b.window, b.slo["windows"]["sidecar"]

    def long_prompts(op: str) -> str:
        # the sidecar's where the pod has one, else the rules' from vLLM's buckets (read only for
        # pods without a sidecar: the SLO file's sidecar_target_label)
        sidecar = b.s(b.names.replica("vllm_sidecar_long_prompt_requests", op, sw), True, True)
        return f"{sidecar}\nor on ({b.by(*b.slo['replica_labels'], 'model_name')})\n{b.replica('vllm_long_prompt_requests', op)}"

    items = [
        Row("Prompt and output lengths"),
        Panel("Prompt length distribution", "Finished requests by prompt length (vLLM's buckets), per interval.",
              [Target(f"sum by (le) (increase({b.s('vllm:request_prompt_tokens_bucket')}[$__rate_interval]))",
                      "{{le}}", fmt="heatmap")], kind="heatmap", unit="short", w=12),
        Panel("Output length distribution", "Finished requests by generated length (vLLM's buckets), per interval.",
              [Target(f"sum by (le) (increase({b.s('vllm:request_generation_tokens_bucket')}[$__rate_interval]))",
                      "{{le}}", fmt="heatmap")], kind="heatmap", unit="short", w=12),
        Panel("Long prompts", f"Finished requests per second with prompts over {lp['tokens']:g} tokens, per replica, "
              f"over the sidecar's {sw} (over {W} from vLLM's buckets on a pod without a sidecar); the line is the "
              f"surge alert's floor ({lp['min_per_second']:g}/s).",
              [Target(long_prompts("rate"), "{{pod}}")], unit="reqps", w=8,
              thresholds=((lp["min_per_second"], "orange"),), threshold_style="line", runbooks=("VLLMLongPromptSurge",)),
        Panel("Long-prompt share", f"Share of finished requests with prompts over {lp['tokens']:g} tokens, over the "
              f"sidecar's {sw} (over {W} from vLLM's buckets on a pod without a sidecar).",
              [Target(long_prompts("ratio_rate"), "{{pod}}")], unit="percentunit", w=8,
              min=0, runbooks=("VLLMLongPromptSurge",)),
        Panel("Prompt length quantiles", "Prompt length p50/p95/p99 over the sidecar's window.",
              [Target(b.s("vllm_sidecar_prompt_length_tokens"), "{{pod}} p{{quantile}}")], unit="short", w=8),
        Row("Caches and speculative decoding"),
        Panel("Prefix-cache hit ratio", f"Prompt tokens served from the prefix cache over prompt tokens queried, over "
              f"{W}; the line is the info alert's {b.slo['prefix_cache']['min_hit_ratio']:g}.",
              [Target(b.replica("vllm_prefix_cache_hit", "ratio_rate"), "{{pod}}",
                      empty_ok="prefix caching disabled or no traffic")], unit="percentunit", w=12, min=0, max=1,
              thresholds=((b.slo["prefix_cache"]["min_hit_ratio"], "orange"),), threshold_style="line",
              runbooks=("VLLMPrefixCacheHitRatioLow",)),
        Panel("Speculative decoding acceptance", "Accepted over drafted speculative tokens (the sidecar).",
              [Target(b.s("vllm_sidecar_spec_decode_acceptance_ratio"), "{{pod}}",
                      empty_ok="speculative decoding is off (no --speculative-config)")],
              unit="percentunit", w=12, min=0, max=1),
    ]
    return b.dashboard("vllm-prompts-cache", "vLLM / Prompts and cache",
                       "Prompt and output lengths, long prompts, prefix cache and speculative decoding.", items)
