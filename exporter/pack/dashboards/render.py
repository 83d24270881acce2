"""Rendering: the dashboards as JSON files, as ConfigMaps for Grafana's dashboard sidecar, and as
grafana-operator ``GrafanaDashboard`` objects that read those ConfigMaps."""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Dict, Mapping, Tuple

from .anomalies import anomalies
from .builder import Builder
from .capacity import capacity
from .disagg import disagg
from .gpu import gpu
from .overview import overview
from .prompts_cache import prompts_cache

DASHBOARDS: Dict[str, Callable[[Builder], Dict[str, Any]]] = {
    "vllm-overview": overview, "vllm-capacity": capacity, "vllm-prompts-cache": prompts_cache,
    "vllm-gpu": gpu, "vllm-anomalies": anomalies, "vllm-disaggregation": disagg}

K8S_PATH = os.path.join("deploy", "kubernetes", "base", "grafana-dashboards.yaml")
OPERATOR_PATH = os.path.join("deploy", "kubernetes", "components", "grafana-operator", "grafana-dashboards.yaml")
FOLDER = "vLLM"
LABELS = {"app.kubernetes.io/name": "vllm-sidecar-exporter"}


def build_all(slo: Mapping[str, Any]) -> Tuple[Dict[str, Dict[str, Any]], Builder]:
    """The dashboards as dicts (file name -> dashboard) and the builder that made them."""
    b = Builder(slo)
    return {f"{name}.json": fn(b) for name, fn in DASHBOARDS.items()}, b


def render_all(slo: Mapping[str, Any]) -> Dict[str, str]:
    """File name -> the dashboard's JSON text."""
    dashboards, _ = build_all(slo)
    return {name: json.dumps(d, indent=2) + "\n" for name, d in dashboards.items()}


def empty_ok(slo: Mapping[str, Any]) -> Dict[str, Dict[str, Dict[str, str]]]:
    """file name -> panel title -> refId -> why that query may answer nothing on a healthy system."""
    dashboards, b = build_all(slo)
    by_uid = {d["uid"]: name for name, d in dashboards.items()}
    out: Dict[str, Dict[str, Dict[str, str]]] = {}
    for (uid, title, ref), why in b.empty_ok.items():
        out.setdefault(by_uid[uid], {}).setdefault(title, {})[ref] = why
    return out


def configmap_name(file_name: str) -> str:
    return file_name[: -len(".json")] + "-dashboard"


def _dump(docs, header: str) -> str:
    import yaml

    from ..ruleyaml import _Dumper

    return header + "---\n".join(yaml.dump(d, Dumper=_Dumper, sort_keys=False, width=1000) for d in docs)


def render_configmaps(rendered: Mapping[str, str]) -> str:
    """The dashboards as ConfigMaps labelled for Grafana's dashboard sidecar (grafana_dashboard=1)."""
    docs = [{
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": configmap_name(name), "labels": {"grafana_dashboard": "1", **LABELS},
                     "annotations": {"grafana_folder": FOLDER}},
        "data": {name: text},
    } for name, text in rendered.items()]
    header = ("# Rendered by `vllm-sidecar-exporter dashboards --slo rules/slo.yaml --k8s-out " + K8S_PATH + "`\n"
              "# from the same code as dashboards/*.json. Do not edit by hand.\n")
    return _dump(docs, header)


def render_operator(rendered: Mapping[str, str]) -> str:
    """One grafana-operator GrafanaDashboard per dashboard, reading the JSON from the ConfigMap that
    render_configmaps writes (so the JSON exists once). ``instanceSelector`` must match your
    Grafana object's labels: the component's kustomization says how to change it."""
    docs = [{
        "apiVersion": "grafana.integreatly.org/v1beta1", "kind": "GrafanaDashboard",
        "metadata": {"name": name[: -len(".json")], "labels": dict(LABELS)},
        "spec": {
            "instanceSelector": {"matchLabels": {"dashboards": "grafana"}},
            # the dashboards live beside vLLM, the Grafana usually elsewhere
            "allowCrossNamespaceImport": True,
            "folder": FOLDER,
            "resyncPeriod": "10m",
            "configMapRef": {"name": configmap_name(name), "key": name},
        },
    } for name in rendered]
    header = ("# Rendered by `vllm-sidecar-exporter dashboards --slo rules/slo.yaml --operator-out "
              + OPERATOR_PATH + "`\n# from the same code as dashboards/*.json. Do not edit by hand.\n")
    return _dump(docs, header)
