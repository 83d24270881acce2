"""Running rule groups over a timeline, as Prometheus' rule manager (and promtool) would have.

At every evaluation time the groups run in order and the rules of a group in order, each rule
seeing what the rules before it recorded at that same time. A group with an interval longer than
the evaluation step runs at the first step of each of its intervals only (``alerts.every_interval``),
its alerts holding their state in between, as Prometheus runs it (promtool runs every group at
every step). Recording rules write their result
under the rule's name and labels; a series the rule returned at the previous evaluation and not
at this one gets a stale marker now (``seriesInPreviousEval``), so it disappears at once instead
of lingering for the lookback delta. Alerting rules feed the state machine in ``alerts``.

The evaluation is vectorized over blocks of evaluation times (a day of 30-second steps by
default): each rule is evaluated for the whole block before the next rule. A rule that reads what
a later rule records (later in its group, or in a later group: a baseline the slow group records
for the alerting group) sees, at each evaluation, only what that rule wrote before it (as
Prometheus' rule manager and promtool, which run it first): the writer is evaluated for the block
first (``evaluation_order``) and the reader sees its series up to just before each evaluation
(``Evaluator``'s ``lagged``). That is exact as long as no rule reads, directly or through others,
what it records itself (it would need its own result at earlier times of the same block); such
rule sets are detected and run one evaluation at a time, which is exact but slow.
"""

from __future__ import annotations

import heapq
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Dict, FrozenSet, List, Optional, Tuple

import numpy as np

from . import alerts
from .promql.ast import NumberLiteral, StringLiteral, SubqueryExpr, VectorSelector, walk
from .promql.engine import DEFAULT_LOOKBACK_MS, Evaluator
from .promql.labels import NAME, Labels, MatcherSet, drop_name, make
from .promql.vector import EvalError, Vec, build
from .rulefile import Group, Rule, fill_label_template
from .series import Store


class RuleEvalError(ValueError):
    """A rule that Prometheus would fail to evaluate; names the rule and the time."""


@dataclass
class AlertTrack:
    """One alert (rule and label set) over the timeline."""

    rule: Rule
    group: str
    labels: Labels            # the alert's labels, alertname included
    active: np.ndarray        # the expression returned this label set at the evaluation
    states: Optional[alerts.States] = None
    every: Optional[np.ndarray] = None  # where its group runs, if not at every evaluation

    @property
    def alertname(self) -> str:
        return self.rule.name


@dataclass
class Run:
    times: np.ndarray          # every evaluation time (ms)
    interval_ms: int
    store: Store               # raw plus recorded series
    alerts: List[AlertTrack] = field(default_factory=list)
    block_steps: int = 0
    notes: List[str] = field(default_factory=list)
    alertnames: List[str] = field(default_factory=list)  # every alert the rules define


def _reads(rules: List[Rule]) -> List[List[int]]:
    """For each rule, the indices of the recording rules whose names it reads (itself included)."""
    out = []
    for r in rules:
        sels = [MatcherSet(n.matchers) for n in walk(r.expr) if isinstance(n, VectorSelector)]
        out.append([i for i, w in enumerate(rules) if w.kind == "record" and any(m.matches_name(w.name) for m in sels)])
    return out


def _lagged(rules: List[Rule], reads: List[List[int]]) -> List[FrozenSet[str]]:
    """For each rule, the names it reads that only rules at or after it record: what it sees of
    them at an evaluation is what they recorded before it."""
    out = []
    for j, ws in enumerate(reads):
        before = {rules[w].name for w in ws if w < j}
        out.append(frozenset(rules[w].name for w in ws if w >= j and rules[w].name not in before))
    return out


def _unlaggable(rule: Rule, names: FrozenSet[str]) -> Optional[str]:
    """Why ``rule`` cannot read ``names`` lagged in blocks, or None: a lagged name read inside a
    subquery (its inner points are shared by the block's evaluations, each of which may see a
    different past), or selected by a selector without an exact name (the lag would hide the
    other series it selects too)."""
    for node in walk(rule.expr):
        if isinstance(node, SubqueryExpr):
            inner = [MatcherSet(n.matchers) for n in walk(node.expr) if isinstance(n, VectorSelector)]
            if any(m.matches_name(n) for m in inner for n in names):
                return "inside a subquery"
        elif isinstance(node, VectorSelector):
            ms = MatcherSet(node.matchers)
            if ms.name_equal() is None and any(ms.matches_name(n) for n in names):
                return "by a selector without an exact name"
    return None


def _plan(rules: List[Rule]) -> Tuple[Optional[List[int]], str, List[FrozenSet[str]]]:
    """(``evaluation_order``, why there is none or "", each rule's lagged names)."""
    reads = _reads(rules)
    lagged = _lagged(rules, reads)

    def refused(why: str):
        return None, why, lagged

    for j, ws in enumerate(reads):
        if j in ws:
            return refused(f"{rules[j].kind} {rules[j].name!r} reads its own output")
        before = {rules[w].name for w in ws if w < j}
        both = [w for w in ws if w > j and rules[w].name in before]
        if both:
            return refused(f"{rules[j].kind} {rules[j].name!r} reads {rules[both[0]].name!r}, "
                           "recorded both before and after it")
        why = _unlaggable(rules[j], lagged[j]) if lagged[j] else None
        if why:
            return refused(f"{rules[j].kind} {rules[j].name!r} reads {sorted(lagged[j])[0]!r}, recorded after it, {why}")
    waits = [set(ws) for ws in reads]
    last: Dict[str, int] = {}
    for i, r in enumerate(rules):  # rules recording one name keep their file order (the first write wins)
        if r.kind == "record":
            if r.name in last:
                waits[i].add(last[r.name])
            last[r.name] = i
    readers: Dict[int, List[int]] = {}
    for i, ws in enumerate(waits):
        for w in ws:
            readers.setdefault(w, []).append(i)
    ready = [i for i, ws in enumerate(waits) if not ws]
    heapq.heapify(ready)
    order: List[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for k in readers.get(i, []):
            waits[k].discard(i)
            if not waits[k]:
                heapq.heappush(ready, k)
    if len(order) < len(rules):
        placed = set(order)
        stuck = min(k for k in range(len(rules)) if k not in placed)
        return refused(f"{rules[stuck].kind} {rules[stuck].name!r} reads, through other rules, what it records")
    return order, "", lagged


def evaluation_order(rules: List[Rule]) -> Optional[List[int]]:
    """The rules' indices in an order where every recording rule comes before the rules that read
    it (and rules recording one name keep their file order), otherwise in file order; None where no
    such order evaluates the rules in blocks exactly as one step at a time in file order: a rule
    reading its own output, directly or through others; a name recorded both before and after a
    reader; a later rule's name read inside a subquery or by a selector without an exact name."""
    return _plan(rules)[0]


def circular_reads(rules: List[Rule]) -> List[Tuple[Rule, Rule]]:
    """A rule that reads its own output, directly or through others: (reader, the writer it reads
    through) for the first, or nothing. What no order of evaluation, and no inlining, can serve."""
    reads = _reads(rules)
    for j, ws in enumerate(reads):
        for w in ws:
            seen, todo = set(), [w]
            while todo:
                k = todo.pop()
                if k == j:
                    return [(rules[j], rules[w])]
                if k not in seen:
                    seen.add(k)
                    todo.extend(reads[k])
    return []


def shared_subexpressions(rules: List[Rule]) -> FrozenSet[str]:
    """Sub-expressions that occur more than once across the rules (worth caching per block)."""
    counts: Counter = Counter()
    for r in rules:
        for node in walk(r.expr):
            if not isinstance(node, (NumberLiteral, StringLiteral)):
                counts[str(node)] += 1
    return frozenset(k for k, c in counts.items() if c > 1)


def _as_vec(res, S: int) -> Vec:
    if isinstance(res, Vec):
        return res
    return Vec([()], np.asarray(res, dtype=np.float64)[None, :], np.ones((1, S), bool), np.zeros(1))


def run(groups: List[Group], store: Store, times: np.ndarray, interval_ms: int,
        lookback_ms: int = DEFAULT_LOOKBACK_MS, left_open: bool = False, block_steps: int = 2880,
        progress: Optional[Callable[[int, int], None]] = None, order=None,
        served: Optional[Callable[[Rule, np.ndarray], Optional[Vec]]] = None, cadence: bool = True) -> Run:
    """Evaluate every rule at every time in ``times`` (a group with a longer interval at the first
    step of each of its intervals; ``cadence=False``: every group at every step, as promtool);
    recorded series go into ``store``. ``served(rule, block)``, when given, may answer a rule's
    expression over a block of times instead (a server's answer: ``remote.RuleServer``); where it
    returns None the rule is evaluated here."""
    times = np.asarray(times, dtype=np.int64)
    flat: List[Tuple[Group, Rule]] = [(g, r) for g in groups for r in g.rules]
    rules = [r for _, r in flat]
    result = Run(times, interval_ms, store, alertnames=sorted({r.name for r in rules if r.kind == "alert"}))
    sequence, reason, lagged = _plan(rules)
    if sequence is None:  # one step at a time in file order: a later rule has not run yet at a step
        block_steps = 1
        sequence = list(range(len(rules)))
        lagged = [frozenset()] * len(rules)
        result.notes.append(f"{reason}: evaluating one step at a time")
    result.block_steps = block_steps
    shared = shared_subexpressions(rules)
    every = {id(g): alerts.every_interval(times, g.interval_ms, interval_ms) if cadence else None for g in groups}
    previous: Dict[int, set] = {i: set() for i in range(len(flat))}  # seriesInPreviousEval per rule
    tracks: Dict[Tuple[int, Labels], AlertTrack] = {}
    n = len(times)
    for a in range(0, n, max(block_steps, 1)):
        b = min(n, a + max(block_steps, 1))
        block = times[a:b]
        evs: Dict[Optional[int], Evaluator] = {}  # one per cadence: every step (None), a slower group's
        for i in sequence:
            g, rule = flat[i]
            mask = every[id(g)]
            if mask is not None and not mask[a:b].any():
                continue  # its group does not run in this block
            at = block if mask is None else block[mask[a:b]]
            pos = np.arange(a, b) if mask is None else a + np.nonzero(mask[a:b])[0]
            key = None if mask is None else id(mask)
            if key not in evs:
                evs[key] = Evaluator(store, at, interval_ms, lookback_ms, left_open, shared, order=order)
            try:
                got = served(rule, block) if served is not None else None  # a server answers the whole grid
                if got is not None and mask is not None:
                    got = _columns(got, mask[a:b])
                ev = evs[key] if not lagged[i] else Evaluator(store, at, interval_ms, lookback_ms, left_open,
                                                              order=order, lagged=lagged[i])
                out = got if got is not None else _as_vec(ev.eval(rule.expr), len(at))
                if rule.kind == "record":
                    _record(store, rule, out, at, previous, i)
                    for ev in evs.values():
                        ev.forget(rule.name)
                else:
                    _alert(rule, g.name, out, at, pos, n, i, tracks, mask)
            except EvalError as exc:
                when = f" at {exc.t_ms / 1000:g}s" if exc.t_ms is not None else ""
                raise RuleEvalError(f"{rule.where}: {rule.kind} {rule.name!r} (group {g.name!r}) failed{when}: "
                                    f"{exc.message}") from None
        if progress:
            progress(b, n)
    for track in tracks.values():
        track.states = alerts.evaluate_every(times, track.active, track.every, track.rule.for_ms,
                                             track.rule.keep_firing_for_ms)
    result.alerts = sorted(tracks.values(), key=lambda t: (t.rule.name, t.labels))
    return result


def _columns(vec: Vec, keep: np.ndarray) -> Vec:
    """``vec`` at the steps where ``keep`` is true (a slower group's evaluations of a block)."""
    K = vec.K[:, keep] if vec.K.ndim == 2 else vec.K
    T = None if vec.T is None or vec.T.ndim != 2 else vec.T[:, keep]
    return Vec(vec.labels, vec.V[:, keep], vec.P[:, keep], K, T)


def _record(store: Store, rule: Rule, out: Vec, block: np.ndarray, previous: Dict[int, set], i: int) -> None:
    labels = []
    for ls in out.labels:
        d = dict(ls)
        d[NAME] = rule.name
        d.update(rule.labels)
        labels.append(make(d))
    vec = build(labels, out.V, out.P, out.K, block,
                what="vector contains metrics with the same labelset after applying rule labels")
    prev = previous[i]
    current = set()
    for j, ls in enumerate(vec.labels):
        p = vec.P[j]
        was = np.concatenate([[ls in prev], p[:-1]])
        stale = ~p & was
        write = p | stale
        if write.any():
            store.write(ls, block[write], np.where(p[write], vec.V[j][write], np.nan), stale[write])
        if p[-1]:
            current.add(ls)
    for ls in prev - set(vec.labels):  # returned before this block, never in it: stale at once
        store.write(ls, block[:1], np.array([np.nan]), np.array([True]))
    previous[i] = current


def _alert(rule: Rule, group: str, out: Vec, block: np.ndarray, pos: np.ndarray, n: int, i: int,
           tracks: Dict[Tuple[int, Labels], AlertTrack], every: Optional[np.ndarray]) -> None:
    labels = []
    for ls in out.labels:
        d = dict(drop_name(ls))
        for k, v in rule.labels:
            d[k] = fill_label_template(v, dict(ls))
        d["alertname"] = rule.name
        labels.append(make(d))
    vec = build(labels, out.V, out.P, out.K, block,
                what="vector contains metrics with the same labelset after applying alert labels")
    for j, ls in enumerate(vec.labels):
        t = tracks.get((i, ls))
        if t is None:
            t = tracks[(i, ls)] = AlertTrack(rule, group, ls, np.zeros(n, bool), every=every)
        t.active[pos] = vec.P[j]
