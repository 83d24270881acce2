""""GPU busy, tokens low" on the user's own night (issue 29 item 5) and by role (issue 28).

The night is the demo's default (`make run`: long-prompt-storm, onset 15 s, 150 s) with the demo's
sidecar settings, the simulator stepped in the test's own time (its clock passed in): the real
sidecar reads the simulator's pages and the stand-in NVML, as in the demo, every second.

- With no history, the sidecar must not learn the flood as normal (it reports the flood as
  degraded: KV pressure, requests held back, long prompts) and compares the busy pod with the
  planned per-replica rate, so the flag shows within a minute of the onset, whatever the seed.
- With a normal history first (the baseline learned from healthy busy time: the baseline lives in
  the sidecar's memory over ``gpu_busy_low.baseline_horizon``, 6 h, so a week of normal traffic is
  the same store as its last hours), the learned baseline decides, and the flag shows within a
  minute too.
- ``VLLMGPUBusyLowThroughput`` fires on the night: the pack (the demo's SLO file), evaluated by the
  project's backtest engine (equal to promtool, tests/analysis/test_backtest_promtool.py) over what a
  Prometheus scraping every 2 s (the demo's interval) stores from the simulated vLLM and the real
  sidecar, never over a boolean a scenario wrote.
"""

from importlib import resources

import numpy as np
import pytest

from conftest import FIXTURES
from exporter.harness.fakenvml import FakeNvml, make_gpus
from exporter.harness.simulate import SimVllm
from exporter.runtime import config
from exporter.runtime.exposition import parse
from exporter.runtime.nvml import NvmlSource
from exporter.runtime.sidecar import Sidecar
from exporter.runtime.signals import (
    Baseline,
    BusyLow,
    Caches,
    KvQueue,
    Latency,
    ModelSignals,
    Prompts,
    Throughput,
    busy_low,
    degraded,
    derive,
    learnable,
)
from helpers import cfg, scraped, snap, value

M = "llama-3.1-70b-instruct"
ONSET = 15.0  # the demo's default
DURATION = 150  # the demo's default
# the demo's sidecar (exporter/harness/demo.py)
DEMO = {"window": 20, "poll_interval": 1, "stall_seconds": 10, "baseline_min_seconds": 20, "gpu": "nvml"}


def night(seed, warmup=0.0, scrape=None):
    """(elapsed, Published) at every poll; with ``scrape`` (s), also what a Prometheus scraping the
    simulated vLLM and the sidecar at that interval stores: {(name, labels): [(t_ms, value)]}."""
    gpus = make_gpus(2)
    sim = SimVllm("long-prompt-storm", gpus=gpus, start=1_800_000_000.0, seed=seed, onset=warmup + ONSET)
    sc = Sidecar(config.build(DEMO, {}), sim.page, NvmlSource(FakeNvml(gpus)), clock=lambda: sim.now)
    sc.baseline.spacing = 2.0  # as the demo sets it
    history, stored = [], {}
    for i in range(int(warmup + DURATION)):
        for _ in range(10):
            sim.step(0.1)
        pub = sc.poll_once()
        history.append((sim.elapsed - warmup, pub))
        if scrape and i % int(scrape) == 0:
            t_ms = int(round(sim.now * 1000))
            for s in parse(sim.page()).samples:
                stored.setdefault((s.name, tuple(s.labels)), []).append((t_ms, s.value))
            for (name, labels), v in scraped(pub).items():
                stored.setdefault((name, labels), []).append((t_ms, v))
    return history, stored


def first_flag(history):
    return next((t for t, pub in history if t >= 0 and value(pub, "gpu_busy_low_throughput", model_name=M) == 1.0),
                None)


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_without_history_the_flag_shows_within_a_minute_and_the_flood_is_never_learned(seed):
    h, _ = night(seed)
    flagged = [t for t, pub in h if value(pub, "gpu_busy_low_throughput", model_name=M) == 1.0]
    assert flagged and min(flagged) >= ONSET, "flagged before the trouble"
    assert min(flagged) - ONSET <= 60, f"first flag {min(flagged) - ONSET:.0f} s after the onset"
    # the flood is degraded time: nothing of it became the baseline, the plan decides
    last = h[-1][1].signals.model(M)
    assert last.busy_low.baseline is None
    assert last.busy_low.threshold == pytest.approx(0.3 * 700)
    assert value(h[-1][1], "throughput_baseline_tokens_per_second", model_name=M) is None


@pytest.mark.parametrize("seed", [1, 5])
def test_with_a_normal_history_the_learned_baseline_flags_within_a_minute(seed):
    warm = 300.0
    h, _ = night(seed, warmup=warm)
    before = [pub for t, pub in h if t < ONSET]
    assert not any(value(p, "gpu_busy_low_throughput", model_name=M) == 1.0 for p in before)
    learned = h[int(warm + ONSET) - 2][1].signals.model(M).busy_low.baseline
    assert learned is not None and learned > 400  # healthy busy traffic makes ~600 tokens/s
    t = first_flag(h)
    assert t is not None and ONSET <= t <= ONSET + 60, t
    # the flood did not drag the baseline down
    assert h[-1][1].signals.model(M).busy_low.baseline == pytest.approx(learned, rel=0.05)


@pytest.mark.parametrize("warm", [0.0, 300.0])
def test_the_pack_fires_busy_low_on_the_night_from_what_the_sidecar_derives(tmp_path, warm):
    """Without history and after a normal stretch the sidecar learned its baseline from."""
    from exporter.analysis.rulefile import load_rule_file
    from exporter.analysis.rulemanager import run as run_rules
    from exporter.analysis.series import Store
    from exporter.pack.rules import render_plain
    from exporter.slo import load_slo

    h, stored = night(2, warmup=warm, scrape=2)
    target = (("namespace", "demo"), ("pod", "vllm-demo-0"))
    store = Store()
    for (name, labels), pts in stored.items():
        job = "vllm-sidecar" if name.startswith("vllm_sidecar_") else "vllm"
        lab = tuple(sorted((("__name__", name), ("job", job), *target, *labels)))
        store.add(lab, [t for t, _ in pts], [v for _, v in pts])
    slo_file = tmp_path / "demo-slo.yaml"
    slo_file.write_text(resources.files("exporter.harness").joinpath("data", "demo-slo.yaml").read_text())
    rules = tmp_path / "vllm.rules.yml"
    rules.write_text(render_plain(load_slo(str(slo_file))))
    start, end = store.time_range()
    times = np.arange(start, end + 1, 2000, dtype=np.int64)
    run = run_rules(load_rule_file(str(rules)), store, times, 2000)
    t0 = 1_800_000_000.0 + warm
    firing = sorted({int(times[i]) / 1000.0 - t0 for tr in run.alerts if tr.alertname == "VLLMGPUBusyLowThroughput"
                     for i in np.nonzero(tr.states.firing)[0]})
    assert firing, "VLLMGPUBusyLowThroughput never fired on the night"
    assert min(firing) >= ONSET
    # it fires on the sidecar's flag: the first firing follows the first flag by the alert's `for`
    # (15 s in the demo's SLO) plus an evaluation or two
    assert min(firing) - first_flag(h) <= 15 + 6, (min(firing), first_flag(h))


# -- the rules, each on its own, with the clock passed in -------------------------------------------------

def _model(**kw):
    parts = dict(throughput=Throughput(generation_tokens_per_second=600.0, prompt_tokens_per_second=4000.0),
                 kv=KvQueue(pressure_level=0, waiting_for_capacity=0.0), latency=Latency(),
                 prompts=Prompts(long_per_second=0.0), caches=Caches())
    parts.update(kw)
    return ModelSignals(model=M, **parts)


def test_a_degraded_poll_is_never_learned():
    ok = _model()
    assert degraded(ok, 0.05) == [] and learnable(ok, 0.97, 0.9, "both", 0.05) == 600.0
    assert learnable(ok, 0.5, 0.9, "both", 0.05) is None  # not busy
    cases = {
        "kv_pressure": _model(kv=KvQueue(pressure_level=2, waiting_for_capacity=0.0)),
        "held_back": _model(kv=KvQueue(pressure_level=1, waiting_for_capacity=3.0)),
        "long_prompt_surge": _model(prompts=Prompts(long_per_second=0.3)),
        "stalled": _model(stalled=True),
        "sleeping": _model(sleep_level=1),
        "busy_low": _model(busy_low=BusyLow(baseline=None, threshold=210.0, flagged=True)),
    }
    for why, m in cases.items():
        assert why in degraded(m, 0.05), why
        assert learnable(m, 0.97, 0.9, "both", 0.05) is None, why
    # a prefill instance learns its prompt tokens/s, and long prompts are its ordinary work
    assert learnable(ok, 0.97, 0.9, "prefill", 0.05) == 4000.0
    assert learnable(cases["long_prompt_surge"], 0.97, 0.9, "prefill", 0.05) == 4000.0
    assert learnable(cases["kv_pressure"], 0.97, 0.9, "prefill", 0.05) is None


def test_the_plan_stands_in_for_a_baseline_not_yet_learned():
    kw = dict(busy_utilization=0.9, low_fraction=0.3, floor=10.0, min_busy_seconds=100, quantile=0.9)
    assert busy_low(M, 150.0, 0.97, None, planned=700.0, **kw).flagged is True  # 150 < 0.3 * 700
    assert busy_low(M, 150.0, 0.97, None, planned=700.0, **kw).threshold == pytest.approx(210.0)
    assert busy_low(M, 150.0, 0.97, None, planned=0.0, **kw).flagged is False  # no plan: the floor
    assert busy_low(M, 5.0, 0.97, None, planned=20.0, **kw).threshold == 10.0  # never below the floor
    assert busy_low(M, 150.0, 0.97, None, planned=700.0, sleeping=True, **kw).flagged is False
    b = Baseline(horizon=3600, spacing=10)
    for i in range(20):
        b.record(M, 1000.0 + 10 * i, 400.0)
    learned = busy_low(M, 150.0, 0.97, b, planned=700.0, **kw)
    assert learned.baseline == 400.0 and learned.threshold == pytest.approx(120.0) and learned.flagged is False


def test_the_plan_judges_only_a_full_window(clock, after_load):
    """A pod's first seconds (its warm-up: GPUs busy prefilling the first requests, few tokens yet)
    are judged by the floor alone; from a full window on, by the plan."""
    from exporter.harness import pagetransform as pt
    from helpers import sidecar_with

    gpus = make_gpus(2)
    for g in gpus:
        g.utilization_percent = 99
    sc, seq = sidecar_with(clock, cfg(poll_interval=1, window=10), after_load, gpu=NvmlSource(FakeNvml(gpus)))
    gen0 = 0.0
    seen = []
    for _ in range(15):
        gen0 += 100.0  # 100 tokens/s: over the floor, under 0.3 x the plan
        seq.text = pt.set_values(after_load, {"vllm:generation_tokens_total": gen0, "vllm:num_requests_running": 8})
        pub = sc.poll_once()
        clock.advance(1)
        seen.append(value(pub, "throughput_low_threshold_tokens_per_second", model_name="tiny-llama"))
    assert seen[1] == 10.0 and seen[-1] == pytest.approx(210.0)
    assert value(pub, "gpu_busy_low_throughput", model_name="tiny-llama") == 1.0


PAGES = FIXTURES / "vllm-0.33"


@pytest.mark.parametrize("role,flagged", [("prefill", 0.0), ("both", 1.0)])
def test_a_busy_healthy_prefill_instance_is_judged_by_its_prompt_tokens(role, flagged):
    """vLLM 0.33's page of a prefill instance: ~18k prompt tokens/s, one output token per request.
    As a prefill instance it is healthy; judged as a replica that decodes too (role both, as
    before roles) its few output tokens are what the flag looks for."""
    c = cfg(window=60, poll_interval=5, role=role)
    snaps = [snap((PAGES / "kv_producer" / f"poll-{p}.txt").read_text(), 1000.0 + 5 * (p - 1)) for p in (1, 2, 3)]
    sig = derive(snaps, snaps, 1010.0, c, util_history=[(1000.0 + t, 0.98) for t in range(11)])
    assert value(sig, "gpu_busy_low_throughput", model_name="llama-3-70b") == flagged
