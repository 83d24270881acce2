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
alerting group whatever else reads it. An alert of the slow group becomes pending at its group's
first evaluation after its condition holds (within one ``slow_interval``) and fires at the first
one its ``for`` after that: a 15-minute wait becomes 16 to 18 minutes at 2m (15 to 15.5 at every
30 s evaluation). Every page and every alert of the SLO's objectives waits less than ``slow_for``
and runs at every evaluation.
``slow_interval: 0s`` keeps every alert in the alerting group, ``views_interval: 0s`` every view.
Where ``views_interval`` is 0s, the views run with the alerts: in the alerting group, or in the
slow group where they read what it records. Prometheus, vmalert and the backtest engine
(``backtest``, ``postmortem``, the detection matrix) run each group at its own interval; promtool's
unit tests run every group at every step, so they prove the conditions, and the matrix the cadence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Sequence, Tuple

from ..slo import seconds
from .alerts import keyed_alert_rules
from .context import Ctx
from .recorded import Recording
from .recording import recording_rules
from .runbooks import act_steps
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
    own_group = seconds(slo["views_interval"]) > 0
    for r in recordings:
        if r.record in fast_reads:
            out.recordings.append(r)
        elif r.record in slow_reads:
            out.slow_recordings.append(r)
        elif own_group:
            out.views.append(r)
        elif needed(recordings, {r.record}) & slow_reads:
            out.slow_recordings.append(r)  # a view kept with the alerts, reading what the slow group records
        else:
            out.recordings.append(r)
    return out


def of_slo(slo: Dict[str, Any]) -> Cadence:
    """The whole pack of one SLO file arranged: every enabled alert (its runbook's steps in it
    where the SLO names no runbook URL) and every recording rule. What every rendered file
    (``rules``, ``vmalert``) starts from."""
    c = Ctx(slo)
    steps = act_steps(slo) if not slo["runbook_base_url"] else {}
    return arrange(slo, recording_rules(c), keyed_alert_rules(c, steps))
