"""The rendered rule files: the alerting group (recording rules and the alerts that read them), the
steady and the slow alerts' groups and the views' group (``cadence``), as a plain Prometheus rule file and as a
PrometheusRule.

``write_all(slo, out_dir)`` writes ``rules/vllm.rules.yml``, its vmalert form
``rules/vllm.vmalert.rules.yml`` (``exporter.pack.vmalert``), the PrometheusRule under
``deploy/kubernetes/base/`` and the runbooks under ``docs/runbooks/``. Only PromQL that
Prometheus 2.42 and 3.x both run, and that Thanos and Mimir rulers run, is used.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List

from . import cadence
from .context import Ctx, le_for  # noqa: F401 - le_for is part of this module's interface
from .ruleyaml import GROUP, dump
from .runbooks import render_runbooks
from .vmalert import VMALERT_PATH, render_vmalert

PLAIN_PATH = os.path.join("rules", "vllm.rules.yml")
OPERATOR_PATH = os.path.join("deploy", "kubernetes", "base", "prometheusrule.yaml")


def render_groups(slo: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The alerting group: the recording rules its alerts read, then the alerts. Rules of a group
    are evaluated in order at the same timestamp, so an alert always reads this evaluation's
    recorded values; across two groups it could read the previous interval's (and promtool's
    results would depend on which group ran first). Then, every ``steady_interval`` and every
    ``slow_interval``, the alerts that wait ``steady_for`` and ``slow_for`` or longer with the
    recording rules only they read, and every ``views_interval`` the views: the rules no alert
    reads (``cadence``)."""
    groups = cadence.of_slo(slo)
    common = slo["labels"]
    out = [{"name": GROUP, "rules": [r.as_rule(common) for r in groups.recordings] + [a for _, a in groups.alerts]}]
    return out + [{"name": name, "interval": every, "rules": [r.as_rule(common) for r in recordings] + [a for _, a in alerts]}
                  for name, every, recordings, alerts in groups.later(slo)]


HEADER = ("# Rendered by `vllm-sidecar-exporter rules --slo rules/slo.yaml --out-dir .` from the SLO file.\n"
          "# Do not edit by hand: change the SLO file and render again.\n")


def render_plain(slo: Dict[str, Any]) -> str:
    return HEADER + dump({"groups": render_groups(slo)})


def render_operator(slo: Dict[str, Any]) -> str:
    obj = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": {
            "name": "vllm-sidecar-exporter",
            "labels": {
                "app.kubernetes.io/name": "vllm-sidecar-exporter",
                "app.kubernetes.io/component": "alerting",
                "role": "alert-rules",
            },
        },
        "spec": {"groups": render_groups(slo)},
    }
    return HEADER + dump(obj)


def rendered_files(slo: Dict[str, Any]) -> Dict[str, str]:
    """Relative path -> text of every file the pack renders from one SLO."""
    files = {PLAIN_PATH: render_plain(slo), OPERATOR_PATH: render_operator(slo), VMALERT_PATH: render_vmalert(slo)}
    files.update(render_runbooks(slo))
    return files


def write_all(slo: Dict[str, Any], out_dir: str) -> List[str]:
    written = []
    for rel, text in rendered_files(slo).items():
        path = os.path.join(out_dir, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
        written.append(path)
    return written
