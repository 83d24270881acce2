"""The alerting pack: one SLO file -> recording rules, alerts, dashboards and runbook links.

It reads ``exporter.slo`` and nothing of the sidecar's runtime: the pack is PromQL and JSON
generated from the SLO, for Prometheus, Grafana and Alertmanager to run.
"""
