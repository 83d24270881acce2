"""The rules no alert reads (views), and the group that evaluates them less often.

Some recording rules exist for the dashboards and the analysis tools only: the capacity and
headroom figures, what the fleet costs, tokens per joule, the error ratio a panel plots. No alert
reads them, directly or through another rule, and none of them changes from one evaluation to the
next in a way a dashboard needs. A recording rule is *read by an alert* when an alert's
expression or annotation names it, or a rule read by an alert does; every other recording rule is
a view. They are evaluated in a group of their own every ``views_interval`` (the SLO file; ``0s``
keeps them in the alerting group), in their own order after the alerting groups' rules: a view
reads the series it aggregates as the alerting groups last wrote them (at most one evaluation
interval old), and no alerting rule ever waits for a view. Which group each rule runs in is
``cadence``.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Sequence

from .recorded import Recording

# a recorded series' name (level:metric:operations): what one rule reads of another
RECORDED = re.compile(r"[A-Za-z_][\w]*:[\w:]*[\w]")


def _reads(text: str) -> set:
    return set(RECORDED.findall(text))


def needed(recordings: Sequence[Recording], roots: set, stop: frozenset = frozenset()) -> set:
    """The names of ``roots`` and of every recording rule they read, directly or through others
    (the names ``recordings`` records; what they read of vLLM's or the sidecar's is not followed),
    neither taking nor following a name in ``stop``."""
    by_name: Dict[str, List[Recording]] = {}
    for r in recordings:
        by_name.setdefault(r.record, []).append(r)
    wanted: set = set()
    todo = set(roots)
    while todo:
        name = todo.pop()
        if name in wanted or name in stop or name not in by_name:
            continue
        wanted.add(name)
        for r in by_name[name]:
            todo |= _reads(r.expr) - wanted
    return wanted


def reads_of_alert(alert: Dict[str, Any]) -> set:
    """The recorded series an alert names in its expression or an annotation's query."""
    return _reads(alert["expr"]) | _reads(" ".join(str(v) for v in (alert.get("annotations") or {}).values()))

