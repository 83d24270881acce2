"""The one configuration object every rule, alert and runbook reads: the SLO plus what is
derived from it once (selectors, grouping labels, recording-rule names, windows in words).

Like a monitoring mixin's ``_config``: a rule never writes a label list, a selector, a window or
a threshold itself; it asks the context, so changing the SLO file changes every place at once.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Tuple

from ..slo import seconds
from .names import Names, grouping, model_labels, outer_labels

# Matchers on vLLM's own label values (not thresholds: these are vLLM's vocabulary)
ERR = 'finished_reason="error"'
ABORT = 'finished_reason="abort"'
NOT_ABORT = 'finished_reason!="abort"'
CAPACITY = 'reason="capacity"'
S5XX = 'status="5xx"'
NOT4XX = 'status!~"4xx"'
TVLLM = 'target="vllm"'
UNCORRECTED = 'type="uncorrected"'


def human_duration(d: str) -> str:
    """``5m`` -> ``5 minutes``, ``90s`` -> ``90 seconds``, ``1h30m`` stays as written."""
    units = {"s": "second", "m": "minute", "h": "hour", "d": "day", "w": "week"}
    if len(d) >= 2 and d[:-1].isdigit() and d[-1] in units:
        n = int(d[:-1])
        return f"{n} {units[d[-1]]}{'' if n == 1 else 's'}"
    return d


def le_for(tokens: float) -> str:
    """vLLM's prompt-length bucket bound at or above ``tokens`` (vLLM uses 1-2-5 buckets), written
    as vLLM writes it (``5000.0``)."""
    mag = 1
    while True:
        for m in (1, 2, 5):
            if m * mag >= tokens:
                return repr(float(m * mag))
        mag *= 10


def indent(text: str, n: int = 2) -> str:
    return "\n".join(" " * n + line for line in text.splitlines())


class Ctx:
    """What every rule reads, made once from one SLO."""

    def __init__(self, slo: Mapping[str, Any]) -> None:
        self.slo = slo
        self.names = Names(slo)
        self.sel = slo["selector"].strip().strip(",")
        self.replica = list(slo["replica_labels"])
        self.outer = outer_labels(slo)
        # every label list a rule writes, outer labels (cluster) first: per pod, per replica
        # (pod and model), per model, per scrape target
        self.per_pod = self.by_(*self.replica)
        self.per_replica = self.by_(*self.replica, "model_name")
        self.per_model = self.by_(*model_labels(self.replica))
        self.target = self.by_("job", "instance")
        self.who = "/".join(f"{{{{ $labels.{x} }}}}" for x in self.replica)
        w = slo["windows"]
        self.rate_window = w["rate"]  # the recording rules' rate window (windows.rate)
        self.sustain_window = w["sustain"]  # windows.sustain
        self.windows: Dict[str, str] = dict(w)
        label = slo.get("sidecar_target_label") or ""
        # the matcher of the raw path's reads where the sidecar serves the figure: pods whose vLLM
        # target does not carry the sidecar's label (sidecar_target_label); "" reads every pod
        self.no_sidecar = f'{label}=""' if label else ""

    # selectors and the usual shapes -------------------------------------------------------
    def by_(self, *labels: str) -> str:
        """A ``by (...)``/``on (...)`` label list: the SLO's outer labels, then ``labels``."""
        return ", ".join(grouping(self.slo, labels))

    def selector(self, *matchers: str) -> str:
        """``{matchers, the SLO's selector}``, or nothing when both are empty."""
        parts = [m for m in matchers if m] + ([self.sel] if self.sel else [])
        return "{" + ", ".join(parts) + "}" if parts else ""

    def rate(self, metric: str, window: str = "", *matchers: str) -> str:
        """Per replica and model: ``sum by (replica, model_name) (rate(metric{...}[window]))``."""
        return f"sum by ({self.per_replica}) (rate({metric}{self.selector(*matchers)}[{window or self.rate_window}]))"

    def running(self, *matchers: str) -> str:
        """The requests vLLM runs now, per replica and model (all its engines), read where they are
        compared rather than recorded; ``matchers`` narrow the pods (``no_sidecar``: the raw path's)."""
        return f"sum by ({self.per_replica}) (vllm:num_requests_running{self.selector(*matchers)})"

    def rec(self, metric: str, op: str, window: str = "") -> str:
        """A per-replica recording rule's name."""
        return self.names.replica(metric, op, window)

    def mrec(self, metric: str, op: str, window: str = "") -> str:
        """A per-model recording rule's name."""
        return self.names.model(metric, op, window)

    def human(self, window: str) -> str:
        return human_duration(window)

    def seconds(self, window: str) -> float:
        return seconds(window)

    @property
    def model(self) -> str:
        return "{{ $labels.model_name }}"

    # roles (prefill/decode disaggregation) ----------------------------------------------------
    @property
    def role(self) -> str:
        """Each replica's role, one series per replica and model with a ``role`` label, from the
        sidecar's ``vllm_sidecar_role_info`` (``recording_pd.roles``); ``both`` where the pod has none."""
        return self.rec("vllm_role", "info")

    @property
    def replicas(self) -> str:
        """Every replica and model vLLM served within the rate window, one series each: the role
        rule's series with the replica's labels only (not its role, nor the SLO's rule labels; read
        at this evaluation, the role rule running first),
        where a join needs a pod's model, instead of vLLM's series over the window again."""
        return f"group by ({self.per_replica}) ({self.role})"

    @property
    def by_role(self) -> str:
        """Per model and role: the group a replica is compared with (a decode instance with decode
        instances, a replica of role both with the others of role both)."""
        return f"{self.per_model}, role"

    @property
    def vllm_rates(self) -> Tuple[str, ...]:
        """The per-replica recorded rates made of vLLM's own counters alone (no sidecar series)."""
        return (self.rec("vllm_generation_tokens", "rate"),)

    def with_role(self, per_replica: str, known: bool = False) -> str:
        """A per-replica-and-model expression with its replica's ``role`` label added (the role rule
        says ``both`` where the pod has no role series; ``both`` too where the rule has no series
        yet). A rate of vLLM's own counters over the rate window (``vllm_rates``), or with
        ``known`` an expression whose replicas the role rule knows at this evaluation (one that
        divides by vLLM's running requests: a page that gave the counters gave them too; a sidecar
        figure read in the alerting group, after the role rule: a sidecar serves its figures from
        vLLM's page, which Prometheus scrapes too, and its role with them), has only replicas the
        role rule has, so the join alone does, without the fallback that reads the expression a
        second time."""
        # an expression of several terms is joined as a whole (``a - b * on ...`` would join b alone)
        x = per_replica
        if "\n" in per_replica:
            x = f"(\n{indent(per_replica, 4)}\n  )"
        elif " " in per_replica:
            x = f"({per_replica})"
        if known or per_replica in self.vllm_rates:
            return f"(\n  {x}\n  * on ({self.per_replica}) group_left (role)\n  {self.role}\n)"
        return (f"(\n  {x}\n  * on ({self.per_replica}) group_left (role)\n  {self.role}\n"
                f"  or on ({self.per_replica})\n"
                f"  label_replace({per_replica}, \"role\", \"both\", \"\", \"\")\n)")

    def prefill(self) -> str:
        """The pods of role prefill (join ``on (replica labels)``)."""
        return f'{self.role}{{role="prefill"}}'

    # evidence in annotations ------------------------------------------------------------------
    def _asked(self, query: str) -> str:
        """``printf "<query>" $labels...``: ``query`` for the alert's replica, as a template
        pipeline's head. In ``query``, ``{R}`` is the selector of the alert's replica (its outer,
        replica and model labels), ``{P}`` that of its pod (no model) and ``{M}`` that of its model."""
        labels = grouping(self.slo, self.replica + ["model_name"])
        model = set(model_labels(self.replica)) | set(self.outer)

        def sel(keep) -> str:
            return "{" + ",".join(f"{x}=%[{i + 1}]q" for i, x in enumerate(labels) if x in keep) + "}"

        pod = set(labels) - {"model_name"}
        q = query.replace("{R}", sel(set(labels))).replace("{P}", sel(pod)).replace("{M}", sel(model)).replace('"', '\\"')
        args = " ".join(f"$labels.{x}" for x in labels)
        return f'printf "{q}" {args}'

    def show(self, query: str, fmt: str = "humanize") -> str:
        """A template that shows, in an annotation, what ``query`` returns for the alert's replica,
        through Prometheus' ``query`` template function: the evidence beside the alert's value
        ("normally 2 %"), ``none`` when it has no value (``{R}``, ``{P}``, ``{M}``: ``_asked``)."""
        return (f"{{{{ with {self._asked(query)} | query }}}}{{{{ . | first | value | {fmt} }}}}"
                f"{{{{ else }}}}none{{{{ end }}}}")

    def show_each(self, query: str, label: str, otherwise: str = "none") -> str:
        """A template that lists, in an annotation, the ``label`` of each series ``query`` returns
        for the alert's replica, in the label's order, each followed by a space (``otherwise`` and a
        space when it returns nothing): ``show`` for a query of several series, asked as the
        annotations are, while the alert is pending or firing, never by the alert's expression
        (``{P}`` and ``{M}`` as in ``_asked``; ``{R}`` only for an alert with a ``model_name``)."""
        return (f'{{{{ range {self._asked(query)} | query | sortByLabel "{label}" }}}}{{{{ .Labels.{label} }}}} '
                f"{{{{ else }}}}{otherwise} {{{{ end }}}}")

    def inputs(self, *metrics: str) -> str:
        """A PromQL query (labels filled in by the alert) that shows a signal's inputs on the
        alert's pod: the ``inputs`` annotation of an alert that reads a boolean."""
        names = "|".join(metrics)
        pod = ", ".join(f'{x}="{{{{ $labels.{x} }}}}"' for x in self.replica)
        return f'{{__name__=~"{names}", {pod}}}'
