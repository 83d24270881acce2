"""The backtest's pieces on their own (no promtool): the PromQL parser, durations, promtool's
series notation, the alert state machine, window bounds (Prometheus 2 and 3), the store's
first-write-wins rule and how rule sets that read their own output are run.
"""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from conftest import ROOT
from exporter.analysis import alerts
from exporter.analysis import rulemanager as rule_runner
from exporter.analysis.promql.durations import DurationError, format_duration, parse_duration
from exporter.analysis.promql.engine import Evaluator
from exporter.analysis.promql.labels import make
from exporter.analysis.promql.lexer import PromQLSyntaxError
from exporter.analysis.promql.parser import parse
from exporter.analysis.rulefile import RuleFileError, groups_from_data
from exporter.analysis.series import Store
from exporter.analysis.sources import SourceError, expand_values, input_series_store


def test_every_pack_expression_parses_and_prints_back_to_the_same_tree():
    doc = yaml.safe_load((ROOT / "rules" / "vllm.rules.yml").read_text())
    for g in doc["groups"]:
        for r in g["rules"]:
            e = parse(r["expr"])
            assert parse(str(e)) == e, r["expr"]


@pytest.mark.parametrize("text,pos,msg", [
    ("sum(rate(x[5m])", 15, "unclosed left parenthesis"),
    ("rate(x)", 0, "expected type range vector"),
    ("x > 1 and 2", 6, "set operator 'and' not allowed"),
    ("1 < 2", 2, "comparisons between scalars must use BOOL"),
    ("foo{a=~\"(\"}", 7, "error parsing regexp"),
    ("x offset 5m offset 1m", 12, "offset may not be set multiple times"),
    ("sum by (a) (x) by (b)", 15, "unexpected"),
])
def test_parse_errors_say_what_and_where(text, pos, msg):
    with pytest.raises(PromQLSyntaxError) as info:
        parse(text)
    assert msg in info.value.message and info.value.pos == pos, (info.value.message, info.value.pos)


def test_precedence_and_literals_follow_prometheus():
    assert str(parse("-2 ^ 2")) == "-2.0 ^ 2.0"  # the sign folds into the literal, ^ binds tighter
    e = parse("a + b * c ^ d ^ e or f and g")
    assert str(e) == "a + b * c ^ d ^ e or f and g"
    assert e.op == "or" and e.rhs.op == "and" and e.lhs.op == "+"
    assert e.lhs.rhs.rhs.op == "^" and e.lhs.rhs.rhs.rhs.op == "^"  # right-associative
    times = np.array([0], dtype=np.int64)
    ev = Evaluator(Store(), times, 60_000)
    assert ev.eval(parse("0x10 + 010 + 1e1 + .5"))[0] == 16 + 8 + 10 + 0.5  # hex, octal, exponent
    assert ev.eval(parse("2 ^ 3 ^ 2"))[0] == 512
    assert ev.eval(parse("-2 ^ 2"))[0] == -4


def test_durations():
    assert parse_duration("1h30m") == 5_400_000
    assert parse_duration("1d") == 86_400_000 and parse_duration("250ms") == 250
    assert format_duration(5_400_000) == "1h30m"
    for bad in ("30m1h", "1.5h", "", "5x"):
        with pytest.raises(DurationError):
            parse_duration(bad)


def test_promtool_series_notation():
    assert expand_values("1+2x3") == [1, 3, 5, 7]
    assert expand_values("5-1x2 _x2 stale 7x1") == [5, 4, 3, None, None, "stale", 7, 7]
    assert expand_values("Inf -Inf") == [float("inf"), float("-inf")]
    acc = expand_values("0.1+0.1x2")  # accumulated like Go's parser: 0.1 + 0.1 + 0.1 is not 0.3
    assert acc[2] == 0.1 + 0.1 + 0.1 and acc[2] != 0.3
    with pytest.raises(ValueError):
        expand_values("1 2 three")
    with pytest.raises(SourceError) as info:
        input_series_store([{"series": "up{", "values": "1"}], 60_000)
    assert "input_series item 1" in str(info.value)


def test_the_alert_state_machine():
    t = np.arange(20, dtype=np.int64) * 60_000
    act = np.zeros(20, bool)
    act[2:8] = True    # 6 minutes
    act[9:10] = True   # back after one minute without
    act[14:16] = True  # back after four minutes without
    st = alerts.evaluate(t, act, for_ms=3 * 60_000)
    assert list(np.nonzero(st.pending)[0]) == [2, 3, 4, 9, 14, 15]
    assert list(np.nonzero(st.firing)[0]) == [5, 6, 7]
    kept = alerts.evaluate(t, act, for_ms=3 * 60_000, keep_firing_for_ms=2 * 60_000)
    # absent at 8 (kept), present at 9 (same alert), absent 10-11 (kept: 0m, 1m after), resolved at 12
    assert list(np.nonzero(kept.firing)[0]) == [5, 6, 7, 8, 9, 10, 11]
    assert list(np.nonzero(kept.pending)[0]) == [2, 3, 4, 14, 15]
    now = alerts.evaluate(t, act, for_ms=0)
    assert np.array_equal(now.firing, act) and not now.pending.any()


def _store(samples):
    st = Store()
    st.add(make({"__name__": "x"}), [t for t, _ in samples], [v for _, v in samples])
    return st


def test_range_bounds_prometheus_2_and_3():
    st = _store([(0, 1.0), (60_000, 2.0), (120_000, 3.0)])
    times = np.array([120_000], dtype=np.int64)
    two = Evaluator(st, times, 60_000).eval(parse("count_over_time(x[2m])"))
    three = Evaluator(st, times, 60_000, left_open=True).eval(parse("count_over_time(x[2m])"))
    assert two.V[0, 0] == 3 and three.V[0, 0] == 2  # the sample at t-2m: in for 2.x, out for 3.x
    # the lookback delta likewise: a sample exactly 5 minutes old is visible in 2.x only
    late = np.array([300_000 + 120_000], dtype=np.int64)
    assert Evaluator(st, late, 60_000).eval(parse("x")).P[0, 0]
    assert Evaluator(st, late, 60_000, left_open=True).eval(parse("x")).n == 0


def test_stale_markers_end_a_series_at_once():
    st = input_series_store([{"series": "x", "values": "1 2 stale"}], 60_000)
    got = Evaluator(st, np.array([60_000, 120_000, 180_000]), 60_000).eval(parse("x"))
    assert got.P[0].tolist() == [True, False, False]
    got = Evaluator(st, np.array([120_000]), 60_000).eval(parse("count_over_time(x[5m])"))
    assert got.V[0, 0] == 2  # range selectors skip the marker


def test_the_first_write_at_a_timestamp_wins():
    st = Store()
    ls = make({"__name__": "r"})
    st.write(ls, np.array([0, 60_000]), np.array([1.0, 2.0]), np.array([False, False]))
    st.write(ls, np.array([60_000, 120_000]), np.array([9.0, 3.0]), np.array([False, False]))
    s = st.get(ls)
    assert s.t.tolist() == [0, 60_000, 120_000] and s.v.tolist() == [1.0, 2.0, 3.0]


def test_rules_reading_their_own_output_run_one_step_at_a_time():
    groups = groups_from_data([{"name": "g", "rules": [
        {"record": "y", "expr": "(y + 1) or x"},
        {"alert": "Big", "expr": "y > 3"},
    ]}], "test")
    st = input_series_store([{"series": "x", "values": "0x10"}], 60_000)
    run = rule_runner.run(groups, st, np.arange(0, 600_001, 60_000), 60_000)
    assert run.block_steps == 1 and "'y' reads its own output" in run.notes[0]
    y = run.store.get(make({"__name__": "y"}))
    assert y.v.tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]  # each evaluation saw the one before
    assert run.alerts[0].states.firing.tolist() == [False] * 4 + [True] * 7


def test_rule_file_errors_name_the_rule():
    with pytest.raises(RuleFileError) as info:
        groups_from_data([{"name": "g", "rules": [{"alert": "A", "expr": "up", "for": "5 minutes"}]}], "f.yml")
    assert "alert 'A'" in str(info.value) and "for" in str(info.value)
    with pytest.raises(RuleFileError) as info:
        groups_from_data([{"name": "g", "rules": [{"alert": "A", "expr": "up", "labels": {"x": "{{ $value }}"}}]}], "f")
    assert "label templates" in str(info.value)


def test_openmetrics_exemplars_and_hashes_inside_label_values():
    """A sample line's exemplar (``# {...} v``) is dropped, a ``#`` inside a quoted label value
    is the value's, and a line without ``#`` takes the fast path: all read alike."""
    from exporter.analysis.sources import load_openmetrics

    text = ('a_total{k="x#y"} 1 10\n'
            'a_total{k="plain"} 2 10\n'
            'a_total{k="ex"} 3 10 # {trace_id="ab#c"} 0.5 9\n'
            '# EOF\n')
    store = load_openmetrics(text.encode()).store
    got = {dict(s.labels)["k"]: float(s.v[0]) for s in store}
    assert got == {"x#y": 1.0, "plain": 2.0, "ex": 3.0}


def test_a_slower_group_runs_once_an_interval_and_its_alerts_hold_their_state_between():
    """As Prometheus runs a group with ``interval: 2m`` beside one at the 30 s step: its recording
    rules write once every 2 minutes (what a faster rule reads there is up to 2 minutes old), its
    alert waits its ``for`` in its own evaluations and stays pending or firing until the group
    runs again (promtool, unlike Prometheus, would run it at every step)."""
    step, slow = 30_000, 120_000
    groups = groups_from_data([
        {"name": "fast", "rules": [{"record": "f", "expr": "x"}, {"alert": "Fast", "expr": "x > 0", "for": "3m"}]},
        {"name": "slow", "interval": "2m", "rules": [{"record": "s", "expr": "f"},
                                                      {"alert": "Slow", "expr": "f > 0", "for": "3m"}]},
    ], "test")
    # x is 0 for 5 minutes, then 1 (from 300 s on), sampled every 30 s
    st = input_series_store([{"series": "x", "values": "0x9 1x30"}], step)
    times = np.arange(0, 39 * step + 1, step, dtype=np.int64)
    run = rule_runner.run(groups, st, times, step)
    assert run.store.get(make({"__name__": "f"})).t.tolist() == times.tolist()
    assert run.store.get(make({"__name__": "s"})).t.tolist() == list(range(0, int(times[-1]) + 1, slow))
    fired = {tr.alertname: int(times[np.argmax(tr.states.firing)]) // 1000 for tr in run.alerts}
    # Fast: pending at 300 s, firing at 480 s; Slow: pending at its first run after the onset
    # (360 s), firing at its first run 3 minutes after that (600 s), and firing between its runs
    assert fired == {"Fast": 480, "Slow": 600}
    slow_alert = next(tr for tr in run.alerts if tr.alertname == "Slow")
    assert slow_alert.states.pending[np.searchsorted(times, 360_000):np.searchsorted(times, 600_000)].all()
    assert slow_alert.states.firing[np.searchsorted(times, 600_000):].all()
    assert not slow_alert.states.pending[:np.searchsorted(times, 360_000)].any()
    # the first step of each interval, whatever the grid (45 s steps: 0, 135, 270, 360, ...)
    grid = np.arange(0, 600_001, 45_000, dtype=np.int64)
    assert (grid[alerts.every_interval(grid, slow, 45_000)] // 1000).tolist() == [0, 135, 270, 360, 495]
    assert alerts.every_interval(grid, 45_000, 45_000) is None and alerts.every_interval(grid, None, 45_000) is None
    # a grid that starts inside an interval waits for the next one, as a Prometheus started then
    late = np.arange(60_000, 300_001, 30_000, dtype=np.int64)
    assert (late[alerts.every_interval(late, slow, 30_000)] // 1000).tolist() == [120, 240]
    # promtool's way (cadence=False): every group at every step, the slow alert at +480 s as well
    fresh = input_series_store([{"series": "x", "values": "0x9 1x30"}], step)
    flat = rule_runner.run(groups, fresh, times, step, cadence=False)
    assert {tr.alertname: int(times[np.argmax(tr.states.firing)]) // 1000 for tr in flat.alerts} == {
        "Fast": 480, "Slow": 480}


@pytest.mark.parametrize("slow_interval", [None, "3m"])
def test_rules_reading_a_later_rule_run_in_blocks_as_one_step_at_a_time(slow_interval):
    """A reader of a later rule's record (its group's, or a later group's, at every step or at its
    own interval) sees what the writer recorded before that evaluation: evaluated in blocks, as
    one step at a time in file order."""
    data = yaml.safe_load((ROOT / "tests" / "fixtures" / "backtest" / "later.rules.yml").read_text())["groups"]
    if slow_interval:
        data[1]["interval"] = slow_interval
    groups = groups_from_data(data, "later")
    x = [{"series": 'x{i="1"}', "values": " ".join(str(v) for v in [1, 1, 2, 8, 9, 1, 1, 10, 10, 0] * 6)}]
    times = np.arange(0, 3_600_001, 60_000)
    block = rule_runner.run(groups, input_series_store(x, 60_000), times, 60_000)
    step = rule_runner.run(groups, input_series_store(x, 60_000), times, 60_000, block_steps=1)
    assert block.block_steps == 2880 and not block.notes
    for name in ("x:doubled", "x:baseline", "x:doubled_max"):
        ls = make({"__name__": name, "i": "1"})
        got, want = block.store.get(ls), step.store.get(ls)
        assert got.t.tolist() == want.t.tolist() and got.v.tolist() == want.v.tolist(), name
    fired = {t.alertname: t.states.firing.tolist() for t in block.alerts}
    assert fired == {t.alertname: t.states.firing.tolist() for t in step.alerts}
    assert any(fired["AboveBaseline"]) and any(fired["DoubledJump"])


def test_a_reader_of_a_later_rule_sees_what_it_recorded_before_that_evaluation():
    groups = groups_from_data([{"name": "fast", "rules": [{"alert": "Seen", "expr": "r"}]},
                               {"name": "slow", "rules": [{"record": "r", "expr": "x"}]}], "t")
    x = [{"series": "x", "values": "1 2 3"}]
    run = rule_runner.run(groups, input_series_store(x, 60_000), np.array([0, 60_000, 120_000]), 60_000)
    assert run.block_steps > 1
    assert run.alerts[0].active.tolist() == [False, True, True]  # nothing recorded before 0
    assert rule_runner.evaluation_order([r for g in groups for r in g.rules]) == [1, 0]


@pytest.mark.parametrize("group, why", [("subquery", "inside a subquery"), ("regex", "without an exact name"),
                                        ("noname", "without an exact name")])
def test_a_later_rule_read_where_blocks_cannot_serve_runs_one_step_at_a_time(group, why):
    data = yaml.safe_load((ROOT / "tests" / "fixtures" / "backtest" / "later-unsafe.rules.yml").read_text())["groups"]
    groups = groups_from_data([g for g in data if g["name"] == group], "unsafe")
    x = [{"series": 'x{i="1"}', "values": "1 1 2 8 9 1 1 10 10 0"}]
    run = rule_runner.run(groups, input_series_store(x, 60_000), np.arange(0, 540_001, 60_000), 60_000)
    assert run.block_steps == 1 and why in run.notes[0]
    assert rule_runner.evaluation_order([r for g in groups for r in g.rules]) is None


def test_two_rules_recording_one_name_keep_their_file_order_in_blocks():
    """The first rule recording ``z`` reads what a later rule records; in blocks the two writers
    still run in file order, so the first write at a timestamp wins, as one step at a time (and as
    Prometheus, which refuses the second write)."""
    groups = groups_from_data(yaml.safe_load((ROOT / "tests" / "fixtures" / "backtest" / "later-twice.rules.yml")
                                             .read_text())["groups"], "twice")
    times = np.arange(0, 600_001, 60_000)
    block = rule_runner.run(groups, input_series_store([], 60_000), times, 60_000)
    step = rule_runner.run(groups, input_series_store([], 60_000), times, 60_000, block_steps=1)
    z = make({"__name__": "z"})
    assert block.block_steps > 1 and block.store.get(z).v.tolist() == step.store.get(z).v.tolist()
    assert block.store.get(z).v.tolist() == [2.0] + [5.0] * 10  # q is written after the first z at 0
