"""The backtest evaluated by the server: ``backtest --prometheus-url URL --engine server``.

Instead of reading every raw series the rules need into this process, each alerting rule's
expression is sent to the server as ``query_range`` over the backtest's evaluation grid, and only
its answer comes back: at which evaluations it returned which label sets. The alert state machine
(``for``, ``keep_firing_for``) runs here over those answers (``alerts.evaluate``), so this
process holds one boolean per alert label set and evaluation, whatever the number of raw samples.
Nothing is written into the server.

Recorded series a rule reads exist only where the rules have run; here they are **inlined**: a
reference to a recording rule's output is replaced by that rule's expression (itself inlined),
with the rule's static labels put on by ``label_replace``:

    name             ->  (expr)                                  what the rule records at t
    name[w]          ->  (expr)[w:step]                          a subquery at the evaluation step
    name offset o    ->  last_over_time((expr)[1ms:step] offset o)
    name{l="v"}      ->  the rules whose static labels match (a quantile), or ``and on (l)`` a
                         one-sample vector carrying l="v"

With the grid aligned to the step (start a multiple of it), a subquery evaluates the expression
at exactly the evaluation times a recording rule would have written, a series the rule stops
returning is gone at once (as its stale marker makes it), and ranges over them hold the same
samples. Unlike the local engine, whose recorded history starts at the backtest's first
evaluation, the server's subqueries reach back before it (as a ruler running all along would have
recorded): the two agree from the data's first sample on, and where the backtest starts later the
server's answer is the one a running ruler would have given.

Each query covers ``chunk_ms`` of the grid (at most ``MAX_POINTS`` evaluations: Prometheus
refuses more than 11,000 points per series), so one query's samples stay within the server's
limits (``--query.max-samples``); a query the server still finds too big (its timeout, its
samples per query) is halved and sent again, down to one evaluation (``promapi.query_range_split``).
The server's API answers are read in one place, ``promapi``. A later rule's output (a baseline
the slow group records for the alerting group) is inlined as any other: the expression at the
evaluation itself, where the local engine reads what that rule recorded before it, up to one of
its group's intervals old. Rules that read their own output, directly or through others
(evaluated one step at a time locally), and selectors by a regex on the name of a recorded series
cannot be inlined: ``Unsupported`` says which; the local engine handles them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import alerts as alert_states
from .promapi import query_range_split
from .promql.ast import AggregateExpr, BinaryExpr, Call, Expr, MatrixSelector, ParenExpr, SubqueryExpr, UnaryExpr, VectorSelector
from .promql.durations import format_duration
from .promql.labels import Labels, make
from .promql.vector import Vec, build
from .rulefile import Group, Rule, fill_label_template
from .rulemanager import AlertTrack, Run, circular_reads
from .series import Store

MAX_POINTS = 11_000  # Prometheus' limit of points per series in one query_range answer


class Unsupported(ValueError):
    """Rules the server path cannot send inlined; one line naming the rule and why."""


@dataclass(frozen=True)
class _Raw(Expr):
    """Already printed PromQL, in parentheses (a node for the printer only)."""

    text: str
    kind: str = "vector"

    @property
    def type(self) -> str:
        return self.kind

    def __str__(self) -> str:
        return self.text


def _q(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _matches(op: str, pattern: str, value: str) -> bool:
    if op == "=":
        return value == pattern
    if op == "!=":
        return value != pattern
    hit = re.fullmatch(pattern, value) is not None
    return hit if op == "=~" else not hit


class Inliner:
    """Rule expressions with every recorded series they read replaced by what records it."""

    def __init__(self, groups: Sequence[Group], step_ms: int) -> None:
        rules = [r for g in groups for r in g.rules]
        fwd = circular_reads(rules)
        if fwd:
            reader, writer = fwd[0]
            raise Unsupported(f"{reader.kind} {reader.name!r} reads {writer.name!r}, recorded by itself or a rule "
                              "that reads it: the server path cannot inline it (use --engine local)")
        self.step = format_duration(step_ms)
        self.defs: Dict[str, List[Rule]] = {}
        self.every: Dict[str, str] = {}  # a recorded name's step: its group's, where that is slower
        for g in groups:
            for r in g.rules:
                if r.kind == "record":
                    self.defs.setdefault(r.name, []).append(r)
                    self.every[r.name] = format_duration(max(step_ms, g.interval_ms or 0))
        self._cache: Dict[Tuple[str, int], str] = {}

    def text(self, e: Expr) -> str:
        return str(self.tx(e))

    def tx(self, e: Expr) -> Expr:
        if isinstance(e, VectorSelector):
            if self._recorded(e) is None:
                return e
            inner = self._instant(e)
            if e.offset_ms:
                return _Raw(f"last_over_time({inner}[1ms:{self.step}] offset {format_duration(e.offset_ms)})")
            return _Raw(inner)
        if isinstance(e, MatrixSelector):
            if self._recorded(e.selector) is None:
                return e
            name = self._recorded(e.selector)
            inner = self._instant(replace(e.selector, offset_ms=0))
            off = f" offset {format_duration(e.selector.offset_ms)}" if e.selector.offset_ms else ""
            # the samples the rule would have written: one per evaluation of its group
            return _Raw(f"{inner}[{format_duration(e.range_ms)}:{self.every.get(name, self.step)}]{off}", "matrix")
        if isinstance(e, SubqueryExpr):
            return replace(e, expr=self.tx(e.expr))
        if isinstance(e, Call):
            return replace(e, args=tuple(self.tx(a) for a in e.args))
        if isinstance(e, AggregateExpr):
            return replace(e, expr=self.tx(e.expr), param=self.tx(e.param) if e.param is not None else None)
        if isinstance(e, BinaryExpr):
            return replace(e, lhs=self.tx(e.lhs), rhs=self.tx(e.rhs))
        if isinstance(e, (UnaryExpr, ParenExpr)):
            return replace(e, expr=self.tx(e.expr))
        return e

    def _recorded(self, sel: VectorSelector) -> Optional[str]:
        for m in sel.matchers:
            if m.name == "__name__":
                if m.op == "=" and m.value in self.defs:
                    return m.value
                if m.op != "=" and any(_matches(m.op, m.value, n) for n in self.defs):
                    raise Unsupported(f"selector {sel}: a regex on the name of a recorded series cannot be inlined")
        return None

    def _instant(self, sel: VectorSelector) -> str:
        """What the recorded series ``sel`` selects at an evaluation, as one expression."""
        name = self._recorded(sel)
        others = [m for m in sel.matchers if m.name != "__name__"]
        parts = []
        for rule in self.defs[name]:
            static = dict(rule.labels)
            if not all(_matches(m.op, m.value, static[m.name]) for m in others if m.name in static):
                continue
            key = (name, id(rule))
            if key not in self._cache:
                body = f"({self.text(rule.expr)})"
                for k, v in rule.labels:
                    body = f"label_replace({body}, {_q(k)}, {_q(v)}, \"\", \"\")"
                self._cache[key] = body
            body = self._cache[key]
            for m in others:
                if m.name in static:
                    continue
                if m.op not in ("=", "!="):
                    raise Unsupported(f"selector {sel}: only = and != matchers on a recorded series' own labels "
                                      "can be inlined")
                # = keeps the series with that value, != drops them (a series without the label has "")
                one = f"label_replace(vector(1), {_q(m.name)}, {_q(m.value)}, \"\", \"\")"
                body = f"({body} {'and' if m.op == '=' else 'unless'} on ({m.name}) {one})"
            parts.append(body)
        if not parts:
            return "(vector(0) < 0)"  # no rule records what the selector asks for: nothing
        return "(" + " or ".join(parts) + ")"


@dataclass
class ServerStats:
    queries: int = 0
    points: int = 0          # points the server answered (alert label sets x evaluations returned)
    longest_query: int = 0   # characters of the longest query sent
    chunk_ms: int = 0

    def answered(self, points: int) -> None:
        self.queries += 1
        self.points += points


def run_on_server(groups: Sequence[Group], url: str, times: np.ndarray, step_ms: int, chunk_ms: int = 6 * 3600_000,
                  session=None, timeout_s: float = 300.0, stats: Optional[ServerStats] = None) -> Run:
    """Every alerting rule of ``groups`` evaluated by the server over ``times`` (aligned to
    ``step_ms``); the alert states computed here (an alert of a slower group changes state only
    where its group runs). The Run's store is empty: nothing is recorded."""
    import requests

    sess = session or requests.Session()
    inl = Inliner(groups, step_ms)
    n = len(times)
    per_chunk = max(1, min(MAX_POINTS, chunk_ms // step_ms))
    stats = stats if stats is not None else ServerStats()
    stats.chunk_ms = per_chunk * step_ms
    rules = [(g, r) for g in groups for r in g.rules if r.kind == "alert"]
    run = Run(times, step_ms, Store(), alertnames=sorted({r.name for _, r in rules}))
    tracks: Dict[Tuple[int, Labels], AlertTrack] = {}
    t0 = int(times[0]) if n else 0
    for i, (g, rule) in enumerate(rules):
        query = inl.text(rule.expr)
        stats.longest_query = max(stats.longest_query, len(query))
        for a in range(0, n, per_chunk):
            b = min(n, a + per_chunk)
            result = query_range_split(sess, url, query, times[a:b], step_ms, timeout_s, stats.answered)
            for item in result:
                metric = dict(item.get("metric") or {})
                metric.pop("__name__", None)
                labels = dict(metric)
                for k, v in rule.labels:
                    labels[k] = fill_label_template(v, metric)
                labels["alertname"] = rule.name
                ls = make(labels)
                tr = tracks.get((i, ls))
                if tr is None:
                    tr = tracks[(i, ls)] = AlertTrack(rule, g.name, ls, np.zeros(n, bool))
                idx = [(round(float(p[0]) * 1000) - t0) // step_ms for p in item.get("values") or []]
                tr.active[np.array([k for k in idx if 0 <= k < n], dtype=np.int64)] = True
    every = {g.name: alert_states.every_interval(times, g.interval_ms, step_ms) for g in groups}
    for tr in tracks.values():
        tr.every = every[tr.group]
        tr.states = alert_states.evaluate_every(times, tr.active, tr.every, tr.rule.for_ms, tr.rule.keep_firing_for_ms)
    run.alerts = sorted(tracks.values(), key=lambda t: (t.rule.name, t.labels))
    return run


def plot_on_server(groups: Sequence[Group], exprs: Sequence[Expr], url: str, times: np.ndarray, step_ms: int,
                   chunk_ms: int = 6 * 3600_000, session=None, timeout_s: float = 300.0):
    """Each plot expression (recorded series inlined) over ``times``: (labels, values with NaN)."""
    import requests

    sess = session or requests.Session()
    inl = Inliner(groups, step_ms)
    n = len(times)
    per_chunk = max(1, min(MAX_POINTS, chunk_ms // step_ms))
    t0 = int(times[0]) if n else 0
    out = []
    for e in exprs:
        rows: Dict[Labels, np.ndarray] = {}
        query = inl.text(e)
        for a in range(0, n, per_chunk):
            b = min(n, a + per_chunk)
            for item in query_range_split(sess, url, query, times[a:b], step_ms, timeout_s):
                ls = make(item.get("metric") or {})
                row = rows.setdefault(ls, np.full(n, np.nan))
                for p in item.get("values") or []:
                    k = (round(float(p[0]) * 1000) - t0) // step_ms
                    if 0 <= k < n:
                        row[k] = float(p[1])
        labels = sorted(rows)
        out.append((labels, np.array([rows[ls] for ls in labels]) if labels else np.zeros((0, n))))
    return out


def answer_vec(result: list, times: np.ndarray, step_ms: int) -> Vec:
    """A ``query_range`` (or instant ``query``) answer as a ``Vec`` on the grid ``times`` (the
    server's order of series; points off the grid are dropped)."""
    n = len(times)
    t0 = int(times[0]) if n else 0
    labels: List[Labels] = []
    V = np.full((len(result), n), np.nan)
    P = np.zeros((len(result), n), bool)
    for i, item in enumerate(result):
        labels.append(make(item.get("metric") or {}))
        points = item.get("values")
        if points is None and item.get("value") is not None:
            points = [item["value"]]
        for p in points or []:
            k = (round(float(p[0]) * 1000) - t0) // step_ms if n > 1 else 0
            if 0 <= k < n and (n > 1 or round(float(p[0]) * 1000) == t0):
                V[i, k] = float(p[1])
                P[i, k] = True
    return build(labels, V, P, np.arange(len(result), dtype=np.float64), times)


class RuleServer:
    """Rules whose expression reads raw series only, answered by the server over each block of
    the grid (``query_range``, at most ``MAX_POINTS`` evaluations a query: the rule runner's
    blocks are sized by ``block_steps``); rules that read what another rule records return None
    and are evaluated here over the recorded series the server's answers made. Passed to
    ``rulemanager.run`` as ``served``: the server does the work over raw samples (rates and
    quantiles over every histogram bucket), this process holds the recorded series only."""

    def __init__(self, groups: Sequence[Group], url: str, step_ms: int, chunk_ms: int = 6 * 3600_000, session=None,
                 timeout_s: float = 300.0, stats: Optional[ServerStats] = None) -> None:
        import requests

        from .promql.ast import walk
        from .promql.labels import MatcherSet

        self.url, self.step_ms, self.timeout_s = url, step_ms, timeout_s
        self.session = session or requests.Session()
        self.stats = stats if stats is not None else ServerStats()
        self.block_steps = max(1, min(MAX_POINTS, chunk_ms // step_ms))  # evaluations per query
        self.stats.chunk_ms = self.block_steps * step_ms
        recorded = {r.name for g in groups for r in g.rules if r.kind == "record"}
        self._raw_only = set()
        for g in groups:
            for r in g.rules:
                sels = [MatcherSet(n.matchers) for n in walk(r.expr) if isinstance(n, VectorSelector)]
                if not any(m.matches_name(name) for m in sels for name in recorded):
                    self._raw_only.add(self._key(r))

    @staticmethod
    def _key(rule: Rule) -> tuple:  # the same rule parsed again (compute renders its own) is the same rule
        return rule.kind, rule.name, str(rule.expr), tuple(rule.labels)

    def reads_raw_only(self, rule: Rule) -> bool:
        return self._key(rule) in self._raw_only

    def __call__(self, rule: Rule, block: np.ndarray) -> Optional[Vec]:
        if not self.reads_raw_only(rule):
            return None
        query = str(rule.expr)
        self.stats.longest_query = max(self.stats.longest_query, len(query))
        result = query_range_split(self.session, self.url, query, block, self.step_ms, self.timeout_s,
                                   self.stats.answered)
        return answer_vec(result, block, self.step_ms)

    def instant(self, expr: str, at_ms: int) -> Vec:
        """An expression over raw series evaluated by the server at one time, as a one-step Vec."""
        from .promapi import query

        self.stats.longest_query = max(self.stats.longest_query, len(expr))
        result = query(self.session, self.url, expr, at_ms, self.timeout_s, post=True, expect="vector")
        self.stats.queries += 1
        self.stats.points += len(result)
        return answer_vec(result, np.array([at_ms], dtype=np.int64), self.step_ms)
