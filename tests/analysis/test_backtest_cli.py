"""``vllm-sidecar-exporter backtest`` end to end: a recorded file in, the table and JSON out, the
CI gate's exit codes, the PNG, one-line errors naming file and line; and a real Prometheus
(a TSDB backfilled by ``promtool tsdb create-blocks-from openmetrics``) read through
``--prometheus-url`` giving the same report as the file it was built from.
"""

from __future__ import annotations

import json

import pytest
import yaml

from conftest import ROOT
from exporter.analysis.sources import expand_values, parse_series_labels
from incident import BAD, EXPECTED_INCIDENT_BY_GROUPS, ONSET, TOTAL, inputs
from promtsdb import prometheus_over
from shared import main_for

BASE_S = 1_700_000_400  # where the OpenMetrics copy of the incident starts (unix seconds, a whole minute)


@pytest.fixture(scope="module")
def incident_inputs():
    return inputs()  # the night, as the pack's promtool test replays it


@pytest.fixture(scope="module")
def incident_file(tmp_path_factory, incident_inputs):
    f = tmp_path_factory.mktemp("bt") / "incident.yml"
    f.write_text(yaml.safe_dump({"interval": "1m", "input_series": incident_inputs}, width=10_000))
    return f


_run = main_for("backtest")


def test_the_table_and_json_of_the_incident(capsys, incident_file, tmp_path):
    rc, out, err = _run(capsys, "--file", str(incident_file), "--step", "1m", "--onset", f"+{ONSET}m",
                        "--json", str(tmp_path / "r.json"))
    assert rc == 0, err
    # the table: one row per alert series, the first firing after the onset as the scenario expects
    for name, minutes in EXPECTED_INCIDENT_BY_GROUPS.items():
        row = next(line for line in out.splitlines() if line.startswith(name + " "))
        assert "pod=vllm-2" in row and f"+{minutes}m" in row, row
    assert "never fired" in out and "VLLMTargetDown" in out.split("never fired")[1]
    rep = json.loads((tmp_path / "r.json").read_text())
    assert rep["evaluations"] == TOTAL + 1 and rep["step_seconds"] == 60
    first = {}
    for a in rep["alerts"]:
        assert a["labels"]["pod"] == BAD
        if a["first_firing_after_onset_seconds"] is not None:
            first[a["alertname"]] = min(first.get(a["alertname"], 1e9), a["first_firing_after_onset_seconds"] / 60)
        assert a["episodes"] == 1
        # firing until the end of the replay, after its for-duration pending
        assert a["episode_spans"][0]["end_ms"] == TOTAL * 60_000
        assert a["firing_seconds"] == (TOTAL * 60 - a["episode_spans"][0]["start_ms"] / 1000) + 60
    assert first == EXPECTED_INCIDENT_BY_GROUPS
    # --json - prints only JSON on stdout
    rc, out, _ = _run(capsys, "--file", str(incident_file), "--step", "1m", "--json", "-")
    assert rc == 0 and json.loads(out)["onset"] is None


def test_the_gate_exit_codes(capsys, incident_file):
    base = ["--file", str(incident_file), "--step", "1m"]
    assert _run(capsys, *base, "--max-episodes-per-day", "20", "--quiet-alerts", "VLLMTargetDown,GPUXidErrors")[0] == 0
    rc, out, err = _run(capsys, *base, "--max-episodes-per-day", "10")
    # 211 one-minute evaluations: one episode is 6.82 per day; VLLMReplicaOutlier fired on two label sets
    assert rc == 1
    gate_lines = [line for line in err.splitlines() if ": gate: " in line]
    assert len(gate_lines) == 1 and "VLLMReplicaOutlier" in gate_lines[0] and "13.65" in gate_lines[0]
    rc, _, err = _run(capsys, *base, "--quiet-alerts", "VLLMTTFTHigh, VLLMTargetDown,VLLMKVCacheExhausted")
    gate_lines = [line for line in err.splitlines() if ": gate: " in line]
    assert rc == 1 and len(gate_lines) == 2
    assert {"VLLMTTFTHigh", "VLLMKVCacheExhausted"} == {line.split(": gate: ")[1].split()[0] for line in gate_lines}
    rc, _, err = _run(capsys, *base, "--quiet-alerts", "NoSuchAlert")
    assert rc == 2 and err.count("\n") == 1 and "NoSuchAlert" in err


def test_the_png_timeline(capsys, incident_file, tmp_path):
    png = tmp_path / "t.png"
    rc, _, err = _run(capsys, "--file", str(incident_file), "--step", "1m", "--onset", "10800", "--png", str(png),
                      "--plot", "namespace_pod_model:vllm_kv_cache_usage:max", "--plot", "sum(vllm:num_requests_waiting)")
    assert rc == 0, err
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    rc, _, err = _run(capsys, "--file", str(incident_file), "--png", str(png), "--plot", "rate(x[5m]")
    assert rc == 2 and "--plot" in err and err.count("\n") == 1


def test_a_prometheusrule_manifest_gives_the_same_report(capsys, incident_file):
    base = ["--file", str(incident_file), "--step", "1m", "--json", "-"]
    plain = json.loads(_run(capsys, *base, "--rules", str(ROOT / "rules" / "vllm.rules.yml"))[1])
    manifest = json.loads(_run(capsys, *base, "--rules", str(ROOT / "deploy/kubernetes/base/prometheusrule.yaml"))[1])
    rendered = json.loads(_run(capsys, *base)[1])
    assert plain == manifest == rendered
    assert len(plain["alerts"]) == 10


def test_bad_input_is_one_line_naming_file_and_line(capsys, tmp_path, incident_file):
    bad = tmp_path / "bad.yml"
    bad.write_text("interval: 1m\ninput_series:\n  - series: 'up{job=\"a\"}'\n    values: '1 2 3'\n"
                   "  - series: 'up{job=\"b\"}'\n    values: '1 2 x3'\n")
    rc, _, err = _run(capsys, "--file", str(bad))
    assert rc == 2 and err.count("\n") == 1 and f"{bad}:5:" in err and "'x3'" in err
    rules = tmp_path / "rules.yml"
    rules.write_text("groups:\n- name: g\n  rules:\n  - record: a:b\n    expr: sum(up)\n  - alert: X\n    expr: rate(up)\n")
    rc, _, err = _run(capsys, "--file", str(incident_file), "--rules", str(rules))
    assert rc == 2 and err.count("\n") == 1 and f"{rules}:6" in err and "alert 'X'" in err and "range vector" in err
    for argv, what in [(["--file", str(tmp_path / "missing.om")], "missing.om"),
                       (["--file", str(incident_file), "--prometheus-url", "http://x"], "exactly one source"),
                       (["--file", str(incident_file), "--start", "yesterday"], "--start"),
                       (["--file", str(incident_file), "--step", "0s"], "--step"),
                       (["--prometheus-url", "http://127.0.0.1:9", "--start", "0", "--end", "600"], "127.0.0.1:9")]:
        rc, _, err = _run(capsys, *argv)
        assert rc == 2 and err.count("\n") == 1 and what in err, (argv, err)
    om = tmp_path / "bad.om"
    om.write_text('# TYPE up gauge\nup{job="a"} 1 1700000000\nup{job="a"} 1\n# EOF\n')
    rc, _, err = _run(capsys, "--file", str(om))
    assert rc == 2 and f"{om}:3:" in err and "timestamp" in err


# -- OpenMetrics and a real Prometheus ---------------------------------------------------------

def openmetrics(inputs, base_s: int, interval_s: int = 60) -> str:
    lines = []
    for item in inputs:
        labels = parse_series_labels(item["series"])
        name = dict(labels)["__name__"]
        inner = ",".join(f'{k}="{v}"' for k, v in labels if k != "__name__")
        for k, v in enumerate(expand_values(item["values"])):
            if v is None or v == "stale":
                continue
            lines.append(f"{name}{{{inner}}} {repr(float(v))} {base_s + k * interval_s}")
    return "\n".join(lines) + "\n# EOF\n"


def test_an_openmetrics_file_gives_the_same_alerts_as_the_promtool_file(capsys, tmp_path, incident_file,
                                                                      incident_inputs):
    om = tmp_path / "incident.om.gz"
    import gzip

    om.write_bytes(gzip.compress(openmetrics(incident_inputs, BASE_S).encode()))
    a = json.loads(_run(capsys, "--file", str(incident_file), "--step", "1m", "--json", "-")[1])
    b = json.loads(_run(capsys, "--file", str(om), "--step", "1m", "--json", "-")[1])
    shift = lambda rep: [(x["alertname"], x["labels"], [(s["start_ms"] - rep["start_ms"], s["seconds"])  # noqa: E731
                                                         for s in x["episode_spans"]]) for x in rep["alerts"]]
    assert b["start_ms"] == BASE_S * 1000 and b["evaluations"] == a["evaluations"]
    assert shift(a) == shift(b) and len(shift(a)) == 10


@pytest.mark.prometheus
def test_a_real_prometheus_gives_the_same_report_as_the_file(capsys, tmp_path, incident_inputs):
    om = tmp_path / "incident.om"
    om.write_text(openmetrics(incident_inputs, BASE_S))
    with prometheus_over(om, tmp_path) as url:
        window = ["--start", str(BASE_S), "--end", str(BASE_S + TOTAL * 60), "--step", "1m", "--json", "-",
                  "--onset", f"+{ONSET}m"]
        rc, served, err = _run(capsys, "--prometheus-url", url, *window)
        assert rc == 0, err
        rc, filed, err = _run(capsys, "--file", str(om), *window)
        assert rc == 0, err
        assert json.loads(served) == json.loads(filed)
        first = {}
        for a in json.loads(served)["alerts"]:
            m = a["first_firing_after_onset_seconds"] / 60
            first[a["alertname"]] = min(first.get(a["alertname"], m), m)
        assert first == EXPECTED_INCIDENT_BY_GROUPS


def test_a_record_shorter_than_one_step_is_refused_in_one_sentence_or_evaluated_with_a_shorter_step(capsys, tmp_path):
    """12 s of 0.5 s polls, starting off the 30 s grid the pack's groups are evaluated on: no step
    of the grid falls in it. Refused with how long a record must be; evaluated with --step 1s."""
    from exporter.harness.flightsim import simulated_record

    text, _ = simulated_record("normal", seconds=12, poll=0.5, onset=1000, t0=1_800_000_007.0)
    f = tmp_path / "short.om"
    f.write_text(text)
    rc, out, err = _run(capsys, "--file", str(f))
    assert rc == 2
    assert err.strip() == (f"vllm-sidecar-exporter backtest: error: {f}: the record spans 11.5s, and the rules are "
                           "evaluated every 30s on the step's grid: a record must span at least 30s (or give a "
                           "--step no longer than the record)")
    rc, out, err = _run(capsys, "--file", str(f), "--step", "1s", "--json", str(tmp_path / "r.json"))
    assert rc == 0, err
    assert json.loads((tmp_path / "r.json").read_text())["evaluations"] == 12  # each whole second, first sample to last

