"""The sidecar path and the raw path, evaluated by promtool (Prometheus' rule engine) on the
committed rule file: a pod whose vLLM target carries the SLO's ``sidecar_target_label`` (what the
deploy monitors write for a pod with the sidecar) is read through its sidecar, and vLLM's raw series
are read only for pods without the label; a pod without the label is read from vLLM's series, with
or without a sidecar beside it (a deployment that does not label its targets stays right)."""

import pytest

from exporter.slo import defaults
from promseries import expect, fmt_series, histogram, prompts_series, run_promtool, series, sidecar_labels, vllm_labels

pytestmark = pytest.mark.prometheus

LABEL = defaults()["sidecar_target_label"]
N = 20
TTFT = "namespace_pod_model:vllm_time_to_first_token_seconds:histogram_quantile5m"
LONG = "namespace_pod_model:vllm_long_prompt_requests:rate5m"
SIDECAR_LONG = "namespace_pod_model:vllm_sidecar_long_prompt_requests:rate5m"
OUT = {"namespace": "llm", "model_name": "llama-70b"}


def slow_ttft(labels):
    """vLLM's buckets: every request at 4 s, so p95 from the buckets is 2.5 + 2.5 x 0.95 = 4.875 s."""
    return histogram("vllm:time_to_first_token_seconds", labels, N, lambda m: [4.0] * 60)


def sidecar_p95(pod, value):
    return series("vllm_sidecar_ttft_seconds", sidecar_labels(pod, model_name="llama-70b", quantile="0.95"),
                  [value] * (N + 1))


def sidecar_role(pod, role="both"):
    """The role a sidecar serves beside every figure of its own (``--role``, ``both`` by default)."""
    return series("vllm_sidecar_role_info", sidecar_labels(pod, role=role), [1] * (N + 1))


def sample(name, pod, value, **extra):
    return {"labels": fmt_series(name, {**OUT, "pod": pod, **extra}), "value": value}


def test_promtool_labelled_pods_are_read_through_the_sidecar_and_the_raw_path_only_without_it(tmp_path):
    """Four pods, vLLM's buckets saying 4.875 s on each: ``side`` (labelled, its sidecar says 0.5 s)
    records the sidecar's 0.5; ``plain`` (no label, no sidecar) records the buckets' 4.875;
    ``unlabelled`` (a sidecar saying 0.5 s, but its target not labelled) records the sidecar's 0.5 as
    well (the sidecar's figure first, the raw one read for it too); ``orphan`` (labelled, no sidecar
    series) records nothing: the raw path leaves a labelled pod out (a labelled pod's role is its
    sidecar's alone: each sidecar here serves one, as every sidecar does). The raw long-prompt rate is
    recorded for the unlabelled pods only, with their role (``both``: no sidecar says another),
    although ``side``'s sidecar serves a rate of its own (0.2, recorded as the sidecar's 5-minute
    rate, beside the buckets' 0.5 of the others)."""
    side, plain = vllm_labels(pod="side", **{LABEL: "true"}), vllm_labels(pod="plain")
    unlabelled, orphan = vllm_labels(pod="unlabelled"), vllm_labels(pod="orphan", **{LABEL: "true"})
    inputs = []
    for lab in (side, plain, unlabelled, orphan):
        inputs += slow_ttft(lab)
        inputs += prompts_series(N, lambda m: 60, lambda m: 30, lab)
        # vLLM's running requests, on every page it serves: the replicas (and roles) the rules know
        inputs.append(series("vllm:num_requests_running", lab, [4] * (N + 1)))
    inputs += [sidecar_p95("side", 0.5), sidecar_p95("unlabelled", 0.5),
               series("vllm_sidecar_long_prompt_requests_per_second", sidecar_labels("side", model_name="llama-70b"),
                      [0.2] * (N + 1)), sidecar_role("side"), sidecar_role("unlabelled")]
    q = {"quantile": "0.95"}
    case = {"interval": "1m", "input_series": inputs, "promql_expr_test": [
        {"expr": TTFT, "eval_time": "15m", "exp_samples": [
            sample(TTFT, "side", 0.5, **q), sample(TTFT, "plain", 4.875, **q), sample(TTFT, "unlabelled", 0.5, **q)]},
        {"expr": LONG, "eval_time": "15m", "exp_samples": [sample(LONG, "plain", 0.5, role="both"),
                                                                   sample(LONG, "unlabelled", 0.5, role="both")]},
        {"expr": SIDECAR_LONG, "eval_time": "15m", "exp_samples": [sample(SIDECAR_LONG, "side", 0.2, role="both")]},
    ]}
    r = run_promtool(tmp_path, [case], alerts=None)
    assert r.returncode == 0, r.stdout + r.stderr


def test_promtool_ttft_alert_reads_the_sidecars_quantile_on_a_labelled_pod(tmp_path):
    """The TTFT objective's alert on pods with the sidecar: ``hot``'s sidecar p95 at 4 s fires it
    (its own buckets, at 0.3 s, are not read), through two minutes without a finished request (the
    sidecar serves no quantile then; its last one within the rate window holds); ``cold``, whose
    sidecar says 0.3 s, stays quiet although its buckets say 4.875 s; ``orphan`` (labelled, no
    sidecar series, buckets at 4.875 s) stays quiet: its buckets are not read."""
    hot, cold = vllm_labels(pod="hot", **{LABEL: "true"}), vllm_labels(pod="cold", **{LABEL: "true"})
    orphan = vllm_labels(pod="orphan", **{LABEL: "true"})
    inputs = histogram("vllm:time_to_first_token_seconds", hot, N, lambda m: [0.3] * 60) + slow_ttft(cold)
    inputs += slow_ttft(orphan)
    # the page leaves the series out at minutes 9-10: Prometheus marks it stale at its next scrape
    idle = series("vllm_sidecar_ttft_seconds", sidecar_labels("hot", model_name="llama-70b", quantile="0.95"),
                  [None if m in (9, 10) else 4.0 for m in range(N + 1)])
    idle["values"] = " ".join("stale" if m == 9 else v for m, v in enumerate(idle["values"].split()))
    inputs += [idle, sidecar_p95("cold", 0.3)]
    case = {"interval": "1m", "input_series": inputs, "alert_rule_test": [
        {"eval_time": "15m", "alertname": "VLLMTTFTHigh",
         "exp_alerts": [expect("VLLMTTFTHigh", {**OUT, "pod": "hot", "quantile": "0.95"}, "4s")]}]}
    r = run_promtool(tmp_path, [case], alerts=["VLLMTTFTHigh"])
    assert r.returncode == 0, r.stdout + r.stderr


def test_promtool_long_prompt_surge_reads_the_sidecar_where_a_pod_has_one(tmp_path):
    """Long prompts at half of 60 requests a minute on three pods. ``side`` (labelled, its sidecar
    seeing 0.4/s) warns from the sidecar's rate, and its raw rate is never recorded; ``plain`` (no
    sidecar) warns from vLLM's buckets; ``unlabelled`` (a sidecar that sees no surge: its threshold is
    exact and its floor is per minute, vLLM's bucket coarser and its floor per 5 minutes) warns from
    its raw rate, read since its target is not labelled: where both are read, the raw path warns
    where the sidecar sees no surge."""
    side, unlabelled, plain = (vllm_labels(pod="side", **{LABEL: "true"}), vllm_labels(pod="unlabelled"),
                               vllm_labels(pod="plain"))
    inputs = []
    for lab in (side, unlabelled, plain):
        inputs += prompts_series(N, lambda m: 60, lambda m: 30, lab)
        inputs.append(series("vllm:num_requests_running", lab, [4] * (N + 1)))
    for pod, rate in (("side", 0.4), ("unlabelled", 0.0)):
        s = sidecar_labels(pod, model_name="llama-70b")
        inputs += [series("vllm_sidecar_long_prompt_requests_per_second", s, [rate] * (N + 1)),
                   series("vllm_sidecar_long_prompt_request_ratio", s, [rate] * (N + 1)), sidecar_role(pod)]
    raw = "namespace_pod_model:vllm_long_prompt_requests:rate5m"
    case = {"interval": "1m", "input_series": inputs,
            "promql_expr_test": [{"expr": raw, "eval_time": "10m", "exp_samples": [
                sample(raw, "unlabelled", 0.5, role="both"), sample(raw, "plain", 0.5, role="both")]}],
            "alert_rule_test": [{"eval_time": "10m", "alertname": "VLLMLongPromptSurge", "exp_alerts": [
                expect("VLLMLongPromptSurge", {**OUT, "pod": "side"}, "400m", evidence=["40%", "none"]),
                expect("VLLMLongPromptSurge", {**OUT, "pod": "unlabelled"}, "500m", evidence=["0%", "none"]),
                expect("VLLMLongPromptSurge", {**OUT, "pod": "plain"}, "500m", evidence=["50%", "none"])]}]}
    r = run_promtool(tmp_path, [case], alerts=["VLLMLongPromptSurge"])
    assert r.returncode == 0, r.stdout + r.stderr


def test_promtool_slow_sustained_surge_warns_on_a_labelled_pod_over_five_minutes(tmp_path):
    """A labelled pod's sidecar sees 4.5 long prompts a minute of 20 requests (0.075/s, 22 %) for
    ten minutes: under the sidecar's 1-minute floor (min_count 6 a minute, 0.1/s), so its 1-minute
    path stays quiet, but over the rules' five minutes it clears min_per_second (0.05/s) and, with
    nothing to compare with, floor_share (15 %): ``slow`` warns from the sidecar's rate averaged over
    five minutes, its value that average. vLLM's buckets, which count no long prompt, are not read
    for it. ``burst`` (the same rate for two minutes, then none) averages 0.03/s over five minutes
    and stays quiet."""
    inputs = []
    for pod, live in (("slow", range(N + 1)), ("burst", (8, 9))):
        lab = vllm_labels(pod=pod, **{LABEL: "true"})
        inputs += prompts_series(N, lambda m: 20, lambda m: 0, lab)
        inputs.append(series("vllm:num_requests_running", lab, [4] * (N + 1)))
        s = sidecar_labels(pod, model_name="llama-70b")
        inputs += [series("vllm_sidecar_long_prompt_requests_per_second", s,
                          [0.075 if m in live else 0.0 for m in range(N + 1)]),
                   series("vllm_sidecar_long_prompt_request_ratio", s,
                          [0.225 if m in live else 0.0 for m in range(N + 1)]), sidecar_role(pod)]
    case = {"interval": "1m", "input_series": inputs,
            "alert_rule_test": [{"eval_time": "10m", "alertname": "VLLMLongPromptSurge", "exp_alerts": [
                expect("VLLMLongPromptSurge", {**OUT, "pod": "slow"}, "75m", evidence=["22.5%", "none"])]}]}
    r = run_promtool(tmp_path, [case], alerts=["VLLMLongPromptSurge"])
    assert r.returncode == 0, r.stdout + r.stderr


def test_promtool_requests_held_back_come_from_the_sidecars_share_and_the_raw_waits_only_without_it(tmp_path):
    """Two pods with 3 requests waiting for capacity, 4 running, the cache at 97 % and a preemption
    a minute: ``side`` (labelled) is held back by what its sidecar made at every poll (0.8 over the
    KV alert's window, 0.5 over the chronic overload's); its raw series are not read, so the rules'
    capacity waits, the preempting flag and the held-back record are made for ``plain`` (no label)
    only, which is held back at 1 (3 waits the full cache explains, preempting as well)."""
    side, plain = vllm_labels(pod="side", **{LABEL: "true"}), vllm_labels(pod="plain")
    inputs = []
    for lab in (side, plain):
        inputs += [series("vllm:num_requests_waiting_by_reason", {**lab, "reason": "capacity"}, [3] * (N + 1)),
                   series("vllm:num_requests_waiting", lab, [3] * (N + 1)),
                   series("vllm:num_requests_running", lab, [4] * (N + 1)),
                   series("vllm:kv_cache_usage_perc", lab, [0.97] * (N + 1)),
                   series("vllm:num_preemptions_total", lab, list(range(N + 1)))]
    side_labels = sidecar_labels("side", model_name="llama-70b")
    inputs += [series("vllm_sidecar_kv_cache_held_back_ratio", side_labels, [0.8] * (N + 1)),
               series("vllm_sidecar_kv_cache_held_back_recent_ratio", side_labels, [0.5] * (N + 1)),
               # an older sidecar's series, no longer read by the pack
               series("vllm_sidecar_kv_cache_capacity_wait_poll_ratio", side_labels, [0.1] * (N + 1))]
    reason, cap = ("namespace_pod_model:vllm_requests_waiting_capacity_reason:sum",
                   "namespace_pod_model:vllm_requests_waiting_capacity:sum")
    share, held = "namespace_pod_model:vllm_requests_waiting_capacity:share", "namespace_pod_model:vllm_requests_held_back:bool"
    flag = "namespace_pod_model:vllm_requests_preempted_or_rejected:bool"
    avg, chronic = ("namespace_pod_model:vllm_requests_held_back:avg_over_time2m",
                    "namespace_pod_model:vllm_requests_held_back_chronic:avg_over_time10m")
    case = {"interval": "1m", "input_series": inputs, "promql_expr_test": [
        {"expr": reason, "eval_time": "15m", "exp_samples": [sample(reason, "plain", 3)]},
        {"expr": cap, "eval_time": "15m", "exp_samples": [sample(cap, "plain", 3)]},
        {"expr": share, "eval_time": "15m", "exp_samples": [sample(share, "plain", 1)]},
        {"expr": flag, "eval_time": "15m", "exp_samples": [sample(flag, "plain", 1)]},
        {"expr": held, "eval_time": "15m", "exp_samples": [sample(held, "plain", 1)]},
        {"expr": avg, "eval_time": "15m", "exp_samples": [sample(avg, "side", 0.8), sample(avg, "plain", 1)]},
        {"expr": chronic, "eval_time": "15m", "exp_samples": [sample(chronic, "side", 0.5), sample(chronic, "plain", 1)]},
    ]}
    r = run_promtool(tmp_path, [case], alerts=None)
    assert r.returncode == 0, r.stdout + r.stderr


def test_promtool_availability_reads_the_sidecars_counters_and_the_raw_series_only_without_it(tmp_path):
    """The availability SLI per replica. ``side`` (labelled): vLLM's own series say 60 requests a
    minute, none failed, but its sidecar counted 30 a minute, 6 failed by vLLM's count and 2 by the
    HTTP server's (errors inside HTTP-200 streams, say): the records are the sidecar's, 0.5/s and
    the larger source's 0.1/s. ``plain`` (no label, no
    sidecar): 54 answers 2xx and 6 answers 5xx a minute on HTTP, the records are vLLM's, 1/s and
    0.1/s. ``orphan`` (labelled, its sidecar's counters absent): nothing, as every raw path
    leaves a labelled pod out. The model's sum and ratio add the two replicas."""
    from promseries import counter

    side, plain = vllm_labels(pod="side", **{LABEL: "true"}), vllm_labels(pod="plain")
    orphan = vllm_labels(pod="orphan", **{LABEL: "true"})
    inputs = []
    for lab in (side, plain, orphan):
        http = {k: lab[k] for k in ("namespace", "pod", "job", "instance")} | ({LABEL: "true"} if LABEL in lab else {})
        inputs += [series("vllm:num_requests_running", lab, [4] * (N + 1)),
                   series("vllm:request_success_total", {**lab, "finished_reason": "stop"}, counter(lambda m: 60, N)),
                   series("vllm:request_success_total", {**lab, "finished_reason": "error"}, [0] * (N + 1)),
                   series("http_requests_total", {**http, "handler": "/v1/completions", "status": "2xx"},
                          counter(lambda m: 54, N)),
                   series("http_requests_total", {**http, "handler": "/v1/completions", "status": "5xx"},
                          counter(lambda m: 6, N))]
    sc = sidecar_labels("side", model_name="llama-70b")
    inputs += [series("vllm_sidecar_availability_requests_total", sc, counter(lambda m: 30, N)),
               # by source: the larger counts (a request both saw counts once)
               series("vllm_sidecar_availability_errors_total", {**sc, "source": "engine"}, counter(lambda m: 6, N)),
               series("vllm_sidecar_availability_errors_total", {**sc, "source": "http"}, counter(lambda m: 2, N))]
    req, err = "namespace_pod_model:vllm_availability_requests:rate5m", "namespace_pod_model:vllm_availability_errors:rate5m"
    ratio = "namespace_model:vllm_availability_errors:ratio_rate5m"
    case = {"interval": "1m", "input_series": inputs, "promql_expr_test": [
        {"expr": req, "eval_time": "15m", "exp_samples": [sample(req, "side", 0.5), sample(req, "plain", 1.0)]},
        {"expr": err, "eval_time": "15m", "exp_samples": [sample(err, "side", 0.1), sample(err, "plain", 0.1)]},
        {"expr": ratio, "eval_time": "15m", "exp_samples": [
            {"labels": fmt_series(ratio, OUT), "value": (0.1 + 0.1) / (0.5 + 1.0)}]},
    ]}
    r = run_promtool(tmp_path, [case], alerts=None)
    assert r.returncode == 0, r.stdout + r.stderr


def test_promtool_without_a_target_label_the_sidecars_held_back_signal_wins_over_the_raw_path(tmp_path):
    """``sidecar_target_label: ""``: every pod's raw series are read, so ``both`` has the raw
    path's held-back share (1: 3 waits with the cache at 97 %) and its sidecar's (0.25, 0.4); the
    sidecar's are the records, the raw path's only where no sidecar serves them (``raw``)."""
    from exporter.pack.rules import render_plain
    from exporter.slo import load_slo

    slo_file = tmp_path / "slo.yaml"
    slo_file.write_text('sidecar_target_label: ""\n')
    rules = tmp_path / "vllm.rules.yml"
    rules.write_text(render_plain(load_slo(str(slo_file))))
    both, raw = vllm_labels(pod="both"), vllm_labels(pod="raw")
    inputs = []
    for lab in (both, raw):
        inputs += [series("vllm:num_requests_waiting_by_reason", {**lab, "reason": "capacity"}, [3] * (N + 1)),
                   series("vllm:num_requests_waiting", lab, [3] * (N + 1)),
                   series("vllm:num_requests_running", lab, [4] * (N + 1)),
                   series("vllm:kv_cache_usage_perc", lab, [0.97] * (N + 1))]
    side_labels = sidecar_labels("both", model_name="llama-70b")
    inputs += [series("vllm_sidecar_kv_cache_held_back_ratio", side_labels, [0.25] * (N + 1)),
               series("vllm_sidecar_kv_cache_held_back_recent_ratio", side_labels, [0.4] * (N + 1))]
    avg, chronic = ("namespace_pod_model:vllm_requests_held_back:avg_over_time2m",
                    "namespace_pod_model:vllm_requests_held_back_chronic:avg_over_time10m")
    case = {"interval": "1m", "input_series": inputs, "promql_expr_test": [
        {"expr": avg, "eval_time": "15m", "exp_samples": [sample(avg, "both", 0.25), sample(avg, "raw", 1)]},
        {"expr": chronic, "eval_time": "15m", "exp_samples": [sample(chronic, "both", 0.4), sample(chronic, "raw", 1)]},
    ]}
    r = run_promtool(tmp_path, [case], rules_path=rules, alerts=None)
    assert r.returncode == 0, r.stdout + r.stderr
