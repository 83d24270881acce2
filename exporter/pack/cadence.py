"""Which group each rule of the pack runs in, and so how often it is evaluated.

Every rendered file holds up to three groups, in this order:

    vllm-sidecar-exporter        at every evaluation: every alert that waits less than ``slow_for``
                                 before firing, and the recording rules those alerts read
    vllm-sidecar-exporter-slow   every ``slow_interval``: the alerts that wait ``slow_for`` or longer
                                 (a replica unlike its peers for 15 minutes, a cold prefix cache for
                                 30, the error budget's ticket burn over an hour), and the recording
                                 rules only they read
    vllm-sidecar-exporter-views  every ``views_interval``: the recording rules no alert reads
                                 (``views``: capacity, cost, efficiency, what a panel plots)

A rule reads what a group before it wrote at most one evaluation interval ago, and never what a
later group writes: a recording rule any fast alert needs, directly or through others, is in the
alerting group whatever else reads it. An alert of the slow group becomes pending at most one
``slow_interval`` after its condition holds and fires at most one more later; every page and
every alert of the SLO's objectives waits less than ``slow_for`` and runs at every evaluation.
``slow_interval: 0s`` keeps every alert in the alerting group, ``views_interval: 0s`` every view.
promtool's unit tests (and the detection matrix, and ``backtest``) evaluate every group at their own
step: the groups' conditions are what they prove, the slow group's added wait is bounded above.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Sequence, Tuple

from ..slo import seconds
from .recorded import Recording
from .views import needed, reads_of_alert

Keyed = Tuple[str, Dict[str, Any]]  # an alert's key under ``alerts:`` and its rule


@dataclass
class Cadence:
    """The pack's rules by group, each list in the order the pack renders it."""
    recordings: List[Recording] = field(default_factory=list)
    alerts: List[Keyed] = field(default_factory=list)
    slow_recordings: List[Recording] = field(default_factory=list)
    slow_alerts: List[Keyed] = field(default_factory=list)
    views: List[Recording] = field(default_factory=list)


def is_slow(slo: Dict[str, Any], rule: Dict[str, Any]) -> bool:
    """An alert the slow group evaluates: one that waits ``slow_for`` or longer, where the SLO
    gives the slow group an interval."""
    return seconds(slo["slow_interval"]) > 0 and seconds(rule["for"]) >= seconds(slo["slow_for"])


def arrange(slo: Dict[str, Any], recordings: Sequence[Recording], alerts: Sequence[Keyed]) -> Cadence:
    """Every recording rule and alert of the pack in its group (see the module's docstring)."""
    fast = [(k, r) for k, r in alerts if not is_slow(slo, r)]
    slow = [(k, r) for k, r in alerts if is_slow(slo, r)]
    fast_reads = needed(recordings, set().union(*(reads_of_alert(r) for _, r in fast)))
    slow_reads = needed(recordings, set().union(*(reads_of_alert(r) for _, r in slow))) - fast_reads
    out = Cadence(alerts=fast, slow_alerts=slow)
    keep_views = seconds(slo["views_interval"]) > 0
    for r in recordings:
        if r.record in fast_reads or (r.record not in slow_reads and not keep_views):
            out.recordings.append(r)
        elif r.record in slow_reads:
            out.slow_recordings.append(r)
        else:
            out.views.append(r)
    return out
