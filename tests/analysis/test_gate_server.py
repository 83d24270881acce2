"""``gate --engine server``: the figures of each range and the sidecar's max and mean signals
evaluated by the server (instant queries, one number back each), only the share signals' own
series read raw. On a real Prometheus (two replicas of vLLM's series and the sidecar's, backfilled
with promtool) the gate's whole result is the local path's, which reads every histogram bucket
of every replica into the process; ``--engine auto`` takes the server past six hours of range.
"""

from __future__ import annotations

import json

import pytest

from exporter.analysis import gate
from loadgen import Phase, history
from promtsdb import prometheus_over
from shared import main_for

START_S = 1_767_225_600
SCRAPE = 15


def _sidecar(pod: str, t0: int, seconds: int, bad_from: int, slow: bool) -> str:
    """The sidecar's signal series of one pod: calm, then (from ``bad_from``) KV pressure, waiting
    requests, a smaller batch, a stretch of vLLM unreadable (values exact in binary: the server's
    sums and counts and numpy's mean agree to the bit)."""
    lines = []
    base = f'namespace="llm",pod="{pod}",instance="{pod}:9181",job="llm/vllm-sidecar"'
    for k in range(seconds // SCRAPE + 1):
        t = t0 + k * SCRAPE
        bad = t - t0 >= bad_from
        phase = (k // 4) % 4
        vals = {
            "vllm_sidecar_kv_cache_usage_ratio": 0.5 + (0.25 + 0.125 * phase / 4 if bad else 0.0),
            "vllm_sidecar_kv_cache_pressure_level": float(phase if bad else 0),
            "vllm_sidecar_requests_waiting_for_capacity": float(2 * phase if bad else 0),
            "vllm_sidecar_requests_waiting": float(3 + phase if bad else phase % 2),
            "vllm_sidecar_requests_running": float(4 if bad and slow else 8 + phase),
            "vllm_sidecar_gpu_busy_low_throughput": float(bad and phase == 3),
            "vllm_sidecar_engine_stalled": 0.0,
        }
        for name, v in vals.items():
            lines.append(f"{name}{{{base}}} {v!r} {t}")
        lines.append(f'vllm_sidecar_target_up{{{base},target="vllm"}} {0.0 if bad and k % 9 == 0 else 1.0} {t}')
    return "\n".join(sorted(lines, key=lambda x: (x.split(" ")[0], int(x.rsplit(" ", 1)[1]))))


_cli = main_for("gate")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gate-server")
    om = tmp / "h.om"
    ok, slow = Phase(1200, 1, 0.3), Phase(1200, 2, 0.8, itl=0.025, waiting=2)
    text = history({"p0": [ok, slow], "p1": [Phase(1200, 1.5, 0.4), Phase(1200, 1.5, 0.9, itl=0.03)]}, START_S,
                   scrape=SCRAPE)
    text = text[: -len("# EOF\n")] + _sidecar("p0", START_S, 2400, 1200, True) + "\n" + \
        _sidecar("p1", START_S, 2400, 1200, False) + "\n# EOF\n"
    om.write_text(text)
    with prometheus_over(om, tmp) as url:
        yield url


RANGES = ["--baseline-range", f"{START_S + 300}/{START_S + 900}", "--baseline-range", f"{START_S + 600}/{START_S + 1190}",
          "--candidate-range", f"{START_S + 1500}/{START_S + 2100}",
          "--candidate-range", f"{START_S + 1800}/{START_S + 2390}"]


@pytest.mark.prometheus
def test_the_server_path_gives_the_local_gate_on_prometheus(capsys, served):
    url = served
    common = ["--prometheus-url", url, "--selector", 'namespace="llm"', "--json", "-", *RANGES]
    rc_l, local, err = _cli(capsys, *common, "--engine", "local")
    assert rc_l == 1, err
    rc_s, server, err = _cli(capsys, *common, "--engine", "server")
    assert rc_s == 1, err
    lo, so = json.loads(local), json.loads(server)
    assert any("evaluated by the server" in n for n in so["notes"])
    assert not any("evaluated by the server" in n for n in lo["notes"])
    so["notes"] = [n for n in so["notes"] if "evaluated by the server" not in n]
    assert so == lo
    # and there is something to agree on: a regression, every signal, a cause
    assert lo["figures"] and any(r["verdict"] == "regressed" for r in lo["figures"])
    cand = lo["signals"]["candidate"]
    assert None not in [cand[k] for k in ("kv_usage_max", "kv_pressure_max", "kv_saturated_share", "waiting_mean",
                                          "running_mean", "running_max", "busy_low_share", "down_share")]
    assert cand["down_share"] > 0 and cand["kv_saturated_share"] > 0
    assert "no sidecar signals" not in lo["likely_cause"]


@pytest.mark.prometheus
def test_auto_takes_the_server_past_six_hours(capsys, served):
    url = served
    long = ["--baseline-range", f"{START_S - 6 * 3600}/{START_S + 1190}",
            "--candidate-range", f"{START_S + 1200}/{START_S + 2390}"]
    common = ["--prometheus-url", url, "--selector", 'namespace="llm"', "--json", "-", *long]
    _, auto, err = _cli(capsys, *common)
    _, local, err = _cli(capsys, *common, "--engine", "local")
    ao, lo = json.loads(auto), json.loads(local)
    assert any("evaluated by the server" in n for n in ao["notes"])
    ao["notes"] = [n for n in ao["notes"] if "evaluated by the server" not in n]
    assert ao == lo and lo["figures"]


def test_what_the_server_summarises_and_what_is_read_raw():
    exprs = gate.server_signal_exprs('namespace="llm"', 1_000, 11_000)
    # (1 s, 11 s]: a range of 9.999 s, Prometheus 2's ranges including their left end
    assert exprs["kv_usage_max"] == 'max(max_over_time(vllm_sidecar_kv_cache_usage_ratio{namespace="llm"}[9999ms]))'
    assert exprs["waiting_mean"] == ('sum(sum_over_time(vllm_sidecar_requests_waiting{namespace="llm"}[9999ms])) / '
                                     'sum(count_over_time(vllm_sidecar_requests_waiting{namespace="llm"}[9999ms]))')
    raw = [s for s, _ in gate.raw_signal_selectors('namespace="llm"', 0)]
    assert sorted(raw) == sorted({'vllm_sidecar_kv_cache_pressure_level{namespace="llm"}',
                                  'vllm_sidecar_gpu_busy_low_throughput{namespace="llm"}',
                                  'vllm_sidecar_engine_stalled{namespace="llm"}',
                                  'vllm_sidecar_target_up{target="vllm", namespace="llm"}'})
