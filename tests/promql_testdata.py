"""Prometheus' own PromQL test files (``promql/testdata/*.test``) run through the backtest's
engine (``exporter.analysis.promql``), the way Prometheus' harness (``promql/test.go`` at the
matching tag) runs them.

The format: ``load <step>`` and series lines (promtool's series notation), ``clear``, and
``eval[_fail|_ordered] instant at <time> <expr>`` followed by the expected result (one series
and value a line, or one number for a scalar). Like ``test.go``, every ``eval`` is run

- as an instant query at its time, and as a range query from a minute before to a minute after
  it at a one-minute step, whose point at that time must be the same result (not for
  ``eval_ordered``, whose range query must only not fail);
- again with every selector and subquery not already pinned pinned to that time with ``@``
  (printed and parsed again, as ``atModifierTestCases`` does), evaluated at -10x, 0, 1/5, 1x
  and 10x that time (-1 s, 0 and 1 s when it is 0), each also as a range query; not when the
  expression calls a function ``@`` cannot pin (``time()``, ``timestamp()``, the date functions,
  ``predict_linear``).

Values match as ``almostEqual`` says (relative error below 1e-6, NaN equal to NaN). The engine
options are the harness': lookback 5 m, subqueries without a step at 1 m, negative offsets and
``@`` enabled, every loaded sample visible to every query (no rule horizon).

Anything the loader cannot read or the engine cannot run is a failure of that ``eval`` (or of
the file, for a line outside any command), never a skip.
"""

from __future__ import annotations

import dataclasses
import math
import re
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

from exporter.analysis.promql import ast
from exporter.analysis.promql.durations import parse_duration
from exporter.analysis.promql.engine import Evaluator
from exporter.analysis.promql.labels import Labels, fmt
from exporter.analysis.promql.parser import parse
from exporter.analysis.promql.vector import Vec
from exporter.analysis.series import Store
from exporter.analysis.sources import expand_values, parse_series_labels

HERE = Path(__file__).resolve().parent / "fixtures" / "promql-testdata"

_LOAD = re.compile(r"load\s+(.+?)")
_EVAL = re.compile(r"eval(?:_(fail|ordered))?\s+instant\s+(?:at\s+(.+?))?\s+(.+)")
_SPACE = re.compile(r"[\t ]+")
EPSILON = 0.000001
MIN_NORMAL = 2.2250738585072014e-308
STEP_MS = 60_000  # NoStepSubqueryIntervalFn and the range query's step
LOOKBACK_MS = 5 * 60_000
NO_HORIZON = np.int64(2 ** 62)
AT_UNSAFE = {"days_in_month", "day_of_month", "day_of_week", "day_of_year", "hour", "minute", "month",
             "year", "predict_linear", "time", "timestamp"}


class TestFileError(ValueError):
    """A line of a test file the loader cannot read."""


@dataclass
class Eval:
    line: int
    expr: str
    at_ms: int
    fail: bool = False
    ordered: bool = False
    scalar: Optional[float] = None
    metrics: Dict[Labels, Tuple[int, float]] = field(default_factory=dict)


@dataclass
class Outcome:
    file: str
    line: int
    expr: str
    error: Optional[str]  # None: passed

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.expr}: {self.error or 'ok'}"


def almost_equal(a: float, b: float) -> bool:
    if math.isnan(a) and math.isnan(b):
        return True
    if a == b:
        return True
    diff = abs(a - b)
    if a == 0 or b == 0 or diff < MIN_NORMAL:
        return diff < EPSILON * MIN_NORMAL
    return diff / (abs(a) + abs(b)) < EPSILON


_GO_INT = re.compile(r"[+-]?(0[xX][0-9a-fA-F]+|0[oO]?[0-7]+|0[bB][01]+|[1-9][0-9]*|0)")


def parse_number(s: str) -> Optional[float]:
    """Go's ``strconv.ParseInt(s, 0, 64)`` then ``strconv.ParseFloat(s, 64)``; None if neither."""
    if _GO_INT.fullmatch(s):
        body = s.lstrip("+-")
        neg = s.startswith("-")
        if len(body) > 1 and body[0] == "0" and body[1] in "0123456789":
            n = int(body, 8)
        else:
            n = int(body, 0)
        return float(-n if neg else n)
    if not re.fullmatch(r"[+-]?(?:[0-9.]+(?:[eE][+-]?[0-9]+)?|[iI]nf(?:inity)?|NaN|nan|inf)", s):
        return None
    try:
        return float(s)
    except ValueError:
        return None


def parse_series(line: str) -> Tuple[Labels, List]:
    """``metric{labels} values`` (``parser.ParseSeriesDesc``)."""
    brace = line.find("{")
    space = re.search(r"\s", line)
    if brace >= 0 and (space is None or brace < space.start()):
        depth, quote, i = 0, None, brace
        while i < len(line):
            ch = line[i]
            if quote:
                if ch == "\\":
                    i += 1
                elif ch == quote:
                    quote = None
            elif ch in "\"'`":
                quote = ch
            elif ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    break
            i += 1
        if i >= len(line):
            raise TestFileError(f"unclosed labels in {line!r}")
        head, values = line[: i + 1], line[i + 1:]
    elif space is not None:
        head, values = line[: space.start()], line[space.start():]
    else:
        head, values = line, ""
    try:
        labels = () if re.fullmatch(r"\{\s*\}", head) else parse_series_labels(head)
        return labels, expand_values(values)
    except ValueError as exc:
        raise TestFileError(f"{line!r}: {exc}") from None


def _lines(text: str) -> List[str]:
    out = []
    for raw in text.split("\n"):
        s = raw.strip()
        out.append("" if s.startswith("#") else s)
    return out


def _load(store: Store, lines: List[str], i: int) -> int:
    m = _LOAD.fullmatch(lines[i])
    if not m:
        raise TestFileError(f"line {i + 1}: invalid load command")
    gap = parse_duration(m.group(1))
    defs: Dict[Labels, Tuple[List[int], List[float], List[bool]]] = {}
    while i + 1 < len(lines) and lines[i + 1]:
        i += 1
        labels, vals = parse_series(lines[i])
        ts, vs, st = [], [], []
        for k, v in enumerate(vals):
            if v is None:
                continue
            ts.append(k * gap)
            vs.append(math.nan if v == "stale" else v)
            st.append(v == "stale")
        defs[labels] = (ts, vs, st)  # a series given twice in one load: the last one (a map in Go)
    for labels, (ts, vs, st) in defs.items():
        store.add(labels, ts, vs, st)
    return i


def _eval(lines: List[str], i: int) -> Tuple[int, Eval]:
    m = _EVAL.fullmatch(lines[i])
    if not m:
        raise TestFileError(f"line {i + 1}: invalid evaluation command")
    mod, at, expr = m.groups()
    cmd = Eval(i + 1, expr, parse_duration(at or ""), fail=mod == "fail", ordered=mod == "ordered")
    j = 1
    while i + 1 < len(lines) and lines[i + 1]:
        i += 1
        n = parse_number(lines[i])
        if n is not None:
            cmd.scalar = n
            break
        labels, vals = parse_series(lines[i])
        if len(vals) != 1 or not isinstance(vals[0], float):
            raise TestFileError(f"line {i + 1}: expected one value in an instant evaluation")
        cmd.metrics[labels] = (j, vals[0])
        j += 1
    return i, cmd


# -- running -----------------------------------------------------------------------------

def _pin(e: ast.Expr, ms: int) -> ast.Expr:
    """Every selector and subquery not inside a subquery given ``@ ms`` where it has none (or
    has ``start()``/``end()``, which test.go overrides by setting the timestamp)."""
    def at_of(node):
        return ast.At(ms=ms) if node.at is None or node.at.preprocessor else node.at

    def go(n: ast.Expr) -> ast.Expr:
        if isinstance(n, ast.VectorSelector):
            return dataclasses.replace(n, at=at_of(n))
        if isinstance(n, ast.MatrixSelector):
            return dataclasses.replace(n, selector=go(n.selector))
        if isinstance(n, ast.SubqueryExpr):
            return dataclasses.replace(n, at=at_of(n))  # its inside: left alone
        if isinstance(n, ast.Call):
            return dataclasses.replace(n, args=tuple(go(a) for a in n.args))
        if isinstance(n, ast.AggregateExpr):
            return dataclasses.replace(n, expr=go(n.expr), param=None if n.param is None else go(n.param))
        if isinstance(n, ast.BinaryExpr):
            return dataclasses.replace(n, lhs=go(n.lhs), rhs=go(n.rhs))
        if isinstance(n, (ast.UnaryExpr, ast.ParenExpr)):
            return dataclasses.replace(n, expr=go(n.expr))
        return n

    return go(e)


def _calls_outside_subqueries(e: ast.Expr):
    yield from ()
    if isinstance(e, ast.Call):
        yield e.func
    if isinstance(e, ast.SubqueryExpr):
        return
    for child in _children(e):
        yield from _calls_outside_subqueries(child)


def _children(e: ast.Expr):
    if isinstance(e, ast.MatrixSelector):
        return [e.selector]
    if isinstance(e, ast.SubqueryExpr):
        return [e.expr]
    if isinstance(e, ast.Call):
        return list(e.args)
    if isinstance(e, ast.AggregateExpr):
        return ([e.param] if e.param is not None else []) + [e.expr]
    if isinstance(e, ast.BinaryExpr):
        return [e.lhs, e.rhs]
    if isinstance(e, (ast.UnaryExpr, ast.ParenExpr)):
        return [e.expr]
    return []


def at_modifier_queries(expr: str, at_ms: int, prometheus3: bool = False) -> List[Tuple[str, int]]:
    """test.go's ``atModifierTestCases``: the pinned expression and its evaluation times."""
    tree = parse(expr, prometheus3)
    if any(f in AT_UNSAFE for f in _calls_outside_subqueries(tree)):
        return []
    text = str(_pin(tree, at_ms))
    times = [-10 * at_ms, 0, int(at_ms / 5), at_ms, 10 * at_ms] if at_ms else [-1000, 0, 1000]
    return [(text, t) for t in times]


Result = Tuple[str, object]  # ("scalar", float) or ("vector", [(labels, value), ...])


def _query(store: Store, expr: str, times: List[int], col: int) -> Result:
    t = np.array(times, dtype=np.int64)
    ev = Evaluator(store, t, STEP_MS, LOOKBACK_MS, horizon=np.full(len(t), NO_HORIZON),
                   start_end=(times[0], times[-1]))
    v = ev.eval(parse(expr))
    if isinstance(v, Vec):  # in the order Prometheus' vector has at that step (``Vec.K``)
        rows = np.argsort(v.keys2d()[:, col], kind="stable") if v.n else []
        return "vector", [(v.labels[i], float(v.V[i, col])) for i in rows if v.P[i, col]]
    if isinstance(v, np.ndarray):
        return "scalar", float(v[col])
    raise AssertionError(f"unexpected result type {type(v).__name__}")


def _compare(cmd: Eval, res: Result, ordered: bool) -> Optional[str]:
    kind, val = res
    if kind == "scalar":
        if cmd.scalar is None:
            return f"got the scalar {val}, expected a vector"
        if not almost_equal(cmd.scalar, val):
            return f"expected scalar {cmd.scalar} but got {val}"
        return None
    if cmd.scalar is not None and not cmd.metrics:
        return f"got a vector {val}, expected the scalar {cmd.scalar}"
    seen = set()
    for pos, (ls, v) in enumerate(val):
        exp = cmd.metrics.get(ls)
        if exp is None:
            return f"unexpected metric {fmt(ls)} in result"
        if ordered and exp[0] != pos + 1:
            return f"expected metric {fmt(ls)} at position {exp[0]} but was at {pos + 1}"
        if not almost_equal(exp[1], v):
            return f"expected {exp[1]} for {fmt(ls)} but got {v}"
        seen.add(ls)
    for ls in cmd.metrics:
        if ls not in seen:
            return f"expected metric {fmt(ls)} not found (got {[(fmt(a), b) for a, b in val]})"
    return None


def run_eval(store: Store, cmd: Eval) -> Optional[str]:
    """None when the eval passes as in test.go, else why not."""
    try:
        queries = [(cmd.expr, cmd.at_ms)] + at_modifier_queries(cmd.expr, cmd.at_ms)
    except Exception as exc:  # the expression does not parse: the whole case fails
        return f"cannot parse: {exc}"
    for expr, t in queries:
        where = "" if (expr, t) == (cmd.expr, cmd.at_ms) else f" [re-run {expr!r} at {t} ms]"
        try:
            res = _query(store, expr, [t], 0)
        except Exception as exc:
            if cmd.fail:
                continue
            return f"error{where}: {type(exc).__name__}: {exc}"
        if cmd.fail:
            return f"expected an error{where}, got none"
        why = _compare(cmd, res, cmd.ordered)
        if why:
            return f"{why}{where}"
        try:
            rres = _query(store, expr, [t - STEP_MS, t, t + STEP_MS], 1)
        except Exception as exc:
            return f"error in range mode{where}: {type(exc).__name__}: {exc}"
        if cmd.ordered:
            continue
        why = _compare(cmd, rres, False)
        if why:
            return f"range mode: {why}{where}"
    return None


def run_file(path: Path, prometheus3: bool = False) -> List[Outcome]:
    """Every eval of one test file, in order (a load or clear applies to the evals after it);
    ``prometheus3``: a v3 file (``promql/promqltest``), run as its harness runs it."""
    read, run = (_eval3, run_eval3) if prometheus3 else (_eval, run_eval)
    lines = _lines(path.read_text(encoding="utf-8"))
    store = Store()
    out: List[Outcome] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line:
            i += 1
            continue
        word = _SPACE.split(line, maxsplit=1)[0].lower()
        try:
            if word == "clear":
                store = Store()
            elif word == "load":
                i = _load(store, lines, i)
            elif word.startswith("eval"):
                start = i
                i, cmd = read(lines, i)
                try:
                    why = run(store, cmd)
                except Exception:  # a bug in the loader or engine: a failure, with its trace
                    why = traceback.format_exc(limit=3)
                out.append(Outcome(path.name, start + 1, cmd.expr, why))
            else:  # load_with_nhcb (native histograms) too
                raise TestFileError(f"line {i + 1}: invalid or unsupported command {line!r}")
        except (TestFileError, ValueError) as exc:
            out.append(Outcome(path.name, i + 1, line, f"cannot read: {exc}"))
            while i + 1 < len(lines) and lines[i + 1]:  # the rest of the command's block
                i += 1
        i += 1
    return out


def run_file3(path: Path) -> List[Outcome]:
    return run_file(path, prometheus3=True)


# -- Prometheus 3 (``promql/promqltest``) ------------------------------------------------------
# The v3 harness (``promql/promqltest/test.go``) adds ``eval range from A to B step S``, ``expect``
# lines (``fail``, ``ordered``, ``warn``, ``info``, ``no_warn``, ``no_info``, with ``msg:`` or
# ``regex:``), ``expected_fail_message``/``expected_fail_regexp``, ``expect string`` and ``expect
# range vector``; its engine runs with Prometheus 3's left-open ranges (the backtest's
# ``--prometheus3-ranges``), delayed name removal and experimental functions and syntax on.

_EVAL3 = re.compile(r"eval(?:_(fail|warn|ordered|info))?\s+instant\s+(?:at\s+(.+?))?\s+(.+)")
_EVAL3_RANGE = re.compile(r"eval(?:_(fail|warn|info))?\s+range\s+from\s+(.+)\s+to\s+(.+)\s+step\s+(.+?)\s+(.+)")
_EXPECT = re.compile(r"expect\s+(ordered|fail|warn|no_warn|info|no_info)(?:\s+(regex|msg):(.+))?")
_CONTEXT_FUNCS = re.compile(r"(start|end|range|step)\(\)")


@dataclass
class Eval3(Eval):
    range_: Optional[Tuple[int, int, int]] = None  # from, to, step (ms) of an ``eval range``
    series: Dict[Labels, Tuple[int, List]] = field(default_factory=dict)  # expected points
    expects: Dict[str, List[Tuple[str, str]]] = field(default_factory=dict)  # kind -> (msg|regex, text)
    fail_message: Optional[str] = None
    fail_regexp: Optional[str] = None
    string: Optional[str] = None
    range_vector: bool = False


def _eval3(lines: List[str], i: int) -> Tuple[int, Eval3]:
    m, r = _EVAL3.fullmatch(lines[i]), _EVAL3_RANGE.fullmatch(lines[i])
    if not m and not r:
        raise TestFileError(f"line {i + 1}: invalid evaluation command")
    if m:
        mod, at, expr = m.groups()
        cmd = Eval3(i + 1, expr, parse_duration(at or ""))
    else:
        mod, a, b, step, expr = r.groups()
        lo, hi, st = parse_duration(a), parse_duration(b), parse_duration(step)
        cmd = Eval3(i + 1, expr, hi, range_=(lo, hi, st))
    cmd.fail, cmd.ordered = mod == "fail", mod == "ordered"
    if mod in ("warn", "info"):
        cmd.expects.setdefault(mod, []).append(("regex", ".*"))
    j = 1
    while i + 1 < len(lines) and lines[i + 1]:
        i += 1
        line = lines[i]
        if cmd.fail and line.startswith("expected_fail_message"):
            cmd.fail_message = line[len("expected_fail_message"):].strip()
            break
        if cmd.fail and line.startswith("expected_fail_regexp"):
            cmd.fail_regexp = line[len("expected_fail_regexp"):].strip()
            break
        if line.startswith("expect range vector"):
            cmd.range_vector = True
            continue
        if line.startswith("expect string"):
            cmd.string = line[len("expect string"):].strip()
            continue
        if line.split(" ")[0] == "expect":
            e = _EXPECT.fullmatch(line.strip())
            if not e:
                raise TestFileError(f"line {i + 1}: invalid expect statement")
            kind, how, text = e.groups()
            cmd.expects.setdefault(kind, []).append((how or "regex", (text or ".*").strip()))
            if kind == "fail":
                cmd.fail = True
            if kind == "ordered":
                cmd.ordered = True
            continue
        n = parse_number(line)
        if n is not None:
            cmd.scalar = n
            break
        labels, vals = parse_series(line)
        if len(vals) > 1 and cmd.range_ is None and not cmd.range_vector:
            raise TestFileError(f"line {i + 1}: expecting multiple values in instant evaluation")
        cmd.series[labels] = (j, vals)
        if len(vals) == 1 and isinstance(vals[0], float):
            cmd.metrics[labels] = (j, vals[0])
        j += 1
    return i, cmd


def _error_matches(cmd: Eval3, exc: Exception) -> Optional[str]:
    msg = str(exc)
    if cmd.fail_message is not None and cmd.fail_message != msg:
        return f"expected the error {cmd.fail_message!r}, got {msg!r}"
    if cmd.fail_regexp is not None and not re.search(cmd.fail_regexp, msg):
        return f"expected an error matching {cmd.fail_regexp!r}, got {msg!r}"
    for how, text in cmd.expects.get("fail", [])[:1]:
        if (how == "msg" and text != msg) or (how == "regex" and not re.search(text, msg)):
            return f"expected an error {how} {text!r}, got {msg!r}"
    return None


def _annotations(cmd: Eval3) -> Optional[str]:
    """The engine reports no warnings or info annotations: an eval that expects one cannot pass."""
    for kind in ("warn", "info"):
        if cmd.expects.get(kind):
            return f"expects a {kind} annotation; the engine reports none"
    return None


def _query3(store: Store, expr: str, times: List[int]):
    t = np.array(times, dtype=np.int64)
    ev = Evaluator(store, t, STEP_MS, LOOKBACK_MS, left_open=True, horizon=np.full(len(t), NO_HORIZON),
                   start_end=(times[0], times[-1]))
    return ev.eval(parse(expr, prometheus3=True))


def _compare_matrix(cmd: Eval3, v, times: List[int]) -> Optional[str]:
    if isinstance(v, str):
        return "a string result in a range query"
    if isinstance(v, np.ndarray):
        got = {(): [(t, float(x)) for t, x in zip(times, v)]}
    else:
        got = {}
        for i, ls in enumerate(v.labels):
            pts = [(times[c], float(v.V[i, c])) for c in range(len(times)) if v.P[i, c]]
            if pts:
                got[ls] = pts
    if cmd.ordered:
        return "expected an ordered result, but a range query returns a matrix"
    for ls, pts in got.items():
        exp = cmd.series.get(ls)
        if exp is None:
            return f"unexpected metric {fmt(ls) if ls else '{}'} in result, has {pts}"
        want = [(times[0] + k * cmd.range_[2], x) for k, x in enumerate(exp[1]) if x is not None]
        if len(want) != len(pts):
            return f"expected {len(want)} points for {fmt(ls) if ls else '{}'}, got {pts}"
        for (wt, wx), (gt, gx) in zip(want, pts):
            if wt != gt or not isinstance(wx, float) or not almost_equal(wx, gx):
                return f"expected {want} for {fmt(ls) if ls else '{}'}, got {pts}"
    for ls in cmd.series:
        if ls not in got:
            return f"expected metric {fmt(ls) if ls else '{}'} not found"
    return None


def run_eval3(store: Store, cmd: Eval3) -> Optional[str]:
    try:
        parse(cmd.expr, prometheus3=True)
    except Exception as exc:
        return f"cannot parse: {exc}"
    why = _annotations(cmd)
    if why:
        return why
    if cmd.range_vector:
        return "expects a range vector from an instant query; the engine returns only instant vectors"
    if cmd.range_ is not None:
        lo, hi, st = cmd.range_
        times = list(range(lo, hi + 1, st))
        try:
            v = _query3(store, cmd.expr, times)
        except Exception as exc:
            if cmd.fail:
                return _error_matches(cmd, exc)
            return f"error: {type(exc).__name__}: {exc}"
        if cmd.fail:
            return "expected an error, got none"
        return _compare_matrix(cmd, v, times)
    queries = [(cmd.expr, cmd.at_ms)] + at_modifier_queries(cmd.expr, cmd.at_ms, prometheus3=True)
    for expr, t in queries:
        where = "" if (expr, t) == (cmd.expr, cmd.at_ms) else f" [re-run {expr!r} at {t} ms]"
        try:
            v = _query3(store, expr, [t])
        except Exception as exc:
            if cmd.fail:
                why = _error_matches(cmd, exc)
                if why:
                    return why + where
                continue
            return f"error{where}: {type(exc).__name__}: {exc}"
        if cmd.fail:
            return f"expected an error{where}, got none"
        if cmd.string is not None:
            if not isinstance(v, str) or json_unquote(cmd.string) != v:
                return f"expected the string {cmd.string}, got {v!r}"
            continue
        if isinstance(v, str):
            return f"got the string {v!r}"
        res = ("scalar", float(v[0])) if isinstance(v, np.ndarray) else (
            "vector", [(v.labels[i], float(v.V[i, 0])) for i in np.argsort(v.keys2d()[:, 0], kind="stable")
                       if v.P[i, 0]])
        why = _compare(cmd, res, cmd.ordered)
        if why:
            return why + where
        if _CONTEXT_FUNCS.search(expr):
            continue
        try:
            rv = _query3(store, expr, [t - STEP_MS, t, t + STEP_MS])
        except Exception as exc:
            return f"error in range mode{where}: {type(exc).__name__}: {exc}"
        if cmd.ordered:
            continue
        rres = ("scalar", float(rv[1])) if isinstance(rv, np.ndarray) else (
            "vector", [(rv.labels[i], float(rv.V[i, 1])) for i in range(rv.n) if rv.P[i, 1]])
        why = _compare(cmd, rres, False)
        if why:
            return f"range mode: {why}{where}"
    return None


def json_unquote(text: str) -> str:
    """Go's ``strconv.Unquote`` of a double-quoted or raw string (``expect string``)."""
    if text.startswith("`") and text.endswith("`"):
        return text[1:-1]
    import json
    return json.loads(text)
