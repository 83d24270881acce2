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


def test_one_busy_poll_in_the_calm_is_not_long_prompts_arriving():
    """Seen on the real CPU vLLM: one poll of the calm at twice its median prompt-token rate, 24 s
    in. Long prompts arriving is the rate over twice the calm's median after the reference quarter,
    for three polls in a row: the flood at poll 60, not the calm's blip at poll 24."""
    from exporter.analysis.postmortem import first_events
    from exporter.analysis.series import Store

    rate = [1000.0] * 120
    rate[24] = 2500.0  # the calm's blip (inside the reference quarter)
    rate[40] = 2600.0  # and one after it, alone
    for i in range(60, 120):
        rate[i] = 4000.0  # the flood
    store = Store()
    labels = (("__name__", "vllm_sidecar_prompt_tokens_per_second"), ("namespace", "e2e"), ("pod", "vllm-0"))
    store.add(labels, [1_000_000 + 1000 * i for i in range(120)], rate)
    got = [e for e in first_events(store, {}) if e.what.startswith("long prompts arriving")]
    assert len(got) == 1 and got[0].t_ms == 1_000_000 + 60_000 and got[0].value == 4000.0, got


def _series_of(store, name):
    from exporter.analysis.promql.labels import NAME
    out = {}
    for s in store:
        d = dict(s.labels)
        if d.pop(NAME) == name:
            t, v = s.without_stale()
            out[tuple(sorted(d.items()))] = dict(zip(t.tolist(), v.tolist()))
    return out


def test_a_record_of_an_older_sidecar_gets_the_summary_series_its_alerts_read():
    """A sidecar older than the pack served the inputs missing one series an input and the throttle
    one series a reason; the alerts read the count and the thermal flag. Merged, its record has them,
    from the same polls; a newer record's own summaries are left as they are."""
    from exporter.analysis.postmortem import merge_records

    pod = 'namespace="llm",pod="vllm-0"'
    gpu = pod + ',gpu="0",uuid="GPU-1"'
    lines = []
    for i, (kv, gen, thermal, cap) in enumerate([(0, 0, 0, 0), (1, 0, 0, 1), (1, 1, 1, 1), (0, 0, 1, 0)]):
        ts = 1000 + 2 * i
        lines += [f'vllm_sidecar_input_missing{{{pod},metric="vllm:kv_cache_usage_perc"}} {kv} {ts}',
                  f'vllm_sidecar_input_missing{{{pod},metric="vllm:generation_tokens_total"}} {gen} {ts}',
                  f'vllm_sidecar_gpu_clock_throttle_active{{{gpu},reason="hw_thermal_slowdown"}} {thermal} {ts}',
                  f'vllm_sidecar_gpu_clock_throttle_active{{{gpu},reason="sw_power_cap"}} {cap} {ts}']
    old = ("\n".join(lines) + "\n# EOF\n").encode()
    store = merge_records([("old", old)])
    pl = (("namespace", "llm"), ("pod", "vllm-0"))
    assert _series_of(store, "vllm_sidecar_inputs_missing") == {pl: {1000000: 0, 1002000: 1, 1004000: 2, 1006000: 0}}
    # the power cap is no thermal reason: the poll with it alone is 0
    assert _series_of(store, "vllm_sidecar_gpu_thermal_throttle_active") == {
        (("gpu", "0"), *pl, ("uuid", "GPU-1")): {1000000: 0, 1002000: 0, 1004000: 1, 1006000: 1}}
    new = (f'vllm_sidecar_inputs_missing{{{pod}}} 5 1000\n'
           f'vllm_sidecar_input_missing{{{pod},metric="vllm:kv_cache_usage_perc"}} 1 1000\n# EOF\n').encode()
    assert _series_of(merge_records([("new", new)]), "vllm_sidecar_inputs_missing") == {pl: {1000000: 5}}
