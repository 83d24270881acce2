"""The annotation-cost benchmark (bench/bench_annotations.py) against a real Prometheus: every
group it times holds one rule whose expression returns the asked number of series, the alerts
carry the pack's own annotation texts, and every group is sampled while its alerts are active, so
that the per-annotation figure in docs/performance.md keeps meaning what it says."""

import json

import pytest
import yaml

from bench import bench_annotations as ba

pytestmark = pytest.mark.prometheus


def test_the_groups_differ_only_in_their_annotations():
    groups = ba.rule_file(alerts=7, interval=5)["groups"]
    assert [g["name"] for g in groups] == ["record", "bare", *ba.KEYS, "all four", "four one-letter"]
    exprs = {g["rules"][0]["expr"] for g in groups}
    assert len(exprs) == 1 and exprs.pop().count("label_replace") == 7
    pack = next(r for g in yaml.safe_load(ba.PACK.read_text())["groups"] for r in g["rules"]
                if r.get("alert") == "VLLMTTFTHigh")
    by_name = {g["name"]: g["rules"][0] for g in groups}
    assert "alert" not in by_name["record"] and "annotations" not in by_name["bare"]
    assert by_name["all four"]["annotations"] == {k: pack["annotations"][k] for k in ba.KEYS}
    for k in ba.KEYS:
        assert by_name[k]["annotations"] == {k: pack["annotations"][k]}
    assert all(g["interval"] == "5s" for g in groups)


def test_a_short_run_samples_every_group_with_its_alerts_active(tmp_path, capsys):
    out = tmp_path / "a.json"
    assert ba.main(["--alerts", "5", "--interval", "1", "--samples", "3", "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert set(got["samples"]) == {"record", "bare", *ba.KEYS, "all four", "four one-letter"}
    assert all(len(v) == 3 and min(v) > 0 for v in got["samples"].values())
    assert got["active"] == {k: 5 for k in got["samples"] if k != "record"}
    assert "per annotation" in capsys.readouterr().out
