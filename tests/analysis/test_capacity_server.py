"""``capacity --engine server`` and ``gate`` against a server: the server evaluates what reads raw
series, the rest runs here; on a real Prometheus (the history backfilled with promtool into TSDB
blocks) the report is the local path's, which reads every raw sample into the process.

The history: two replicas of one model, one switching between chat and a prefill-heavy flood
with requests waiting (so the prefill weight is fitted from saturated steps and there are two
load mixes), the other with speculative decoding and the sidecar's GPU series (utilization,
energy): every figure of the report, from the rules over raw series to the headroom rules at
the end. The server path is also run with a query chunk that does not divide the range (each
rule's answer pieced together from seven-minute queries), chosen by ``--engine auto`` for a
range over six hours, and against a Prometheus whose ``--query.max-samples`` refuses the whole
range (the queries halved until they fit; one line with the server's reason when nothing fits).
The one reader of the API's answers (``promapi``) is checked on the same server: a wrong result
type, a parse error, a page that is no API answer, no server at all.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest

from exporter.analysis.promapi import ServerError, SourceError
from exporter.analysis.remote import RuleServer
from exporter.analysis.rulefile import groups_from_data
from loadgen import Phase, history
from promtsdb import prometheus_over
from shared import main_for
from test_capacity import MIXED, START_S, TEST_SLO

SPEC = [Phase(1200, 1, 0.3, spec_accepted_ratio=0.7, gpu_utilization=0.3, power_watts=300),
        Phase(1200, 2.5, 0.9, spec_accepted_ratio=0.6, gpu_utilization=0.6, power_watts=450)]


_cli = main_for("capacity")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("capacity-server")
    f = tmp / "two.om"
    f.write_text(history({"p0": MIXED, "p1": SPEC}, START_S))
    s = tmp / "slo.yaml"
    s.write_text(TEST_SLO)
    with prometheus_over(f, tmp) as url:
        yield url, f, s


@pytest.mark.prometheus
def test_the_server_path_gives_the_local_report_on_prometheus(capsys, served):
    url, f, s = served
    rng = ["--slo", str(s), "--start", str(START_S + 300), "--end", str(START_S + 2400), "--target-qps", "3",
           "--json", "-"]
    rc, filed, err = _cli(capsys, "--file", str(f), *rng)
    assert rc == 0, err
    rc, local, err = _cli(capsys, "--prometheus-url", url, "--engine", "local", *rng)
    assert rc == 0, err
    assert "evaluated by the server" not in err
    rc, server, err = _cli(capsys, "--prometheus-url", url, "--engine", "server", *rng)
    assert rc == 0, err
    assert "evaluated by the server in" in err
    rc, chunked, err = _cli(capsys, "--prometheus-url", url, "--engine", "server", "--server-chunk", "7m", *rng)
    assert rc == 0, err
    want = json.loads(filed)
    assert json.loads(local) == want
    assert json.loads(server) == want
    assert json.loads(chunked) == want
    # and the report is not an empty one: both replicas, the fitted weight, two mixes, the GPU figures
    m = want["models"][0]
    assert m["replicas_now"] == 2 and m["weighted"]["prefill_weight"]["source"] == "fitted"
    assert len(m["weighted"]["mixes"]) == 3 and m["spec_decode_acceptance"] is not None
    assert m["gpu_utilization"] is not None and m["tokens_per_joule"] is not None
    assert m["sustainable"]["tokens_per_second"] > 0
    assert None not in m["recording_rules_at_end"].values()  # the headroom rules at the end, too


@pytest.mark.prometheus
def test_auto_picks_the_server_past_six_hours_and_agrees(capsys, served):
    url, f, s = served
    # seven hours of range, six of them before the data: the rules' records start empty on both paths
    rng = ["--slo", str(s), "--start", str(START_S - 6 * 3600 + 300), "--end", str(START_S + 2400), "--json", "-"]
    rc, auto, err = _cli(capsys, "--prometheus-url", url, *rng)
    assert rc == 0, err
    assert "evaluated by the server in" in err
    rc, local, err = _cli(capsys, "--prometheus-url", url, "--engine", "local", *rng)
    assert rc == 0, err
    assert json.loads(auto) == json.loads(local)
    assert json.loads(auto)["models"][0]["sustainable"]["tokens_per_second"] > 0


def _limited(served, tmp_path, max_samples: int):
    """Another Prometheus over a copy of the same blocks, with ``--query.max-samples`` set."""
    from promtsdb import prometheus_serving

    url, f, s = served
    data = tmp_path / "tsdb"
    shutil.copytree(f.parent / "tsdb", data, ignore=shutil.ignore_patterns("lock", "wal", "chunks_head"))
    return prometheus_serving(data, tmp_path, flags=[f"--query.max-samples={max_samples}"])


def _queries(err: str) -> int:
    return int(re.search(r"evaluated by the server in (\d+) queries", err).group(1))


@pytest.mark.prometheus
def test_queries_too_big_for_the_server_are_halved_until_they_fit(capsys, served, tmp_path):
    url, f, s = served
    rng = ["--slo", str(s), "--start", str(START_S + 300), "--end", str(START_S + 2400), "--json", "-"]
    rc, filed, err = _cli(capsys, "--file", str(f), *rng)
    assert rc == 0, err
    rc, _, err = _cli(capsys, "--prometheus-url", url, "--engine", "server", *rng)
    assert rc == 0, err
    whole = _queries(err)
    # 200 samples a query: a rate over every bucket of both replicas for the whole range is refused
    # (and the local path's raw reads would be too); its halves, or their halves, pass
    with _limited(served, tmp_path, 200) as small:
        rc, out, err = _cli(capsys, "--prometheus-url", small, "--engine", "server", *rng)
    assert rc == 0, err
    assert _queries(err) > whole
    assert json.loads(out) == json.loads(filed)


@pytest.mark.prometheus
def test_a_server_refusal_is_one_line_with_its_reason(capsys, served, tmp_path):
    url, f, s = served
    # so small that even one evaluation is too big: the server's reason, in one line
    with _limited(served, tmp_path, 10) as small:
        rc, _, err = _cli(capsys, "--prometheus-url", small, "--engine", "server", "--slo", str(s), "--start",
                          str(START_S + 300), "--end", str(START_S + 2400))
    assert rc == 2 and err.count("\n") == 1, err
    assert "query processing would load too many samples into memory" in err and small in err


def test_the_rule_server_sends_only_rules_over_raw_series():
    groups = groups_from_data([{"name": "g", "rules": [
        {"record": "a:x:rate5m", "expr": "sum(rate(x[5m]))"},
        {"record": "a:y:sum", "expr": "sum(y)"},
        {"record": "a:xy:ratio", "expr": "a:x:rate5m / a:y:sum"},
        {"record": "a:z:max", "expr": 'max({__name__=~"a:x:.*"})'},
    ]}], "<test>")
    rs = RuleServer(groups, "http://127.0.0.1:9", 60_000, 7 * 60_000)
    sent = [r.name for r in groups[0].rules if rs.reads_raw_only(r)]
    assert sent == ["a:x:rate5m", "a:y:sum"]
    assert rs.block_steps == 7
    assert issubclass(ServerError, SourceError)  # one hierarchy: every caller of a source catches both


@pytest.mark.prometheus
def test_the_one_api_reader_on_a_real_prometheus(served):
    import requests

    from exporter.analysis.promapi import query, query_range_split

    url, _, _ = served
    sess = requests.Session()
    at = (START_S + 600) * 1000
    assert query(sess, url, "1 + 1", at, 30)[1] == "2"  # a scalar answer, as the server gave it
    with pytest.raises(ServerError, match=r"returned 'scalar', expected a vector"):
        query(sess, url, "1 + 1", at, 30, expect="vector")
    with pytest.raises(ServerError, match=r"failed: bad_data .*parse error") as bad:
        query(sess, url, "sum(", at, 30)
    assert not bad.value.too_big and url in str(bad.value)
    with pytest.raises(ServerError, match=r"HTTP 404, not a Prometheus API answer"):
        query(sess, url + "/nowhere", "up", at, 30)
    with pytest.raises(SourceError, match=r"ConnectionError"):  # every caller of a source catches it
        query(sess, "http://127.0.0.1:9", "up", at, 5)
    # a refusal that is not about size is not retried in halves
    told = []
    with pytest.raises(ServerError, match="bad_data"):
        query_range_split(sess, url, "sum(", [at, at + 60_000, at + 120_000], 60_000, 30, told.append)
    assert told == []
