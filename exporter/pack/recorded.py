"""``Recording``: one recording rule as the pack writes it (its name, expression and labels)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict


@dataclass(frozen=True)
class Recording:
    record: str
    expr: str
    labels: Dict[str, str] = field(default_factory=dict)

    def as_rule(self, common: Dict[str, str] = None) -> Dict[str, object]:
        r: Dict[str, object] = {"record": self.record, "expr": self.expr}
        labels = {**(common or {}), **self.labels}
        if labels:
            r["labels"] = labels
        return r
