"""Two clusters in one ruler: the pack keeps them apart (the SLO's ``outer_labels``, default
``[cluster]``).

Two clusters run the same namespace, pod and model names with different loads: in cluster ``a``
the incident of test_incident_scenario hits ``vllm-2``, in cluster ``b`` it hits ``vllm-0``.
promtool evaluates the shipped rule file three times: over cluster a's series alone, over b's
alone (each as that cluster's own Prometheus has them, without any cluster label), and over both
merged, each series labelled with its cluster (as a global ruler sees them, the cluster being an
external label). Every recorded series and every firing alert of the merged run must be exactly
what the cluster's own run computed, plus its cluster label; and the same merged input through a
pack rendered with ``outer_labels: []`` must not be (so the comparison can fail).

The static test reads every rendered rule and dashboard query and finds any ``by (...)`` or
``on (...)`` label list without the outer labels.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
from pathlib import Path
from typing import Dict, List, Set, Tuple

import pytest
import yaml

from conftest import ROOT
from exporter.pack.rules import render_plain
from exporter.slo import load_slo
from incident import ONSET, PODS, TOTAL, replica
from promseries import RULES, in_file_order, promtool

pytestmark = pytest.mark.prometheus

RECORDED = '{__name__=~"namespace_pod_model:.+|namespace_model:.+"}'
EXPR_MINUTES = (ONSET - 30, ONSET + 3, ONSET + 6, ONSET + 12, TOTAL)
ALERT_FROM = ONSET - 10  # every evaluation from here to the end, every alert


def _cluster_inputs(bad_pod: str) -> List[dict]:
    out = []
    for pod in PODS:
        out += replica(pod, incident=(pod == bad_pod))
    return out


def _with_label(inputs: List[dict], name: str, value: str) -> List[dict]:
    out = []
    for s in inputs:
        text = s["series"]
        i = text.index("{")
        out.append({**s, "series": f'{text[:i + 1]}{name}="{value}", {text[i + 1:]}'.replace(", }", "}")})
    return out


Sample = Tuple[str, float]


def _promtool(tmp: Path, rule_file: Path, inputs: List[dict], tag: str) -> Tuple[Dict[int, Dict[str, float]],
                                                                               Dict[Tuple[int, str], Set[str]]]:
    """promtool's recorded series (per minute of EXPR_MINUTES) and firing alerts over ``inputs``."""
    doc = yaml.safe_load(rule_file.read_text())
    alertnames = sorted({r["alert"] for g in doc["groups"] for r in g["rules"] if "alert" in r})
    test = {"name": tag, "interval": "1m", "input_series": inputs,
            "alert_rule_test": [{"eval_time": f"{m}m", "alertname": a, "exp_alerts": []}
                                for m in range(ALERT_FROM, TOTAL + 1) for a in alertnames],
            "promql_expr_test": [{"expr": RECORDED, "eval_time": f"{m}m", "exp_samples": []} for m in EXPR_MINUTES]}
    f = tmp / f"two-clusters-{tag}.yml"
    f.write_text(yaml.safe_dump({"rule_files": [str(rule_file)], "evaluation_interval": "1m",
                                 **in_file_order(rule_file), "tests": [test]}, sort_keys=False, width=10_000))
    r = subprocess.run([promtool(), "test", "rules", str(f)], capture_output=True, text=True, timeout=900)
    text = r.stdout + r.stderr
    series: Dict[int, Dict[str, float]] = {}
    alerts: Dict[Tuple[int, str], Set[str]] = {}
    for block in re.split(r"\n(?=\s{4}(?:alertname|expr): )", text):
        am = re.match(r"\s{4}alertname: (\w+), time: (?:(\d+)h)?(?:(\d+)m)?", block)
        if am:
            got = block.split("got:", 1)[1]
            minute = int(am.group(2) or 0) * 60 + int(am.group(3) or 0)
            alerts[(minute, am.group(1))] = set(re.findall(r"Labels:\{(.*?)\}\n", got))
            continue
        em = re.match(r"\s{4}expr: .*?, time: (?:(\d+)h)?(?:(\d+)m)?,", block)
        if em:
            minute = int(em.group(1) or 0) * 60 + int(em.group(2) or 0)
            got = block.split("got:", 1)[1]
            series[minute] = {ls: float(v) for ls, v in re.findall(r"(\{.*?\}) (\S+?)(?:,|\n|$)", got)}
    assert set(series) == set(EXPR_MINUTES), f"promtool's report did not parse:\n{text[-3000:]}"
    return series, alerts


def _labelled(ls: str, cluster: str) -> str:
    """``{__name__="x", a="b"}`` with ``cluster="..."`` among its labels, sorted as promtool prints them."""
    pairs = re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', ls)
    pairs.append(("cluster", cluster))
    name = [p for p in pairs if p[0] == "__name__"]
    rest = sorted(p for p in pairs if p[0] != "__name__")
    return "{" + ", ".join(f'{k}="{v}"' for k, v in name + rest) + "}"


def _close(a: float, b: float) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b)) or abs(a - b) <= 1e-9 * max(abs(a), abs(b))


def _differences(alone: Dict[str, tuple], merged: tuple) -> List[str]:
    """Where the merged run differs from the union of the clusters' own runs."""
    m_series, m_alerts = merged
    diffs = []
    for minute in EXPR_MINUTES:
        want: Dict[str, float] = {}
        for cl, (series, _) in alone.items():
            want.update({_labelled(ls, cl): v for ls, v in series[minute].items()})
        got = m_series[minute]
        for ls in sorted(set(want) | set(got)):
            if ls not in got or ls not in want or not _close(want[ls], got[ls]):
                diffs.append(f"{minute}m {ls}: alone {want.get(ls)}, merged {got.get(ls)}")
    keys = set(m_alerts) | {k for _, a in alone.values() for k in a}
    for key in sorted(keys):
        want_a = {_labelled("{" + ls + "}", cl)[1:-1] for cl, (_, a) in alone.items() for ls in a.get(key, ())}
        if want_a != m_alerts.get(key, set()):
            diffs.append(f"{key}: alone {sorted(want_a)}, merged {sorted(m_alerts.get(key, set()))}")
    return diffs


def test_two_clusters_in_one_ruler_compute_what_each_cluster_computes_alone(tmp_path):
    a, b = _cluster_inputs("vllm-2"), _cluster_inputs("vllm-0")
    alone = {"a": _promtool(tmp_path, RULES, a, "a"), "b": _promtool(tmp_path, RULES, b, "b")}
    merged_inputs = _with_label(a, "cluster", "a") + _with_label(b, "cluster", "b")
    merged = _promtool(tmp_path, RULES, merged_inputs, "merged")
    diffs = _differences(alone, merged)
    assert not diffs, f"{len(diffs)} differences, first: " + "\n".join(diffs[:8])
    # the comparison has substance: each cluster fired on its own bad replica, and many series were recorded
    fired = {(name, "vllm-2" if 'pod="vllm-2"' in ls else "other")
             for (_, name), sets in alone["a"][1].items() for ls in sets}
    assert ("VLLMKVCacheExhausted", "vllm-2") in fired
    assert any('pod="vllm-0"' in ls and 'cluster="b"' in ls for sets in merged[1].values() for ls in sets)
    assert len(merged[0][TOTAL]) >= 150

    # the same merged input through a pack that drops the cluster (outer_labels: []) is wrong
    slo = load_slo(None)
    slo["outer_labels"] = []
    flat = tmp_path / "flat.rules.yml"
    flat.write_text(render_plain(slo))
    flat_merged = _promtool(tmp_path, flat, merged_inputs, "flat")
    assert len(_differences(alone, flat_merged)) > 100


OUTER = ("cluster",)
# dashboard queries that aggregate across whatever the variables select, on purpose: a heatmap's
# buckets (one series per bucket bound; per cluster they would draw one cell several times)
WHOLE_SELECTION = {"by (le)"}


def _label_lists(expr: str):
    for m in re.finditer(r"\b(by|on)\s*\(([^)]*)\)", expr):
        yield m.group(0), [x.strip() for x in m.group(2).split(",") if x.strip()]


def _dashboard_exprs(obj):
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k in ("expr", "query", "definition") and isinstance(v, str):
                yield v
            else:
                yield from _dashboard_exprs(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _dashboard_exprs(v)


def _rendered_exprs():
    for f in (RULES, ROOT / "deploy" / "kubernetes" / "base" / "prometheusrule.yaml"):
        doc = yaml.safe_load(f.read_text())
        groups = doc["groups"] if "groups" in doc else doc["spec"]["groups"]
        for g in groups:
            for r in g["rules"]:
                yield f.name, r.get("record") or r.get("alert"), r["expr"]
    for f in sorted((ROOT / "dashboards").glob("*.json")):
        for e in _dashboard_exprs(json.loads(f.read_text())):
            yield f.name, "query", e


def test_every_grouping_and_join_keeps_the_outer_labels():
    missing, lists = [], 0
    aggregators = re.compile(r"\b(sum|avg|min|max|count|group|quantile|stddev|stdvar|topk|bottomk|count_values)\s*\(")
    for where, rule, expr in _rendered_exprs():
        for text, labels in _label_lists(expr):
            lists += 1
            if not set(OUTER) <= set(labels) and text not in WHOLE_SELECTION:
                missing.append(f"{where} {rule}: {text}")
        # an aggregation without by (...) drops every label, the cluster too
        for m in aggregators.finditer(expr):
            missing.append(f"{where} {rule}: {m.group(0)} without by (...)")
    assert not missing, "\n".join(missing[:20])
    assert lists > 300


def test_outer_labels_never_rename_the_recorded_series():
    slo = load_slo(None)
    names = lambda s: sorted(r["record"] for g in yaml.safe_load(render_plain(s))["groups"]  # noqa: E731
                             for r in g["rules"] if "record" in r)
    default = names(slo)
    for outer in ([], ["cluster", "region"]):
        other = dict(slo, outer_labels=outer)
        assert names(other) == default
    rendered = render_plain(dict(slo, outer_labels=["cluster", "region"]))
    assert "by (cluster, region, namespace, pod, model_name)" in rendered
    assert "on (cluster, region, job, instance)" in rendered
    assert "cluster" not in render_plain(dict(slo, outer_labels=[]))
