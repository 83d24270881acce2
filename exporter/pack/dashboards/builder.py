"""The dashboard builder: panels, targets and rows in, Grafana dashboard JSON out.

A small builder of our own rather than grafana-foundation-sdk: the dashboards use six panel
types and a handful of options, the builder has no dependency to pin, and the JSON it writes is
plain Grafana schema that a reviewer can read in the diff. tests/pack/test_dashboards_schema.py
type-checks it against Grafana's own schema (npm's ``@grafana/schema``) for Grafana 10 to 13.

Everything that depends on the SLO file comes from the ``Builder``: recording-rule names
(``exporter.pack.names``), the rate window, the selectors of the template variables (with the
SLO's cluster label) and the runbook base URL. The dashboard modules never spell a window, a
recording-rule level or a threshold themselves.

Every panel has a one-line description and a unit; each target may carry ``empty_ok``, the
written reason why the panel may legitimately show nothing. It is not written into the JSON
(Grafana's schema has no place for it): ``Builder.empty_ok`` collects it for the live test.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..names import LATENCY_HISTOGRAMS, Names, grouping, model_labels

TAG = "vllm-sidecar-exporter"
# The data source: panels and variables read the ${datasource} variable, so one dashboard serves
# every Prometheus (and provisioning needs no UID); the import dialog's DS_PROMETHEUS input (see
# Builder.inputs) pre-selects that variable.
DS = {"type": "prometheus", "uid": "${datasource}"}
DS_INPUT = "DS_PROMETHEUS"
# the series every label_values() variable reads: vLLM's own gauge, present on every replica
VAR_SERIES = "vllm:num_requests_running"
# The oldest Grafana release line the dashboards are checked against (tests/grafana_schema)
# and the dashboard schema version it writes.
GRAFANA_MIN = "10.4.0"
SCHEMA_VERSION = 39
# The flight recorder's events (exporter/runtime/flight.py), counted per kind by every sidecar:
# Grafana cannot reach the pods, so their events come to the dashboards as this counter
FLIGHT_EVENTS = "vllm_sidecar_flight_events_total"
PANEL_NAMES = {"timeseries": "Time series", "stat": "Stat", "state-timeline": "State timeline",
               "heatmap": "Heatmap", "table": "Table", "alertlist": "Alert list"}


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
    thresholds: Sequence[Tuple[float, str]] = ()  # (value, color) above the base color
    base_color: str = "green"
    threshold_style: str = "off"  # off | line | area
    runbooks: Sequence[str] = ()
    mappings: Sequence[dict] = ()
    min: Optional[float] = None
    max: Optional[float] = None
    decimals: Optional[int] = None
    stack: bool = False
    transformations: Sequence[dict] = ()
    data_links: Sequence[dict] = ()  # per value (row, series): fieldConfig.defaults.links
    doc_links: Sequence[dict] = ()  # panel links besides the runbooks'


@dataclass
class Row:
    title: str


def value_map(*entries: Tuple[str, str, str]) -> List[Dict[str, Any]]:
    """A value mapping: (value, text, color) for each value."""
    return [{"type": "value", "options": {v: {"text": t, "color": c, "index": i}
                                          for i, (v, t, c) in enumerate(entries)}}]


LEVEL_MAP = value_map(("0", "ok", "green"), ("1", "elevated", "yellow"), ("2", "saturated", "orange"),
                      ("3", "thrashing", "red"))
FLAG_MAP = value_map(("0", "no", "green"), ("1", "YES", "red"))
UP_MAP = value_map(("0", "down", "red"), ("1", "up", "green"))
QUANTILES = ("0.5", "0.95", "0.99")
LATENCY_NAMES = dict(LATENCY_HISTOGRAMS)  # recording-rule metric -> vLLM's names of its histogram


def link(title: str, url: str, tooltip: str, icon: str = "doc") -> Dict[str, Any]:
    """A panel link. Grafana's schema types panel links as dashboard links, every field required;
    the fields a plain URL link does not use carry their schema defaults."""
    return {"title": title, "type": "link", "url": url, "tooltip": tooltip, "icon": icon, "targetBlank": True,
            "asDropdown": False, "includeVars": False, "keepTime": False, "tags": []}


class Builder:
    def __init__(self, slo: Mapping[str, Any]) -> None:
        self.slo = slo
        self.names = Names(slo)
        self.window = slo["windows"]["rate"]
        self.sustain = slo["windows"]["sustain"]
        self.runbook_base = slo["runbook_base_url"].rstrip("/")
        self.cluster = slo["dashboards"]["cluster_label"]  # "" turns the cluster variable off
        # what no aggregation drops: the SLO's outer labels (as in the rules) and the cluster variable's
        self.outer = grouping(slo, [self.cluster] if self.cluster else [])
        # the labels that name one model's peer group: a replica is compared within its cluster too
        self.peer_labels = self.by_list(*model_labels(slo["replica_labels"]))
        self.empty_ok: Dict[Tuple[str, str, str], str] = {}  # (dashboard uid, panel title, refId) -> why

    # -- selectors and names ---------------------------------------------------------------------

    def by_list(self, *labels: str) -> List[str]:
        return self.outer + [x for x in labels if x not in self.outer]

    def by(self, *labels: str) -> str:
        """A ``by (...)``/``on (...)`` label list: the outer labels (cluster) first, then ``labels``,
        so that with the cluster variable at All two clusters' ``llm/vllm-0`` stay two series."""
        return ", ".join(self.by_list(*labels))

    def sel(self, model: bool = True, pod: bool = True, *extra: str) -> str:
        """Label matchers for the template variables, cluster first (when on)."""
        m = []
        if self.cluster:
            m.append(f'{self.cluster}=~"$cluster"')
        m.append('namespace=~"$namespace"')
        if model:
            m.append('model_name=~"$model_name"')
        if pod:
            m.append('pod=~"$pod"')
        return ", ".join(m + list(extra))

    def s(self, metric: str, model: bool = True, pod: bool = True, *extra: str) -> str:
        """A vector selector over ``metric`` narrowed by the template variables."""
        return f"{metric}{{{self.sel(model, pod, *extra)}}}"

    def replica(self, metric: str, op: str, *extra: str) -> str:
        """A per-replica recording rule, selected by every variable."""
        return self.s(self.names.replica(metric, op), True, True, *extra)

    def model(self, metric: str, op: str, window: str = "") -> str:
        """A per-model recording rule (no pod label), selected by cluster, namespace and model."""
        return self.s(self.names.model(metric, op, window), True, False)

    def quantiles(self, metric: str) -> List[Target]:
        """p50/p95/p99 of a latency histogram per replica over the rate window."""
        return [Target(self.quantile(metric, q), f"{{{{pod}}}} p{float(q) * 100:g}") for q in QUANTILES]

    def quantile(self, metric: str, q: str) -> str:
        """One quantile of a latency histogram per replica over the rate window, taken when the panel
        is looked at from vLLM's buckets under every name vLLM has given them (the rules record only
        the quantile they read: the rules' and the panel's figures are the same numbers)."""
        by = self.by(*self.slo["replica_labels"], "model_name", "le")
        rates = "\nor\n".join(f"sum by ({by}) (rate({self.s(n + '_bucket')}[{self.window}]))"
                               for n in LATENCY_NAMES[metric])
        return f"histogram_quantile({q},\n{rates}\n)"

    def runbook(self, alert: str) -> str:
        return f"{self.runbook_base}/{alert}.md"

    # -- the dashboard ---------------------------------------------------------------------------

    def postmortem_doc(self) -> str:
        """docs/postmortem.md next to the runbooks (``runbook_base_url`` is docs/runbooks), or ""."""
        return self.runbook_base.rsplit("/", 1)[0] + "/postmortem.md" if self.runbook_base else ""

    def flight_events_expr(self, window: str = "$__interval") -> str:
        """The flight-recorder events each pod opened over ``window``, per kind (only those > 0)."""
        return (f"sum by ({self.by('namespace', 'pod', 'kind')}) (increase({self.s(FLIGHT_EVENTS, False)}[{window}])) > 0")

    def flight_annotation(self) -> Dict[str, Any]:
        """An annotation on every event the pods' flight recorders pinned (KV thrashing, a stall,
        vLLM unreachable or restarted, a GPU XID), one per pod and kind. The Prometheus data
        source's own annotation fields (expr, step, titleFormat, tagKeys, textFormat,
        useValueForTime), which its prepareAnnotation reads; Grafana's dashboard schema does not
        model a data source's annotation fields (tests/grafana_schema/checker.py checks them)."""
        return {"datasource": DS, "enable": True, "hide": False, "iconColor": "orange",
                "name": "Flight recorder events", "expr": self.flight_events_expr("$__interval"), "step": "1m",
                "titleFormat": "{{kind}} on {{pod}}", "tagKeys": "namespace,pod,kind",
                "textFormat": "The pod's flight recorder pinned the polls around it: "
                              "GET /debug/flight?start=&end= on the pod (docs/postmortem.md)",
                "useValueForTime": False}

    def dashboard(self, uid: str, title: str, description: str, items: Sequence[Any],
                  flight: bool = True) -> Dict[str, Any]:
        """``flight``: annotate the flight recorders' events (``flight_annotation``)."""
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
            panels.append(self.panel(uid, it, pid, {"h": it.h, "w": it.w, "x": x, "y": y}))
            pid += 1
            x += it.w
            row_h = max(row_h, it.h)
        kinds = sorted({p["type"] for p in panels if p["type"] != "row"})
        return {
            "__inputs": self.inputs(),
            "__requires": self.requires(kinds),
            "uid": uid,
            "title": title,
            "description": description,
            "tags": [TAG, "vllm"],
            "timezone": "browser",
            "editable": True,
            "graphTooltip": 1,
            "schemaVersion": SCHEMA_VERSION,
            "version": 1,
            "refresh": "30s",
            "time": {"from": "now-3h", "to": "now"},
            "links": [{"title": "vLLM dashboards", "type": "dashboards", "tags": [TAG], "asDropdown": True,
                       "includeVars": True, "keepTime": True, "icon": "external link", "targetBlank": False,
                       "tooltip": "The other vLLM dashboards, with the same variables and time range"}],
            "annotations": {"list": [{"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                                      "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
                                      "name": "Annotations & Alerts", "type": "dashboard"}]
                            + ([self.flight_annotation()] if flight else [])},
            "templating": {"list": self.variables()},
            "panels": panels,
        }

    @staticmethod
    def inputs() -> List[Dict[str, Any]]:
        """What Grafana's import dialog asks for (the shape Grafana's own "Export for sharing
        externally" writes). Import replaces ``${DS_PROMETHEUS}`` in every string with the chosen
        data source's UID; only the datasource variable's current value holds it."""
        return [{"name": DS_INPUT, "label": "Prometheus", "description": "The Prometheus that scrapes vLLM and "
                 "the sidecar and evaluates the vLLM rules pack", "type": "datasource", "pluginId": "prometheus",
                 "pluginName": "Prometheus"}]

    @staticmethod
    def requires(kinds: Sequence[str]) -> List[Dict[str, Any]]:
        reqs = [{"type": "grafana", "id": "grafana", "name": "Grafana", "version": GRAFANA_MIN},
                {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"}]
        reqs += [{"type": "panel", "id": k, "name": PANEL_NAMES[k], "version": ""} for k in kinds]
        return sorted(reqs, key=lambda r: r["id"])

    def variables(self) -> List[Dict[str, Any]]:
        def query_var(name: str, label: str, label_name: str, matchers: str) -> Dict[str, Any]:
            q = f"label_values({VAR_SERIES}{{{matchers}}}, {label_name})" if matchers else \
                f"label_values({VAR_SERIES}, {label_name})"
            # allValue .* also matches series without the label (one cluster, no cluster label)
            return {"type": "query", "name": name, "label": label, "datasource": DS,
                    "query": {"query": q, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
                    "includeAll": True, "multi": True, "allValue": ".*", "refresh": 2, "sort": 1, "regex": "",
                    "current": {"selected": True, "text": ["All"], "value": ["$__all"]}, "hide": 0}

        c = f'{self.cluster}=~"$cluster"' if self.cluster else ""
        ns = ", ".join(x for x in (c, 'namespace=~"$namespace"') if x)
        out: List[Dict[str, Any]] = [
            # Imported: "${DS_PROMETHEUS}" becomes the chosen data source's UID, which Scenes-based
            # dashboards select (they match the value). Provisioned (ConfigMap, file, operator), it
            # matches nothing: the pre-Scenes variable code matches the text "default" (the default
            # data source), Scenes takes the first Prometheus in Grafana's list.
            {"type": "datasource", "name": "datasource", "label": "Data source", "query": "prometheus",
             "current": {"selected": False, "text": "default", "value": "${" + DS_INPUT + "}"},
             "hide": 0, "refresh": 1, "regex": "", "includeAll": False, "multi": False},
        ]
        if self.cluster:
            out.append(query_var("cluster", "Cluster", self.cluster, ""))
        out += [
            query_var("namespace", "Namespace", "namespace", c),
            query_var("model_name", "Model", "model_name", ns),
            query_var("pod", "Pod", "pod", ns + ', model_name=~"$model_name"'),
        ]
        return out

    def panel(self, uid: str, p: Panel, pid: int, grid: Dict[str, int]) -> Dict[str, Any]:
        targets = []
        for i, t in enumerate(p.targets):
            ref = chr(ord("A") + i)
            targets.append({"refId": ref, "datasource": DS, "expr": t.expr, "legendFormat": t.legend or "__auto",
                            "format": t.fmt, "instant": t.instant, "range": not t.instant, "editorMode": "code"})
            if t.empty_ok:
                self.empty_ok[(uid, p.title, ref)] = t.empty_ok
        steps: List[Dict[str, Any]] = [{"color": p.base_color, "value": None}]
        steps += [{"color": c, "value": v} for v, c in p.thresholds]
        defaults: Dict[str, Any] = {"unit": p.unit, "thresholds": {"mode": "absolute", "steps": steps}}
        for key in ("min", "max", "decimals"):
            if getattr(p, key) is not None:
                defaults[key] = getattr(p, key)
        if p.mappings:
            defaults["mappings"] = list(p.mappings)
        if p.data_links:
            defaults["links"] = list(p.data_links)
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
        if p.transformations:
            out["transformations"] = list(p.transformations)
        links = list(p.doc_links)
        if p.runbooks and self.runbook_base:  # no runbook URL configured: no link to nowhere
            links += [link(f"Runbook: {a}", self.runbook(a), f"What to do when {a} fires") for a in p.runbooks]
        if links:
            out["links"] = links
        return out

    @staticmethod
    def options(p: Panel) -> Dict[str, Any]:
        """Each panel plugin's options, in the shape its schema (``panelcfg``) has in Grafana 10
        to 13; required fields written out with Grafana's defaults."""
        if p.kind == "timeseries":
            return {"legend": {"displayMode": "table", "placement": "bottom", "showLegend": True,
                               "calcs": ["lastNotNull", "max"]}, "tooltip": {"mode": "multi", "sort": "desc"}}
        if p.kind == "stat":
            # percentChangeColorMode (Grafana 11+) is left out: 10 does not know it, and it only
            # matters with showPercentChange
            return {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                    "colorMode": "value", "graphMode": "area", "textMode": "auto", "orientation": "auto",
                    "justifyMode": "auto", "showPercentChange": False, "wideLayout": True}
        if p.kind == "state-timeline":
            return {"showValue": "auto", "mergeValues": True, "rowHeight": 0.9, "alignValue": "left",
                    "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True, "calcs": []},
                    "tooltip": {"mode": "single", "sort": "none"}}
        if p.kind == "heatmap":
            return {"calculate": False, "yAxis": {"unit": p.unit, "axisPlacement": "left"},
                    "cellGap": 1, "color": {"mode": "scheme", "scheme": "Oranges", "steps": 64, "exponent": 0.5,
                                            "fill": "dark-orange", "reverse": False},
                    "rowsFrame": {"layout": "auto"}, "tooltip": {"mode": "single", "yHistogram": True},
                    "legend": {"show": True}, "showValue": "auto", "exemplars": {"color": "rgba(255,0,255,0.7)"}}
        if p.kind == "table":
            return {"showHeader": True, "cellHeight": "sm", "frameIndex": 0}
        if p.kind == "alertlist":
            return {"alertListOptions": {}, "viewMode": "list", "groupMode": "default", "maxItems": 20,
                    "sortOrder": 1, "dashboardAlerts": False, "alertName": "", "alertInstanceLabelFilter": "",
                    "stateFilter": {"firing": True, "pending": True, "noData": False, "normal": False, "error": True}}
        return {}
