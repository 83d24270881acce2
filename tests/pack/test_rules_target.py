"""``rules --target vmalert``: the vmalert form of the pack on stdout, the file ``make rules`` writes,
and the helpers it adds (the rules themselves run on VictoriaMetrics in test_vmalert.py)."""

import yaml

from conftest import ROOT
from exporter.cli import main
from exporter.pack.vmalert import render_vmalert
from exporter.slo import load_slo


def test_rules_target_vmalert_prints_the_shipped_file(capsys):
    assert main(["rules", "--target", "vmalert"]) == 0
    out = capsys.readouterr().out
    assert out == render_vmalert(load_slo(None)) == (ROOT / "rules" / "vllm.vmalert.rules.yml").read_text()
    doc = yaml.safe_load(out)
    rules = [r for g in doc["groups"] for r in g["rules"]]
    assert [g["interval"] for g in doc["groups"]] == ["1m", "1m", "2m", "4m"]  # alerting, steady and slow alerts, views
    kff = {k for k, v in load_slo(None)["alerts"].items() if v.get("keep_firing_for", "0s") not in ("0s", "0m")}
    helpers = {r["record"].split(":")[1] for r in rules if r.get("record", "").startswith("alert:")}
    assert helpers == kff  # one set of helpers per alert that keeps firing, named by its key
    held = next(r for r in rules if r.get("record") == "alert:VLLMTTFTHigh:held")["expr"]
    assert held == "count_over_time(alert:VLLMTTFTHigh:condition[630s]) >= 11"  # for 10m at 1m: 11 evaluations
    alert = next(r for r in rules if r.get("alert") == "VLLMTTFTHigh")
    assert "keep_firing_for" not in alert and alert["expr"].endswith("max_over_time(alert:VLLMTTFTHigh:active[930s])")


def test_rules_target_vmalert_interval_and_a_bad_one(capsys):
    assert main(["rules", "--target", "vmalert", "--interval", "30s"]) == 0
    doc = yaml.safe_load(capsys.readouterr().out)
    held = next(r for r in doc["groups"][0]["rules"] if r.get("record") == "alert:VLLMGPUBusyLowThroughput:held")["expr"]
    assert doc["groups"][0]["interval"] == "30s" and held.endswith("[135s]) >= 5")  # for 2m at 30 s
    # the steady group keeps its own interval: TTFT's 10 minutes are 11 evaluations at 1m, the
    # queue's 5 minutes 6, whatever --interval says
    steady = {r.get("record"): r["expr"] for r in doc["groups"][1]["rules"]}
    assert doc["groups"][1]["interval"] == "1m" and steady["alert:VLLMTTFTHigh:held"].endswith("[630s]) >= 11")
    assert steady["alert:VLLMQueueBuildup:held"].endswith("[330s]) >= 6")
    assert main(["rules", "--target", "vmalert", "--interval", "soon"]) == 2
    assert "--interval" in capsys.readouterr().err
