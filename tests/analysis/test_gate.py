"""The regression gate: result files read as vLLM writes them, every verdict of the rule on
hand-worked cases, the noise rule's false alarms and power as documented, the same figures from
Prometheus ranges, the sidecar's signals and the likely cause, and the command line (exit codes,
table, Markdown, JSON, one-line errors; a backfilled Prometheus read through ranges).

``tests/fixtures/gate`` holds real ``vllm bench serve --save-result`` files from the CPU vLLM on
this 2-core machine (see its PROVENANCE.md): four runs of one configuration (the noise) and two of
a configuration that costs latency.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import FIXTURES
from exporter.analysis import benchfile, gate
from exporter.analysis.promql.labels import make
from exporter.analysis.series import Store
from exporter.analysis.sources import load_openmetrics
from loadgen import Phase, history
from promtsdb import prometheus_over
from shared import main_for

GATE = FIXTURES / "gate"
SAME = [str(GATE / f"same-config-{i}.json") for i in range(1, 5)]
COSTLY = [str(GATE / f"max-num-seqs-1-{i}.json") for i in range(1, 3)]
START_S = 1_767_225_600


# -- result files -------------------------------------------------------------------------------------

def test_a_real_result_file():
    r = benchfile.load(SAME[0])
    d = json.loads((GATE / "same-config-1.json").read_text())
    assert r.figures["request_throughput"] == d["request_throughput"]
    assert r.figures["mean_ttft_ms"] == d["mean_ttft_ms"] and r.figures["p99_itl_ms"] == d["p99_itl_ms"]
    assert r.figures["failed_ratio"] == 0.0
    assert "p50_ttft_ms" not in r.figures and r.figures["median_ttft_ms"] == d["p50_ttft_ms"]  # once
    assert not any(k.startswith("std_") for k in r.figures)
    assert r.load == {"backend": "vllm", "endpoint_type": "vllm", "model_id": "tiny-llama", "num_prompts": 60,
                      "request_rate": 8.0, "burstiness": 1.0, "max_concurrency": None}
    # date is the local time the file was saved (here read as UTC): the run began `duration` before
    r0 = benchfile.load(SAME[0], utc_offset_s=0)
    assert r0.end_ms == 1_796_030_324_000  # 2026-11-30T09:18:44Z
    assert r0.start_ms == round((1_796_030_324 - d["duration"]) * 1000)
    assert benchfile.load(SAME[0], utc_offset_s=3600).end_ms == r0.end_ms - 3_600_000


def test_appended_results_take_the_last(tmp_path):
    a = json.loads((GATE / "same-config-1.json").read_text())
    b = dict(a, request_throughput=1.5)
    f = tmp_path / "appended.json"
    f.write_text(json.dumps(a) + "\n" + json.dumps(b))
    assert benchfile.load(str(f)).figures["request_throughput"] == 1.5


@pytest.mark.parametrize("text,needle", [
    ("{", "not JSON"),
    ("[{}, {}]", "a list of results"),
    ('{"model_id": "x"}', "not a `vllm bench serve --save-result` file"),
    ('{"completed": 0, "mean_ttft_ms": 1}', "no request completed"),
])
def test_bad_files(tmp_path, text, needle):
    f = tmp_path / "r.json"
    f.write_text(text)
    with pytest.raises(benchfile.BenchFileError, match=needle) as e:
        benchfile.load(str(f))
    assert str(e.value).startswith(str(f)) and "\n" not in str(e.value)


# -- the rule -----------------------------------------------------------------------------------------

ST = gate.Settings(0.10, 1.0)
TTFT, THR, ITL, FAILED = (gate.spec(k) for k in ("mean_ttft_ms", "request_throughput", "mean_itl_ms", "failed_ratio"))


def test_directions_and_labels():
    assert (TTFT.direction, TTFT.unit, TTFT.label, TTFT.latency) == (-1, "ms", "TTFT mean", True)
    assert (THR.direction, THR.unit) == (+1, "req/s") and FAILED.direction == -1
    assert gate.spec("p99.9_e2el_ms").label == "E2E latency p99.9" and gate.spec("std_ttft_ms") is None


@pytest.mark.parametrize("s,base,cand,verdict", [
    (TTFT, [100], [115], "regressed"),        # +15% > 10%, 15 ms >= 1 ms; one run a side: threshold only
    (TTFT, [100], [105], "ok"),
    (TTFT, [100], [80], "improved"),
    (THR, [10], [8.5], "regressed"),          # throughput down 15%
    (THR, [10], [11.5], "improved"),
    (ITL, [2.0], [2.5], "within noise"),      # +25% but 0.5 ms < the 1 ms minimum effect
    (FAILED, [0.0], [0.02], "regressed"),     # failures where there were none
    (FAILED, [0.0], [0.0], "ok"),
    (TTFT, [100, 102, 98], [130, 128, 132], "regressed"),  # clear of a tight spread
    # +20% in medians, but runs vary by ~30%: t = 0.166 / 0.276 = 0.60, p 0.29
    (TTFT, [100, 150, 70], [120, 160, 90], "within noise"),
    (THR, [10, 10.2, 9.8], [7, 7.1, 6.9], "regressed"),
])
def test_verdicts_by_hand(s, base, cand, verdict):
    assert gate.judge(s, base, cand, ST).verdict == verdict


def test_the_noise_numbers_by_hand():
    r = gate.judge(TTFT, [100, 150, 70], [120, 160, 90], ST)
    assert r.baseline_median == 100 and r.candidate_median == 120 and r.change == pytest.approx(0.2)
    # logs: b 4.6052 5.0106 4.2485 (mean 4.6214), c 4.7875 5.0752 4.4998 (mean 4.7875);
    # pooled sd sqrt((0.2915 + 0.1655) / 4) = 0.338; se 0.338 sqrt(2/3) = 0.276; t = 0.601 on 4 df
    assert r.noise.relative and r.noise.sd == pytest.approx(0.338, abs=1e-3)
    assert r.noise.p == pytest.approx(0.290, abs=5e-3)
    # not gated: shown, never fails
    assert gate.judge(TTFT, [100], [500], ST, gated=False).verdict == "not gated"


def test_false_alarms_and_power_of_the_rule():
    """The documented behaviour (docs/capacity-and-gate.md): at 20% run-to-run noise, identical
    configurations fail a figure about 5% of the time with 2 or more runs a side (and often with
    one run a side), and a real 50% regression is found more often the more runs there are."""
    rng = np.random.default_rng(7)

    def rates(n, trials=1500):
        fa = pw = 0
        for _ in range(trials):
            b = 100 * np.exp(rng.normal(0, 0.2, n))
            fa += gate.judge(TTFT, list(b), list(100 * np.exp(rng.normal(0, 0.2, n))), ST).verdict == "regressed"
            pw += gate.judge(TTFT, list(b), list(150 * np.exp(rng.normal(0, 0.2, n))), ST).verdict == "regressed"
        return fa / trials, pw / trials

    one, two, three, five = rates(1), rates(2), rates(3), rates(5)
    assert one[0] > 0.25
    for fa, _ in (two, three, five):
        assert fa < 0.08
    assert two[1] < three[1] < five[1] and five[1] > 0.8


def test_compare_the_real_runs():
    same = [benchfile.load(f) for f in SAME]
    costly = [benchfile.load(f) for f in COSTLY]
    # the costly configuration: slower by far, on every measure that matters
    c = gate.compare(same[:2], costly, ST)
    bad = {r.spec.key for r in c.regressed}
    assert {"request_throughput", "output_throughput", "mean_ttft_ms", "median_ttft_ms", "mean_e2el_ms"} <= bad
    assert not c.passed
    # the same configuration again, on what this machine measures reliably
    robust = gate.Settings(0.10, 1.0, ("*_throughput", "failed_ratio"))
    assert gate.compare([same[0], same[2]], [same[1], same[3]], robust).passed
    assert not gate.compare([same[0], same[2]], costly, robust).passed
    # rows: throughputs first, then TTFT, TPOT, ITL, E2E latency, mean then percentiles
    keys = [r.spec.key for r in c.rows]
    assert keys[:4] == ["request_throughput", "output_throughput", "total_token_throughput", "failed_ratio"]
    assert keys[4:7] == ["mean_ttft_ms", "median_ttft_ms", "p90_ttft_ms"]
    assert gate.unmatched_patterns(c.rows, ["mean_*", "nothing_*"]) == ["nothing_*"]


# -- Prometheus ranges and the sidecar's signals -----------------------------------------------------------

def test_figures_from_a_range_by_hand():
    # 20 minutes at 1 req/s (TTFT 0.3 s), 20 minutes at 2 req/s (TTFT 0.8 s, ITL 25 ms), 100 tokens each
    st = load_openmetrics(history({"p0": [Phase(1200, 1, 0.3), Phase(1200, 2, 0.8, itl=0.025)]}, START_S).encode()).store
    r = gate.range_run(st, 'namespace="llm"', (START_S + 1500) * 1000, (START_S + 2100) * 1000, "later")
    assert r.figures["request_throughput"] == pytest.approx(2.0)
    assert r.figures["output_throughput"] == pytest.approx(200)
    assert r.figures["total_token_throughput"] == pytest.approx(200 + 2 * 400)
    assert r.figures["failed_ratio"] == 0
    assert r.figures["mean_ttft_ms"] == pytest.approx(800)
    assert r.figures["median_ttft_ms"] == pytest.approx(750)   # (0.5, 1.0] bucket: 0.5 + 0.5 x 0.5
    assert r.figures["p99_ttft_ms"] == pytest.approx(995)
    assert r.figures["mean_itl_ms"] == pytest.approx(25)
    early = gate.range_run(st, "", (START_S + 300) * 1000, (START_S + 900) * 1000, "early")
    c = gate.compare([early], [r], ST)
    verdicts = {x.spec.key: x.verdict for x in c.rows}
    assert verdicts["mean_ttft_ms"] == "regressed" and verdicts["request_throughput"] == "improved"
    assert "mean_tpot_ms" not in verdicts  # this history has no per-request TPOT histogram
    with pytest.raises(ValueError, match="ends before"):
        gate.range_run(st, "", 10, 10, "x")


def _series(store, name, values, t0_ms=0, step_ms=1000, **labels):
    store.add(make({"__name__": name, "namespace": "llm", "pod": "p0", **labels}),
              [t0_ms + i * step_ms for i in range(len(values))], values)


def test_signals_of_a_range_by_hand():
    st = Store()
    _series(st, "vllm_sidecar_kv_cache_pressure_level", [0, 0, 1, 2, 3, 3, 2, 0, 0, 0])
    _series(st, "vllm_sidecar_kv_cache_usage_ratio", [0.5, 0.9, 0.97, 0.99, 1.0, 1.0, 0.98, 0.9, 0.8, 0.7])
    _series(st, "vllm_sidecar_requests_waiting", [0, 0, 2, 4, 6, 8, 4, 0, 0, 0])
    _series(st, "vllm_sidecar_requests_running", [4, 8, 16, 16, 16, 16, 16, 8, 4, 2])
    _series(st, "vllm_sidecar_requests_waiting_for_capacity", [0, 0, 0, 3, 5, 5, 1, 0, 0, 0])
    _series(st, "vllm_sidecar_gpu_busy_low_throughput", [0] * 10)
    _series(st, "vllm_sidecar_target_up", [1] * 9 + [0], target="vllm")
    _series(st, "vllm:num_preemptions_total", [0, 0, 0, 0, 2, 5, 7, 7, 7, 7])
    _series(st, "vllm_sidecar_requests_waiting", [50] * 10, namespace="other")  # another deployment
    s = gate.range_signals(st, 'namespace="llm"', 0, 9000)  # (0, 9 s]: the first sample is out
    assert s.kv_pressure_max == 3 and s.kv_saturated_share == pytest.approx(4 / 9)
    assert s.kv_usage_max == 1.0 and s.waiting_for_capacity_max == 5
    assert s.waiting_mean == pytest.approx(24 / 9) and s.running_max == 16
    assert s.running_mean == pytest.approx(102 / 9)  # 8 + 5 x 16 + 8 + 4 + 2
    assert s.busy_low_share == 0 and s.stalled_share is None and s.down_share == pytest.approx(1 / 9)
    assert s.preemptions == pytest.approx(7, rel=0.15)  # increase() extrapolates to the range's ends
    m = gate.median_signals([gate.Signals(waiting_mean=1), gate.Signals(waiting_mean=3), gate.Signals()])
    assert m.waiting_mean == 2 and m.preemptions is None


@pytest.mark.parametrize("cand,needle", [
    (gate.Signals(down_share=0.2), "could not be read 20% of the run"),
    (gate.Signals(stalled_share=0.1), "the engine stalled"),
    (gate.Signals(preemptions=12, waiting_for_capacity_max=4), "KV-cache pressure: 12 preemptions"),
    (gate.Signals(busy_low_share=0.5), "GPUs busy but tokens low 50%"),
    (gate.Signals(waiting_mean=6, running_max=1), "smaller batch: at most 1 running (baseline 16)"),
    # what the real max-num-seqs 1 run showed: vLLM's reason="capacity" counts a full batch too
    (gate.Signals(waiting_for_capacity_max=14, kv_usage_max=0.03, waiting_mean=4.7, running_max=1,
                  kv_saturated_share=0.5), "smaller batch: at most 1 running (baseline 16) while 4.7 waited on "
                                           "average (baseline 0.2), the KV cache at most 3% full"),
    (gate.Signals(waiting_for_capacity_max=14, kv_usage_max=0.97), "requests waiting with the cache 97% full"),
    (gate.Signals(down_share=0.05), "no sidecar signal explains it"),  # a read timed out now and then
    (gate.Signals(waiting_mean=6, running_max=16), "each step is slower"),
    (gate.Signals(waiting_mean=0.1, running_max=16), "no sidecar signal explains it"),
    (gate.Signals(), "no sidecar signals for the candidate's run"),
])
def test_likely_causes(cand, needle):
    base = gate.Signals(preemptions=0, waiting_for_capacity_max=0, waiting_mean=0.2, running_max=16, down_share=0,
                        stalled_share=0, busy_low_share=0, kv_saturated_share=0)
    assert needle in gate.likely_cause(base, cand)


# -- the command line -----------------------------------------------------------------------------------

_cli = main_for("gate")


def test_cli_fails_the_costly_candidate(capsys, tmp_path):
    rc, out, err = _cli(capsys, "--baseline", SAME[0], SAME[2], "--candidate", *COSTLY,
                        "--markdown", str(tmp_path / "g.md"), "--json", str(tmp_path / "g.json"))
    assert rc == 1
    assert out.startswith("gate: FAIL: ") and "baseline 2 runs, candidate 2 runs" in out.splitlines()[0]
    row = next(ln for ln in out.splitlines() if ln.startswith("request throughput"))
    assert "(median of 2)" in row and row.endswith("regressed")
    assert "request throughput regressed -" in err and all(ln.startswith("vllm-sidecar-exporter gate: ")
                                                          for ln in err.splitlines())
    md = (tmp_path / "g.md").read_text()
    assert md.startswith("### vLLM regression gate: **FAIL**") and "| request throughput |" in md
    doc = json.loads((tmp_path / "g.json").read_text())
    assert doc["verdict"] == "fail" and doc["threshold"] == 0.1 and doc["mode"] == "files"
    assert [r["source"] for r in doc["candidate"]] == COSTLY
    assert next(r for r in doc["figures"] if r["key"] == "mean_ttft_ms")["better"] == "lower"


def test_cli_passes_the_same_configuration(capsys):
    rc, out, err = _cli(capsys, "--baseline", SAME[0], SAME[2], "--candidate", SAME[1], SAME[3],
                        "--figures", "*_throughput,failed_ratio")
    assert rc == 0 and out.startswith("gate: PASS") and err == ""
    assert "not gated" in out


def test_cli_threshold_from_the_slo_file_and_flags(capsys, tmp_path):
    slo = tmp_path / "slo.yaml"
    slo.write_text("gate: {max_regression: 0.9}\n")
    # request throughput fell 40-45%: under a 90% threshold that is no regression
    rc, out, _ = _cli(capsys, "--slo", str(slo), "--baseline", SAME[0], "--candidate", COSTLY[0],
                      "--figures", "request_throughput")
    assert rc == 0, out
    rc, out, _ = _cli(capsys, "--slo", str(slo), "--threshold", "0.2", "--baseline", SAME[0], "--candidate",
                      COSTLY[0], "--figures", "request_throughput")
    assert rc == 1 and "one run a side" in out


@pytest.mark.parametrize("args,needle", [
    ([], "nothing to compare"),
    (["--baseline", "B"], "give both --baseline and --candidate"),
    (["--baseline-range", "1/2", "--candidate-range", "3/4"], "need --prometheus-url"),
    (["--baseline", "B", "--candidate", "/no/such.json"], "/no/such.json: No such file or directory"),
    (["--baseline", "B", "--candidate", "B", "--figures", "nothing_*"], "--figures: no figure matches nothing_*"),
    (["--baseline", "B", "--candidate", "B", "--figures", "mean_*,nothing_*"], "no figure matches 'nothing_*'"),
    (["--baseline", "B", "--candidate", "B", "--threshold", "0"], "--threshold must be positive"),
    (["--prometheus-url", "http://x", "--baseline-range", "5/4", "--candidate-range", "3/4"], "ends before it starts"),
    (["--prometheus-url", "http://x", "--baseline-range", "5", "--candidate-range", "3/4"], "is not START/END"),
    (["--prometheus-url", "http://x", "--selector", "pod=", "--baseline-range", "1/2", "--candidate-range", "3/4"],
     "--selector"),
])
def test_cli_errors_are_one_line(capsys, args, needle):
    rc, out, err = _cli(capsys, *[SAME[0] if a == "B" else a for a in args])
    assert rc == 2 and needle in err and err.count("\n") == 1, err


def test_cli_refuses_runs_of_different_loads(capsys, tmp_path):
    d = json.loads((GATE / "same-config-1.json").read_text())
    f = tmp_path / "faster.json"
    f.write_text(json.dumps(dict(d, request_rate=16.0)))
    rc, _, err = _cli(capsys, "--baseline", SAME[0], "--candidate", str(f))
    assert rc == 2 and "request_rate 16.0 against 8.0" in err
    rc, out, _ = _cli(capsys, "--baseline", SAME[0], "--candidate", str(f), "--allow-different-load")
    assert rc == 0 and "ran a different load" in out


@pytest.mark.prometheus
def test_cli_ranges_of_a_real_prometheus(capsys, tmp_path):
    om = tmp_path / "h.om"
    om.write_text(history({"p0": [Phase(1200, 1, 0.3), Phase(1200, 2, 0.8, itl=0.025)]}, START_S))
    with prometheus_over(om, tmp_path) as url:
        rc, out, err = _cli(capsys, "--prometheus-url", url, "--selector", 'namespace="llm"', "--json", "-",
                            "--baseline-range", f"{START_S + 300}/{START_S + 900}",
                            "--candidate-range", f"{START_S + 1500}/{START_S + 2100}")
        assert rc == 1, err
        doc = json.loads(out)
        rows = {r["key"]: r for r in doc["figures"]}
        assert doc["mode"] == "prometheus"
        assert rows["mean_ttft_ms"]["verdict"] == "regressed"
        assert rows["mean_ttft_ms"]["baseline_median"] == pytest.approx(300)
        assert rows["mean_ttft_ms"]["candidate_median"] == pytest.approx(800)
        assert rows["request_throughput"]["verdict"] == "improved"
        # no sidecar series in this history: said so instead of a cause
        assert "no sidecar signals" in doc["likely_cause"]
        rc, _, err = _cli(capsys, "--prometheus-url", url, "--selector", 'namespace="nobody"',
                          "--baseline-range", f"{START_S + 300}/{START_S + 900}",
                          "--candidate-range", f"{START_S + 1500}/{START_S + 2100}")
        assert rc == 2 and "no vLLM requests in" in err
