"""``Alert``: one alerting rule as a concern module writes it (condition, severity, texts),
before ``alert_rules`` applies the SLO file's settings to it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict


@dataclass(frozen=True)
class Alert:
    """One alerting rule before the SLO's settings are applied.

    ``rule_id`` is its key under ``alerts:`` in the SLO file: the alert's name, or the name plus
    a suffix when one alert has several rules (``VLLMErrorBudgetBurnPage``/``...Ticket``)."""

    name: str
    expr: str
    severity: str
    summary: str
    description: str
    rule_id: str = ""
    labels: Dict[str, str] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return self.rule_id or self.name
