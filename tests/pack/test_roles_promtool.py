"""`promtool test rules`: prefill/decode disaggregation on the pack's existing alerts. A healthy
fleet of one prefill and three decode instances of one model (the user's design B) is quiet on
the fleet comparisons, the long-prompt surge and "GPU busy, tokens low" for a day and more; the
same fleet without the sidecars' role series (every pod of role both, as before roles) fires the
fleet comparison on the prefill instance, which is what the roles are for."""

import pytest

from promseries import counter, expect, gauge, histogram, prompts_series, run_promtool, series, sidecar_labels, vllm_labels

pytestmark = pytest.mark.prometheus

DAY = 24 * 60
MINUTES = DAY + 120
ALERTS = ("VLLMReplicaOutlier", "VLLMLongPromptSurge", "VLLMGPUBusyLowThroughput")


def instance(pod, role, tokens_per_min, requests_per_min, ttft, with_role=True):
    """One healthy instance: busy GPUs, its output tokens, a fifth of its prompts long (RAG), its TTFT."""
    v, s = vllm_labels(pod=pod), sidecar_labels(pod=pod)
    m = {**s, "model_name": "llama-70b"}
    out = [series("vllm:num_requests_running", v, gauge(lambda t: 8, MINUTES)),
           series("vllm:generation_tokens_total", v, counter(lambda t: tokens_per_min, MINUTES)),
           series("vllm_sidecar_gpu_mean_utilization_ratio", s, gauge(lambda t: 0.97, MINUTES)),
           # a sidecar that does not know roles flags a prefill instance: busy GPUs, almost no output
           series("vllm_sidecar_gpu_busy_low_throughput", m, gauge(lambda t: 1 if role == "prefill" else 0, MINUTES)),
           series("vllm_sidecar_long_prompt_requests_per_second", m, gauge(lambda t: requests_per_min / 300, MINUTES)),
           series("vllm_sidecar_long_prompt_request_ratio", m, gauge(lambda t: 0.2, MINUTES))]
    out += prompts_series(MINUTES, lambda t: requests_per_min, lambda t: requests_per_min // 5, v)
    out += histogram("vllm:time_to_first_token_seconds", v, MINUTES, lambda t: [ttft] * 10)
    if with_role:
        out.append(series("vllm_sidecar_role_info", {**s, "role": role}, gauge(lambda t: 1, MINUTES)))
    return out


def design_b(with_role=True):
    """One prefill instance (every request's prompt, one output token each, TTFT = the whole
    prefill) and three TP2 decode instances (a third of the requests each, 1,000 tokens/s, TTFT =
    the KV fetch and first step)."""
    fleet = instance("prefill-0", "prefill", 60, 60, 1.5, with_role)
    for i in range(3):
        fleet += instance(f"decode-{i}", "decode", 60000, 20, 0.4, with_role)
    return fleet


def quiet_through_the_day(alert):
    return [{"eval_time": f"{m}m", "alertname": alert, "exp_alerts": []} for m in (15, 60, 360, DAY + 60, DAY + 110)]


@pytest.mark.parametrize("alert", ALERTS)
def test_a_healthy_prefill_decode_fleet_is_quiet(alert, tmp_path):
    test = {"interval": "1m", "input_series": design_b(), "alert_rule_test": quiet_through_the_day(alert)}
    r = run_promtool(tmp_path, [test], alerts=[alert])
    assert r.returncode == 0, r.stdout + r.stderr


def test_without_roles_the_prefill_instance_is_an_outlier(tmp_path):
    """The same fleet with no role series: every pod counts as role both and the prefill instance,
    making almost no output tokens (and its TTFT the whole prefill), is compared with the decode
    instances: what the issue saw from minute 15, and what the roles fix."""
    pod = {"namespace": "llm", "pod": "prefill-0", "model_name": "llama-70b"}
    fired = [expect("VLLMReplicaOutlier", {**pod, "signal": "throughput"}, "0.00", evidence=["125m"]),
             expect("VLLMReplicaOutlier", {**pod, "signal": "ttft"}, "4.97")]  # a TTFT outlier asks nothing
    test = {"interval": "1m", "input_series": design_b(with_role=False),
            "alert_rule_test": [{"eval_time": "60m", "alertname": "VLLMReplicaOutlier", "exp_alerts": fired}]}
    r = run_promtool(tmp_path, [test], alerts=["VLLMReplicaOutlier"])
    assert r.returncode == 0, r.stdout + r.stderr
