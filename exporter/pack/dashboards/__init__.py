"""Grafana dashboards as code, rendered from the SLO file so thresholds, windows, recording-rule
names and runbook links match the rules pack.

``vllm-sidecar-exporter dashboards --slo rules/slo.yaml --out-dir dashboards`` writes one JSON per
dashboard: overview, capacity, prompts and cache, GPU, anomalies, prefill-decode and speculative
decoding. They pass Grafana's own schema
for Grafana 10 to 13 (tests/pack/test_dashboards_schema.py), use a ``${datasource}`` variable instead
of fixed data source UIDs (the import dialog asks for it through ``__inputs``), stable UIDs, shared
tags and links between them, and variables for cluster, namespace, model_name and pod.

``builder`` holds the panel/target/dashboard model, one module per dashboard defines it, and
``render`` turns them into JSON, ConfigMaps and grafana-operator GrafanaDashboards.
"""

from .render import DASHBOARDS, K8S_PATH, OPERATOR_PATH, build_all, empty_ok, render_all, render_configmaps, render_operator

__all__ = ["DASHBOARDS", "K8S_PATH", "OPERATOR_PATH", "build_all", "empty_ok", "render_all", "render_configmaps",
           "render_operator"]
