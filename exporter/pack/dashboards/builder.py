"""The dashboard builder: panels, targets and rows in, Grafana dashboard JSON out.

A small builder of our own rather than grafana-foundation-sdk: the dashboards use six panel
types and a handful of options, the builder has no dependency to pin, and the JSON it writes is
plain Grafana schema that a reviewer can read in the diff.

Every panel has a one-line description and a unit; each target may carry ``empty_ok``, the
written reason why the panel may legitimately show nothing (the live test accepts an empty
answer only for those).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence

DS = {"type": "prometheus", "uid": "${datasource}"}
TAG = "vllm-sidecar-exporter"
SEL = 'namespace=~"$namespace", model_name=~"$model_name", pod=~"$pod"'
SEL_POD = 'namespace=~"$namespace", pod=~"$pod"'
L = "namespace_pod_model"


@dataclass
class Target:
    expr: str
    legend: str = ""
    empty_ok: str = ""  # why this query may return nothing on a healthy system
    fmt: str = "time_series"
    instant: bool = False


@dataclass
class Panel:
    title: str
    description: str
    targets: List[Target]
    kind: str = "timeseries"
    unit: str = "short"
    w: int = 12
    h: int = 8
    thresholds: Sequence[tuple] = ()  # (value, color)
    threshold_style: str = "off"  # off | line | area
    runbooks: Sequence[str] = ()
    mappings: Sequence[dict] = ()
    min: Optional[float] = None
    max: Optional[float] = None
    stack: bool = False
    extra: Dict[str, Any] = field(default_factory=dict)


@dataclass
class Row:
    title: str


class Builder:
    def __init__(self, slo: Mapping[str, Any]) -> None:
        self.slo = slo
        self.base = slo["runbook_base_url"].rstrip("/")

    def dashboard(self, uid: str, title: str, description: str, items: Sequence[Any]) -> Dict[str, Any]:
        panels: List[Dict[str, Any]] = []
        x = y = row_h = 0
        pid = 1
        for it in items:
            if isinstance(it, Row):
                if x:
                    y += row_h
                    x = row_h = 0
                panels.append({"id": pid, "type": "row", "title": it.title, "collapsed": False,
                               "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
                pid += 1
                y += 1
                continue
            if x + it.w > 24:
                y += row_h
                x = row_h = 0
            panels.append(self.panel(it, pid, {"h": it.h, "w": it.w, "x": x, "y": y}))
            pid += 1
            x += it.w
            row_h = max(row_h, it.h)
        return {
            "uid": uid,
            "title": title,
            "description": description,
            "tags": [TAG, "vllm"],
            "timezone": "browser",
            "editable": True,
            "graphTooltip": 1,
            "schemaVersion": 39,
            "version": 1,
            "refresh": "30s",
            "time": {"from": "now-3h", "to": "now"},
            "links": [{"title": "vLLM dashboards", "type": "dashboards", "tags": [TAG], "asDropdown": True,
                       "includeVars": True, "keepTime": True, "icon": "external link", "targetBlank": False}],
            "annotations": {"list": [{"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                                      "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
                                      "name": "Annotations & Alerts", "type": "dashboard"}]},
            "templating": {"list": self.variables()},
            "panels": panels,
        }

    def variables(self) -> List[Dict[str, Any]]:
        def query_var(name: str, label: str, q: str) -> Dict[str, Any]:
            return {"type": "query", "name": name, "label": label, "datasource": DS,
                    "definition": q, "query": {"query": q, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
                    "includeAll": True, "multi": True, "allValue": ".*", "refresh": 2, "sort": 1,
                    "current": {"selected": True, "text": ["All"], "value": ["$__all"]}, "hide": 0}

        return [
            {"type": "datasource", "name": "datasource", "label": "Data source", "query": "prometheus",
             "current": {}, "hide": 0, "refresh": 1, "regex": "", "includeAll": False, "multi": False},
            query_var("namespace", "Namespace", "label_values(vllm:num_requests_running, namespace)"),
            query_var("model_name", "Model", 'label_values(vllm:num_requests_running{namespace=~"$namespace"}, model_name)'),
            query_var("pod", "Pod", 'label_values(vllm:num_requests_running{namespace=~"$namespace", model_name=~"$model_name"}, pod)'),
        ]

    def panel(self, p: Panel, pid: int, grid: Dict[str, int]) -> Dict[str, Any]:
        targets = []
        for i, t in enumerate(p.targets):
            # recording rules are named after the SLO file's rate window (default 5m)
            expr = re.sub(r":(rate|ratio_rate|histogram_quantile|mean)5m\b", r":\g<1>" + self.slo["windows"]["rate"], t.expr)
            d = {"refId": chr(ord("A") + i), "datasource": DS, "expr": expr, "legendFormat": t.legend or "__auto",
                 "format": t.fmt, "instant": t.instant, "range": not t.instant, "editorMode": "code"}
            if t.empty_ok:
                d["vllmSidecarEmptyOk"] = t.empty_ok  # read by the tests; Grafana ignores unknown keys
            targets.append(d)
        steps = [{"color": "green", "value": None}] + [{"color": c, "value": v} for v, c in p.thresholds]
        defaults: Dict[str, Any] = {"unit": p.unit, "thresholds": {"mode": "absolute", "steps": steps}}
        if p.min is not None:
            defaults["min"] = p.min
        if p.max is not None:
            defaults["max"] = p.max
        if p.mappings:
            defaults["mappings"] = list(p.mappings)
        if p.kind == "timeseries":
            defaults["custom"] = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10, "showPoints": "never",
                                  "spanNulls": False, "thresholdsStyle": {"mode": p.threshold_style},
                                  "stacking": {"mode": "normal" if p.stack else "none", "group": "A"}}
        out: Dict[str, Any] = {
            "id": pid, "type": p.kind, "title": p.title, "description": p.description, "datasource": DS,
            "gridPos": grid, "targets": targets,
            "fieldConfig": {"defaults": defaults, "overrides": []},
            "options": self.options(p),
        }
        if p.runbooks:
            out["links"] = [{"title": f"Runbook: {a}", "url": f"{self.base}/{a}.md", "targetBlank": True}
                            for a in p.runbooks]
        out.update(p.extra)
        return out

    @staticmethod
    def options(p: Panel) -> Dict[str, Any]:
        if p.kind == "timeseries":
            return {"legend": {"displayMode": "table", "placement": "bottom", "showLegend": True,
                               "calcs": ["lastNotNull", "max"]}, "tooltip": {"mode": "multi", "sort": "desc"}}
        if p.kind == "stat":
            return {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                    "colorMode": "value", "graphMode": "area", "textMode": "auto", "orientation": "auto"}
        if p.kind == "state-timeline":
            return {"showValue": "auto", "mergeValues": True, "rowHeight": 0.9, "alignValue": "left",
                    "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True}}
        if p.kind == "heatmap":
            return {"calculate": False, "yAxis": {"unit": p.unit, "axisPlacement": "left"},
                    "cellGap": 1, "color": {"mode": "scheme", "scheme": "Oranges", "steps": 64},
                    "rowsFrame": {"layout": "auto"}, "tooltip": {"show": True, "yHistogram": True},
                    "legend": {"show": True}}
        if p.kind == "table":
            return {"showHeader": True, "cellHeight": "sm", "footer": {"show": False}}
        if p.kind == "alertlist":
            return {"alertListOptions": {}, "viewMode": "list", "groupMode": "default", "maxItems": 20,
                    "sortOrder": 1, "dashboardAlerts": False, "alertName": "", "alertInstanceLabelFilter": "",
                    "stateFilter": {"firing": True, "pending": True, "noData": False, "normal": False, "error": True}}
        return {}


LEVEL_MAP = [{"type": "value", "options": {
    "0": {"text": "ok", "color": "green", "index": 0}, "1": {"text": "elevated", "color": "yellow", "index": 1},
    "2": {"text": "saturated", "color": "orange", "index": 2}, "3": {"text": "thrashing", "color": "red", "index": 3}}}]
FLAG_MAP = [{"type": "value", "options": {"0": {"text": "no", "color": "green", "index": 0},
                                          "1": {"text": "YES", "color": "red", "index": 1}}}]
UP_MAP = [{"type": "value", "options": {"0": {"text": "down", "color": "red", "index": 0},
                                        "1": {"text": "up", "color": "green", "index": 1}}}]


def quantiles(record: str, legend_prefix: str) -> List[Target]:
    return [Target(f'{L}:{record}:histogram_quantile5m{{{SEL}, quantile="{q}"}}', f"{{{{pod}}}} p{int(float(q) * 100)}")
            for q in ("0.5", "0.95", "0.99")]
