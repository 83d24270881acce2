"""Rendering: the dashboards as JSON files and as ConfigMaps for Grafana's dashboard sidecar."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Mapping

from .anomalies import anomalies
from .builder import Builder
from .capacity import capacity
from .gpu import gpu
from .overview import overview
from .prompts_cache import prompts_cache

DASHBOARDS = {"vllm-overview": overview, "vllm-capacity": capacity, "vllm-prompts-cache": prompts_cache,
              "vllm-gpu": gpu, "vllm-anomalies": anomalies}


def render_all(slo: Mapping[str, Any]) -> Dict[str, str]:
    b = Builder(slo)
    return {f"{name}.json": json.dumps(fn(b), indent=2, sort_keys=False) + "\n" for name, fn in DASHBOARDS.items()}


K8S_PATH = os.path.join("deploy", "kubernetes", "base", "grafana-dashboards.yaml")


def render_configmaps(rendered: Mapping[str, str]) -> str:
    """The dashboards as ConfigMaps labelled for Grafana's dashboard sidecar (grafana_dashboard=1)."""
    import yaml

    from ..rules import _Dumper

    docs = []
    for name, text in rendered.items():
        docs.append({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name[: -len(".json")] + "-dashboard",
                         "labels": {"grafana_dashboard": "1", "app.kubernetes.io/name": "vllm-sidecar-exporter"},
                         "annotations": {"grafana_folder": "vLLM"}},
            "data": {name: text},
        })
    header = ("# Rendered by `vllm-sidecar-exporter dashboards --slo rules/slo.yaml --k8s-out " + K8S_PATH + "`\n"
              "# from the same code as dashboards/*.json. Do not edit by hand.\n")
    return header + "---\n".join(yaml.dump(d, Dumper=_Dumper, sort_keys=False, width=1000) for d in docs)

