"""Prometheus' own PromQL test files (v2.42.0, ``tests/fixtures/promql-testdata``) through the
backtest's engine, with the range-query and ``@`` re-runs of Prometheus' harness
(``tests/promql_testdata.py``): every eval passes, and the number of evals run is the number the
files hold. Plus the defects those files found, each pinned by its own test."""

from __future__ import annotations

import numpy as np
import pytest

from exporter.analysis.promql.engine import Evaluator
from exporter.analysis.promql.labels import make
from exporter.analysis.promql.lexer import PromQLSyntaxError
from exporter.analysis.promql.parser import parse
from exporter.analysis.series import Store
from promql_testdata import HERE, at_modifier_queries, parse_number, run_file, run_file3

# evals per file at v2.42.0 (566 in all), counted from the files by hand: a loader that drops a
# case changes the count
V2_42 = {"aggregators.test": 83, "at_modifier.test": 33, "collision.test": 2, "functions.test": 207,
         "histograms.test": 38, "literals.test": 20, "operators.test": 94, "selectors.test": 31,
         "staleness.test": 14, "subquery.test": 25, "trig_functions.test": 19}


def test_the_files_are_all_there():
    assert sorted(p.name for p in (HERE / "v2.42.0").glob("*.test")) == sorted(V2_42)
    assert sum(V2_42.values()) == 566


@pytest.mark.parametrize("name", sorted(V2_42))
def test_prometheus_2_42_promql_test_file(name):
    outcomes = run_file(HERE / "v2.42.0" / name)
    failed = [str(o) for o in outcomes if o.error]
    assert not failed, f"{len(failed)} of {len(outcomes)} failed:\n" + "\n".join(failed)
    assert len(outcomes) == V2_42[name]


def test_a_line_the_loader_cannot_read_is_a_failure(tmp_path):
    f = tmp_path / "bad.test"
    f.write_text("load 5m\n  m 1 2 3\n\nfrobnicate everything\n\neval instant at 5m m\n  m 2\n\n"
                 "eval instant at 5m m\n  m 3\n\neval instant at 5m m{\n  m 2\n")
    out = run_file(f)
    assert [o.error is None for o in out] == [False, True, False, False]
    assert "invalid or unsupported command" in out[0].error and "expected 3" in out[2].error and "cannot parse" in out[3].error


def test_at_modifier_re_runs_follow_the_harness():
    qs = at_modifier_queries("sum_over_time(x[5m:1m]) + y", 100_000)
    assert [t for _, t in qs] == [-1_000_000, 0, 20_000, 100_000, 1_000_000]
    assert qs[0][0] == "sum_over_time(x[5m:1m] @ 100.000) + y @ 100.000"
    assert at_modifier_queries("time() + x", 100_000) == []  # time() cannot be pinned
    assert [t for _, t in at_modifier_queries("x", 0)] == [-1000, 0, 1000]


def test_scalar_lines_are_read_like_go():
    assert parse_number("010") == 8 and parse_number("0x10") == 16 and parse_number("1e3") == 1000
    assert parse_number("-Inf") == float("-inf") and parse_number('foo{a="b"} 1') is None


# -- the defects the files found ---------------------------------------------------------------

def _metric_store():
    s = Store()
    for job, step in (("1", 1), ("2", 2)):
        s.add(make({"__name__": "metric", "job": job}), np.arange(0, 1001) * 10_000,
              np.arange(0, 1001) * float(step))
    return s


def test_at_inside_a_subquery_sees_past_the_inner_step():
    """An inner step at 25 s evaluating ``metric[100s] @ 100`` reads samples up to 100 s: the
    outer evaluation (at 100 s) may see them. The engine used to cut each inner step's view at
    the inner step itself and answered 18 (0+1+2 +0+1+2+3+4+5 ...), not 275."""
    ev = Evaluator(_metric_store(), np.array([100_000]), 60_000)  # a rule's evaluation at 100 s
    v = ev.eval(parse('sum_over_time(sum_over_time(metric{job="1"}[100s] @ 100)[100s:25s] @ 50)'))
    assert v.n == 1 and v.V[0, 0] == 275


def test_a_subquery_inside_a_rule_still_sees_nothing_later_than_the_evaluation():
    """The backtest's rule: nothing later than t is visible at t, also through a subquery."""
    ev = Evaluator(_metric_store(), np.array([30_000]), 60_000)
    v = ev.eval(parse('sum_over_time(sum_over_time(metric{job="1"}[100s] @ 100)[100s:25s] @ 50)'))
    assert v.V[0, 0] == 5 * (0 + 1 + 2 + 3)  # inner steps -50 s to 50 s each see 0..30 s only


def _groups():
    s = Store()
    for g in ("production", "canary", "PROD-x"):
        s.add(make({"__name__": "m", "group": g}), [0], [1.0])
    return s


@pytest.mark.parametrize("rx,want", [
    ("((?i)PRO).*", ["PROD-x", "production"]),          # a flag inside a group: Go applies it to the rest
    (".*((?i)DUC).*", ["production"]),
    ("(?i)can.*|x", ["canary"]),
    ("prod.*$", ["production"]),
])
def test_regex_matchers_have_go_semantics(rx, want):
    v = Evaluator(_groups(), np.array([0]), 60_000).eval(parse(f'm{{group=~"{rx}"}}'))
    assert sorted(dict(ls)["group"] for ls in v.labels) == want


@pytest.mark.parametrize("rx", ["a(?=b)", r"(a)\1", r"a\Z", "(?<!a)b"])
def test_regexes_go_refuses_are_refused(rx):
    """Python's ``re`` took these; Go's regexp (RE2) does not, so Prometheus refuses the query."""
    with pytest.raises(PromQLSyntaxError, match="error parsing regexp"):
        parse(f'm{{group=~"{rx}"}}'.replace("\\", "\\\\"))


# -- Prometheus 3 ------------------------------------------------------------------------------
# The float-only files of v3.14.0 (``promql/promqltest/testdata``; extended_vectors.test, the
# only other file without ``{{`` native histograms in its evals, loads some) through the engine
# in ``--prometheus3-ranges`` mode (left-open windows and lookback) and Prometheus 3's syntax of
# numbers as durations. What cannot pass is listed here, line by line, with why (the README's
# backtest section explains each): the test fails when one of them starts passing or any other
# eval fails.

V3_14 = {"at_modifier.test": 71, "collision.test": 2, "duration_expression.test": 59, "literals.test": 25,
         "name_label_dropping.test": 30, "selectors.test": 31, "staleness.test": 17, "trig_functions.test": 19,
         "type_and_unit.test": 58}
# experimental duration expressions ([5m+1m], offset (2*2), step(), range(), min_of); the
# 9 evals of the file without one (numbers as durations, offset -4) pass
_DURATION_EXPR = {17, 23, 35, 41, 47, 53, 59, 65, 71, 77, 83, 89, 100, 104, 108, 112, 116, 132, 135, 141,
                  147, 155, 158, 161, 164, 167, 170, 173, 176, 179, 182, 185, 188, 191, 194, 197, 200, 203, 206,
                  209, 212, 215, 218, 221, 224, 227, 232, 235, 238, 241, 250}
V3_CANNOT_PASS = {
    "duration_expression.test": {line: "experimental duration expression" for line in _DURATION_EXPR},
    "name_label_dropping.test": {line: "delayed __name__ removal (feature flag promql-delayed-name-removal)"
                                 for line in (59, 64, 69, 74, 89, 115, 119, 123)},
    "type_and_unit.test": {line: "__type__/__unit__ labels (feature flag type-and-unit-labels)"
                           for line in (39, 53, 56, 63, 77, 92, 122, 140, 181, 195, 198, 208, 222, 237, 279)},
}


def test_v3_files_are_all_there():
    assert sorted(p.name for p in (HERE / "v3.14.0").glob("*.test")) == sorted(V3_14)
    assert sum(V3_14.values()) == 312


@pytest.mark.parametrize("name", sorted(V3_14))
def test_prometheus_3_14_float_test_file_in_prometheus3_mode(name):
    outcomes = run_file3(HERE / "v3.14.0" / name)
    assert len(outcomes) == V3_14[name]
    failed = {o.line: o for o in outcomes if o.error}
    known = V3_CANNOT_PASS.get(name, {})
    unexpected = [str(o) for line, o in failed.items() if line not in known]
    now_passing = sorted(set(known) - set(failed))
    assert not unexpected, "\n".join(unexpected)
    assert not now_passing, f"listed as failing but pass now (update V3_CANNOT_PASS and the README): {now_passing}"


def test_prometheus3_syntax_only_when_asked():
    with pytest.raises(PromQLSyntaxError):
        parse("rate(x[300])")  # Prometheus 2.42 refuses a number as a duration
    with pytest.raises(PromQLSyntaxError):
        parse("x offset 0s")
    assert parse("rate(x[300])", prometheus3=True) == parse("rate(x[5m])")
    assert parse("x offset 90 @ 100s", prometheus3=True) == parse("x offset 1m30s @ 100")
    assert parse("max_over_time(x[5m:1.5])", prometheus3=True) == parse("max_over_time(x[5m:1500ms])")
    with pytest.raises(PromQLSyntaxError, match="unknown function"):
        parse("mad_over_time(x[5m])")  # experimental in Prometheus 3, unknown to 2.42
    parse("mad_over_time(x[5m])", prometheus3=True)


def test_prometheus3_experimental_functions():
    s = Store()
    s.add(make({"__name__": "x", "a": "1"}), [0, 10_000, 20_000, 30_000, 40_000], [1.0, 2.0, 3.0, 4.0, 100.0])
    ev = Evaluator(s, np.array([40_000]), 60_000, left_open=True)
    mad = ev.eval(parse("mad_over_time(x[1m])", prometheus3=True))
    assert mad.labels == [make({"a": "1"})] and mad.V[0, 0] == 1.0  # |1 2 3 4 100 - 3| -> 2 1 0 1 97
    first = ev.eval(parse("first_over_time(x[25s])", prometheus3=True))
    assert first.labels == [make({"__name__": "x", "a": "1"})] and first.V[0, 0] == 3.0  # (15 s, 40 s]
