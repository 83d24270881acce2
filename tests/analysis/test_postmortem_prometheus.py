"""``postmortem --prometheus-url``: the alerts at Prometheus' resolution are what Prometheus had.

A real Prometheus scrapes a vLLM stand-in serving real vLLM pages and the real sidecar (its flight
recorder on) and evaluates the pack (windows scaled to the test's seconds); the cache fills, the KV
alert fires in Prometheus. ``postmortem --sidecar ... --prometheus-url ...`` must show, in its
Prometheus column, the first firing sample of Prometheus' own ``ALERTS``. Then a Prometheus that
does not evaluate the pack (the record backfilled into it, no rules): the report evaluates the
pack over what that one stored, and says so.
"""

import datetime as dt
import gzip
import re
import subprocess

import pytest

from exporter.harness.localstack import SidecarThread, Stack, wait_until
from exporter.harness.pageserver import PageServer
from exporter.pack import rules as rules_mod
from exporter.slo import load_slo
from promtsdb import prometheus_over
from shared import PressureScript

pytestmark = pytest.mark.prometheus

POD = {"namespace": "llm", "pod": "vllm-0"}
ALERT = "VLLMKVCacheExhausted"


# the pack's windows of hours and days scaled to the test's minute (the record holds about one):
# the server evaluation inlines recorded series as subqueries at the evaluation step, and a day's
# baseline read every 5 s is 17,280 evaluations of its expression per step (53 s of Prometheus'
# CPU for this record with the default windows, 4 s with these)
SCALED = """windows: {held_back: 10s, target_seen: 2m, batch_peak: 2m, baseline: 2m, baseline_offset: 30s,
          baseline_edge: 30s, history_from: 10m, history_step: 1m}
burn_rates:
  page:
    - {long: 1m, short: 20s, factor: 14.4}
    - {long: 2m, short: 30s, factor: 6}
  ticket:
    - {long: 3m, short: 1m, factor: 1}
capacity: {sustain: 30s, history: 5m, peak_window: 2m}
gpu_busy_low: {baseline_horizon: 2m}
"""


def _hms(ms):
    return dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).strftime("%H:%M:%S")


def _row(md, name):
    rows = [ln for ln in md.splitlines() if ln.startswith(f"| {name} |")]
    assert rows, f"no {name} row in the report:\n{md}"
    return [c.strip() for c in rows[0].strip("|").split("|")]


def _postmortem(args, out):
    r = subprocess.run(["vllm-sidecar-exporter", "postmortem", *args, "--out", str(out)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return (out / "report.md").read_text()


def test_the_prometheus_column_is_what_prometheus_had(tmp_path):
    slo = tmp_path / "slo.yaml"
    slo.write_text(f"for: {{{ALERT}: 4s, VLLMTargetDown: 3s}}\nevaluation_interval: 1s\n{SCALED}")
    rules_file = tmp_path / "vllm.rules.yml"
    rules_file.write_text(rules_mod.render_plain(load_slo(str(slo))))
    script = PressureScript()
    vllm = PageServer(script).start()
    sidecar = SidecarThread({"vllm_url": vllm.url, "poll_interval": 0.5, "window": 5,
                             "flight_labels": "namespace=llm,pod=vllm-0"})
    try:
        with Stack(tmp_path) as st:
            st.start_prometheus(
                [{"job": "vllm", "address": f"127.0.0.1:{vllm.port}", "labels": POD},
                 {"job": "vllm-sidecar", "address": sidecar.address, "labels": POD}],
                [rules_file])
            wait_until(st.targets_up, 60, what="both targets up", diag=st.diag)
            wait_until(lambda: st.query('vllm_sidecar_generation_tokens_per_second{pod="vllm-0"}'), 30,
                       what="sidecar series", diag=st.diag)
            script.kv, script.capacity = 0.97, 3
            wait_until(lambda: st.alert_state(ALERT) == "firing", 60, every=0.2, what="KV alert firing", diag=st.diag)
            # the postmortem comes after the page: let the waits go on for some 20 s of firing, so
            # that the record also holds enough of them for the second half's 5 s evaluations (a
            # 10 s held-back window and a 4 s for: two evaluations in a row)
            wait_until(lambda: len([p for s in st.query(f'ALERTS{{alertname="{ALERT}",alertstate="firing"}}[10m]')
                                    for p in s["values"]]) >= 20, 90, every=0.5,
                       what="the KV alert firing for 20 evaluations", diag=st.diag)
            fired = st.query(f'ALERTS{{alertname="{ALERT}",alertstate="firing"}}[10m]')
            assert fired
            first_ms = round(min(float(p[0]) for s in fired for p in s["values"]) * 1000)

            out = tmp_path / "report"
            md = _postmortem(["--sidecar", f"http://{sidecar.address}", "--prometheus-url", st.prom_url,
                              "--slo", str(slo)], out)
            assert "first firing, Prometheus (its ALERTS)" in md
            assert "its own ALERTS" in md and "evaluates" in md
            cells = _row(md, ALERT)
            # the Prometheus column: the first ALERTS sample Prometheus wrote, to the second
            assert cells[4].startswith(_hms(first_ms)), (cells, _hms(first_ms), md)
            assert cells[3] != "—"  # and the sidecar's record saw it too, at poll resolution
            assert "pod=vllm-0" in cells[1]
            assert "resampled" not in md
            record = out / "record.om.gz"
    finally:
        sidecar.close()
        vllm.stop()

    # a Prometheus that holds the record but evaluates no rule: the pack is evaluated over its data,
    # every 5 s here (the SLO's evaluation_interval: the server's subqueries step at it)
    slo5 = tmp_path / "slo5.yaml"
    slo5.write_text(slo.read_text().replace("evaluation_interval: 1s", "evaluation_interval: 5s"))
    plain = tmp_path / "record.om"
    plain.write_bytes(gzip.decompress(record.read_bytes()))
    (tmp_path / "backfilled").mkdir()
    with prometheus_over(plain, tmp_path / "backfilled") as url:
        md2 = _postmortem(["--file", str(record), "--prometheus-url", url, "--slo", str(slo5)], tmp_path / "report2")
    assert "first firing, Prometheus (the pack over its data)" in md2
    assert "evaluates none of the pack's alerts" in md2 and "backtest --engine server" in md2
    assert "every 5 s" in md2
    cells = _row(md2, ALERT)
    assert re.match(r"\d\d:\d\d:\d\d", cells[4]), cells
