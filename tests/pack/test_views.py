"""The views: the recording rules no alert reads, evaluated in a group of their own every
``views_interval`` (exporter/pack/views.py)."""

import re

import yaml

from conftest import ROOT
from exporter.pack import rules as rules_mod
from exporter.pack.ruleyaml import GROUP, VIEWS_GROUP
from exporter.slo import load_slo

NAME = re.compile(r"[A-Za-z_][\w]*:[\w:]*[\w]")


def _groups(text):
    return {g["name"]: g for g in yaml.safe_load(text)["groups"]}


def test_no_alert_reads_a_view_and_the_views_are_the_dashboards_figures():
    groups = _groups((ROOT / rules_mod.PLAIN_PATH).read_text())
    assert set(groups) == {GROUP, VIEWS_GROUP}
    assert groups[VIEWS_GROUP]["interval"] == load_slo(None)["views_interval"] == "2m"
    views = {r["record"] for r in groups[VIEWS_GROUP]["rules"]}
    main = groups[GROUP]["rules"]
    # nothing of the alerting group (recording rules, alerts, their annotations' queries) names a view
    for r in main:
        read = set(NAME.findall(r["expr"] + " ".join((r.get("annotations") or {}).values())))
        assert not read & views, (r.get("record") or r.get("alert"), read & views)
    # what the capacity, cost and efficiency panels plot is there; every alert is in the alerting group
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


def test_views_interval_0s_keeps_one_group_with_the_same_rules():
    slo = load_slo(None)
    two = _groups(rules_mod.render_plain(slo))
    slo["views_interval"] = "0s"
    one = _groups(rules_mod.render_plain(slo))
    assert list(one) == [GROUP]
    key = lambda rs: sorted(yaml.safe_dump(r, sort_keys=True) for r in rs)  # noqa: E731
    assert key(one[GROUP]["rules"]) == key(two[GROUP]["rules"] + two[VIEWS_GROUP]["rules"])


def test_every_render_runs_the_views_at_their_interval_and_vmalert_the_alerts_at_its_own():
    """promtool's unit tests evaluate every group at the test's interval, so the views' cadence is
    the group's ``interval`` field, which Prometheus, the PrometheusRule (prometheus-operator) and
    vmalert each honour."""
    from exporter.pack.vmalert import VMALERT_PATH

    operator = yaml.safe_load((ROOT / rules_mod.OPERATOR_PATH).read_text())["spec"]["groups"]
    vm = yaml.safe_load((ROOT / VMALERT_PATH).read_text())["groups"]
    assert [(g["name"], g.get("interval")) for g in operator] == [(GROUP, None), (VIEWS_GROUP, "2m")]
    assert [(g["name"], g["interval"]) for g in vm] == [(GROUP, "1m"), (VIEWS_GROUP, "2m")]
    assert {r["record"] for r in vm[1]["rules"]} == {r["record"] for r in operator[1]["rules"]}
