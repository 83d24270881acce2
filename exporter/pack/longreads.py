"""Reads over days, at the cost of hours.

A rule evaluated every 30 s that reads a recorded series over 14 days reads 40,320 samples of it
at every evaluation (3 days: 8,640; 1 day: 2,880), for every series it selects. ``coarsen``
rewrites each such read (``max_over_time``, ``min_over_time``, ``avg_over_time``,
``sum_over_time`` of a recorded series over ``windows.history_from`` or longer) into a read of a
recorded aggregate over ``windows.history_step`` (one hour: 120 samples per evaluation), taken
over the long window at that step (a subquery: one point per hour, 336 for 14 days):

- ``max``/``min``: the maximum of the hourly maxima, and of the current hour's (``both``: each
  read once): the same maximum
  over a window between the long one and one step longer (the subquery's first hour starts up to
  a step before the window);
- ``sum``: the sum of the hourly sums at each step, plus the current hour's sum, so that the window
  reaches now (or the read's offset) as before: the samples between the last step and an hour
  before now are counted twice (a share of up to one step in the long window: 1/72 of a 3-day
  window, 1/24 of a day);
- ``avg``: those sums over the hourly counts summed the same way: the average of every sample (not
  of the hourly averages, so a series recorded only some of the time, as the busy replicas'
  throughput is, weighs each sample once), the same samples counted twice.

``quantile_over_time`` reads one sample every ``windows.quantile_step`` (5 minutes: 288 points
over a day instead of 2,880): a quantile of a sample of the window, approximately the quantile of
all of it (a quantile of hourly figures would not be). The hourly aggregates are recorded right after the
series they aggregate, so the
current hour's figure is this evaluation's."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Dict, List, Sequence

from ..slo import seconds
from .recorded import Recording

# a recorded series (a name with colons) and its matchers, if any
SERIES = r"([A-Za-z_][\w]*:[\w:]*)(\{[^{}]*\})?"
QUANTILE = re.compile(r"\bquantile_over_time\(([\d.]+), " + SERIES + r"\[(\w+)\](?: offset (\w+))?\)")
PART = "longread_part"  # the label ``both`` tells its two sides apart with, dropped again
READ = re.compile(r"\b(max|min|avg|sum)_over_time\(" + SERIES + r"\[(\w+)\](?: offset (\w+))?\)")


def exact(slo: Dict) -> Dict:
    """``slo`` with the long reads sample by sample (``history_step`` and ``quantile_step`` 0s): what
    the analysis tools evaluate. A server evaluating the pack with every recorded series inlined
    would otherwise run an hour of steps inside each of 14 days of hourly ones per query; the
    maxima are the same, the sums within one step."""
    return {**slo, "windows": {**slo["windows"], "history_step": "0s", "quantile_step": "0s"}}


def step_name(series: str, fn: str, step: str) -> str:
    """The hourly aggregate's name: ``level:metric:op`` -> ``level:metric:op_max_over_time1h``."""
    return f"{series}_{fn}_over_time{step}"


def both(fn: str, steps: str, current: str) -> str:
    """``fn`` (max, min, sum) of the steps' figure and the current step's, series by series, where
    either or both exist. Each side is read once: the two are told apart by a label (``PART``) that
    the aggregation drops again (``(a > b) or b or a`` would evaluate the subquery twice)."""
    return (f"{fn} without ({PART}) (\n  label_replace({steps}, \"{PART}\", \"steps\", \"\", \"\")\n  or\n"
            f"  label_replace({current}, \"{PART}\", \"current\", \"\", \"\")\n)")


def coarsen(rules: Sequence[Recording], windows: Dict[str, str]) -> List[Recording]:
    """``rules`` with every read over ``windows.history_from`` or longer of a recorded series taken
    from hourly (``windows.history_step``) aggregates, and those aggregates recorded once each,
    right after the rule that records the series (or before the first reader, for a series the pack
    does not record)."""
    step, longest = windows["history_step"], seconds(windows["history_from"])
    if seconds(step) <= 0:
        return list(rules)
    needed: Dict[str, List[Recording]] = {}  # series -> its step aggregates, in first-use order
    out: List[Recording] = []

    def aggregate(series: str, fn: str, matchers: str) -> str:
        # over every series of the name: a read with matchers selects among the aggregates
        name = step_name(series, fn, step)
        have = needed.setdefault(series, [])
        if all(r.record != name for r in have):
            have.append(Recording(name, f"{fn}_over_time({series}[{step}])"))
        return name + matchers

    def rewrite(m: re.Match) -> str:
        fn, series, matchers, window, offset = m.group(1), m.group(2), m.group(3) or "", m.group(4), m.group(5)
        if seconds(window) < longest:
            return m.group(0)
        off = f" offset {offset}" if offset else ""
        sub = f"[{window}:{step}]{off}"
        if fn in ("max", "min"):
            agg = aggregate(series, fn, matchers)
            return both(fn, f"{fn}_over_time({agg}{sub})", f"{agg}{off}")

        def total(agg: str) -> str:
            # the whole steps, and the current step's aggregate: the window reaches now (or the offset)
            return both("sum", f"sum_over_time({agg}{sub})", f"{agg}{off}")

        if fn == "sum":
            return total(aggregate(series, "sum", matchers))
        return f"({total(aggregate(series, 'sum', matchers))}\n/ {total(aggregate(series, 'count', matchers))})"

    def sample(m: re.Match) -> str:
        q, series, matchers, window, offset = m.group(1), m.group(2), m.group(3) or "", m.group(4), m.group(5)
        if seconds(window) < longest or seconds(windows["quantile_step"]) <= 0:
            return m.group(0)
        off = f" offset {offset}" if offset else ""
        return f"quantile_over_time({q}, {series}{matchers}[{window}:{windows['quantile_step']}]{off})"

    rewritten = [replace(r, expr=QUANTILE.sub(sample, READ.sub(rewrite, r.expr))) for r in rules]
    placed = set()
    defined = {r.record for r in rewritten}
    for r in rewritten:
        # a series the pack does not record: its aggregates before the first reader
        for series, aggs in needed.items():
            if series not in defined and series not in placed and any(a.record in r.expr for a in aggs):
                out += aggs
                placed.add(series)
        out.append(r)
        if r.record in needed and r.record not in placed:
            out += needed[r.record]
            placed.add(r.record)
    return out
