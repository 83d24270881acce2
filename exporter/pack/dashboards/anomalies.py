"""Dashboard: GPU busy with few tokens, stalled engines, replicas against their peers, the sidecar's health."""

from __future__ import annotations

from typing import Any, Dict

from .builder import FLAG_MAP, SEL, SEL_POD, UP_MAP, L, Builder, Panel, Row, Target


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
