"""The bound of bench/sidecar_bound.py: which rules it replaces by one sidecar read, so that the
figures docs/performance.md quotes from it keep meaning what they say."""

from bench import sidecar_bound as sb
from exporter.pack.ruleyaml import GROUP, SLOW_GROUP

RULES = {"groups": [
    {"name": GROUP, "rules": [
        {"record": "namespace_pod_model:a:rate5m", "expr": "sum(rate(a_total[5m]))"},
        {"record": "namespace_pod_model:b:sum", "expr": "sum(b)"},
        {"record": "namespace_model:c:avg", "expr": "avg(c)"},
        {"alert": "X", "expr": "namespace_pod_model:a:rate5m > 1", "for": "5m"},
        {"alert": "Y", "expr": "namespace_pod_model:b:sum > 1"},
    ]},
    {"name": SLOW_GROUP, "rules": [{"record": "namespace_pod_model:d:rate5m", "expr": "sum(rate(d_total[5m]))"}]},
]}
SERIES = {"namespace_pod_model:a:rate5m": 500, "namespace_pod_model:b:sum": 100, "namespace_model:c:avg": 300,
          'X{severity="warning"}': 200, "Y": 50, "namespace_pod_model:d:rate5m": 900}


def exprs(rules):
    return {(g["name"], r.get("record") or r.get("alert")): r["expr"] for g in rules["groups"] for r in g["rules"]}


def test_records_replaces_the_alerting_groups_per_pod_records_that_select_more_than_the_bound():
    before, after = exprs(RULES), exprs(sb.bounded(RULES, SERIES, 100, alerts_too=False))
    changed = {k for k in before if before[k] != after[k]}
    assert changed == {(GROUP, "namespace_pod_model:a:rate5m")}
    assert after[(GROUP, "namespace_pod_model:a:rate5m")] == sb.ONE_READ.format(level="pod, model_name")
    assert RULES["groups"][0]["rules"][0]["expr"] == "sum(rate(a_total[5m]))"  # the input is not changed


def test_all_replaces_the_per_model_records_and_the_alerts_too_never_another_group():
    after = exprs(sb.bounded(RULES, SERIES, 100, alerts_too=True))
    assert after[(GROUP, "namespace_model:c:avg")] == sb.ONE_READ.format(level="model_name")
    assert after[(GROUP, "X")] == sb.ONE_READ.format(level="pod, model_name") + " > 2"
    assert after[(GROUP, "Y")] == "namespace_pod_model:b:sum > 1"  # 50 series: below the bound
    assert after[(SLOW_GROUP, "namespace_pod_model:d:rate5m")] == "sum(rate(d_total[5m]))"
