"""``Recording``: one recording rule as the pack writes it (its name, expression and labels), and
whether the alerts read it as a baseline (``cadence``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict


@dataclass(frozen=True)
class Recording:
    record: str
    expr: str
    labels: Dict[str, str] = field(default_factory=dict)
    # a figure the alerts compare with, not this moment's: one over the last hour or day, or from
    # the past (an offset). Its value moves over hours, so the slow group may record it and the
    # alerting group read it up to one slow_interval old (``cadence.arrange``).
    baseline: bool = False

    def as_rule(self, common: Dict[str, str] = None) -> Dict[str, object]:
        r: Dict[str, object] = {"record": self.record, "expr": self.expr}
        labels = {**(common or {}), **self.labels}
        if labels:
            r["labels"] = labels
        return r
