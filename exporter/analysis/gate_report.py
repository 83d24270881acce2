"""Writing the gate's result: a text table for the CI log, Markdown for a pull-request comment,
JSON for machines. Every figure is shown with both sides' medians (and the number of runs), the
change, the run-to-run spread and its verdict; the sidecar's signals during the runs follow,
with the likely cause when the candidate regressed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from .benchfile import BenchRun
from .gate import Comparison, Row, Signals
from .report import fmt_time

SIGNAL_WORDS = (
    ("preemptions", "preemptions (vLLM counter)", "n"),
    ("kv_usage_max", "KV-cache usage, highest", "%"),
    ("kv_pressure_max", "the sidecar's KV pressure level, highest (0 ok … 3 thrashing)", "n"),
    ("kv_saturated_share", "... at saturated or thrashing", "%"),
    ("waiting_for_capacity_max", "requests waiting for capacity (KV or batch full), most", "n"),
    ("waiting_mean", "requests waiting, mean", "n"),
    ("running_mean", "requests running, mean", "n"),
    ("running_max", "requests running, most", "n"),
    ("busy_low_share", "GPU busy but tokens low", "%"),
    ("stalled_share", "engine stalled", "%"),
    ("down_share", "vLLM unreadable", "%"),
)


@dataclass
class GateResult:
    comparison: Comparison
    baseline: Sequence[BenchRun]
    candidate: Sequence[BenchRun]
    mode: str                                  # "files" or "prometheus"
    signals_baseline: Optional[Signals] = None
    signals_candidate: Optional[Signals] = None
    likely_cause: Optional[str] = None
    notes: List[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.comparison.passed


def fmt_value(v: float, unit: str) -> str:
    if unit == "share":
        return f"{v:.1%}"
    if unit == "ms":
        return f"{v:.3g} ms" if abs(v) < 1000 else f"{v:,.0f} ms"
    return f"{v:.3g} {unit}" if abs(v) < 1000 else f"{v:,.0f} {unit}"


def fmt_change(r: Row) -> str:
    if r.change in (float("inf"), float("-inf")):
        return "new" if r.change > 0 else "gone"
    return f"{r.change:+.1%}"


def fmt_spread(r: Row) -> str:
    """The run-to-run spread (± one standard deviation) and the test's p-value."""
    nz = r.noise
    if nz is None:
        return "unknown"
    sd = f"±{nz.sd:.0%}" if nz.relative else "±" + fmt_value(nz.sd, r.spec.unit)
    return f"{sd} (p {min(nz.p, 1.0):.2g})"


def _side(v: float, runs: Sequence[float], unit: str) -> str:
    text = fmt_value(v, unit)
    return f"{text} (median of {len(runs)})" if len(runs) > 1 else text


def headline(res: GateResult) -> str:
    c = res.comparison
    gated = [r for r in c.rows if r.gated]
    bad = c.regressed
    runs = f"baseline {len(res.baseline)} run{'s' if len(res.baseline) != 1 else ''}, " \
           f"candidate {len(res.candidate)} run{'s' if len(res.candidate) != 1 else ''}"
    if bad:
        return f"FAIL: {len(bad)} of {len(gated)} figures regressed by more than {c.settings.threshold:.0%} " \
               f"beyond the run-to-run noise ({runs})"
    noisy = [r for r in gated if r.verdict == "within noise"]
    tail = f"; {len(noisy)} worse by more than {c.settings.threshold:.0%} but within noise" if noisy else ""
    return f"PASS: no figure regressed by more than {c.settings.threshold:.0%} ({runs}){tail}"


def _signal(v: Optional[float], kind: str) -> str:
    if v is None:
        return "-"
    return f"{v:.0%}" if kind == "%" else f"{v:.3g}"


def _table(cols: List[str], rows: List[List[str]]) -> List[str]:
    widths = [max(len(c), *(len(r[i]) for r in rows)) if rows else len(c) for i, c in enumerate(cols)]
    out = ["  ".join(c.ljust(w) for c, w in zip(cols, widths)).rstrip()]
    out += ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
    return out


def _rows(res: GateResult) -> List[List[str]]:
    return [[r.spec.label, _side(r.baseline_median, r.baseline, r.spec.unit),
             _side(r.candidate_median, r.candidate, r.spec.unit), fmt_change(r), fmt_spread(r), r.verdict]
            for r in res.comparison.rows]


def text(res: GateResult) -> str:
    lines = [f"gate: {headline(res)}", ""]
    lines += _table(["FIGURE", "BASELINE", "CANDIDATE", "CHANGE", "RUN-TO-RUN", "VERDICT"], _rows(res))
    if res.signals_candidate is not None:
        lines += ["", "sidecar signals during the runs:"]
        lines += _table(["SIGNAL", "BASELINE", "CANDIDATE"],
                        [[w, _signal(getattr(res.signals_baseline, k), kind),
                          _signal(getattr(res.signals_candidate, k), kind)] for k, w, kind in SIGNAL_WORDS])
    if res.likely_cause:
        lines += ["", f"likely cause: {res.likely_cause}"]
    for n in list(res.comparison.notes) + list(res.notes):
        lines += ["", f"note: {n}"]
    return "\n".join(lines) + "\n"


def markdown(res: GateResult) -> str:
    word, rest = headline(res).split(": ", 1)
    out = [f"### vLLM regression gate: **{word}**", "", rest[0].upper() + rest[1:] + ".", "",
           "| figure | baseline | candidate | change | run-to-run spread | verdict |",
           "| --- | ---: | ---: | ---: | ---: | --- |"]
    for r in _rows(res):
        verdict = f"**{r[5]}**" if r[5] == "regressed" else r[5]
        out.append(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]} | {verdict} |")
    if res.likely_cause:
        out += ["", f"**Likely cause** (the sidecar's signals): {res.likely_cause}."]
    if res.signals_candidate is not None:
        out += ["", "<details><summary>Sidecar signals during the runs</summary>", "",
                "| signal | baseline | candidate |", "| --- | ---: | ---: |"]
        out += [f"| {w} | {_signal(getattr(res.signals_baseline, k), kind)} | "
                f"{_signal(getattr(res.signals_candidate, k), kind)} |" for k, w, kind in SIGNAL_WORDS]
        out += ["", "</details>"]
    th = res.comparison.settings
    out += ["", f"Regressed: worse than the baseline by more than {th.threshold:.0%} (medians of the runs), beyond the "
                f"run-to-run spread (one-sided t test at {th.confidence:.0%}; p is its p-value), and for latencies by at "
                f"least {th.min_effect_ms:g} ms."]
    for n in list(res.comparison.notes) + list(res.notes):
        out += ["", f"_Note: {n}._"]
    return "\n".join(out) + "\n"


def _run(r: BenchRun) -> Dict[str, Any]:
    return {"source": r.source, "label": r.label, "load": r.load,
            "start": None if r.start_ms is None else fmt_time(r.start_ms),
            "end": None if r.end_ms is None else fmt_time(r.end_ms)}


def to_dict(res: GateResult) -> Dict[str, Any]:
    c = res.comparison

    def num(x: float) -> Optional[float]:
        return None if x != x or x in (float("inf"), float("-inf")) else x

    return {
        "verdict": "pass" if res.passed else "fail",
        "summary": headline(res),
        "mode": res.mode,
        "threshold": c.settings.threshold, "min_effect_ms": c.settings.min_effect_ms,
        "confidence": c.settings.confidence,
        "figures_gated": list(c.settings.figures) or ["*"],
        "baseline": [_run(r) for r in res.baseline], "candidate": [_run(r) for r in res.candidate],
        "figures": [{"key": r.spec.key, "label": r.spec.label, "unit": r.spec.unit,
                     "better": "higher" if r.spec.direction > 0 else "lower", "gated": r.gated,
                     "baseline": r.baseline, "candidate": r.candidate, "baseline_median": r.baseline_median,
                     "candidate_median": r.candidate_median, "change": num(r.change), "worse_by": r.worse,
                     "spread": None if r.noise is None else {"sd": r.noise.sd, "relative": r.noise.relative,
                                                             "p_worse": r.noise.p, "p_better": r.noise.p_better},
                     "verdict": r.verdict} for r in c.rows],
        "signals": None if res.signals_candidate is None else {
            "baseline": vars(res.signals_baseline), "candidate": vars(res.signals_candidate)},
        "likely_cause": res.likely_cause,
        "notes": list(c.notes) + list(res.notes),
    }


def to_json(res: GateResult) -> str:
    return json.dumps(to_dict(res), indent=2) + "\n"
