"""Names of the pack's recording rules, made in one place from the SLO file.

Recording rules follow Prometheus' ``level:metric:operations`` convention. The level names the
labels a rule keeps: per replica it is the SLO's ``replica_labels`` plus ``model`` (with the
default ``[namespace, pod]``: ``namespace_pod_model``), per model the same without the labels
that name one replica (``pod``, ``instance``): ``namespace_model``. Rules, alerts, dashboards and
runbooks all take their names from here, so a different ``replica_labels`` or rate window renames
every reference at once.

The SLO's ``outer_labels`` (default ``[cluster]``) are kept by every aggregation and matched by
every join on top of those labels (``grouping``), the way the kubernetes-mixin aggregates
``by (cluster, ...)``: over a global ruler (Thanos, Mimir, VictoriaMetrics) two clusters that run
the same namespace and pod stay two series, and where the label is absent (one Prometheus) the
grouping is the same as without it. They never enter a level: recorded series keep their names
whatever ``outer_labels`` holds.
"""

from __future__ import annotations

from typing import Any, List, Mapping, Sequence, Tuple

REPLICA_ONLY = ("pod", "instance")

# vLLM's latency histograms: (recording-rule metric, vLLM's names of it newest first), read by the
# rules (TTFT) and the dashboards (every one)
LATENCY_HISTOGRAMS: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("vllm_time_to_first_token_seconds", ("vllm:time_to_first_token_seconds",)),
    ("vllm_inter_token_latency_seconds", ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")),
    ("vllm_e2e_request_latency_seconds", ("vllm:e2e_request_latency_seconds",)),
    ("vllm_request_queue_time_seconds", ("vllm:request_queue_time_seconds",)),
)


def outer_labels(slo: Mapping[str, Any]) -> List[str]:
    """The labels above a replica (the cluster, a region) that no aggregation or join drops."""
    return list(slo.get("outer_labels", ["cluster"]))


def grouping(slo: Mapping[str, Any], labels: Sequence[str]) -> List[str]:
    """``labels`` with the SLO's outer labels first: what every ``by (...)`` and ``on (...)`` of the
    pack lists (``grouping(slo, ["pod"])`` -> ``["cluster", "pod"]``)."""
    outer = outer_labels(slo)
    return outer + [x for x in labels if x not in outer]


def replica_level(replica_labels: Sequence[str]) -> str:
    return "_".join(list(replica_labels) + ["model"])


def model_labels(replica_labels: Sequence[str]) -> List[str]:
    """The labels that identify a model across its replicas (replica labels less pod/instance)."""
    return [x for x in replica_labels if x not in REPLICA_ONLY] + ["model_name"]


def model_level(replica_labels: Sequence[str]) -> str:
    return "_".join([x for x in replica_labels if x not in REPLICA_ONLY] + ["model"])


class Names:
    """Recording-rule names for one SLO: ``Names(slo).replica("vllm_generation_tokens", "rate")``
    is ``namespace_pod_model:vllm_generation_tokens:rate5m`` with the default rate window."""

    def __init__(self, slo: Mapping[str, Any]) -> None:
        self.replica_labels = list(slo["replica_labels"])
        self.window = slo["windows"]["rate"]
        self.replica_prefix = replica_level(self.replica_labels)
        self.model_prefix = model_level(self.replica_labels)

    def _op(self, op: str, window: str = "") -> str:
        # operations over a range carry their window (rate5m, the rate window unless another is
        # given); instant ones (max, sum) do not, unless a window is given (avg_over_time + 1d)
        if op in ("rate", "ratio_rate", "histogram_quantile", "mean"):
            return f"{op}{window or self.window}"
        return f"{op}{window}"

    def replica(self, metric: str, op: str, window: str = "") -> str:
        return f"{self.replica_prefix}:{metric}:{self._op(op, window)}"

    def model(self, metric: str, op: str, window: str = "") -> str:
        return f"{self.model_prefix}:{metric}:{self._op(op, window)}"
