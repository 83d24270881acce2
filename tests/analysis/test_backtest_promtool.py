"""The backtest against promtool's own rule engine (Prometheus 2.42), on the same input.

For each scenario promtool is asked, at every evaluation and for every alert, to expect nothing:
what it reports instead is its timeline of firing alerts, which must equal the backtest's at every
evaluation. The same promtool run checks values: ``promql_expr_test`` cases whose expected samples
are this project's engine's results, for every rule expression of the pack, every series the pack
records, and a list of targeted functions; promtool compares floats exactly, so one ulp of
difference fails.

Scenarios (the incident replay and the busy day of the real pack are compared in
test_incident_scenario, in the same promtool run that gives their timelines): crafted
rules for ``for``, ``keep_firing_for``, stale markers, series appearing and disappearing, counter
resets, ``histogram_quantile`` edge cases, ``group_left`` joins and label templates; a rule
group that reads its own output (evaluated one step at a time); rules that read a later rule's
record, in their group and in a later group (evaluated in blocks, each reader seeing what the
writer recorded before its evaluation); and such reads blocks cannot serve (inside a subquery, by
a selector without an exact name: one step at a time).
"""

from __future__ import annotations

import pytest

from conftest import FIXTURES
from promseries import counter, fmt_series, gauge, series, values
from promtool_equiv import Scenario, compare

pytestmark = pytest.mark.prometheus

CRAFTED = FIXTURES / "backtest" / "crafted.rules.yml"
FORWARD = FIXTURES / "backtest" / "forward.rules.yml"
LATER = FIXTURES / "backtest" / "later.rules.yml"
LATER_UNSAFE = FIXTURES / "backtest" / "later-unsafe.rules.yml"


def _assert_same(out, min_firing=0):
    assert not out.expr_failures, "promtool disagrees with the engine's values:\n" + "\n---\n".join(out.expr_failures[:5])
    for name, mine in out.backtest.items():
        theirs = out.promtool.get(name, {})
        diff = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
        assert not diff, (f"{name}: firing alerts differ at {len(diff)} evaluations, first "
                          f"{diff[0]}: backtest {mine.get(diff[0])}, promtool {theirs.get(diff[0])}")
    assert sum(len(t) for t in out.backtest.values()) >= min_firing


# -- crafted rules --------------------------------------------------------------------------

N = 81  # samples at 30 s: 0 .. 40 minutes


def _flap():
    v = [0] * 10 + [1] * 6 + [0] * 4 + [1] * 4 + [0] * 14 + [1] + [0] * 6 + [1] * 15
    return values(v) + " _x20"  # the series stops: visible for the lookback, then gone


def _alert_inputs(shift: int = 0):
    """30-second samples of everything the crafted alerts read; ``shift`` moves the events."""
    s = lambda name, labels, v: {"series": fmt_series(name, labels), "values": v}  # noqa: E731
    out = [
        s("flap", {"instance": "i1"}, _flap()),
        # i1: 1/s, a restart at sample 31, then 3/s; i2: 2/s with a pause
        series("requests_total", {"job": "api", "instance": "i1"},
               [30.0 * k for k in range(31)] + [5 + 90.0 * k for k in range(N - 31)]),
        s("requests_total", {"job": "api", "instance": "i2"}, "0+60x30 1800x10 1800+60x39"),
        s("up", {"job": "api", "instance": "i1"}, f"1x{20 + shift} _x16 1x{43 - shift}"),
        series("queue_depth", {"queue": "q1"}, [0] * 20 + list(range(1, 13)) + [12 - k for k in range(12)] + [0] * 37),
        s("errors", {"instance": "i1"}, "0x15 3x30 0x34"),
        s("team_info", {"instance": "i1", "team": "red"}, "1x25 stale"),
        s("team_info", {"instance": "i1", "team": "blue"}, "_x26 1x54"),
        s("stale_gauge", {"instance": "i1"}, "1x5 stale _x2 2x10 stale _x20 3x3 stale"),
        s("gauge", {"pod": "a"}, "1x20 7x20 2x40"),
        s("gauge", {"pod": "b"}, f"_x{10 + shift} 3x10 9x5 _x20 4x{33 - shift}"),
        s("gauge", {"pod": "c"}, "2x30 stale _x10 20x10 1x28"),
        s("gauge_limit", {"pod": "a"}, "8x80"),
        s("gauge_limit", {"pod": "b"}, "10x40 0x40"),
        s("gauge_limit", {"pod": "c"}, "4x80"),
    ]
    # histograms: api slows down mid-way; web has no +Inf bucket (NaN); batch has non-monotonic
    # buckets; idle never observes anything (NaN)
    def hist(job, per_bucket, bounds=("0.1", "0.5", "1", "+Inf")):
        for i, le in enumerate(bounds):
            out.append(series("latency_seconds_bucket", {"job": job, "le": le}, counter(lambda m, i=i: per_bucket(m, i), N - 1)))

    hist("api", lambda m, i: [10, 12, 14, 15][i] if m < 30 else [1, 2, 3, 15][i])
    hist("web", lambda m, i: [2, 4, 6][i], bounds=("0.1", "0.5", "1"))
    hist("batch", lambda m, i: [5, 3, 9, 9][i] if m % 7 else [0, 0, 1, 9][i])
    hist("idle", lambda m, i: 0)
    hist("dup", lambda m, i: [1, 2, 2, 3, 4][i], bounds=("0.5", "1", "1.0", "2", "+Inf"))
    return out


FUNCTION_EXPRS = [
    # counters and gauges over ranges
    "rate(requests_total[5m])", "increase(requests_total[3m])", "rate(requests_total[90s])",
    "rate(requests_total[5m] offset 2m)", "irate(requests_total[2m])", "delta(gauge[4m])", "idelta(gauge[2m])",
    "deriv(queue_depth[10m])", "predict_linear(queue_depth[10m], 3600)", "resets(requests_total[10m])",
    "changes(gauge[10m])", "avg_over_time(gauge[5m])", "sum_over_time(gauge[5m])", "min_over_time(gauge[7m])",
    "max_over_time(gauge[7m])", "count_over_time(gauge[5m])", "last_over_time(gauge[5m])",
    "stddev_over_time(gauge[5m])", "stdvar_over_time(gauge[10m])", "quantile_over_time(0.3, gauge[10m])",
    "present_over_time(stale_gauge[2m])", "absent_over_time(nothing[5m])", "absent_over_time(stale_gauge[1m])",
    "holt_winters(queue_depth[10m], 0.5, 0.3)", "avg_over_time(gauge[1h])",
    # histograms
    "histogram_quantile(0.9, rate(latency_seconds_bucket[5m]))",
    "histogram_quantile(0.5, sum by (le) (rate(latency_seconds_bucket[5m])))",
    "histogram_quantile(1, rate(latency_seconds_bucket[2m]))", "histogram_quantile(0, rate(latency_seconds_bucket[2m]))",
    "histogram_quantile(-1, rate(latency_seconds_bucket[2m]))", "histogram_quantile(2, rate(latency_seconds_bucket[2m]))",
    "histogram_quantile(0.99, latency_seconds_bucket)",
    # labels, absence, scalars
    'label_replace(gauge, "x", "$1-$2", "pod", "(.)(.*)")', 'label_replace(gauge, "pod", "", "pod", "a")',
    'label_replace(gauge, "y", "${1}z", "pod", "(a|b)")', 'label_join(team_info, "j", ",", "instance", "team")',
    'absent(gauge{pod="zzz"})', 'absent(nothing{a="b", c=~"d"})', 'absent(gauge)', "vector(1)",
    'scalar(gauge{pod="a"})', "scalar(gauge)", "time()", "vector(time())", "timestamp(gauge)",
    "timestamp(gauge offset 1m)", "timestamp(sum(gauge))",
    # functions of instant vectors
    "clamp(gauge, 2, 5)", "clamp_max(gauge, 3)", "clamp_min(gauge, 4)", "clamp(gauge, 5, 2)", "abs(gauge - 5)",
    "ceil(gauge / 3)", "floor(gauge / 3)", "round(gauge / 3)", "round(gauge / 3, 0.25)", "sqrt(gauge)",
    "sgn(gauge - 4)", "sort(gauge)", "sort_desc(gauge)", "hour()", "minute()", "day_of_week()",
    "month(vector(1700000000))", "year()", "days_in_month(vector(1706745600))", "day_of_year(vector(1700000000))",
    # aggregations
    "sum(gauge)", "sum by (pod) (gauge)", "sum without (pod) (gauge)", "avg(gauge)", "min(gauge)", "max(gauge)",
    "count(gauge)", "group(gauge)", "stddev(gauge)", "stdvar(gauge)", "quantile(0.25, gauge)",
    "quantile by (job) (0.9, rate(requests_total[5m]))", "topk(2, gauge)", "bottomk(1, gauge)",
    'count_values("v", gauge)', "sum(rate(requests_total[5m]))", "avg(rate(requests_total[5m]) * 3.7)",
    "sum(gauge / 3)", "sum(gauge or gauge_limit * 1.1)", "avg by (job) (rate(latency_seconds_bucket[5m]))",
    # binary operators and matching
    "gauge + on (pod) gauge_limit", "gauge * ignoring (x) gauge_limit", "gauge / on (pod) group_left () gauge_limit",
    "gauge_limit - on (pod) group_right () gauge", "gauge > bool 2", "gauge > 2", "2 < gauge", "2 < bool gauge",
    "gauge == gauge_limit", "gauge != bool gauge_limit", "gauge and gauge_limit > 5", "gauge or gauge_limit",
    "gauge unless gauge_limit < 5", "gauge and on () up", "gauge unless ignoring (pod) gauge_limit",
    "errors * on (instance) group_left (team) team_info", "gauge % 3", "gauge ^ 2", "-gauge", "+gauge",
    "2 ^ 3 ^ 2", "10 % 3", "-2 ^ 2", "(1 + 2) * 3", "0x10 + 1e1", "5 > bool 3", "gauge offset 5m",
    "max_over_time(gauge[10m:1m])", "rate(requests_total[5m:30s])", "avg_over_time(rate(requests_total[2m])[10m:])",
    "min_over_time(gauge[5m:2m] offset 1m)",
    # what the crafted rules recorded
    '{__name__=~"job:.+|queue:.+|pod:.+"}',
]


def test_crafted_rules_and_functions_match_promtool(tmp_path):
    times = [60, 300, 330, 600, 750, 900, 1200, 1500, 1800, 2100, 2400]
    out = compare(tmp_path, CRAFTED, [
        Scenario("alerts", _alert_inputs(), "30s", 2400, 0, FUNCTION_EXPRS, times),
        Scenario("alerts-shifted", _alert_inputs(shift=3), "30s", 2400, 0),
    ], eval_interval_s=30, group_eval_order=["crafted-records", "crafted-alerts"])
    _assert_same(out, min_firing=60)
    fired = {name for (_, name) in out.backtest["alerts"]}
    assert {"Flapping", "RequestsHigh", "ApiAbsent", "LatencyHigh", "QueueGrowing", "CounterReset", "TeamErrors",
            "StaleGauge", "Immediate", "RatioHigh", "Outlier"} <= fired, fired
    assert out.expr_cases >= 1000


def test_rules_that_read_their_own_output_match_promtool(tmp_path):
    x = series("x", {"i": "1"}, gauge(lambda m: [0, 2, 8, 9, 1, 0, 10, 10, 0][m // 5 % 9], 60))
    out = compare(tmp_path, FORWARD, [Scenario("forward", [x], "1m", 3600, 0,
                                                ["x:smoothed", "x:doubled"], [600, 1200, 2400])])
    _assert_same(out, min_firing=5)


def test_rules_that_read_a_later_rule_match_promtool_in_blocks(tmp_path):
    """Readers of what a later rule records (in their group, or a later group) see what it wrote
    before each evaluation, as promtool, and the engine still evaluates in blocks."""
    x = series("x", {"i": "1"}, gauge(lambda m: [1, 1, 2, 8, 9, 1, 1, 10, 10, 0][m // 4 % 10], 60))
    out = compare(tmp_path, LATER, [Scenario("later", [x], "1m", 3600, 0,
                                             ["x:doubled", "x:baseline", "x:doubled_max"], [600, 1200, 2400])])
    _assert_same(out, min_firing=5)


def test_reads_of_a_later_rule_blocks_cannot_serve_match_promtool(tmp_path):
    """A later rule's record read inside a subquery or by a selector without an exact name (run
    one step at a time): promtool's values and alerts."""
    x = series("x", {"i": "1"}, gauge(lambda m: [1, 1, 2, 8, 9, 1, 1, 10, 10, 0][m % 10], 60))
    out = compare(tmp_path, LATER_UNSAFE, [Scenario("unsafe", [x], "1m", 3600, 0, ["x:r", "x:w", "r", "x:v", "s", "x:u"],
                                                    [300, 600, 720, 1200])])
    _assert_same(out, min_firing=1)
