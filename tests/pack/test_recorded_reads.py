"""What the pack records is what something reads: every recorded series is read by a rule, a
panel, a runbook or the analysis tools, and every recorded name a runbook gives is recorded."""

import re

import yaml

from conftest import ROOT
from promseries import RULES

BOOKS = ROOT / "docs" / "runbooks"


def _rules():
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def test_every_recorded_series_a_runbook_names_is_in_the_pack():
    """A runbook that asks for a recording rule the pack no longer records answers an on-call with an
    empty result: every ``level:metric:operations`` name in a runbook is recorded by the pack."""
    recorded = {r["record"] for r in _rules() if "record" in r}
    named = {(p.stem, n) for p in sorted(BOOKS.glob("*.md"))
             for n in re.findall(r"\b[a-z_]+:[a-z0-9_]+:[a-z0-9_]+\b", p.read_text())}
    assert len(named) > 40  # the check sees what it looks for
    assert not {(book, n) for book, n in named if n not in recorded}


def test_every_recording_rule_is_read():
    """A recorded series nobody reads costs every evaluation for nothing: each is read by another
    rule, a dashboard panel, a runbook, or the analysis tools (``capacity``, ``backtest``, ``gate``,
    ``postmortem``, which name it through the pack's ``Names``: its metric part in their source)."""
    rules = _rules()
    readers = "\n".join([r["expr"] + str(r.get("annotations", {})) for r in rules]
                        + [p.read_text() for p in sorted((ROOT / "dashboards").glob("*.json"))]
                        + [p.read_text() for p in sorted(BOOKS.glob("*.md"))])
    tools = "\n".join(p.read_text() for p in sorted((ROOT / "exporter" / "analysis").rglob("*.py")))
    recorded = {r["record"] for r in rules if "record" in r}
    assert len(recorded) > 100  # the check sees what it looks for
    unread = {n for n in recorded
              if not re.search(re.escape(n) + r"(?!\w)", readers) and f'"{n.split(":")[1]}"' not in tools}
    assert not unread
