"""Dashboard: GPU busy with few tokens, stalled engines, replicas against their peers, the sidecar's health."""

from __future__ import annotations

from typing import Any, Dict

from .builder import FLAG_MAP, UP_MAP, Builder, Panel, Row, Target, link


def anomalies(b: Builder) -> Dict[str, Any]:
    peers = ", ".join(b.peer_labels)
    tok = b.names.replica("vllm_generation_tokens", "rate")
    ttft = b.names.replica("vllm_time_to_first_token_seconds", "histogram_quantile")

    def against_peers(expr_of) -> str:
        """Each replica's value over the median of its model's replicas (all pods, whatever $pod says)."""
        return (f"{expr_of(b.sel())} / on ({peers}) group_left () "
                f"quantile by ({peers}) (0.5, {expr_of(b.sel(True, False))})")

    med_tok = against_peers(lambda sel: f"{tok}{{{sel}}}")
    med_ttft = against_peers(lambda sel: f'max without (quantile) ({ttft}{{{sel}, quantile="0.95"}})')
    o = b.slo["outlier"]
    items = [
        Row("GPU busy, tokens low"),
        Panel("Busy GPUs, few tokens", "1 while the replica's GPUs are busy and its tokens/s are far below its own "
              "learned normal (the incident's signature).",
              [Target(b.s("vllm_sidecar_gpu_busy_low_throughput"), "{{pod}}")], kind="state-timeline",
              unit="none", w=12, mappings=FLAG_MAP, runbooks=("VLLMGPUBusyLowThroughput",)),
        Panel("Tokens against the learned baseline", "Generation tokens/s, the learned busy-time baseline and the "
              "threshold under which a busy replica is flagged.",
              [Target(b.s("vllm_sidecar_generation_tokens_per_second"), "{{pod}} tokens/s"),
               Target(b.s("vllm_sidecar_throughput_baseline_tokens_per_second"), "{{pod}} baseline",
                      empty_ok="the baseline needs baseline_min_seconds of busy history"),
               Target(b.s("vllm_sidecar_throughput_low_threshold_tokens_per_second"), "{{pod}} threshold")],
              unit="suffix: tok/s", w=12, runbooks=("VLLMGPUBusyLowThroughput",)),
        Panel("Mean GPU utilization", "Mean utilization of each replica's GPUs over the sidecar's window.",
              [Target(b.s("vllm_sidecar_gpu_mean_utilization_ratio", False), "{{pod}}")], unit="percentunit", w=12,
              min=0, max=1),
        Panel("Engine stalled", "1 while requests run and no token has come out for the stall time.",
              [Target(b.s("vllm_sidecar_engine_stalled"), "{{pod}}")], kind="state-timeline", unit="none", w=12,
              mappings=FLAG_MAP, runbooks=("VLLMEngineStalled",)),
        Row("Each replica against its peers"),
        Panel("Tokens/s against the peers' median", f"Each replica's tokens/s over {b.window} divided by the median "
              f"of all replicas of its model: one sick replica stands out while the average looks fine. The line is "
              f"the outlier alert's {o['throughput_factor']:g} (with at least {o['min_replicas']:g} replicas).",
              [Target(med_tok, "{{pod}}")], unit="percentunit", w=12,
              thresholds=((o["throughput_factor"], "red"),), threshold_style="line",
              runbooks=("VLLMReplicaOutlier",)),
        Panel("TTFT p95 against the peers' median", f"Each replica's TTFT p95 over {b.window} divided by the median "
              f"of its model's replicas; the line is the outlier alert's {o['ttft_factor']:g}.",
              [Target(med_ttft, "{{pod}}")], unit="percentunit", w=12,
              thresholds=((o["ttft_factor"], "red"),), threshold_style="line",
              runbooks=("VLLMReplicaOutlier",)),
        Panel("Long prompts per replica", "Long prompts per second per replica (the sidecar, over its window).",
              [Target(b.s("vllm_sidecar_long_prompt_requests_per_second"), "{{pod}}")], unit="reqps", w=12,
              runbooks=("VLLMLongPromptSurge",)),
        Row("Flight recorder: the incidents each pod kept at poll resolution"),
        Panel("Flight recorder events per pod", "The events each pod's flight recorder opened over the dashboard's "
              "time range, by kind (KV thrashing, a stall, vLLM unreachable or restarted, a GPU XID): each pod "
              "kept the polls around them. Fetch them from the pod: kubectl -n NAMESPACE port-forward pod/POD "
              "19181:9181, then GET http://127.0.0.1:19181/debug/flight/events (the list) and /debug/flight?event=ID "
              "(the record), or vllm-sidecar-exporter postmortem --sidecar http://127.0.0.1:19181; "
              "top --replay walks through it.",
              [Target(b.flight_events_expr("$__range"), "{{pod}} {{kind}}", fmt="table", instant=True,
                      empty_ok="no flight recorder event in the time range")],
              kind="table", unit="none", w=12, decimals=0,
              data_links=([link("${__data.fields.pod}: fetch its events (kubectl -n ${__data.fields.namespace} "
                                "port-forward pod/${__data.fields.pod} 19181:9181; GET /debug/flight/events)",
                                b.postmortem_doc() + "#in-kubernetes", "How to fetch this pod's flight record")]
                          if b.postmortem_doc() else ()),
              doc_links=([link("Postmortem from the flight recorder", b.postmortem_doc(),
                               "Fetching a pod's record, postmortem, top --replay")] if b.postmortem_doc() else ())),
        Panel("Flight recorder events", "Events each pod's flight recorder opened, per kind, over time (the same "
              "events annotate the dashboards).",
              [Target(b.flight_events_expr("$__rate_interval"), "{{pod}} {{kind}}",
                      empty_ok="no flight recorder event in the time range")], unit="none", w=12, decimals=0),
        Row("The sidecar itself"),
        Panel("Targets up", "Whether each sidecar reads vLLM and the GPUs.",
              [Target(b.s("vllm_sidecar_target_up", False), "{{pod}} {{target}}")], kind="state-timeline",
              unit="none", w=12, mappings=UP_MAP, runbooks=("VLLMTargetDown",)),
        Panel("Read errors", "Failed reads per second, by target and reason.",
              [Target(f"sum by ({b.by('pod', 'target', 'reason')}) (rate({b.s('vllm_sidecar_poll_errors_total', False)}"
                      f"[$__rate_interval]))", "{{pod}} {{target}} {{reason}}", empty_ok="no read has failed")],
              unit="ops", w=12, runbooks=("VLLMTargetDown",)),
        Panel("Inputs missing", "vLLM metrics the sidecar needs and cannot find under any known name.",
              [Target(f"{b.s('vllm_sidecar_input_missing', False)} == 1", "{{pod}} {{metric}}",
                      empty_ok="every input present")], kind="state-timeline", unit="none", w=24, h=5,
              mappings=FLAG_MAP, runbooks=("VLLMSidecarInputMissing",)),
    ]
    return b.dashboard("vllm-anomalies", "vLLM / Anomalies", "GPU busy with few tokens, stalled engines, each replica "
                       "against its peers, and the sidecar's own health.", items)
