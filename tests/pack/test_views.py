"""The pack's four groups (exporter/pack/cadence.py): the alerting group at every evaluation, the
alerts that wait ``steady_for`` or longer every ``steady_interval``, those that wait ``slow_for`` or
longer every ``slow_interval``, and the views, the recording rules no alert reads, every
``views_interval`` (exporter/pack/views.py)."""

import re

import pytest
import yaml

from conftest import ROOT
from exporter.analysis.rulefile import groups_from_data
from exporter.analysis.rulemanager import evaluation_order
from exporter.pack import rules as rules_mod
from exporter.pack.context import Ctx
from exporter.pack.recording import recording_rules
from exporter.pack.ruleyaml import GROUP, SLOW_GROUP, STEADY_GROUP, VIEWS_GROUP
from exporter.pack.vmalert import render_vmalert
from exporter.slo import load_slo, seconds

NAME = re.compile(r"[A-Za-z_][\w]*:[\w:]*[\w]")


def _groups(text):
    return {g["name"]: g for g in yaml.safe_load(text)["groups"]}


def test_no_alert_reads_a_view_and_the_views_are_the_dashboards_figures():
    groups = _groups((ROOT / rules_mod.PLAIN_PATH).read_text())
    assert list(groups) == [GROUP, STEADY_GROUP, SLOW_GROUP, VIEWS_GROUP]
    assert groups[VIEWS_GROUP]["interval"] == load_slo(None)["views_interval"] == "4m"
    views = {r["record"] for r in groups[VIEWS_GROUP]["rules"]}
    main = groups[GROUP]["rules"] + groups[STEADY_GROUP]["rules"] + groups[SLOW_GROUP]["rules"]
    # nothing of the alerting group (recording rules, alerts, their annotations' queries) names a view
    for r in main:
        read = set(NAME.findall(r["expr"] + " ".join((r.get("annotations") or {}).values())))
        assert not read & views, (r.get("record") or r.get("alert"), read & views)
    # what the capacity, cost and efficiency panels plot is there; no alert is in the views' group
    assert {"namespace_model:vllm_generation_tokens_headroom:ratio", "namespace_model:vllm_cost_per_hour:sum",
            "namespace_model:vllm_generation_tokens_per_joule:ratio_rate5m"} <= views
    assert not [r for r in groups[VIEWS_GROUP]["rules"] if "alert" in r]
    assert len(views) >= 20 and len([r for r in main if "record" in r]) > len(views)
    # a view reads only what is recorded before it: the alerting group's rules or the views above it
    recorded = {r["record"] for r in main if "record" in r}
    for r in groups[VIEWS_GROUP]["rules"]:
        own = {n for n in NAME.findall(r["expr"]) if n in views}
        assert own <= recorded, r["record"]
        recorded.add(r["record"])


def test_the_slow_group_holds_the_alerts_that_wait_slow_for_and_what_only_they_read():
    slo = load_slo(None)
    groups = _groups((ROOT / rules_mod.PLAIN_PATH).read_text())
    assert groups[SLOW_GROUP]["interval"] == slo["slow_interval"] == "2m" and slo["slow_for"] == "15m"
    fast, slow = groups[GROUP]["rules"], groups[SLOW_GROUP]["rules"]
    assert {r["alert"] for r in slow if "alert" in r} == {
        "VLLMReplicaOutlier", "VLLMPrefixCacheHitRatioLow", "VLLMErrorBudgetBurn", "VLLMSpecDecodeAcceptanceLow"}
    # every alert of the slow group waits 15 minutes or more; every other one less, the pages first
    assert all(seconds(r["for"]) >= 900 for r in slow if "alert" in r)
    assert all(seconds(r["for"]) < 900 for r in fast if "alert" in r)
    assert {"VLLMKVCacheExhausted", "VLLMPreemptionsSustained", "VLLMGPUBusyLowThroughput",
            "VLLMCorruptedRequests", "VLLMTargetDown", "VLLMLongPromptSurge"} <= {r["alert"] for r in fast if "alert" in r}
    # the ticket-level burn is slow, the page stays at every evaluation
    burns = {(g, r["labels"]["severity"]) for g in (GROUP, SLOW_GROUP) for r in groups[g]["rules"]
             if r.get("alert") == "VLLMErrorBudgetBurn"}
    assert burns == {(GROUP, "critical"), (SLOW_GROUP, "warning")}
    # the alerting group reads of what the slow group records only its baselines; the slow group
    # reads what the groups before it recorded (the TTFT p95 its outlier compares) and records what
    # only it reads
    slow_records = {r["record"] for r in slow if "record" in r}
    assert "namespace_pod_model:vllm_time_to_first_token_seconds_p95:ratio_to_peer_median" in slow_records
    baselines = {r.record for r in recording_rules(Ctx(slo)) if r.baseline}
    assert baselines <= slow_records and "namespace_pod_target:vllm_sidecar_target_up:down_expected" not in baselines
    read_by_fast = set()
    for r in fast:
        read = set(NAME.findall(r["expr"] + " ".join((r.get("annotations") or {}).values())))
        assert read & slow_records <= baselines, (r.get("record") or r.get("alert"), read & slow_records - baselines)
        read_by_fast |= read & slow_records
    assert read_by_fast == baselines  # each baseline is one the alerts read
    # ... and what the steady group records (the TTFT p95 of the replica its outlier compares,
    # recorded for the steady TTFT alert)
    assert "namespace_pod_model:vllm_time_to_first_token_seconds:histogram_quantile5m" in {
        r["record"] for r in groups[STEADY_GROUP]["rules"] if "record" in r}


def test_the_steady_group_holds_the_alerts_that_wait_steady_for_and_no_page():
    slo = load_slo(None)
    groups = _groups((ROOT / rules_mod.PLAIN_PATH).read_text())
    assert groups[STEADY_GROUP]["interval"] == slo["steady_interval"] == "1m" and slo["steady_for"] == "5m"
    fast, steady = groups[GROUP]["rules"], groups[STEADY_GROUP]["rules"]
    alerts = {(r["alert"], r["labels"]["severity"]) for r in steady if "alert" in r}
    assert {a for a, _ in alerts} == {
        "VLLMTTFTHigh", "VLLMTTFTMeanHigh", "VLLMInterTokenLatencyHigh", "VLLMErrorRatioHigh", "VLLMSidecarInputMissing",
        "GPUThermalThrottling", "VLLMKVTransferSlow", "VLLMKVLeasesExpiring", "VLLMDisaggregationImbalance",
        "VLLMQueueBuildup"}
    # each waits 5 to 15 minutes (its evaluation interval a fifth of its wait at most); no page is here
    assert all(300 <= seconds(r["for"]) < 900 for r in steady if "alert" in r)
    assert all(seconds(r["for"]) < 300 for r in fast if "alert" in r)
    assert {s for _, s in alerts} == {"warning"}
    # the error ratio's warning (10 minutes) is steady, its page (2 minutes) at every evaluation
    ratio = {(g, r["labels"]["severity"]) for g in (GROUP, STEADY_GROUP) for r in groups[g]["rules"]
             if r.get("alert") == "VLLMErrorRatioHigh"}
    assert ratio == {(GROUP, "critical"), (STEADY_GROUP, "warning")}
    # the steady group records what only its alerts read (the TTFT p95 and mean, the ITL mean, the
    # P/D sides); nothing of the alerting group reads those
    records = {r["record"] for r in steady if "record" in r}
    assert {"namespace_pod_model:vllm_time_to_first_token_seconds:mean5m",
            "namespace_pod_model:vllm_inter_token_latency_seconds:mean5m", "namespace_model:vllm_side_load:ratio"} <= records
    for r in fast:
        read = set(NAME.findall(r["expr"] + " ".join((r.get("annotations") or {}).values())))
        assert not read & records, (r.get("record") or r.get("alert"), read & records)


def test_a_zero_interval_keeps_the_same_rules_in_fewer_groups():
    slo = load_slo(None)
    four = _groups(rules_mod.render_plain(slo))
    key = lambda rs: sorted(yaml.safe_dump(r, sort_keys=True) for r in rs)  # noqa: E731
    every = key([r for g in four.values() for r in g["rules"]])
    slo["steady_interval"] = "0s"
    three = _groups(rules_mod.render_plain(slo))
    assert list(three) == [GROUP, SLOW_GROUP, VIEWS_GROUP] and key([r for g in three.values() for r in g["rules"]]) == every
    assert three[SLOW_GROUP] == four[SLOW_GROUP]
    slo["slow_interval"] = "0s"
    two = _groups(rules_mod.render_plain(slo))
    assert list(two) == [GROUP, VIEWS_GROUP] and key(two[GROUP]["rules"] + two[VIEWS_GROUP]["rules"]) == every
    assert two[VIEWS_GROUP] == three[VIEWS_GROUP]
    slo["views_interval"] = "0s"
    one = _groups(rules_mod.render_plain(slo))
    assert list(one) == [GROUP] and key(one[GROUP]["rules"]) == every
    slo["slow_interval"] = "2m"
    fast_and_slow = _groups(rules_mod.render_plain(slo))
    assert list(fast_and_slow) == [GROUP, SLOW_GROUP]
    assert key(fast_and_slow[GROUP]["rules"] + fast_and_slow[SLOW_GROUP]["rules"]) == every


def test_every_render_runs_each_group_at_its_interval_and_vmalert_the_alerts_at_their_own():
    """promtool's unit tests evaluate every group at the test's interval, so the views' and the slow
    alerts' cadence is the group's ``interval`` field, which Prometheus, the PrometheusRule (prometheus-operator) and
    vmalert each honour."""
    from exporter.pack.vmalert import VMALERT_PATH

    operator = yaml.safe_load((ROOT / rules_mod.OPERATOR_PATH).read_text())["spec"]["groups"]
    vm = yaml.safe_load((ROOT / VMALERT_PATH).read_text())["groups"]
    assert [(g["name"], g.get("interval")) for g in operator] == [
        (GROUP, None), (STEADY_GROUP, "1m"), (SLOW_GROUP, "2m"), (VIEWS_GROUP, "4m")]
    assert [(g["name"], g["interval"]) for g in vm] == [
        (GROUP, "1m"), (STEADY_GROUP, "1m"), (SLOW_GROUP, "2m"), (VIEWS_GROUP, "4m")]
    assert {r["record"] for r in vm[3]["rules"]} == {r["record"] for r in operator[3]["rules"]}
    # vmalert's stand-ins for keep_firing_for count the evaluations of their own group: the
    # outlier's 15 minutes are 8 evaluations at 2m (and 9 to have held them), not 15 at 1m
    held = next(r for r in vm[2]["rules"] if r.get("record") == "alert:VLLMReplicaOutlier:held")["expr"]
    assert held == "count_over_time(alert:VLLMReplicaOutlier:condition[1020s]) >= 9"


@pytest.mark.parametrize("steady, slow, shown", [(a, b, c) for a in ("1m", "0s") for b in ("2m", "0s") for c in ("2m", "0s")])
def test_no_rule_reads_a_record_written_by_a_later_group_or_a_later_rule(steady, slow, shown):
    """Whatever the three intervals, every recorded series a rule reads (in its expression or an
    annotation's query) is written before it (by an earlier group, or earlier in its own group), or
    is a baseline of the slow group; and the backtest engine finds an order that evaluates every
    writer before its readers (so it runs in blocks, not one step at a time)."""
    slo = load_slo(None)
    slo["steady_interval"], slo["slow_interval"], slo["views_interval"] = steady, slow, shown
    text = rules_mod.render_plain(slo)
    groups = yaml.safe_load(text)["groups"]
    assert [g["name"] for g in groups] == [n for n, on in ((GROUP, True), (STEADY_GROUP, steady != "0s"),
                                                             (SLOW_GROUP, slow != "0s"), (VIEWS_GROUP, shown != "0s")) if on]
    every = {r["record"] for g in groups for r in g["rules"] if "record" in r}
    slow_records = {r["record"] for g in groups if g["name"] == SLOW_GROUP for r in g["rules"] if "record" in r}
    baselines = {r.record for r in recording_rules(Ctx(slo)) if r.baseline} & slow_records
    assert bool(baselines) == (slow != "0s")
    written = set()
    for g in groups:
        for r in g["rules"]:
            read = set(NAME.findall(r["expr"] + " ".join((r.get("annotations") or {}).values()))) & every
            assert read - baselines <= written, (g["name"], r.get("record") or r.get("alert"), read - written)
            if "record" in r:
                written.add(r["record"])
    parsed = groups_from_data(groups, "pack")
    assert evaluation_order([r for g in parsed for r in g.rules]) is not None


@pytest.mark.parametrize("variant", ["slow alerts disabled", "slow_for beyond every wait"])
def test_the_baselines_are_recorded_where_no_alert_waits_slow_for(variant):
    """With no alert in the slow group, the group is still rendered with the baselines the faster
    alerts read: every recorded name a rule reads is recorded by some rule, in every file."""
    slo = load_slo(None)
    if variant == "slow_for beyond every wait":
        slo["slow_for"] = "100h"
    else:
        for cfg in slo["alerts"].values():
            if seconds(cfg["for"]) >= seconds(slo["slow_for"]):
                cfg["enabled"] = False
    for text in (rules_mod.render_plain(slo), render_vmalert(slo)):
        groups = yaml.safe_load(text)["groups"]
        slow = next(g for g in groups if g["name"] == SLOW_GROUP)
        assert not [r for r in slow["rules"] if "alert" in r]
        every = {r["record"] for g in groups for r in g["rules"] if "record" in r}
        assert "job_instance_target:vllm_scrape_target:max_over_time1h" in every
        for g in groups:
            for r in g["rules"]:
                read = {n for n in NAME.findall(r["expr"]) if n.startswith(("namespace", "job_instance"))}
                assert read <= every, (r.get("record") or r.get("alert"), read - every)
