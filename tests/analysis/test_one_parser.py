"""One of each: Prometheus durations have one parser (``exporter.slo.parse_duration``) and
classic ``histogram_quantile`` one implementation (``exporter.runtime.buckets.bucket_quantile``),
shared by the SLO loader, the sidecar and the backtest's PromQL engine, with Prometheus' results."""

from __future__ import annotations

import math

import numpy as np
import pytest

from exporter import slo
from exporter.analysis.promql import durations as promql_durations
from exporter.analysis.promql import quantile as promql_quantile
from exporter.analysis.promql.engine import Evaluator
from exporter.analysis.promql.labels import make
from exporter.analysis.promql.parser import parse
from exporter.analysis.series import Store
from exporter.errors import ConfigError
from exporter.runtime import buckets as sidecar_buckets


def test_one_duration_parser_everywhere():
    assert promql_durations.parse_duration is slo.parse_duration
    assert promql_durations.DurationError is slo.DurationError


@pytest.mark.parametrize("text,ms", [
    ("0", 0), ("0s", 0), ("1h30m", 5_400_000), ("250ms", 250), ("1y", 365 * 86_400_000),
    ("1y2w3d4h5m6s7ms", 33_019_506_007), ("292y", 292 * 365 * 86_400_000),
])
def test_durations_prometheus_accepts(text, ms):
    assert slo.parse_duration(text) == ms
    assert slo.seconds(text) == ms / 1000


@pytest.mark.parametrize("text", [
    "30s30s",     # each unit once (the old SLO loader read this as 60 s)
    "30m1h",      # in order
    "", "5", "1.5h", "5x", "-5m", " 5m", "5m\n", "5M",
    "\u0665m",    # an Arabic-Indic digit: Go's [0-9] is ASCII (the old engine parser took it as 5m)
    "293y",       # over 2^63 ns
    "1ms1s",
])
def test_durations_prometheus_refuses(text):
    with pytest.raises(slo.DurationError):
        slo.parse_duration(text)
    with pytest.raises(ValueError):
        slo.seconds(text)


def _slo_file(tmp_path, text):
    f = tmp_path / "slo.yaml"
    f.write_text(text)
    return str(f)


def test_slo_loader_refuses_a_duration_prometheus_refuses(tmp_path):
    path = _slo_file(tmp_path, "alerts:\n  VLLMKVCacheExhausted: {for: 30s30s}\n")
    with pytest.raises(ConfigError) as info:
        slo.load_slo(path)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith('alerts.VLLMKVCacheExhausted.for: "30s30s" is not a Prometheus duration'), msg


def test_slo_loader_refuses_a_zero_window_but_takes_a_zero_for(tmp_path):
    with pytest.raises(ConfigError, match=r"^windows\.rate: \"0s\" must be longer than 0"):
        slo.load_slo(_slo_file(tmp_path, "windows: {rate: 0s}\n"))
    got = slo.load_slo(_slo_file(tmp_path, "alerts:\n  VLLMKVCacheExhausted: {for: '0'}\n"))
    assert got["alerts"]["VLLMKVCacheExhausted"]["for"] == "0"


# -- histogram_quantile ----------------------------------------------------------------------

INF = math.inf


def _engine(q, buckets):
    """``histogram_quantile(q, h)`` through the PromQL engine, one step."""
    store = Store()
    for le, c in buckets:
        store.add(make({"__name__": "h_bucket", "le": "+Inf" if le == INF else repr(le)}), [0], [c])
    v = Evaluator(store, np.array([0]), 60_000).eval(parse(f"histogram_quantile({q}, h_bucket)"))
    return float(v.V[0][0]) if v.n else None


# (q, buckets, what Prometheus 2.42 answers)
CASES = [
    (0.5, [(1, 2), (2, 6), (INF, 8)], 1.5),
    (0.99, [(1, 2), (2, 6), (INF, 8)], 2.0),                 # the +Inf bucket: the highest finite bound
    (0.5, [(-1, 2), (0, 4), (INF, 8)], 0.0),
    (0.1, [(-1, 2), (0, 4), (INF, 8)], -1.0),                # first bucket, bound <= 0: the bound
    (0.5, [(1, 2), (2, 6)], math.nan),                       # no +Inf bucket
    (0.5, [(1, 0), (INF, 0)], math.nan),                     # no observations
    (1.5, [(1, 2), (INF, 4)], INF), (-0.5, [(1, 2), (INF, 4)], -INF),
    (0.5, [(1, 5), (2, 3), (INF, 10)], 1.0),                 # monotonicity fix: 3 -> 5
    # q = 0 with an empty first bucket: rank 0 / count 0 is NaN in Go (the sidecar's old copy said 1)
    (0.0, [(1, 0), (2, 5), (INF, 5)], math.nan),
    # a NaN first count freezes ensureMonotonic and the binary search lands in bucket 2 (the
    # sidecar's old copy read NaN as 0 and said 2.0)
    (0.5, [(1, math.nan), (2, 5), (INF, 10)], math.nan),
]


@pytest.mark.parametrize("q,buckets,want", CASES)
def test_histogram_quantile_as_prometheus_in_the_sidecar_and_the_engine(q, buckets, want):
    got = sidecar_buckets.histogram_quantile(q, buckets)
    assert got == want or (math.isnan(got) and math.isnan(want)), got
    e = _engine(q, buckets)
    assert e == want or (math.isnan(e) and math.isnan(want)), e


def test_the_engine_runs_the_sidecars_implementation():
    assert promql_quantile.bucket_quantile is sidecar_buckets.bucket_quantile
    rng = np.random.default_rng(7)
    bounds = [0.1, 0.5, 0.5, 1.0, 5.0, INF]
    C = rng.choice([0.0, 1.0, 3.0, 7.0, math.nan, 2.0], (len(bounds), 200))
    q = rng.choice([0.0, 0.25, 0.5, 0.9, 0.99, 1.0], 200)
    vec = promql_quantile._columns(q, bounds, C)
    one = [sidecar_buckets.histogram_quantile(float(q[j]), list(zip(bounds, C[:, j].tolist()))) for j in range(200)]
    assert np.array_equal(vec, np.array(one), equal_nan=True)
