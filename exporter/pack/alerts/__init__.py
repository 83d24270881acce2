"""Alerting rules, one module per concern (as the monitoring mixins split them):

    capacity    KV cache, preemptions, the waiting queue, long-prompt surges
    latency     TTFT and inter-token latency against their objectives
    anomalies   a busy GPU with few tokens, a stalled engine, a replica unlike its peers, caches
    errors      corrupted outputs, error ratios and the availability SLO's burn rates
    gpu         XID, thermal throttling, uncorrectable ECC
    health      the sidecar's and vLLM's targets, inputs gone missing after an upgrade
    disagg      prefill/decode: KV transfers failing, slow or expiring, one side saturated
    speculative speculative decoding accepting far fewer drafts than normal or planned

Each module's ``alerts(ctx)`` returns ``Alert`` values: the condition, severity and texts only.
``alert_rules`` below adds, in one place, what every alert gets from the SLO file: its ``for``
(and ``keep_firing_for``), its runbook link, severity, label and annotation overrides, and
drops the ones the SLO disables.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Tuple

from ..context import Ctx
from . import anomalies, capacity, disagg, errors, gpu, health, latency, speculative
from .alert import Alert

__all__ = ["Alert", "alert_rules", "all_alerts", "finish", "keyed_alert_rules", "runbook_url"]


def all_alerts(c: Ctx) -> List[Alert]:
    out: List[Alert] = []
    for module in (capacity, latency, anomalies, errors, health, gpu, disagg, speculative):
        out += module.alerts(c)
    return out


def runbook_url(slo: Mapping[str, Any], name: str) -> str:
    """``<runbook_base_url>/<Alert>.md``; without a base URL, the runbook's path in this repository."""
    base = slo["runbook_base_url"].rstrip("/")
    return f"{base}/{name}.md" if base else f"docs/runbooks/{name}.md"


def finish(a: Alert, slo: Mapping[str, Any], steps: Mapping[str, str]) -> Dict[str, Any]:
    """The rule as Prometheus reads it, with everything the SLO file says about it: its for and
    keep_firing_for, severity, labels (the SLO's common ones, then this alert's), annotations and
    its runbook (a link, plus the runbook's steps when no runbook URL is configured)."""
    settings = slo["alerts"].get(a.key)
    if settings is None:
        raise KeyError(f"alert rule {a.key} has no entry under alerts: in the SLO defaults")
    labels = {"severity": settings.get("severity", a.severity), **a.labels, **slo["labels"],
              **settings.get("labels", {})}
    annotations = {"summary": a.summary, "description": a.description, "runbook_url": runbook_url(slo, a.name)}
    if not slo["runbook_base_url"] and steps.get(a.name):
        annotations["runbook"] = steps[a.name]
    annotations.update(settings.get("annotations", {}))
    rule: Dict[str, Any] = {"alert": a.name, "expr": a.expr, "for": settings["for"]}
    if "keep_firing_for" in settings:
        rule["keep_firing_for"] = settings["keep_firing_for"]
    rule["labels"] = labels
    rule["annotations"] = annotations
    return rule


def alert_rules(c: Ctx, steps: Mapping[str, str]) -> List[Dict[str, Any]]:
    """Every enabled alert as Prometheus reads it; ``steps`` (alert -> its runbook's "Act" lines,
    ``runbooks.act_steps``) go into the rule when the SLO names no runbook URL."""
    return [rule for _, rule in keyed_alert_rules(c, steps)]


def keyed_alert_rules(c: Ctx, steps: Mapping[str, str]) -> List[Tuple[str, Dict[str, Any]]]:
    """``alert_rules`` with each rule's key under ``alerts:`` (unique, where alert names are not)."""
    alerts = all_alerts(c)
    keys = [a.key for a in alerts]
    if len(keys) != len(set(keys)):
        raise ValueError(f"two alert rules share a key: {sorted(k for k in keys if keys.count(k) > 1)}")
    return [(a.key, finish(a, c.slo, steps)) for a in alerts if c.slo["alerts"][a.key].get("enabled", True)]
