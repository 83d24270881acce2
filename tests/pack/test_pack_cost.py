"""What the pack asks of Prometheus at every evaluation: no per-replica series is read over more
than an hour. A read over days costs its window's samples for every series it selects, and
replicas are many and renamed at every rollout (each name a series of its own that stays in the
window for its whole length), so the long windows read per-model series only (the batch ceiling
too: the highest uncontended batch of the model's replicas, recorded per model)."""

import pytest
import yaml

from conftest import ROOT
from exporter.analysis.promql.ast import MatrixSelector, SubqueryExpr, VectorSelector, walk
from exporter.analysis.promql.parser import parse
from exporter.pack import rules as rules_mod
from exporter.slo import load_slo
from promseries import fmt_series, gauge, run_promtool, series, vllm_labels

HOUR_MS = 3_600_000


def long_reads(rules_text: str, over_ms: int):
    """{series name: longest window in ms} for every selector read over more than ``over_ms``."""
    out = {}
    for group in yaml.safe_load(rules_text)["groups"]:
        for rule in group["rules"]:
            for node in walk(parse(rule["expr"])):
                if isinstance(node, MatrixSelector) and node.range_ms > over_ms:
                    selectors, rng = [node.selector], node.range_ms
                elif isinstance(node, SubqueryExpr) and node.range_ms > over_ms:
                    selectors, rng = [n for n in walk(node.expr) if isinstance(n, VectorSelector)], node.range_ms
                else:
                    continue
                for sel in selectors:
                    out[sel.name] = max(out.get(sel.name, 0), rng)
    return out


def test_long_windows_read_per_model_series_only():
    text = (ROOT / rules_mod.PLAIN_PATH).read_text()
    reads = long_reads(text, HOUR_MS)
    # the check can see what it looks for: the pack does read days (burn rates, baselines, capacity)
    assert max(reads.values()) >= 14 * 24 * HOUR_MS and len(reads) >= 5, reads
    per_replica = {name for name in reads if not name.startswith("namespace_model:")}
    assert per_replica == set(), per_replica
    assert any(n.startswith("namespace_model:vllm_requests_running_uncontended:max") for n in reads)


def test_targets_seen_are_remembered_by_a_recorded_series_not_read_again_from_raw_ones():
    """Whether a target was seen within windows.target_seen (an hour) is read from the pack's own
    record of the targets that answer (one series a target, written at every evaluation), never
    from vLLM's or the sidecar's series over the hour (a subquery of 60 steps over every target).
    The hour is a baseline the slow group records (up to slow_interval old); the alerting group
    adds the targets seen within Prometheus' lookback, so a target is known from its first answer."""
    groups = yaml.safe_load((ROOT / rules_mod.PLAIN_PATH).read_text())["groups"]
    rules = {r.get("record"): r["expr"] for g in groups for r in g["rules"]}
    group_of = {r.get("record"): g["name"] for g in groups for r in g["rules"]}
    present = "namespace_pod_target_job_instance:vllm_scrape_target:present"
    seen = "job_instance_target:vllm_scrape_target:max_over_time1h"
    up = "namespace_pod_target:up:down_seen1h"
    nodes = list(walk(parse(rules[up])))
    assert not [n for n in nodes if isinstance(n, SubqueryExpr)]
    assert {n.selector.name: n.range_ms for n in nodes if isinstance(n, MatrixSelector)} == {present: 5 * 60_000}
    assert {n.name for n in nodes if isinstance(n, VectorSelector)} == {"up", present, seen}
    nodes = list(walk(parse(rules[seen])))
    assert {n.selector.name: n.range_ms for n in nodes if isinstance(n, MatrixSelector)} == {present: HOUR_MS}
    assert group_of[seen] == "vllm-sidecar-exporter-slow"
    assert group_of[up] == group_of[present] == "vllm-sidecar-exporter"
    assert {n.name for n in walk(parse(rules[present])) if isinstance(n, VectorSelector)} == {
        "vllm:num_requests_running", "vllm_sidecar_build_info"}


@pytest.mark.prometheus
def test_promtool_a_target_seen_within_the_hour_and_gone_reads_down_and_one_gone_longer_is_forgotten(tmp_path):
    """vLLM's target of pod a answers for 10 minutes and then fails (up 0): down (0) at minute 30,
    20 minutes after it was last seen, and no longer looked at by minute 77 (its last series is
    visible for the lookback, to minute 15; the hour is the slow group's record, read as it was
    one evaluation before). Pod b's vLLM and sidecar answer throughout: never written (only the
    targets down are)."""
    seen = "namespace_pod_target:up:down_seen1h"
    a, b = vllm_labels(pod="a"), vllm_labels(pod="b")
    sidecar_b = {"namespace": "llm", "pod": "b", "job": "llm/sidecar", "instance": "b:9400"}
    target = lambda lab: {k: lab[k] for k in ("namespace", "pod", "job", "instance")}  # noqa: E731
    inputs = [
        series("up", target(a), gauge(lambda m: 1 if m < 10 else 0, 80)),
        series("vllm:num_requests_running", a, gauge(lambda m: 3 if m < 10 else None, 80)),
        series("up", target(b), gauge(lambda m: 1, 80)),
        series("vllm:num_requests_running", b, gauge(lambda m: 3, 80)),
        series("up", sidecar_b, gauge(lambda m: 1, 80)),
        series("vllm_sidecar_build_info", {**sidecar_b, "version": "1"}, gauge(lambda m: 1, 80)),
    ]
    out = lambda pod, t, v: {"labels": fmt_series(seen, {"namespace": "llm", "pod": pod, "target": t}), "value": v}  # noqa: E731
    case = _expr_case(inputs, [(30, seen, [out("a", "vllm", 0)]), (77, seen, [])], minutes=80)
    r = run_promtool(tmp_path, [case])
    assert r.returncode == 0, r.stdout + r.stderr


def test_reads_over_days_take_hourly_aggregates():
    """Every read over a day or more (windows.history_from) of a recorded series reads its
    hourly aggregates (windows.history_step) at an hourly step, or (a quantile) one sample every
    windows.quantile_step: no rule reads a day of a 30 s series sample by sample."""
    for group in yaml.safe_load((ROOT / rules_mod.PLAIN_PATH).read_text())["groups"]:
        for rule in group["rules"]:
            for node in walk(parse(rule["expr"])):
                if isinstance(node, MatrixSelector):
                    assert node.range_ms < 24 * HOUR_MS, (rule.get("record") or rule.get("alert"), rule["expr"])
                elif isinstance(node, SubqueryExpr) and node.range_ms >= 24 * HOUR_MS:
                    assert node.step_ms in (HOUR_MS, 5 * 60_000), rule["expr"]


def test_the_ceiling_is_the_uncontended_batch_or_the_operators_max_num_seqs():
    def rules(slo):
        return {r.get("record"): r["expr"] for g in yaml.safe_load(rules_mod.render_plain(slo))["groups"]
                for r in g["rules"]}
    learned = rules(load_slo(None))
    assert learned["namespace_model:vllm_requests_running_uncontended:max"] == (
        "max by (cluster, namespace, model_name) (\n  sum by (cluster, namespace, pod, model_name) "
        "(vllm:num_requests_running{vllm_sidecar=\"\"})\n"
        "  and on (cluster, namespace, pod, model_name)\n"
        "  (namespace_pod_model:vllm_requests_waiting_capacity_reason:sum == 0)\n)")
    # the raw path reads vLLM's series of the pods without a sidecar only
    reason = learned["namespace_pod_model:vllm_requests_waiting_capacity_reason:sum"]
    assert reason.count('vllm_sidecar=""') == 2 and reason.count('vllm:num_requests_waiting') == 2
    hourly = "namespace_model:vllm_requests_running_uncontended:max_max_over_time1h"
    assert learned[hourly] == "max_over_time(namespace_model:vllm_requests_running_uncontended:max[1h])"
    # the day's hourly maxima and this hour's, each read once (longreads.both)
    part = '"longread_part"'
    assert learned["namespace_model:vllm_batch_ceiling:max"] == (
        f"max without (longread_part) (\n  label_replace(max_over_time({hourly}[1d:1h]), {part}, \"steps\", \"\", \"\")"
        f"\n  or\n  label_replace({hourly}, {part}, \"current\", \"\", \"\")\n)")
    slo = load_slo(None)
    slo["kv_cache"]["max_num_seqs"] = 20
    assert rules(slo)["namespace_model:vllm_batch_ceiling:max"].endswith("* 0 + 20")


def test_a_renamed_replica_level_moves_the_check_with_it():
    """Replica labels from the SLO rename the levels; the reads stay per model under any names."""
    slo = load_slo(None)
    slo["replica_labels"] = ["cluster", "namespace", "pod"]
    text = rules_mod.render_plain(slo)
    reads = long_reads(text, HOUR_MS)
    assert {n for n in reads if not n.startswith("cluster_namespace_model:")} == set()
    assert any(n.startswith("cluster_namespace_model:vllm_requests_running_uncontended:max") for n in reads)


# -- the two cheaper reads, evaluated by promtool (Prometheus' rule engine) ------------------------

def _expr_case(input_series, checks, minutes=40):
    return {"interval": "1m", "input_series": input_series,
            "promql_expr_test": [{"expr": expr, "eval_time": f"{m}m", "exp_samples": exp} for m, expr, exp in checks]}


@pytest.mark.prometheus
def test_promtool_the_old_release_fallback_still_holds_on_old_pages_and_is_idle_on_current_ones(tmp_path):
    """A batch that ran at 32 for ten minutes with nothing waiting, then at 20 with 4 requests
    waiting, the cache half used. On a current page (vLLM's reason says deferred, not capacity)
    nobody waits for capacity: 0. On an old page (no waiting reason) every waiting request is a
    candidate, and below 0.9 of the ceiling (32, learned while nothing waited) they are held back
    by the cache: 4. The ceiling is per model and never learned from the contended batch."""
    cap = "namespace_pod_model:vllm_requests_waiting_capacity:sum"
    ceiling = "namespace_model:vllm_batch_ceiling:max"
    batch = gauge(lambda m: 32 if m < 10 else 20, 40)
    waits = gauge(lambda m: 0 if m < 10 else 4, 40)
    usage = gauge(lambda m: 0.5, 40)
    cur, old = vllm_labels(pod="cur"), vllm_labels(pod="old", engine=None)
    out = {"namespace": "llm", "model_name": "llama-70b"}
    cases = [
        _expr_case([series("vllm:num_requests_running", cur, batch),
                    series("vllm:kv_cache_usage_perc", cur, usage),
                    series("vllm:num_requests_waiting", cur, waits),
                    series("vllm:num_requests_waiting_by_reason", {**cur, "reason": "capacity"}, gauge(lambda m: 0, 40)),
                    series("vllm:num_requests_waiting_by_reason", {**cur, "reason": "deferred"}, waits)],
                   [(20, cap, [{"labels": fmt_series(cap, {**out, "pod": "cur"}), "value": 0}]),
                    (20, ceiling, [{"labels": fmt_series(ceiling, out), "value": 32}])]),
        _expr_case([series("vllm:num_requests_running", old, batch),
                    series("vllm:gpu_cache_usage_perc", old, usage),
                    series("vllm:num_requests_waiting", old, waits)],
                   [(5, cap, [{"labels": fmt_series(cap, {**out, "pod": "old"}), "value": 0}]),
                    (20, cap, [{"labels": fmt_series(cap, {**out, "pod": "old"}), "value": 4}]),
                    (20, ceiling, [{"labels": fmt_series(ceiling, out), "value": 32}])]),
    ]
    r = run_promtool(tmp_path, cases)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.prometheus
def test_promtool_the_sustainable_figure_keeps_the_best_of_replicas_long_gone(tmp_path):
    """The pack's own two rules (the best replica now, its maximum over the history) on replicas
    that come and go, as a rollout replaces them: the best level ever held (9, by a pod gone
    since minute 3) stays, while the best of the replicas serving now is 2."""
    data = yaml.safe_load((ROOT / rules_mod.PLAIN_PATH).read_text())
    best, hourly, sustainable = ("namespace_model:vllm_generation_tokens_sustained_per_replica:max",
                                 "namespace_model:vllm_generation_tokens_sustained_per_replica:max_max_over_time1h",
                                 "namespace_model:vllm_generation_tokens_sustainable_per_replica:max_over_time14d")
    chosen = [r for g in data["groups"] for r in g["rules"] if r.get("record") in (best, hourly, sustainable)]
    assert [r["record"] for r in chosen] == [best, hourly, sustainable]
    rules = tmp_path / "capacity.rules.yml"
    rules.write_text(yaml.safe_dump({"groups": [{"name": "capacity", "rules": chosen}]}, sort_keys=False))
    held = "namespace_pod_model:vllm_generation_tokens_within_slo:min_over_time10m"
    pod = {"namespace": "llm", "model_name": "llama-70b"}
    out = fmt_series(sustainable, pod)
    case = _expr_case(
        [{"series": fmt_series(held, {**pod, "pod": "a"}), "values": "5 9 7 _x37"},
         {"series": fmt_series(held, {**pod, "pod": "b"}), "values": "_x10 3 4 8 6 _x26"},
         {"series": fmt_series(held, {**pod, "pod": "c"}), "values": "_x30 2 2 2 2 2 2 2 2 2 2"}],
        [(0, sustainable, [{"labels": out, "value": 5}]),
         (38, sustainable, [{"labels": out, "value": 9}]),
         (38, best, [{"labels": fmt_series(best, pod), "value": 2}])])
    r = run_promtool(tmp_path, [case], rules_path=rules)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.prometheus
def test_promtool_a_long_read_takes_the_steps_and_the_current_step_each_once(tmp_path):
    """``longreads.both`` in Prometheus' engine: the max, min and sum of the steps' figure and the
    current step's, series by series, where both exist, where only the steps' does (a model whose
    series stopped this hour) and where only the current one does (a model seen for the first time);
    the label that tells the sides apart never reaches the result."""
    from exporter.pack.longreads import both

    steps, cur = "x_steps", "x_current"
    lab = {m: {"model_name": m} for m in ("both", "gone", "new")}
    inputs = [series(steps, lab["both"], [4] * 5), series(cur, lab["both"], [7] * 5),
              series(steps, lab["gone"], [6] * 5), series(cur, lab["new"], [2] * 5)]
    name = lambda m: fmt_series("", lab[m]).lstrip()  # noqa: E731 - labels only: an aggregation drops the name

    def checks(fn, want):
        return [(3, both(fn, steps, cur), [{"labels": name(m), "value": v} for m, v in want.items()])]

    case = _expr_case(inputs, checks("max", {"both": 7, "gone": 6, "new": 2})
                      + checks("min", {"both": 4, "gone": 6, "new": 2})
                      + checks("sum", {"both": 11, "gone": 6, "new": 2}), minutes=4)
    r = run_promtool(tmp_path, [case])
    assert r.returncode == 0, r.stdout + r.stderr


def test_no_rule_reads_the_sidecars_per_input_or_per_reason_series():
    """The sidecar serves one series for the question an alert asks of several: how many inputs are
    missing (one a pod, not one an input), whether a GPU is thermally throttled (one a GPU, not one
    a throttle reason). The per-input and per-reason series are for the runbooks' queries and the
    panels; no rule selects them at every evaluation (the missing inputs' names are asked only in the
    alert's description, when it fires)."""
    read = {n.name for g in yaml.safe_load((ROOT / rules_mod.PLAIN_PATH).read_text())["groups"]
            for r in g["rules"] for n in walk(parse(r["expr"])) if isinstance(n, VectorSelector)}
    assert {"vllm_sidecar_inputs_missing", "vllm_sidecar_gpu_thermal_throttle_active"} <= read
    assert not read & {"vllm_sidecar_input_missing", "vllm_sidecar_gpu_clock_throttle_active"}
