"""Comparing the backtest with promtool's own rule engine on the same input.

``compare(tmp, rule_file, groups)`` writes one promtool unit-test file with a test group per
scenario. Each group asks promtool, at every evaluation and for every alert, to expect nothing,
so promtool lists every alert that fires (the timeline); and it holds ``promql_expr_test`` cases
whose expected samples are what this project's engine computes, so promtool fails on any value
that differs (to the last bit: it compares floats exactly). The backtest runs on the same input
and the two timelines are returned for the test to compare.
"""

from __future__ import annotations

import math
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Set, Tuple

import numpy as np
import yaml

from exporter.analysis import rulemanager as rule_runner
from exporter.analysis.promql.durations import parse_duration
from exporter.analysis.promql.engine import Evaluator
from exporter.analysis.promql.labels import fmt
from exporter.analysis.promql.parser import parse
from exporter.analysis.promql.vector import Vec
from exporter.analysis.rulefile import load_rule_file
from exporter.analysis.sources import input_series_store
from promseries import in_file_order, promtool

Timeline = Dict[Tuple[int, str], Set[str]]  # (seconds, alertname) -> label sets as promtool prints them


@dataclass
class Scenario:
    name: str
    input_series: List[dict]
    interval: str = "1m"
    end_s: int = 3600                       # last evaluation (seconds from 0)
    check_from_s: int = 0                   # first evaluation whose alerts are compared
    exprs: Sequence[str] = ()               # expressions whose values promtool verifies
    expr_times_s: Sequence[int] = ()        # at these times
    alertnames: Sequence[str] = ()          # filled from the rule file when empty


@dataclass
class Outcome:
    promtool: Dict[str, Timeline] = field(default_factory=dict)
    backtest: Dict[str, Timeline] = field(default_factory=dict)
    expr_cases: int = 0
    order_dependent: int = 0
    evaluations: Dict[str, int] = field(default_factory=dict)
    expr_failures: List[str] = field(default_factory=list)
    output: str = ""


def _label_text(labels) -> str:
    return ", ".join(f'{k}="{v}"' for k, v in labels)


def _seconds(text: str) -> int:
    total = 0
    for n, unit in re.findall(r"(\d+)(h|ms|m|s)", text):
        total += int(n) * {"h": 3600, "m": 60, "s": 1, "ms": 0}[unit]
    return total


def _dur(s: int) -> str:
    return f"{s}s"


def _samples(vec, times_count: int, k: int) -> List[Tuple[str, float]]:
    if not isinstance(vec, Vec):
        return [("{}", float(vec[k]))]
    return [(fmt(ls) if ls else "{}", float(vec.V[i, k])) for i, ls in enumerate(vec.labels) if vec.P[i, k]]


# the series orders the engine is run with: label order, reversed, and a few random ones
ORDERS = (None, "reverse", 1, 2, 3, 4)


def _rounding(vals: Sequence[float]) -> Optional[float]:
    """A ``round()`` step at which nearly equal values (an ulp or so apart) all agree."""
    if len(set(vals)) == 1 or any(math.isinf(v) or math.isnan(v) for v in vals):
        return None
    mag = max(max(abs(v) for v in vals), 1e-300)
    for digits in (12, 11, 10, 9):
        q = 10.0 ** (math.floor(math.log10(mag)) - digits)
        inv = 1.0 / q
        if len({math.floor(v * inv + 0.5) / inv for v in vals}) == 1:
            return q
    raise AssertionError(f"summation orders disagree beyond rounding: {vals}")


def expr_cases(stores, exprs: Sequence[str], times_s: Sequence[int], interval_ms: int) -> List[dict]:
    """promql_expr_test cases expecting this engine's results.

    ``stores`` are the series after running the rules with each of ``ORDERS`` (the order in
    which series are added up). Where all orders agree to the bit, the case expects exactly that
    value. Where they do not, the result depends on the order Prometheus adds series in, which is
    its series creation order (random in promtool): the case then compares ``round(expr, q)`` at
    a step ``q`` where all orders agree. A result holding NaN (never equal to itself) is checked
    as its non-NaN part plus its count of NaN.
    """
    times = np.array([t * 1000 for t in times_s], dtype=np.int64)
    evs = [Evaluator(st, times, interval_ms, order=o) for st, o in zip(stores, ORDERS)]
    cases = []
    for text in exprs:
        node = parse(text)
        results = [ev.eval(node) for ev in evs]
        res = results[0]
        for k, t in enumerate(times_s):
            got = _samples(res, len(times), k)
            others = [dict(_samples(r, len(times), k)) for r in results[1:]]
            if any(math.isnan(v) for _, v in got):
                vtext = text if isinstance(res, Vec) else f"vector({text})"
                finite = [(ls, v) for ls, v in got if not math.isnan(v)]
                nans = len(got) - len(finite)
                cases.append({"expr": f"count({vtext}) - (count(({vtext}) >= -Inf) or vector(0))", "eval_time": _dur(t),
                              "exp_samples": [{"labels": "{}", "value": float(nans)}]})
                got, text_t = finite, f"({vtext}) >= -Inf"
            else:
                text_t = text
            steps = [_rounding([v] + [o[ls] for o in others if ls in o]) for ls, v in got]
            steps = [q for q in steps if q is not None]
            if steps:
                q = min(steps)
                inv = 1.0 / q
                # round() drops the metric name: keep it as a label, or two series that differ only
                # in their name (rate5m and rate2m of one metric) would collide
                wrapped = (f'label_replace({text_t}, "{KEPT_NAME}", "$1", "__name__", "(.+)")' if isinstance(res, Vec)
                           else f"vector({text_t})")
                cases.append({"expr": f"round({wrapped}, {q!r})", "eval_time": _dur(t), "order_dependent": True,
                              "exp_samples": [{"labels": _name_as_label(ls), "value": math.floor(v * inv + 0.5) / inv}
                                              for ls, v in got]})
            else:
                cases.append({"expr": text_t, "eval_time": _dur(t),
                              "exp_samples": [{"labels": ls, "value": v} for ls, v in got]})
    return cases


KEPT_NAME = "name_before_round"


def _name_as_label(ls_text: str) -> str:
    """``metric{a="b"}`` -> ``{a="b",name_before_round="metric"}`` (``{}`` stays ``{}``)."""
    i = ls_text.index("{")
    name, inner = ls_text[:i], ls_text[i + 1:-1]
    if not name:
        return ls_text
    return "{" + (inner + "," if inner else "") + f'{KEPT_NAME}="{name}"' + "}"


def backtest(rule_file: Path, sc: Scenario, eval_interval_ms: int, order=None):
    store = input_series_store(sc.input_series, parse_duration(sc.interval))
    groups = load_rule_file(str(rule_file))
    times = np.arange(0, sc.end_s * 1000 + 1, eval_interval_ms, dtype=np.int64)
    # as promtool runs them: every group at every step
    run = rule_runner.run(groups, store, times, eval_interval_ms, order=order, cadence=False)
    timeline: Timeline = {}
    for tr in run.alerts:
        for k in np.nonzero(tr.states.firing)[0]:
            t = int(times[k] // 1000)
            if t >= sc.check_from_s:
                timeline.setdefault((t, tr.alertname), set()).add(_label_text(tr.labels))
    return run, timeline


def compare(tmp: Path, rule_file: Path, scenarios: Sequence[Scenario], eval_interval_s: int = 60,
            group_eval_order: Optional[Sequence[str]] = None) -> Outcome:
    out = Outcome()
    alertnames = sorted({r.name for g in load_rule_file(str(rule_file)) for r in g.rules if r.kind == "alert"})
    tests = []
    for sc in scenarios:
        run, timeline = backtest(rule_file, sc, eval_interval_s * 1000)
        out.backtest[sc.name] = timeline
        names = list(sc.alertnames) or alertnames
        evals = [{"eval_time": _dur(t), "alertname": a, "exp_alerts": []}
                 for t in range(sc.check_from_s, sc.end_s + 1, eval_interval_s) for a in names]
        out.evaluations[sc.name] = len(range(sc.check_from_s, sc.end_s + 1, eval_interval_s))
        cases = []
        if sc.exprs:
            stores = [run.store]
            for order in ORDERS[1:]:
                other, other_timeline = backtest(rule_file, sc, eval_interval_s * 1000, order=order)
                assert other_timeline == timeline, f"{sc.name}: the alert timeline depends on the summation order"
                stores.append(other.store)
            cases = expr_cases(stores, sc.exprs, sc.expr_times_s, eval_interval_s * 1000)
        out.expr_cases += len(cases)
        out.order_dependent += sum(1 for c in cases if c.pop("order_dependent", False))
        tests.append({"name": sc.name, "interval": sc.interval, "input_series": sc.input_series,
                      "alert_rule_test": evals, "promql_expr_test": cases})
    doc = {"rule_files": [str(rule_file)], "evaluation_interval": _dur(eval_interval_s), **in_file_order(rule_file),
           "tests": tests}
    if group_eval_order:
        # promtool runs groups in random order unless told (in_file_order: the file's, as the backtest)
        doc["group_eval_order"] = list(group_eval_order)
    f = tmp / f"equiv-{rule_file.stem}.yml"
    f.write_text(yaml.dump(doc, Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper), sort_keys=False, width=10_000))
    r = subprocess.run([promtool(), "test", "rules", str(f)], capture_output=True, text=True, timeout=600)
    text = r.stdout + r.stderr
    out.output = text
    for sc in scenarios:
        out.promtool[sc.name] = {}
    current = scenarios[0].name if len(scenarios) == 1 else None
    # promtool prints each failure as "name: <group>," (when named) then "alertname: ..." or "expr: ..."
    parsed = 0
    for block in re.split(r"\n(?=\s{4}(?:name|alertname|expr|rule): )", "\n" + text):
        nm = re.match(r"\s{4}name: (.+?),\s*$", block, re.M)
        if nm:
            current = nm.group(1)
            continue
        am = re.match(r"\s{4}alertname: (\w+), time: (\S+?),", block)
        if am:
            parsed += 1
            labels = re.findall(r"Labels:\{(.*?)\}\n", block.split("got:", 1)[1])
            key = (_seconds(am.group(2)), am.group(1))
            out.promtool.setdefault(current, {}).setdefault(key, set()).update(labels)
        elif re.match(r"\s{4}(expr|rule): ", block):
            parsed += 1
            out.expr_failures.append(block.strip()[:1500])
    if r.returncode != 0 and not parsed:
        raise AssertionError(f"promtool failed without a parsable report:\n{text[-3000:]}")
    return out
