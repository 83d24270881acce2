"""``postmortem`` on a flight record the real sidecar made of a simulated long-prompt flood (fake
clock): the report orders the first events as they happened and names the alerts at both
resolutions; the merged record it writes loads in backtest."""

import re
import subprocess

import pytest

from exporter.harness.flightsim import simulated_record


@pytest.fixture(scope="module")
def record(tmp_path_factory):
    d = tmp_path_factory.mktemp("pm")
    text, rec = simulated_record(seconds=300, onset=60)
    f = d / "flight.om"
    f.write_text(text)
    return f, rec


def test_postmortem_orders_the_flood(record, tmp_path):
    f, rec = record
    out = tmp_path / "report"
    r = subprocess.run(["vllm-sidecar-exporter", "postmortem", "--file", str(f), "--out", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    md = (out / "report.md").read_text()
    assert (out / "timeline.png").stat().st_size > 10_000
    assert (out / "record.om.gz").exists()
    rows = re.findall(r"^\| \d\d:\d\d:\d\d \(\+(\d+) s\) \| demo/vllm-demo-0 \| ([^|]+) \|", md, re.M)
    at = {what.strip().split(" (")[0]: int(sec) for sec, what in rows}
    # the flood starts at 60 s: the long prompts' token rate shows within a few polls (a rate lags
    # its window), the first request held back by the cache at once (the batch runs far below its
    # ceiling while long prompts wait), then preemptions, then the peak
    assert 55 <= at["long prompts arriving"] <= 75
    assert 55 <= at["first request waiting for KV capacity"] <= at["first preemption"] <= at["peak KV-cache usage"]
    assert "first SLO miss" in at
    # the alert at poll resolution, and what a 15 s scrape would have shown
    assert re.search(r"^\| VLLMKVCacheExhausted \|.*\| critical \| \d\d:\d\d:\d\d", md, re.M)
    assert "docs/runbooks/VLLMKVCacheExhausted.md" in md and "## What to do" in md


def test_postmortem_needs_a_source(tmp_path):
    r = subprocess.run(["vllm-sidecar-exporter", "postmortem", "--out", str(tmp_path)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "--sidecar" in r.stderr and len(r.stderr.strip().splitlines()) == 1
