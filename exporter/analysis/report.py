"""Writing a backtest ``Summary``: a plain-text table for people, JSON for machines.

Times print as RFC 3339 (UTC); history that starts near unix time 0 (promtool's unit-test input)
prints as offsets from 0 instead (``t+3h5m``), which is how promtool names its evaluation times.
"""

from __future__ import annotations

import datetime as _dt
import json
from typing import Any, Dict, List, Optional, Sequence

from .summary import AlertSummary, Summary, Violation

_RELATIVE_BEFORE_MS = 10 * 365 * 86_400_000  # before 1980: an offset from promtool's time 0


def fmt_time(ms: int) -> str:
    if abs(ms) < _RELATIVE_BEFORE_MS:
        return "t+" + fmt_span(ms) if ms >= 0 else "t-" + fmt_span(-ms)
    d = _dt.datetime.fromtimestamp(ms / 1000, tz=_dt.timezone.utc)
    text = d.strftime("%Y-%m-%dT%H:%M:%S")
    if ms % 1000:
        text += f".{ms % 1000:03d}"
    return text + "Z"


def fmt_span(ms: Optional[int]) -> str:
    """``1h23m``, ``45s``, ``0s``; ``-`` for None."""
    if ms is None:
        return "-"
    sign = "-" if ms < 0 else ""
    s = abs(int(round(ms / 1000)))
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    parts = [f"{v}{u}" for v, u in ((d, "d"), (h, "h"), (m, "m"), (s, "s")) if v]
    return sign + ("".join(parts) or "0s")


def _identity(a: AlertSummary) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(a.identity.items())) or "-"


def table(summary: Summary, violations: Sequence[Violation] = ()) -> str:
    head = (f"backtest {fmt_time(summary.start_ms)} .. {fmt_time(summary.end_ms)}, every {fmt_span(summary.step_ms)} "
            f"({summary.evaluations} evaluations, {summary.days:.2f} days)")
    if summary.onset_ms is not None:
        head += f"; onset {fmt_time(summary.onset_ms)}"
    lines = [head]
    for note in summary.notes:
        lines.append(f"note: {note}")
    cols = ["ALERT", "SEVERITY", "SERIES", "FIRING", "EPISODES", "PER DAY", "LONGEST", "PENDING"]
    if summary.onset_ms is not None:
        cols.append("AFTER ONSET")
    rows: List[List[str]] = []
    for a in sorted(summary.alerts, key=lambda a: (-a.firing_ms, a.alertname, _identity(a))):
        row = [a.alertname, a.severity or "-", _identity(a), fmt_span(a.firing_ms), str(len(a.episodes)),
               f"{a.episodes_per_day:.2f}", fmt_span(a.longest_ms), fmt_span(a.pending_ms)]
        if summary.onset_ms is not None:
            after = a.first_firing_after_onset_ms
            row.append("-" if after is None else "+" + fmt_span(after))
        rows.append(row)
    if rows:
        widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
        lines.append("")
        lines.append("  ".join(c.ljust(w) for c, w in zip(cols, widths)).rstrip())
        for r in rows:
            lines.append("  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip())
    else:
        lines.append("")
        lines.append("no alert fired or went pending")
    quiet = summary.quiet()
    if quiet:
        lines.append("")
        lines.append(f"never fired ({len(quiet)}): {', '.join(quiet)}")
    if violations:
        lines.append("")
        lines.extend(f"GATE: {v.reason}" for v in violations)
    return "\n".join(lines) + "\n"


def to_dict(summary: Summary, violations: Sequence[Violation] = ()) -> Dict[str, Any]:
    return {
        "start": fmt_time(summary.start_ms), "end": fmt_time(summary.end_ms),
        "start_ms": summary.start_ms, "end_ms": summary.end_ms,
        "step_seconds": summary.step_ms / 1000, "evaluations": summary.evaluations, "days": summary.days,
        "onset": None if summary.onset_ms is None else fmt_time(summary.onset_ms),
        "alerts": [{
            "alertname": a.alertname, "labels": a.labels, "severity": a.severity or None,
            "firing_seconds": a.firing_ms / 1000, "pending_seconds": a.pending_ms / 1000,
            "episodes": len(a.episodes), "episodes_per_day": a.episodes_per_day,
            "longest_episode_seconds": a.longest_ms / 1000,
            "first_firing_after_onset_seconds": None if a.first_firing_after_onset_ms is None
            else a.first_firing_after_onset_ms / 1000,
            "episode_spans": [{"start": fmt_time(e.start_ms), "end": fmt_time(e.end_ms), "start_ms": e.start_ms,
                               "end_ms": e.end_ms, "seconds": e.duration_ms / 1000} for e in a.episodes],
        } for a in sorted(summary.alerts, key=lambda a: (a.alertname, sorted(a.labels.items())))],
        "totals": [{"alertname": t.alertname, "series": t.series, "episodes": t.episodes,
                    "episodes_per_day": t.episodes_per_day, "firing_seconds": t.firing_ms / 1000}
                   for t in summary.totals],
        "never_fired": summary.quiet(),
        "violations": [v.reason for v in violations],
        "notes": list(summary.notes),
    }


def to_json(summary: Summary, violations: Sequence[Violation] = ()) -> str:
    return json.dumps(to_dict(summary, violations), indent=2, sort_keys=False) + "\n"
