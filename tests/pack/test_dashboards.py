"""The dashboards: generated and committed, structurally sound, rendered entirely from the SLO
file, filtered by the cluster variable everywhere, importable through Grafana's import dialog,
every query valid PromQL over real names, and every panel answered by a real Prometheus holding
real data. (Grafana's own schema: test_dashboards_schema.py.)"""

import copy
import json
import re
import subprocess
import time

import pytest
import yaml

from conftest import ROOT, page
from exporter.harness import pagetransform as pt
from exporter.harness.fakenvml import FakeNvml, make_gpus
from exporter.harness.localstack import SidecarThread, Stack, wait_until
from exporter.harness.pageserver import PageServer
from exporter.pack import dashboards as dash_mod
from exporter.pack.names import Names
from exporter.slo import load_slo
from promql_names import known_names, metric_names
from promseries import pack_in_one_group
from shared import PressureScript

DASH_DIR = ROOT / "dashboards"
SLO_FILE = ROOT / "rules" / "slo.yaml"


def committed():
    return {p.name: json.loads(p.read_text()) for p in sorted(DASH_DIR.glob("*.json"))}


def all_targets():
    for name, d in committed().items():
        for p in d["panels"]:
            for t in p.get("targets", []):
                yield name, p, t


def variable_queries(d):
    """(variable, the series its label_values() reads) for each query variable."""
    for v in d["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"]["query"]
            assert q.startswith("label_values(") and q.endswith(")"), q
            yield v, q[len("label_values("):].rsplit(",", 1)[0]


def annotation_exprs():
    """The PromQL of every Prometheus annotation of the committed dashboards."""
    return {a["expr"] for d in committed().values() for a in d["annotations"]["list"] if "expr" in a}


def fill(expr, namespace=".*", model=".*", pod=".*", cluster=".*"):
    return (expr.replace("$cluster", cluster).replace("$namespace", namespace).replace("$model_name", model)
            .replace("$pod", pod).replace("$__rate_interval", "1m").replace("$__interval", "15s")
            .replace("$__range", "1h"))


def test_committed_json_is_the_generated_output():
    rendered = dash_mod.render_all(load_slo(str(SLO_FILE)))
    assert set(rendered) == {p.name for p in DASH_DIR.glob("*.json")}
    for name, text in rendered.items():
        assert (DASH_DIR / name).read_text() == text, f"{name} drifted: run `make rules`"


def test_structure():
    dashes = committed()
    assert set(dashes) == {"vllm-overview.json", "vllm-capacity.json", "vllm-prompts-cache.json",
                           "vllm-gpu.json", "vllm-anomalies.json", "vllm-disaggregation.json"}
    uids = [d["uid"] for d in dashes.values()]
    assert len(set(uids)) == len(uids)
    for name, d in dashes.items():
        assert "vllm-sidecar-exporter" in d["tags"]
        assert d["links"] and d["links"][0]["type"] == "dashboards"
        names = [v["name"] for v in d["templating"]["list"]]
        assert names == ["datasource", "cluster", "namespace", "model_name", "pod"]
        ids = [p["id"] for p in d["panels"]]
        assert len(set(ids)) == len(ids), f"{name}: duplicate panel ids"
        cells = set()
        for p in d["panels"]:
            g = p["gridPos"]
            assert 0 <= g["x"] and g["x"] + g["w"] <= 24
            for x in range(g["x"], g["x"] + g["w"]):
                for y in range(g["y"], g["y"] + g["h"]):
                    assert (x, y) not in cells, f"{name}: panel {p['title']!r} overlaps another"
                    cells.add((x, y))
            if p["type"] == "row":
                continue
            assert p["description"].strip(), f"{name}: {p['title']} has no description"
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert p["fieldConfig"]["defaults"].get("unit"), f"{name}: {p['title']} has no unit"
            for t in p["targets"]:
                assert t["refId"] and t["datasource"]["uid"] == "${datasource}"
        text = json.dumps(d)
        assert '"uid": "${datasource}"' in text
        # no fixed datasource UIDs anywhere
        for p in d["panels"]:
            for t in p.get("targets", []):
                assert t["datasource"]["uid"] == "${datasource}"


def test_alert_panels_link_to_runbooks(tmp_path):
    """With a runbook URL in the SLO, alert panels link to the runbooks; without one (the default),
    no link points nowhere."""
    for d in committed().values():
        assert not any(p.get("links") for p in d["panels"]), "a runbook link without a runbook URL"
    f = tmp_path / "slo.yaml"
    f.write_text("runbook_base_url: https://runbooks.example.org/vllm\n")
    linked = set()
    for d in (json.loads(t) for t in dash_mod.render_all(load_slo(str(f))).values()):
        for p in d["panels"]:
            for link in p.get("links", []):
                assert link["url"].endswith(".md")
                if link["url"] == "https://runbooks.example.org/postmortem.md":  # docs/ next to docs/runbooks
                    assert (ROOT / "docs" / "postmortem.md").exists()
                    continue
                linked.add(link["url"].rsplit("/", 1)[1][:-3])
    for name in linked:
        assert (ROOT / "docs" / "runbooks" / f"{name}.md").exists()
    assert {"VLLMKVCacheExhausted", "VLLMGPUBusyLowThroughput", "VLLMTTFTHigh", "VLLMLongPromptSurge"} <= linked


def test_thresholds_come_from_the_slo_file(tmp_path):
    f = tmp_path / "slo.yaml"
    f.write_text("objectives: {ttft_p95_seconds: 2.25}\nkv_cache: {warn: 0.85}\n")
    d = json.loads(dash_mod.render_all(load_slo(str(f)))["vllm-overview.json"])
    ttft = next(p for p in d["panels"] if p["title"] == "Time to first token")
    assert ttft["fieldConfig"]["defaults"]["thresholds"]["steps"][1]["value"] == 2.25
    cap = json.loads(dash_mod.render_all(load_slo(str(f)))["vllm-capacity.json"])
    kv = next(p for p in cap["panels"] if p["title"] == "KV-cache usage")
    assert kv["fieldConfig"]["defaults"]["thresholds"]["steps"][1]["value"] == 0.85


@pytest.mark.prometheus
def test_every_query_is_valid_promql(tmp_path):
    rules = [{"record": f"panel:check{i}", "expr": fill(t["expr"])} for i, (_, _, t) in enumerate(all_targets())]
    var_series = {series for d in committed().values() for _, series in variable_queries(d)}
    for i, series in enumerate(sorted(var_series)):
        rules.append({"record": f"var:check{i}", "expr": fill(series)})
    for i, expr in enumerate(sorted(annotation_exprs())):
        rules.append({"record": f"annotation:check{i}", "expr": fill(expr)})
    f = tmp_path / "panels.yml"
    f.write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}))
    r = subprocess.run(["promtool", "check", "rules", str(f)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_flight_recorder_events_annotate_the_dashboards_and_list_per_pod(tmp_path):
    """Every dashboard annotates the events the pods' flight recorders opened (one per pod and
    kind, the dashboard's variables applied); the anomalies dashboard lists them per pod, with a
    link per pod to how its record is fetched when a runbook URL is set."""
    for name, d in committed().items():
        ann = [a for a in d["annotations"]["list"] if a.get("name") == "Flight recorder events"]
        assert len(ann) == 1, name
        a = ann[0]
        assert a["datasource"] == {"type": "prometheus", "uid": "${datasource}"} and a["enable"]
        assert "increase(vllm_sidecar_flight_events_total{" in a["expr"] and a["expr"].endswith("> 0")
        assert 'pod=~"$pod"' in a["expr"] and 'model_name' not in a["expr"]  # the counter is per pod
        assert 'namespace=~"$namespace"' in a["expr"] and "by (cluster, namespace, pod, kind)" in a["expr"]
        assert a["titleFormat"] == "{{kind}} on {{pod}}"
    anomalies = committed()["vllm-anomalies.json"]
    table = next(p for p in anomalies["panels"] if p["title"] == "Flight recorder events per pod")
    assert table["type"] == "table" and table["targets"][0]["instant"]
    assert "[$__range]" in table["targets"][0]["expr"] and "links" not in table["fieldConfig"]["defaults"]
    f = tmp_path / "slo.yaml"
    f.write_text("runbook_base_url: https://runbooks.example.org/vllm\n")
    d = json.loads(dash_mod.render_all(load_slo(str(f)))["vllm-anomalies.json"])
    table = next(p for p in d["panels"] if p["title"] == "Flight recorder events per pod")
    (row_link,) = table["fieldConfig"]["defaults"]["links"]
    assert row_link["url"] == "https://runbooks.example.org/postmortem.md#in-kubernetes"
    assert "${__data.fields.pod}" in row_link["title"] and "${__data.fields.namespace}" in row_link["title"]
    assert "### In Kubernetes" in (ROOT / "docs" / "postmortem.md").read_text()


def test_every_query_reads_only_real_names():
    known = known_names()
    for name, p, t in all_targets():
        unknown = metric_names(fill(t["expr"])) - known
        assert not unknown, f"{name} / {p['title']}: {sorted(unknown)}"
    for expr in annotation_exprs():
        assert not metric_names(fill(expr)) - known, expr


class FillingScript(PressureScript):
    """The real after_pressure page with counters advancing and the KV cache filling up."""

    growth, only_prefix = 0.03, ""  # vLLM and HTTP counters

    def gauges(self, text):
        return pt.set_values(text, {"vllm:kv_cache_usage_perc": min(0.95, 0.3 + 0.01 * self.n),
                                    "vllm:num_requests_running": 8, "vllm:num_requests_waiting": 2})


@pytest.mark.prometheus
def test_every_panel_gets_data_from_a_real_prometheus(tmp_path):
    vllm = PageServer(FillingScript()).start()
    gpus = make_gpus(2)
    nv = FakeNvml(gpus)
    for g in gpus:
        g.utilization_percent = 97
        g.clock_event_reasons = 0x4  # sw power cap: something to show in the throttle panel
        g.energy_from_power = True   # the energy counter rises with the power drawn: tokens per joule
    sidecar = SidecarThread({"vllm_url": vllm.url, "poll_interval": 0.5, "window": 10, "gpu": "nvml",
                                                         "stall_seconds": 5}, nvml=nv)
    labels = {"namespace": "llm", "pod": "vllm-0"}
    try:
        with Stack(tmp_path) as st:
            st.start_prometheus([{"job": "vllm", "address": f"127.0.0.1:{vllm.port}", "labels": labels},
                                 {"job": "vllm-sidecar", "address": sidecar.address, "labels": labels}],
                                [pack_in_one_group(tmp_path)])
            wait_until(st.targets_up, 120, what="targets up", diag=st.diag)
            nv.inject_xid(1, 13)
            # enough samples for every rate window and recording rule
            ttft = Names(load_slo(str(SLO_FILE))).replica("vllm_time_to_first_token_seconds", "histogram_quantile")
            wait_until(lambda: st.query(ttft), 120, what="recording rules", diag=st.diag)
            wait_until(lambda: st.query("vllm_sidecar_gpu_xid_errors_total"), 120, what="xid", diag=st.diag)
            may_be_empty = dash_mod.empty_ok(load_slo(str(SLO_FILE)))
            # every panel asked at one settled moment: both targets scraped well several times in a
            # row and every rule evaluated since (a scrape that timed out on a busy machine leaves a
            # gap in which nothing answers)
            at = st.settled_at(after=time.time())
            empty = {}
            for name, p, t in all_targets():
                if not may_be_empty.get(name, {}).get(p["title"], {}).get(t["refId"]):
                    expr = fill(t["expr"], namespace="llm", model="tiny-llama", pod="vllm-0")
                    if not st.query(expr, at=at):
                        empty[f"{name} / {p['title']} / {t['refId']}"] = expr
            assert not empty, "panels without data:\n" + "\n".join(f"{k}: {e}" for k, e in empty.items())
            for d in committed().values():
                for v, series in variable_queries(d):
                    if v["name"] == "cluster":  # one Prometheus, no cluster label: All (.*) matches
                        continue
                    assert st.query(fill(series, namespace="llm", model="tiny-llama"), at=at), v["name"]
            # and the cluster variable narrows every panel: a cluster nobody has leaves them all empty
            leaking = [f"{name} / {p['title']}" for name, p, t in all_targets()
                       if st.query(fill(t["expr"], cluster="no-such-cluster"), at=at)]
            assert not leaking, "panels that ignore $cluster:\n" + "\n".join(leaking)
    finally:
        sidecar.close()
        vllm.stop()


@pytest.mark.prometheus
def test_the_lora_panels_get_data_from_real_lora_pages(tmp_path):
    """The LoRA panels, empty on the stand-in page above, answered by a real Prometheus scraping
    the real pages of a vLLM serving two adapters and the real sidecar reading them."""
    current = {"page": page("lora_running.txt")}
    vllm = PageServer(lambda: current["page"]).start()
    sidecar = SidecarThread({"vllm_url": vllm.url, "poll_interval": 0.5, "window": 10, "gpu": "none"})
    labels = {"namespace": "llm", "pod": "vllm-0"}
    cap = committed()["vllm-capacity.json"]
    queries = {(p["title"], t["refId"]): fill(t["expr"], namespace="llm", model="tiny-llama", pod="vllm-0")
               for p in cap["panels"] if p["title"].startswith("LoRA") for t in p.get("targets", [])}
    assert len(queries) == 6
    reasons = dash_mod.empty_ok(load_slo(str(SLO_FILE)))["vllm-capacity.json"]

    def values(key, at=None):
        return {r["metric"].get("adapter", ""): float(r["value"][1]) for r in st.query(queries[key], at=at)}

    try:
        with Stack(tmp_path) as st:
            st.start_prometheus([{"job": "vllm", "address": f"127.0.0.1:{vllm.port}", "labels": labels},
                                 {"job": "vllm-sidecar", "address": sidecar.address, "labels": labels}], [])
            wait_until(st.targets_up, 120, what="targets up", diag=st.diag)
            active = ("LoRA adapters with requests", "A")
            wait_until(lambda: values(active) == {"tiny-lora": 1, "tiny-lora-b": 1}, 120, what="adapters active",
                       diag=st.diag)
            at = st.settled_at(after=time.time())  # asked where no timed-out scrape left a gap
            for key, expr in queries.items():
                # every query answers but running and waiting apart, which vLLM 0.32 never gives
                assert bool(st.query(expr, at=at)) != ("never apart" in reasons[key[0]][key[1]]), key
            against = "LoRA adapters against max_lora"
            assert values((against, "A"), at) == {"": 2} and values((against, "B"), at) == {"": 2}
            assert values((against, "C"), at) == {"": 2}
            current["page"] = page("lora_after.txt")
            wait_until(lambda: values(active) == {"tiny-lora": 0, "tiny-lora-b": 0}, 120, what="adapters idle",
                       diag=st.diag)
            at = st.settled_at(after=time.time())
            assert values((against, "A"), at) == {"": 0} and values((against, "B"), at) == {"": 2}
    finally:
        sidecar.close()
        vllm.stop()


# -- everything from the SLO file -------------------------------------------------------------------

# Every SLO value the dashboards use, changed. Values are chosen so that none equals a default or a
# fixed constant of the dashboards, and each is recognisable in text.
OTHER_SLO = """
replica_labels: [cluster, namespace, pod]
runbook_base_url: https://runbooks.example.org/vllm
windows: {rate: 3m, sustain: 90s, sidecar: 45s}
objectives: {ttft_mean_seconds: 1.25, ttft_p95_seconds: 2.75, output_tokens_per_second: 40, availability: 0.9975}
kv_cache: {warn: 0.82, critical: 0.93}
long_prompt: {tokens: 6000, min_per_second: 0.07}
prefix_cache: {min_hit_ratio: 0.42}
error_ratio: {max: 0.035}
outlier: {throughput_factor: 0.6, ttft_factor: 2.5, min_replicas: 4}
dashboards: {cluster_label: k8s_cluster}
cost: {prices: {reserved: 3.25}, gpus_per_replica: 4, hours_per_month: 720, monthly_fixed: 250}
disaggregation: {transfer_failure_ratio: 0.045, recompute_share: 0.55, transfer_ttft_share: 0.4, expired_share: 0.11,
                 saturated_waiting: 3.5, room_waiting: 0.45, room_load: 0.65}
speculative: {planned_speedup: 1.9, low_factor: 0.65}
burn_rates:
  page:
    - {long: 2h, short: 10m, factor: 12.5}
    - {long: 12h, short: 45m, factor: 5.5}
  ticket:
    - {long: 4d, short: 8h, factor: 1.75}
"""

# The defaults those keys replace, as the dashboards would print them (thresholds, text, queries).
DEFAULT_WINDOWS = ("5m", "2m", "30m", "6h", "3d")
DEFAULT_NUMBERS = {1.5, 3.0, 30.0, 1 / 30.0, 0.999, 0.001, 0.9, 0.95, 4000.0, 0.05, 0.3, 0.5, 2.0, 14.4, 6.0, 730.0, 400.0}
# Fixed constants of the dashboards that are not SLO values, and where they may appear: the
# error-budget stat's colour steps, the GPU temperature lines, the median (quantile 0.5) of the peer
# comparison.
FIXED = {"Error budget left (30 days)": {0.25, 0.5}, "Temperature": {83.0, 90.0},
         "Engine sleep": {2.0}}  # vLLM's sleep level 2 (all discarded)


def _numbers(text):
    """Numbers written in text or PromQL, with strings, quantile labels, label_values and durations
    taken out (quantile="0.5", histogram_quantile(0.99, ...) and the median's 0.5 are not SLO values)."""
    t = re.sub(r'quantile="[^"]*"', "", text)
    t = re.sub(r"quantile by \([^)]*\) \(0\.5,", "", t)
    t = re.sub(r"histogram_quantile\(0\.\d+,", "", t)  # the quantile a latency panel shows
    t = re.sub(r"\[\d+[smhd]\]", "", t)  # range selectors
    t = re.sub(r"\b\d+(ms|s|m|h|d)\b", "", t)  # durations in text
    t = re.sub(r"\bp\d\d\b", "", t)  # p50, p95, p99
    return {float(m) for m in re.findall(r"(?<![\w.])\d+(?:\.\d+)?(?:e-?\d+)?(?![\w.])", t)}


def _walk(node, path=""):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _walk(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _walk(v, f"{path}[{i}]")
    else:
        yield path, node


def test_nothing_of_the_default_slo_survives_another_slo(tmp_path):
    f = tmp_path / "slo.yaml"
    f.write_text(OTHER_SLO)
    slo = load_slo(str(f))
    names = Names(slo)
    dashes = {n: json.loads(t) for n, t in dash_mod.render_all(slo).items()}
    seen_numbers = set()
    for name, d in dashes.items():
        for p in d["panels"]:
            fixed = FIXED.get(p["title"], set())
            where = f"{name} / {p['title']}"
            texts = [p.get("description", "")] + [t["expr"] for t in p.get("targets", [])]
            for text in texts:
                for w in DEFAULT_WINDOWS:
                    if w not in fixed:
                        assert not re.search(rf"\b{w}\b", text), f"{where}: default window {w} in {text!r}"
                nums = _numbers(text)
                seen_numbers |= nums
                bad = {x for x in nums if any(abs(x - dflt) < 1e-9 for dflt in DEFAULT_NUMBERS)} - fixed
                assert not bad, f"{where}: default value(s) {sorted(bad)} in {text!r}"
            for path, v in _walk(p.get("fieldConfig", {})):
                if path.endswith(".value") and isinstance(v, (int, float)):
                    seen_numbers.add(float(v))
                    assert v in fixed or all(abs(v - dflt) > 1e-9 for dflt in DEFAULT_NUMBERS), \
                        f"{where}: default threshold {v}"
            for t in p.get("targets", []):
                # every recording rule is named from this SLO: its level and its rate window
                for rec in re.findall(r"\b[a-z_]+:[a-z_]+:[a-z_]+\w*", t["expr"]):
                    assert rec.startswith((names.replica_prefix + ":", names.model_prefix + ":")), f"{where}: {rec}"
                    if "vllm_availability_errors" in rec:  # the burn rates: the windows of this SLO's pairs
                        assert re.search(r":ratio_rate(10m|45m|2h|12h)$", rec), f"{where}: {rec}"
                    elif re.search(r":(rate|ratio_rate|histogram_quantile|mean)\w+$", rec):
                        # the rules' rate window, or the sidecar's for the sidecar's own figures
                        window = "45s" if ":vllm_sidecar_" in rec else "3m"
                        assert rec.endswith(window), f"{where}: {rec} is not named after the {window} window"
                assert 'k8s_cluster=~"$cluster"' in t["expr"], f"{where}: no cluster filter"
            for link in p.get("links", []):
                assert link["url"].startswith("https://runbooks.example.org/vllm/") or \
                    link["url"] == "https://runbooks.example.org/postmortem.md", link
        text = json.dumps(d)
        assert "rate5m" not in text and "docs/runbooks" not in text
        assert not re.search(r"\bnamespace_(pod_)?model:", text)  # the default levels
        assert [v for v in d["templating"]["list"] if v["name"] == "cluster"][0]["query"]["query"] == \
            "label_values(vllm:num_requests_running, k8s_cluster)"
    # and the new values are there: thresholds, lines and text
    expected = {1.25, 2.75, 1 / 40, 0.9975, 0.82, 0.93, 6000, 0.07, 0.42, 0.035, 0.6, 2.5, 4, 12.5, 5.5, 1.75,
                0.045, 0.55, 0.4 * 2.75, 0.11, 3.5, 0.45, 0.65, 1.9}
    missing = {x for x in expected if not any(abs(x - y) < 1e-9 for y in seen_numbers)}
    assert not missing, f"SLO values the dashboards do not show: {sorted(missing)}"
    assert any("over 3m" in p.get("description", "") for d in dashes.values() for p in d["panels"])
    assert any("every 90s window" in p.get("description", "") for d in dashes.values() for p in d["panels"])
    burn = next(p for p in dashes["vllm-overview.json"]["panels"] if p["title"] == "Burn rate")
    assert [t["legendFormat"] for t in burn["targets"]] == ["{{model_name}} 10m", "{{model_name}} 45m",
                                                             "{{model_name}} 2h", "{{model_name}} 12h"]


def test_the_other_slo_renders_valid_promql_over_names_the_rules_would_have(tmp_path):
    """Sanity of the non-default rendering itself: every query still parses and names only
    recording rules that the same SLO's names module makes."""
    f = tmp_path / "slo.yaml"
    f.write_text(OTHER_SLO)
    slo = load_slo(str(f))
    dashes = {n: json.loads(t) for n, t in dash_mod.render_all(slo).items()}
    rules = [{"record": f"panel:check{i}", "expr": fill(t["expr"])}
             for i, t in enumerate(t for d in dashes.values() for p in d["panels"] for t in p.get("targets", []))]
    f = tmp_path / "panels.yml"
    f.write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}))
    r = subprocess.run(["promtool", "check", "rules", str(f)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def _selectors(expr):
    """Every vector selector of a PromQL expression: (metric name, matcher text or None)."""
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    e = re.sub(r"\[[^\]]*\]", "", e)  # range selectors ([5m], [$__rate_interval])
    out = []
    for m in re.finditer(r'"[^"]*"|([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(\{[^}]*\})?', e):
        name = m.group(1)
        if not name:
            continue
        rest = e[m.end():].lstrip()
        if name in metric_names(name) and not rest.startswith("(") and not re.fullmatch(r"\d.*", name):
            out.append((name, m.group(2)))
    return out


def test_the_cluster_variable_filters_every_selector():
    for name, d in committed().items():
        cluster = [v for v in d["templating"]["list"] if v["name"] == "cluster"]
        assert cluster, name
        v = cluster[0]
        assert v["query"]["query"] == "label_values(vllm:num_requests_running, cluster)"
        # All is .*, which also matches series without a cluster label: harmless with one cluster
        assert v["includeAll"] and v["allValue"] == ".*" and v["current"]["value"] == ["$__all"]
        assert re.fullmatch(v["allValue"], "")
        for other, series in variable_queries(d):
            if other["name"] != "cluster":
                assert 'cluster=~"$cluster"' in series, other["name"]
        for p in d["panels"]:
            for t in p.get("targets", []):
                sels = _selectors(t["expr"])
                assert sels, t["expr"]
                for metric, matchers in sels:
                    assert matchers and 'cluster=~"$cluster"' in matchers, \
                        f"{name} / {p['title']}: {metric} is not filtered by cluster in {t['expr']}"


def test_the_cluster_variable_can_be_turned_off(tmp_path):
    f = tmp_path / "slo.yaml"
    f.write_text('dashboards: {cluster_label: ""}\n')
    for d in (json.loads(t) for t in dash_mod.render_all(load_slo(str(f))).values()):
        assert [v["name"] for v in d["templating"]["list"]] == ["datasource", "namespace", "model_name", "pod"]
        assert "$cluster" not in json.dumps(d)
    f.write_text('dashboards: {cluster_label: "not a label"}\n')
    with pytest.raises(Exception, match="dashboards.cluster_label"):
        load_slo(str(f))


# -- import and provisioning ------------------------------------------------------------------------

def grafana_import(dashboard, inputs):
    """What Grafana's POST /api/dashboards/import does with the dialog's answers (a port of
    pkg/services/dashboardimport/utils/dash_template_evaluator.go): every ${NAME} of an __inputs
    entry, in every string, becomes the input's value; __inputs itself is dropped; an input the
    request lacks is an error."""
    variables = {}
    for inp in dashboard.get("__inputs", []):
        given = [i for i in inputs if i["type"] == inp["type"] and i["name"] in (inp["name"], "*")]
        if not given:
            raise KeyError(f"Dashboard input variable: {inp['name']} missing from import command")
        variables["${" + inp["name"] + "}"] = given[0]["value"]

    def ev(v):
        if isinstance(v, str):
            return re.sub(r"(\$\{.+?\})", lambda m: variables.get(m.group(1), m.group(1)), v)
        if isinstance(v, dict):
            return {k: ev(x) for k, x in v.items() if k != "__inputs"}
        if isinstance(v, list):
            return [ev(x) for x in v]
        return v

    return ev(dashboard)


def test_the_import_dialog_asks_for_prometheus_and_sets_the_datasource_variable():
    for name, d in committed().items():
        assert d["__inputs"] == [{"name": "DS_PROMETHEUS", "label": "Prometheus", "description": d["__inputs"][0]["description"],
                                  "type": "datasource", "pluginId": "prometheus", "pluginName": "Prometheus"}]
        req = {(r["type"], r["id"]) for r in d["__requires"]}
        kinds = {p["type"] for p in d["panels"]} - {"row"}
        assert req == {("grafana", "grafana"), ("datasource", "prometheus")} | {("panel", k) for k in kinds}, name
        # what the dialog's answer changes: the datasource variable's value, nothing else
        with pytest.raises(KeyError, match="DS_PROMETHEUS"):
            grafana_import(d, [])
        imported = grafana_import(d, [{"name": "DS_PROMETHEUS", "type": "datasource", "pluginId": "prometheus",
                                       "value": "P1809F7CD0C75ACF3"}])
        assert "__inputs" not in imported and "${DS_PROMETHEUS}" not in json.dumps(imported)
        ds = imported["templating"]["list"][0]
        assert ds["type"] == "datasource" and ds["query"] == "prometheus"
        assert ds["current"]["value"] == "P1809F7CD0C75ACF3"
        before, after = copy.deepcopy(d), copy.deepcopy(imported)
        before.pop("__inputs")
        before["templating"]["list"][0].pop("current")
        after["templating"]["list"][0].pop("current")
        assert before == after
        # panels and variables keep reading ${datasource}, so the picker switches them all
        for p in imported["panels"]:
            if p["type"] != "row":
                assert p["datasource"]["uid"] == "${datasource}"


def test_provisioned_the_datasource_variable_falls_back_to_an_existing_data_source():
    """Provisioning (sidecar ConfigMap, file provider, operator) ignores __inputs: the value
    "${DS_PROMETHEUS}" then matches no data source; Grafana's pre-Scenes variable code takes the
    option whose text is the stored text ("default": the default data source), Scenes the first
    Prometheus data source. No fixed UID anywhere."""
    for name, d in committed().items():
        ds = d["templating"]["list"][0]
        assert ds["current"]["text"] == "default" and ds["current"]["value"] == "${DS_PROMETHEUS}"
        assert ds["regex"] == "" and not ds["includeAll"] and not ds["multi"]
        uids = {v for path, v in _walk(d) if path.endswith(".uid") and path != ".uid"}
        assert uids <= {"${datasource}", "-- Grafana --"}, (name, uids)


def _recording_rules_read(dashes):
    return {rec for d in dashes.values() for p in d["panels"] for t in p.get("targets", [])
            for rec in re.findall(r"\b[a-z_]+:[a-z_]+:[a-z_]+\w*", t["expr"])}


def _recorded(slo):
    from exporter.pack.rules import render_groups

    return {r["record"] for g in render_groups(slo) for r in g["rules"] if "record" in r}


def test_every_recording_rule_a_panel_reads_is_in_the_rules_pack():
    slo = load_slo(str(SLO_FILE))
    missing = _recording_rules_read(committed()) - _recorded(slo)
    assert not missing, sorted(missing)


def test_every_recording_rule_a_panel_reads_is_in_the_rules_pack_for_another_slo(tmp_path):
    f = tmp_path / "slo.yaml"
    f.write_text(OTHER_SLO)
    slo = load_slo(str(f))
    dashes = {n: json.loads(t) for n, t in dash_mod.render_all(slo).items()}
    missing = _recording_rules_read(dashes) - _recorded(slo)
    assert not missing, sorted(missing)
