"""Dashboard: the prefill/decode fleet and speculative decoding. Each replica's role, throughput
per role, KV-transfer health (failures, prompts computed again, transfer time, bytes, requests
waiting on a fetch, expiring leases), the balance of the two sides per model, speculative
acceptance, and sleeping engines. Every query reads the pack's recording rules
(``recording_pd``) or vLLM's own series."""

from __future__ import annotations

from typing import Any, Dict

from .builder import Builder, Panel, Row, Target, value_map

SLEEP_MAP = value_map(("0", "awake", "green"), ("1", "weights offloaded", "blue"), ("2", "all discarded", "purple"))
NO_CONNECTOR = "no KV connector on this replica (role both), or no transfer in the window"
NO_SIDES = "no replica of the model says its role (no sidecar with --role prefill or decode)"
NO_SPEC = "speculative decoding is off (no --speculative-config)"


def disagg(b: Builder) -> Dict[str, Any]:
    d, W = b.slo["disaggregation"], b.window
    rec = b.names.replica
    role = rec("vllm_role", "info")
    join = b.by("namespace", "pod", "model_name")
    slow_at = d["transfer_ttft_share"] * b.slo["objectives"]["ttft_p95_seconds"]
    sp = b.slo["speculative"]

    def per_role(metric: str) -> str:
        """A vLLM counter's rate summed per model and role (the role the replica's sidecar gives)."""
        return (f"sum by ({b.by('namespace', 'model_name', 'role')}) (\n"
                f"  sum by ({join}) (rate({b.s(metric)}[$__rate_interval]))\n"
                f"  * on ({join}) group_left (role)\n  {b.s(role)}\n)")

    items = [
        Row("Roles and throughput"),
        Panel("Replicas per role", "Replicas of each model by the role their sidecar was given (--role); a pod "
              "without a sidecar counts as both.",
              [Target(f"count by ({b.by('namespace', 'model_name', 'role')}) ({b.s(role)})", "{{model_name}} {{role}}")],
              unit="short", w=6, min=0, decimals=0),
        Panel("Prompt tokens/s per role", "Prompt tokens per second summed per model and role: the prefill side's "
              "work (a decode instance's prompt tokens arrive mostly by KV transfer).",
              [Target(per_role("vllm:prompt_tokens_total"), "{{model_name}} {{role}}")], unit="suffix: tok/s", w=9),
        Panel("Output tokens/s per role", "Output tokens per second summed per model and role: the decode side's "
              "work (a prefill instance makes one token per request).",
              [Target(per_role("vllm:generation_tokens_total"), "{{model_name}} {{role}}")], unit="suffix: tok/s", w=9),
        Row("KV transfer"),
        Panel("KV transfer failure ratio", f"Failed KV transfers over failed and completed, per replica, over {W}; "
              f"the line is the page's {d['transfer_failure_ratio']:g}.",
              [Target(b.replica("vllm_kv_transfer_failures", "ratio_rate"), "{{pod}}", empty_ok=NO_CONNECTOR)],
              unit="percentunit", w=8, min=0, thresholds=((d["transfer_failure_ratio"], "red"),),
              threshold_style="line", runbooks=("VLLMKVTransferFailing",)),
        Panel("Prompt tokens by transfer and computed again", f"Per replica over {W}: the share of prompt tokens "
              f"that arrived by KV transfer, and, of those a decode instance's prefix cache did not hold, the share "
              f"it computed itself (decode instances only: the others compute theirs by design). "
              f"A decode instance computing them (above the line, {d['recompute_share']:g}) lost its "
              f"transfers silently.",
              [Target(b.replica("vllm_prompt_tokens_transferred", "ratio_rate"), "{{pod}} by transfer",
                      empty_ok="no prompt tokens by source (vLLM before 0.11) or no traffic"),
               Target(b.replica("vllm_prompt_tokens_recomputed", "ratio_rate"), "{{pod}} computed",
                      empty_ok="no prompt tokens by source (vLLM before 0.11) or no traffic")],
              unit="percentunit", w=8, min=0, max=1, thresholds=((d["recompute_share"], "red"),),
              threshold_style="line", runbooks=("VLLMKVTransferFailing",)),
        Panel("KV transfer time p95", f"Transfer time p95 per replica over {W}; the line is "
              f"{d['transfer_ttft_share']:g} of the TTFT p95 objective ({slow_at:g} s): a decode instance's TTFT "
              f"includes its KV fetch.",
              [Target(b.replica("vllm_kv_transfer_seconds", "histogram_quantile"), "{{pod}}", empty_ok=NO_CONNECTOR)],
              unit="s", w=8, min=0, thresholds=((slow_at, "orange"),), threshold_style="line",
              runbooks=("VLLMKVTransferSlow",)),
        Panel("KV bytes moved", f"Bytes per second moved by KV transfers, per replica, over {W}.",
              [Target(b.replica("vllm_kv_transfer_bytes", "rate"), "{{pod}}", empty_ok=NO_CONNECTOR)],
              unit="Bps", w=8, min=0),
        Panel("Requests waiting on a KV fetch", "Waiting requests by stage of their asynchronous KV load "
              "(vLLM registers the series on KV consumers and kv_both instances only).",
              [Target(f"sum by ({b.by('namespace', 'pod', 'stage')}) ({b.s('vllm:num_requests_kv_fetch_by_stage')})",
                      "{{pod}} {{stage}}", empty_ok="no KV consumer among the replicas")],
              unit="short", w=8, min=0, stack=True),
        Panel("KV leases expired", f"Requests whose KV lease expired before the decode side read it, per finished "
              f"request, over {W} (counted on the prefill side); the line is the warning's {d['expired_share']:g}.",
              [Target(b.replica("vllm_kv_expired_requests", "ratio_rate"), "{{pod}}",
                      empty_ok="no KV producer among the replicas")],
              unit="percentunit", w=8, min=0, thresholds=((d["expired_share"], "orange"),), threshold_style="line",
              runbooks=("VLLMKVLeasesExpiring",)),
        Row("Balance: which side to scale"),
        Panel("Requests waiting per instance, per side", "Requests waiting for capacity per instance of each side "
              f"(awake engines, averaged over {W}); saturated at the line ({d['saturated_waiting']:g}), room below "
              f"{d['room_waiting']:g} per instance.",
              [Target(b.model("vllm_side_requests_waiting_per_instance", "avg"), "{{model_name}} {{role}}",
                      empty_ok=NO_SIDES)],
              unit="short", w=8, min=0, thresholds=((d["saturated_waiting"], "red"),), threshold_style="line",
              runbooks=("VLLMDisaggregationImbalance",)),
        Panel("Load per side", "Tokens/s per instance of each side (prefill: prompt tokens, decode: output tokens) "
              "over what one instance carries (planned, else the most one carried while the side was saturated, over "
              "the baseline window); room below "
              f"the line ({d['room_load']:g}).",
              [Target(b.model("vllm_side_load", "ratio"), "{{model_name}} {{role}}",
                      empty_ok=NO_SIDES + "; or no capacity planned (capacity.<side>_tokens_per_second) and the side "
                      "not saturated in the baseline window (nothing to learn it from)")],
              unit="percentunit", w=8, min=0, thresholds=((d["room_load"], "orange"),), threshold_style="line",
              runbooks=("VLLMDisaggregationImbalance",)),
        Panel("KV cache usage per side", "KV-cache usage averaged over each side's awake instances; room below "
              f"the line ({b.slo['kv_cache']['warn']:g}).",
              [Target(b.model("vllm_side_kv_cache_usage", "avg"), "{{model_name}} {{role}}", empty_ok=NO_SIDES)],
              unit="percentunit", w=8, min=0, max=1, thresholds=((b.slo["kv_cache"]["warn"], "orange"),),
              threshold_style="line", runbooks=("VLLMDisaggregationImbalance",)),
        Panel("Tokens/s per instance, per side", "What one instance of each side carries now, and what it carries "
              "at most (planned, else learned).",
              [Target(b.model("vllm_side_tokens_per_instance", "rate"), "{{model_name}} {{role}}", empty_ok=NO_SIDES),
               Target(b.model("vllm_side_tokens_per_instance_capacity", "max"), "{{model_name}} {{role}} capacity",
                      empty_ok="no capacity planned and the side not saturated in the baseline window")],
              unit="suffix: tok/s", w=24),
        Row("Speculative decoding and sleep"),
        Panel("Draft acceptance", f"Accepted over drafted tokens per replica over {W}, and the model's average over "
              f"{b.slo['windows']['baseline']} (the warning fires below {sp['low_factor']:g} of it).",
              [Target(b.replica("vllm_spec_decode_acceptance", "ratio_rate"), "{{pod}}", empty_ok=NO_SPEC),
               Target(b.model("vllm_spec_decode_acceptance", "avg_over_time" + b.slo["windows"]["baseline"]),
                      "{{model_name}} normal", empty_ok=NO_SPEC + "; or less history than the baseline window")],
              unit="percentunit", w=8, min=0, max=1, runbooks=("VLLMSpecDecodeAcceptanceLow",)),
        Panel("Mean accepted length", f"Tokens per verify step (1 + accepted tokens per draft) over {W}: an upper "
              f"bound of the speedup; the line is the planned {sp['planned_speedup']:g}x.",
              [Target(b.replica("vllm_spec_decode_mean_accepted_length", "ratio_rate"), "{{pod}}", empty_ok=NO_SPEC)],
              unit="short", w=8, min=1, thresholds=((sp["planned_speedup"], "green"),), base_color="orange",
              threshold_style="line", runbooks=("VLLMSpecDecodeAcceptanceLow",)),
        Panel("Acceptance per draft position", "Drafts whose token at each position was accepted, over drafts.",
              [Target(f"sum by ({b.by('namespace', 'pod', 'position')}) "
                      f"(rate({b.s('vllm:spec_decode_num_accepted_tokens_per_pos_total')}[$__rate_interval]))\n"
                      f"/ on ({b.by('namespace', 'pod')}) group_left ()\n"
                      f"sum by ({b.by('namespace', 'pod')}) "
                      f"(rate({b.s('vllm:spec_decode_num_drafts_total')}[$__rate_interval]))",
                      "{{pod}} position {{position}}", empty_ok=NO_SPEC)],
              unit="percentunit", w=8, min=0, max=1),
        Panel("Engine sleep", "0 awake, 1 weights offloaded, 2 all discarded (vLLM's sleep mode): a sleeping engine "
              "is not stalled, not down and not spare capacity; no alert judges it.",
              [Target(b.replica("vllm_engine_sleep_level", "max"), "{{pod}}",
                      empty_ok="vLLM before 0.11 does not say whether it sleeps")],
              kind="state-timeline", unit="none", w=24, mappings=SLEEP_MAP),
    ]
    return b.dashboard("vllm-disaggregation", "vLLM / Prefill-decode and speculative decoding",
                       "Roles, KV transfer, the balance of the prefill and decode sides, speculative acceptance "
                       "and sleeping engines.", items)
