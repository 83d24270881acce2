"""The dashboards: generated and committed, structurally sound, every query valid PromQL over
real names, and every panel answered by a real Prometheus holding real data."""

import json
import subprocess

import pytest
import yaml

from exporter.pack import dashboards as dash_mod
from exporter.harness import pagetransform as pt
from exporter.harness.fakenvml import FakeNvml, make_gpus
from exporter.harness.localstack import SidecarThread, Stack, wait_until
from exporter.harness.pageserver import PageServer
from exporter.slo import load_slo
from conftest import ROOT, page
from promql_names import known_names, metric_names

DASH_DIR = ROOT / "dashboards"


def committed():
    return {p.name: json.loads(p.read_text()) for p in sorted(DASH_DIR.glob("*.json"))}


def all_targets():
    for name, d in committed().items():
        for p in d["panels"]:
            for t in p.get("targets", []):
                yield name, p, t


def fill(expr, namespace=".*", model=".*", pod=".*"):
    return (expr.replace("$namespace", namespace).replace("$model_name", model).replace("$pod", pod)
            .replace("$__rate_interval", "1m").replace("$__interval", "15s"))


def test_committed_json_is_the_generated_output():
    rendered = dash_mod.render_all(load_slo(str(ROOT / "rules" / "slo.yaml")))
    assert set(rendered) == {p.name for p in DASH_DIR.glob("*.json")}
    for name, text in rendered.items():
        assert (DASH_DIR / name).read_text() == text, f"{name} drifted: run `make rules`"


def test_structure():
    dashes = committed()
    assert set(dashes) == {"vllm-overview.json", "vllm-capacity.json", "vllm-prompts-cache.json",
                           "vllm-gpu.json", "vllm-anomalies.json"}
    uids = [d["uid"] for d in dashes.values()]
    assert len(set(uids)) == len(uids)
    for name, d in dashes.items():
        assert "vllm-sidecar-exporter" in d["tags"]
        assert d["links"] and d["links"][0]["type"] == "dashboards"
        names = [v["name"] for v in d["templating"]["list"]]
        assert names == ["datasource", "namespace", "model_name", "pod"]
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


def test_alert_panels_link_to_runbooks():
    linked = set()
    for d in committed().values():
        for p in d["panels"]:
            for link in p.get("links", []):
                assert link["url"].endswith(".md")
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
    var_queries = {v["definition"] for d in committed().values() for v in d["templating"]["list"] if v["type"] == "query"}
    for i, q in enumerate(sorted(var_queries)):
        series = q[len("label_values("):].rsplit(",", 1)[0]
        rules.append({"record": f"var:check{i}", "expr": fill(series)})
    f = tmp_path / "panels.yml"
    f.write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}))
    r = subprocess.run(["promtool", "check", "rules", str(f)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_query_reads_only_real_names():
    known = known_names()
    for name, p, t in all_targets():
        unknown = metric_names(fill(t["expr"])) - known
        assert not unknown, f"{name} / {p['title']}: {sorted(unknown)}"


class Script:
    """The real after_pressure page with counters advancing and the KV cache filling up."""

    def __init__(self):
        self.base = page("after_pressure.txt")
        self.n = 0

    def __call__(self):
        self.n += 1
        text = pt.scale_counters(self.base, 1 + self.n * 0.03, only_prefix="")  # vLLM and HTTP counters
        return pt.set_values(text, {"vllm:kv_cache_usage_perc": min(0.95, 0.3 + 0.01 * self.n),
                                    "vllm:num_requests_running": 8, "vllm:num_requests_waiting": 2})


@pytest.mark.prometheus
def test_every_panel_gets_data_from_a_real_prometheus(tmp_path):
    vllm = PageServer(Script()).start()
    gpus = make_gpus(2)
    nv = FakeNvml(gpus)
    for g in gpus:
        g.utilization_percent = 97
        g.clock_event_reasons = 0x4  # sw power cap: something to show in the throttle panel
    sidecar = SidecarThread({"vllm_url": vllm.url, "poll_interval": 0.5, "window": 10, "gpu": "nvml",
                                                         "stall_seconds": 5}, nvml=nv)
    labels = {"namespace": "llm", "pod": "vllm-0"}
    try:
        with Stack(tmp_path) as st:
            st.start_prometheus([{"job": "vllm", "address": f"127.0.0.1:{vllm.port}", "labels": labels},
                                 {"job": "vllm-sidecar", "address": sidecar.address, "labels": labels}],
                                [ROOT / "rules" / "vllm.rules.yml"])
            wait_until(st.targets_up, 30, what="targets up", diag=st.diag)
            nv.inject_xid(1, 13)
            # enough samples for every rate window and recording rule
            wait_until(lambda: st.query("namespace_pod_model:vllm_time_to_first_token_seconds:histogram_quantile5m"),
                       40, what="recording rules", diag=st.diag)
            wait_until(lambda: st.query("vllm_sidecar_gpu_xid_errors_total"), 30, what="xid", diag=st.diag)
            empty = []
            for name, p, t in all_targets():
                expr = fill(t["expr"], namespace="llm", model="tiny-llama", pod="vllm-0")
                if not st.query(expr) and not t.get("vllmSidecarEmptyOk"):
                    empty.append(f"{name} / {p['title']}: {expr}")
            assert not empty, "panels without data:\n" + "\n".join(empty)
            for d in committed().values():
                for v in d["templating"]["list"]:
                    if v["type"] == "query":
                        series = v["definition"][len("label_values("):].rsplit(",", 1)[0]
                        assert st.query(fill(series, namespace="llm", model="tiny-llama")), v["name"]
    finally:
        sidecar.close()
        vllm.stop()
