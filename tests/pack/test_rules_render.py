"""The rendered pack: committed files equal the defaults rendered, promtool accepts them, and
every metric they read exists in real vLLM output or the sidecar's."""

import subprocess

import pytest
import yaml

from conftest import ROOT, VLLM_PAGES
from exporter.pack import rules as rules_mod
from exporter.runtime.config import ConfigError
from exporter.runtime.exposition import parse
from exporter.slo import load_slo

SLO = ROOT / "rules" / "slo.yaml"


def test_committed_files_are_the_defaults_rendered(tmp_path):
    slo = load_slo(str(SLO))
    assert slo == load_slo(None), "rules/slo.yaml must hold the defaults"
    files = rules_mod.rendered_files(slo)
    assert {rules_mod.PLAIN_PATH, rules_mod.OPERATOR_PATH} < set(files) and len(files) > 20
    for rel, text in files.items():
        committed = (ROOT / rel).read_text()
        assert committed == text, f"{rel} drifted: run `vllm-sidecar-exporter rules --slo rules/slo.yaml --out-dir .`"


def _alerts(text):
    return [r for g in yaml.safe_load(text)["groups"] for r in g["rules"] if "alert" in r]


@pytest.mark.parametrize("path", [rules_mod.PLAIN_PATH, "rules/vllm.vmalert.rules.yml"])
def test_every_alert_reads_as_one_sentence(path):
    """An on-call paged at night reads the expression to learn why it fired: every alert of the
    rendered pack is at most 12 lines and 600 characters, its work in named recording rules."""
    alerts = _alerts((ROOT / path).read_text())
    assert len(alerts) > 20
    long = {r["alert"]: (len(r["expr"].splitlines()), len(r["expr"])) for r in alerts
            if len(r["expr"].splitlines()) > 12 or len(r["expr"]) > 600}
    assert not long, f"alerts longer than 12 lines or 600 characters (lines, characters): {long}"


def test_alerts_compared_with_normal_show_the_normal_beside_their_value():
    """The evidence: an alert that compares with what is normal says what normal is, through a
    query in its description (the value beside its normal level); a boolean signal names a
    PromQL query that shows its inputs."""
    by_name = {r["alert"]: r for r in _alerts((ROOT / rules_mod.PLAIN_PATH).read_text())}
    for name in ("VLLMLongPromptSurge", "VLLMGPUBusyLowThroughput", "VLLMReplicaOutlier", "VLLMPrefixCacheHitRatioLow"):
        d = by_name[name]["annotations"]["description"]
        assert ("normally" in d or "median" in d) and "| query }}" in d, name
    for name in ("VLLMEngineStalled", "VLLMTargetDown", "VLLMSidecarInputMissing"):
        assert "{__name__=~" in by_name[name]["annotations"]["description"], name


def test_cli_renders_the_same(tmp_path):
    r = subprocess.run(["python", "-m", "exporter", "rules", "--slo", str(SLO), "--out-dir", str(tmp_path)],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / rules_mod.PLAIN_PATH).read_text() == (ROOT / rules_mod.PLAIN_PATH).read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text("kv_cache: {critical: 2}\n")
    r = subprocess.run(["python", "-m", "exporter", "rules", "--slo", str(bad)], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "kv_cache.critical" in r.stderr


@pytest.mark.prometheus
def test_promtool_checks_both_files(tmp_path):
    r = subprocess.run(["promtool", "check", "rules", str(ROOT / rules_mod.PLAIN_PATH)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    spec = yaml.safe_load((ROOT / rules_mod.OPERATOR_PATH).read_text())["spec"]
    f = tmp_path / "from-operator.yml"
    f.write_text(yaml.safe_dump(spec))
    r = subprocess.run(["promtool", "check", "rules", str(f)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_slo_changes_reach_the_rules(tmp_path):
    f = tmp_path / "slo.yaml"
    f.write_text('selector: \'namespace="prod"\'\nobjectives: {ttft_p95_seconds: 2}\nlong_prompt: {tokens: 8000}\n'
                 'for: {VLLMKVCacheExhausted: 30s}\navailability_sli: engine\n')
    text = rules_mod.render_plain(load_slo(str(f)))
    assert 'vllm:kv_cache_usage_perc{namespace="prod"}' in text
    assert 'le="10000.0"' in text
    assert '{quantile="0.95"} > 2' in text
    assert "for: 30s" in text
    assert 'finished_reason!="abort"' in text and "http_requests_total" not in text


@pytest.mark.parametrize("body,needle", [
    ("objectives: {availability: 1}\n", "objectives.availability"),
    ("for: {NoSuchAlert: 5m}\n", "for.NoSuchAlert"),
    ("for: {VLLMTTFTHigh: soon}\n", "alerts.VLLMTTFTHigh.for"),
    ("alerts: {VLLMTTFTHigh: {for: 5m, page: true}}\n", "alerts.VLLMTTFTHigh.page"),
    ("alerts: {NoSuchAlert: {for: 5m}}\n", "alerts.NoSuchAlert"),
    ("burn_rates: {page: [{long: 5m, short: 1h, factor: 14.4}]}\n", "burn_rates.page[0]"),
    ("windows: {rate: fast}\n", "windows.rate"),
    ("bogus: 1\n", "bogus"),
    ("availability_sli: dns\n", "availability_sli"),
    ("selector: '{a=\"b\"}'\n", "selector"),
    ("alerts: {VLLMTTFTHigh: {enabled: maybe}}\n", "alerts.VLLMTTFTHigh.enabled"),
    ("alerts: {VLLMTTFTHigh: {severity: page}}\n", "alerts.VLLMTTFTHigh.severity"),
    ("alerts: {VLLMTTFTHigh: {labels: {bad-name: x}}}\n", "alerts.VLLMTTFTHigh.labels.bad-name"),
    ("labels: {team: [a, b]}\n", "labels.team"),
    ("alerts: {VLLMTTFTHigh: {keep_firing_for: forever}}\n", "alerts.VLLMTTFTHigh.keep_firing_for"),
])
def test_bad_slo_files_are_refused(tmp_path, body, needle):
    """A wrong SLO file is one line naming the key."""
    f = tmp_path / "slo.yaml"
    f.write_text(body)
    with pytest.raises(ConfigError) as e:
        load_slo(str(f))
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_a_file_written_for_an_earlier_release_with_target_seen_step_still_loads(tmp_path):
    """windows.target_seen_step (the step of the raw subquery earlier releases read targets with)
    means nothing now that the answering targets are recorded: a file that sets it loads, its other
    windows taken as written."""
    f = tmp_path / "slo.yaml"
    f.write_text("windows: {target_seen: 2h, target_seen_step: 1m}\n")
    slo = load_slo(str(f))
    assert slo["windows"]["target_seen"] == "2h" and "target_seen_step" not in slo["windows"]
    assert "[2h]" in rules_mod.render_plain(slo)


def test_le_for_matches_vllm_bucket_strings():
    assert rules_mod.le_for(4000) == "5000.0"
    assert rules_mod.le_for(5000) == "5000.0"
    assert rules_mod.le_for(8000) == "10000.0"
    assert rules_mod.le_for(1500) == "2000.0"
    bounds = {dict(s.labels)["le"] for s in parse((VLLM_PAGES / "after_load.txt").read_text()).samples
              if s.name == "vllm:request_prompt_tokens_bucket"}
    assert rules_mod.le_for(4000) in bounds


# -- every name a rule reads exists --------------------------------------------------------------

from promql_names import known_names, metric_names  # noqa: E402


def test_every_metric_a_rule_reads_exists_in_real_output():
    data = yaml.safe_load((ROOT / rules_mod.PLAIN_PATH).read_text())
    used = set()
    for g in data["groups"]:
        for r in g["rules"]:
            used |= metric_names(r["expr"])
    unknown = used - known_names()
    assert not unknown, f"rules read metrics no real output has: {sorted(unknown)}"
    # and the checker itself sees the names it should
    assert {"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "vllm_sidecar_gpu_busy_low_throughput",
            "http_requests_total", "vllm:request_prompt_tokens_bucket"} <= used


def test_every_slo_override_takes_effect(tmp_path):
    """Per alert: enabled, severity, for, keep_firing_for, extra labels and annotations; for every
    rule: extra labels; a runbook URL. Each shows in the rendered files."""
    f = tmp_path / "slo.yaml"
    f.write_text(
        "runbook_base_url: https://wiki.example.org/llm/runbooks/\n"
        "labels: {team: llm-serving}\n"
        "alerts:\n"
        "  VLLMPrefixCacheHitRatioLow: {enabled: false}\n"
        "  VLLMTTFTHigh: {severity: critical, for: 7m, keep_firing_for: 20m, labels: {pager: primary},\n"
        "                 annotations: {dashboard: https://grafana.example.org/d/vllm-overview}}\n")
    slo = load_slo(str(f))
    groups = yaml.safe_load(rules_mod.render_plain(slo))["groups"]
    rules = [r for g in groups for r in g["rules"]]  # the alerting, slow alerts' and views' groups
    alerts = {r["alert"]: r for r in rules if "alert" in r}
    assert "VLLMPrefixCacheHitRatioLow" not in alerts and "VLLMReplicaOutlier" in alerts
    t = alerts["VLLMTTFTHigh"]
    assert (t["for"], t["keep_firing_for"]) == ("7m", "20m")
    assert t["labels"] == {"severity": "critical", "team": "llm-serving", "pager": "primary"}
    assert t["annotations"]["dashboard"] == "https://grafana.example.org/d/vllm-overview"
    assert t["annotations"]["runbook_url"] == "https://wiki.example.org/llm/runbooks/VLLMTTFTHigh.md"
    assert "runbook" not in t["annotations"]  # the URL is there: no steps in the alert
    assert all(r["labels"]["team"] == "llm-serving" for r in rules)  # recording rules too
    assert alerts["VLLMKVCacheExhausted"]["labels"] == {"severity": "critical", "team": "llm-serving"}
    # the runbook says what the SLO says
    book = rules_mod.rendered_files(slo)["docs/runbooks/VLLMTTFTHigh.md"]
    assert "**Severity:** critical" in book and "7 minutes" in book and "20 minutes" in book




@pytest.mark.prometheus
def test_promtool_rule_labels_from_the_slo_break_no_rule(tmp_path):
    """With the SLO's ``labels`` (every rule, recorded series included, carries them) a rule that
    joins a recorded series with an aggregation by ``or`` must still match on the replica: otherwise
    both sides survive, and are the same series once the rule's labels are added, and Prometheus
    refuses the rule's whole result. A pod with no GPU series (2 GPUs from the SLO file) and 5xx
    answers over HTTP (availability_sli http): its GPU count, cost and failed requests are recorded,
    each once, with the team label."""
    from promseries import counter, fmt_series, in_file_order, promtool, series, vllm_labels

    slo = load_slo(None)
    slo["labels"] = {"team": "llm"}
    slo["availability_sli"] = "http"
    rules = tmp_path / "labelled.rules.yml"
    rules.write_text(rules_mod.render_plain(slo))
    pod = vllm_labels(pod="p")
    http = {k: pod[k] for k in ("namespace", "pod", "job", "instance")}
    inputs = [series("vllm:num_requests_running", pod, [2] * 21),
              series("vllm:request_success_total", {**pod, "finished_reason": "stop"}, counter(lambda m: 60, 20)),
              series("http_requests_total", {**http, "handler": "/v1/completions", "status": "2xx"}, counter(lambda m: 54, 20)),
              series("http_requests_total", {**http, "handler": "/v1/completions", "status": "5xx"}, counter(lambda m: 6, 20))]
    out = {"namespace": "llm", "pod": "p", "model_name": "llama-70b", "team": "llm"}
    gpus, errors = "namespace_pod_model:vllm_sidecar_gpus:count", "namespace_pod_model:vllm_availability_errors:rate5m"
    test = {"interval": "1m", "input_series": inputs, "promql_expr_test": [
        {"expr": gpus, "eval_time": "15m", "exp_samples": [{"labels": fmt_series(gpus, out), "value": 2}]},
        {"expr": errors, "eval_time": "15m", "exp_samples": [{"labels": fmt_series(errors, out), "value": 0.1}]}]}
    f = tmp_path / "test.yml"
    f.write_text(yaml.safe_dump({"rule_files": [str(rules)], "evaluation_interval": "1m", **in_file_order(rules),
                                 "tests": [test]}, sort_keys=False, width=10_000))
    r = subprocess.run([promtool(), "test", "rules", str(f)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
