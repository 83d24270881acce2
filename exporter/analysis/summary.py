"""What the rules would have done, in numbers: per alert and label set, time firing and pending,
firing episodes (per day), the longest episode and the first firing after an onset; and the CI
gate's verdict on them.

An evaluation in a state counts one evaluation interval of that state (the state holds until the
next evaluation). An episode is a run of consecutive firing evaluations.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import numpy as np

from .alerts import runs
from .rulemanager import Run

DAY_MS = 86_400_000


@dataclass(frozen=True)
class Episode:
    start_ms: int
    end_ms: int         # the last firing evaluation
    duration_ms: int    # evaluations x interval


@dataclass(frozen=True)
class AlertSummary:
    alertname: str
    labels: Dict[str, str]          # every label of the alert, alertname excluded
    identity: Dict[str, str]        # the labels that tell its series apart (the rule's own left out)
    firing_ms: int
    pending_ms: int
    episodes: List[Episode]
    episodes_per_day: float
    longest_ms: int
    first_firing_after_onset_ms: Optional[int]

    @property
    def severity(self) -> str:
        return self.labels.get("severity", "")


@dataclass(frozen=True)
class AlertTotal:
    alertname: str
    series: int
    episodes: int
    episodes_per_day: float
    firing_ms: int


@dataclass(frozen=True)
class Summary:
    start_ms: int
    end_ms: int
    step_ms: int
    evaluations: int
    days: float
    onset_ms: Optional[int]
    alerts: List[AlertSummary]
    totals: List[AlertTotal]
    rule_alertnames: List[str]      # every alert the rules define, fired or not
    notes: List[str] = field(default_factory=list)

    def quiet(self) -> List[str]:
        fired = {t.alertname for t in self.totals if t.episodes}
        return [a for a in self.rule_alertnames if a not in fired]


def summarize(run: Run, onset_ms: Optional[int] = None) -> Summary:
    times = run.times
    step = run.interval_ms
    n = len(times)
    start, end = (int(times[0]), int(times[-1])) if n else (0, 0)
    days = (n * step) / DAY_MS if n else 0.0
    out: List[AlertSummary] = []
    for tr in run.alerts:
        firing, pending = tr.states.firing, tr.states.pending
        eps = [Episode(int(times[s]), int(times[e]), (e - s + 1) * step) for s, e in runs(firing)]
        first = None
        if onset_ms is not None:
            after = np.nonzero(firing & (times >= onset_ms))[0]
            if len(after):
                first = int(times[after[0]]) - onset_ms
        labels = {k: v for k, v in tr.labels if k != "alertname"}
        own = {k for k, _ in tr.rule.labels}
        identity = {k: v for k, v in labels.items() if k not in own}
        out.append(AlertSummary(tr.alertname, labels, identity, int(firing.sum()) * step, int(pending.sum()) * step,
                                eps, len(eps) / days if days else 0.0, max((e.duration_ms for e in eps), default=0),
                                first))
    out = [a for a in out if a.firing_ms or a.pending_ms]
    totals: Dict[str, List[AlertSummary]] = {}
    for a in out:
        totals.setdefault(a.alertname, []).append(a)
    tot = [AlertTotal(name, len(items), sum(len(a.episodes) for a in items),
                      sum(len(a.episodes) for a in items) / days if days else 0.0, sum(a.firing_ms for a in items))
           for name, items in sorted(totals.items())]
    return Summary(start, end, step, n, days, onset_ms, out, tot, list(run.alertnames), list(run.notes))


@dataclass(frozen=True)
class Violation:
    alertname: str
    reason: str


def gate(summary: Summary, max_episodes_per_day: Optional[float] = None,
         quiet_alerts: Sequence[str] = ()) -> List[Violation]:
    """The CI gate: alerts that fired more often than ``max_episodes_per_day`` (all its label sets
    together), and alerts of ``quiet_alerts`` that fired at all."""
    out: List[Violation] = []
    by_name = {t.alertname: t for t in summary.totals}
    if max_episodes_per_day is not None:
        for t in summary.totals:
            if t.episodes_per_day > max_episodes_per_day:
                out.append(Violation(t.alertname, f"{t.alertname} fired {t.episodes_per_day:.2f} episodes per day "
                                                  f"({t.episodes} in {summary.days:.2f} days over {t.series} series), "
                                                  f"more than --max-episodes-per-day {max_episodes_per_day:g}"))
    for name in quiet_alerts:
        t = by_name.get(name)
        if t is not None and t.episodes:
            plural = "s" if t.episodes != 1 else ""
            out.append(Violation(name, f"{name} fired ({t.episodes} episode{plural}, {t.firing_ms / 60000:.1f} minutes firing) "
                                       f"but --quiet-alerts says it must not fire"))
    return out
