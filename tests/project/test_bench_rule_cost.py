"""The quiet per-rule cost benchmark (bench/bench_rule_cost.py) against a real Prometheus: the
series it says each rule selects are what the rule's selectors select, so that its figures keep
meaning what the docs say as the code changes."""

import pytest
import yaml

from bench import bench_rule_cost as rc
from promtsdb import create_blocks

pytestmark = pytest.mark.prometheus

T0 = 1_700_000_000


def test_each_rules_selected_series_and_time_come_from_a_quiet_prometheus(tmp_path):
    lines = []
    for name, pods in (("x_total", "ab"), ("y", "abc")):
        lines.append(f"# TYPE {name.removesuffix('_total')} {'counter' if name.endswith('_total') else 'gauge'}")
        for pod in pods:
            for k in range(41):  # ten minutes every 15 s
                lines.append(f'{name}{{pod="{pod}"}} {k * 3 if name.endswith("_total") else 1} {T0 + 15 * k}')
    om = tmp_path / "data.om"
    om.write_text("\n".join(lines) + "\n# EOF\n")
    data = tmp_path / "tsdb"
    create_blocks(om, data)
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [
        {"record": "pod:x:rate5m", "expr": "sum by (pod) (rate(x_total[5m]))"},  # 2 series
        {"record": "pod:y:with_x", "expr": "y and on (pod) x_total"},  # 3 + 2
        {"alert": "YStuck", "expr": "max_over_time(y[5m]) > 0 unless y offset 1m"},  # 3 + 3
    ]}]}))
    costs = rc.quiet_costs(data, {"t": rules}, repeat=2, at=T0 + 400)
    got = costs["files"]["t"]
    assert [(x["rule"], x["series"]) for x in got["rules"]] == [("pod:x:rate5m", 2), ("pod:y:with_x", 5),
                                                                ("YStuck", 6)]
    assert got["series"] == 13 and costs["repeat"] == 2
    assert all(x["ms"] > 0 for x in got["rules"]) and got["total_ms"] == sum(x["ms"] for x in got["rules"])
    out = []
    rc.report(costs, out.append, top=1)
    assert out[0].startswith("t: 3 rules, ") and out[0].endswith("13 series selected") and len(out) == 2
