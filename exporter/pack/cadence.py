"""Which group each rule of the pack runs in, and so how often it is evaluated.

Every rendered file holds up to four groups, in this order:

    vllm-sidecar-exporter        at every evaluation: every alert that waits less than
                                 ``steady_for`` before firing, and the recording rules those alerts
                                 read (the pages, the early warnings)
    vllm-sidecar-exporter-steady every ``steady_interval``: the alerts that wait ``steady_for`` or
                                 longer but less than ``slow_for`` (a queue not draining for 5
                                 minutes, a TTFT p95 or ITL over its objective for 10, a hot GPU,
                                 an imbalanced P/D fleet), and
                                 the recording rules only they read
    vllm-sidecar-exporter-slow   every ``slow_interval``: the alerts that wait ``slow_for`` or longer
                                 (a replica unlike its peers for 15 minutes, a cold prefix cache for
                                 30, the error budget's ticket burn over an hour), and the recording
                                 rules only they read
    vllm-sidecar-exporter-views  every ``views_interval``: the recording rules no alert reads
                                 (``views``: capacity, cost, efficiency, what a panel plots)

A rule reads what a group before it wrote at most one evaluation interval ago, and what a later
group writes only where it is a baseline: a recording rule any fast alert needs, directly or
through others, is in the alerting group whatever else reads it (and one a steady alert needs in
the steady group, unless a fast one needs it too), unless the alerts read it as a baseline
(``Recording.baseline``: the busy throughput a replica of its model and role normally makes,
learned over a day, per model, which the alerting group puts beside each replica; the scrape
targets seen within the hour, to which the alerting group adds those seen within Prometheus'
lookback). A baseline moves over hours, so the slow group records it, with what only it reads, and
the groups before read it up to one ``slow_interval`` old (Prometheus' 5-minute lookback holds it
between two evaluations; the backtest engine evaluates the slow group's baselines first and lets a
reader see what they recorded before its evaluation). The slow group is rendered for its baselines
even where no alert waits ``slow_for``. A baseline is one whose absence keeps its alert silent (a
Prometheus just started has none until the slow group first runs: up to ``slow_interval``, in
which the rules' path of the GPU-busy alert cannot fire and a target already gone before the start
is not known) and whose age delays no crossing: a new pod, or a target answering once, is known at
the alerting group's next evaluation. Not vLLM expected to answer (it gates
a page from the first evaluation), not the long-prompt normals (without one the surge warning
falls back to a share of requests, which a code-serving fleet's normal traffic exceeds), not half
an hour of preemptions (a count crossing its threshold, up to 2 minutes late).
An alert of a slower group becomes pending at its group's first evaluation
after its condition holds (within one interval) and fires at the first one its ``for`` after that:
a 15-minute wait becomes 16 to 18 minutes at 2m (15 to 15.5 at every 30 s evaluation), a 5-minute
wait 5 to 6 minutes at 1m: a fifth of the wait at most. Every page waits less than
``steady_for`` and runs at every evaluation. Where Prometheus evaluates every ``steady_interval``
or less often anyway (the SLO's evaluation_interval of 1m), the steady alerts run as often as
before, reading the alerting group's records up to one evaluation old; at 30 s, the steady group
halves what those alerts' rules cost.
``slow_interval: 0s`` keeps every slow alert and every baseline in the group before it, ``steady_interval: 0s`` every
steady one in the alerting group, ``views_interval: 0s`` every view.
Where ``views_interval`` is 0s, the views run with the alerts: in the alerting group, or in the
steady or the slow group where they read what that group records (the later of the two).
Prometheus, vmalert and the backtest engine (``backtest``, ``postmortem``, the detection matrix)
run each group at its own interval; promtool's
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
from .ruleyaml import SLOW_GROUP, STEADY_GROUP, VIEWS_GROUP
from .runbooks import act_steps
from .views import needed, reads_of_alert

Keyed = Tuple[str, Dict[str, Any]]  # an alert's key under ``alerts:`` and its rule


@dataclass
class Cadence:
    """The pack's rules by group, each list in the order the pack renders it."""
    recordings: List[Recording] = field(default_factory=list)
    alerts: List[Keyed] = field(default_factory=list)
    steady_recordings: List[Recording] = field(default_factory=list)
    steady_alerts: List[Keyed] = field(default_factory=list)
    slow_recordings: List[Recording] = field(default_factory=list)
    slow_alerts: List[Keyed] = field(default_factory=list)
    views: List[Recording] = field(default_factory=list)

    def later(self, slo: Dict[str, Any]) -> List[Tuple[str, str, List[Recording], List[Keyed]]]:
        """The groups after the alerting group that hold rules, in order: (name, interval, recording
        rules, alerts). What every rendered file (``rules``, ``vmalert``) writes after the first."""
        groups = [(STEADY_GROUP, "steady_interval", self.steady_recordings, self.steady_alerts),
                  (SLOW_GROUP, "slow_interval", self.slow_recordings, self.slow_alerts),
                  (VIEWS_GROUP, "views_interval", self.views, [])]
        # a group holding recording rules only (the slow group's baselines where no alert waits
        # slow_for) is rendered too
        return [(name, slo[key], recordings, alerts) for name, key, recordings, alerts in groups if recordings or alerts]


def tier(slo: Dict[str, Any], rule: Dict[str, Any]) -> str:
    """The group an alert runs in by how long it waits: ``slow`` (``slow_for`` or longer, where the
    SLO gives the slow group an interval), ``steady`` (``steady_for`` or longer, likewise), else
    ``fast``."""
    wait = seconds(rule["for"])
    if seconds(slo["slow_interval"]) > 0 and wait >= seconds(slo["slow_for"]):
        return "slow"
    if seconds(slo["steady_interval"]) > 0 and wait >= seconds(slo["steady_for"]):
        return "steady"
    return "fast"


def arrange(slo: Dict[str, Any], recordings: Sequence[Recording], alerts: Sequence[Keyed]) -> Cadence:
    """Every recording rule and alert of the pack in its group (see the module's docstring)."""
    by_tier: Dict[str, List[Keyed]] = {"fast": [], "steady": [], "slow": []}
    for k, r in alerts:
        by_tier[tier(slo, r)].append((k, r))

    def roots(keyed: List[Keyed]) -> set:
        return set().union(*(reads_of_alert(r) for _, r in keyed))

    # the baselines the alerting and steady groups read are the slow group's, with what only they read
    late = frozenset(r.record for r in recordings if r.baseline and seconds(slo["slow_interval"]) > 0)
    fast_reads = needed(recordings, roots(by_tier["fast"]), stop=late)
    steady_reads = needed(recordings, roots(by_tier["steady"]), stop=late) - fast_reads
    baselines = needed(recordings, roots(by_tier["fast"]) | roots(by_tier["steady"])) & late
    slow_reads = needed(recordings, roots(by_tier["slow"]) | baselines) - fast_reads - steady_reads
    out = Cadence(alerts=by_tier["fast"], steady_alerts=by_tier["steady"], slow_alerts=by_tier["slow"])
    own_group = seconds(slo["views_interval"]) > 0
    for r in recordings:
        if r.record in fast_reads:
            out.recordings.append(r)
        elif r.record in steady_reads:
            out.steady_recordings.append(r)
        elif r.record in slow_reads:
            out.slow_recordings.append(r)
        elif own_group:
            out.views.append(r)
        else:  # a view kept with the alerts: in the latest group whose records it reads
            reaches = needed(recordings, {r.record})
            (out.slow_recordings if reaches & slow_reads else
             out.steady_recordings if reaches & steady_reads else out.recordings).append(r)
    return out


def of_slo(slo: Dict[str, Any]) -> Cadence:
    """The whole pack of one SLO file arranged: every enabled alert (its runbook's steps in it
    where the SLO names no runbook URL) and every recording rule. What every rendered file
    (``rules``, ``vmalert``) starts from."""
    c = Ctx(slo)
    steps = act_steps(slo) if not slo["runbook_base_url"] else {}
    return arrange(slo, recording_rules(c), keyed_alert_rules(c, steps))
