"""Grafana dashboards as code, rendered from the SLO file so thresholds and runbook links match
the rules pack.

``vllm-sidecar-exporter dashboards --slo rules/slo.yaml --out-dir dashboards`` writes one JSON per
dashboard: overview, capacity, prompts and cache, GPU, anomalies. They import into Grafana 10 and
11: a ``${datasource}`` variable instead of fixed datasource UIDs, stable UIDs, shared tags and
links between them, variables for namespace, model_name and pod.

``builder`` holds the panel/target/dashboard model, one module per dashboard defines it, and
``render`` turns them into JSON and Kubernetes objects.
"""

from .render import DASHBOARDS, K8S_PATH, render_all, render_configmaps

__all__ = ["DASHBOARDS", "K8S_PATH", "render_all", "render_configmaps"]
