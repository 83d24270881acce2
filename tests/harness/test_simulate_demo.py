"""The simulated vLLM looks exactly like a real one, behaves like its scenarios say, and the demo
shows the sidecar catching them."""

import io

import pytest

from conftest import page
from exporter.harness.demo import run_demo
from exporter.harness.fakenvml import FakeNvml, make_gpus
from exporter.harness.simulate import SimVllm, template_page
from exporter.runtime import config
from exporter.runtime.exposition import parse
from exporter.runtime.inputs import normalize
from exporter.runtime.nvml import NvmlSource
from exporter.runtime.sidecar import Sidecar
from helpers import points, value


def series_shape(text):
    """Names and labels; the model name and the cache size (an info metric's labels) may differ."""
    return {(s.name, tuple((k, v if s.name != "vllm:cache_config_info" else "") for k, v in s.labels if k != "model_name"))
            for s in parse(text).samples}


def test_sim_page_has_exactly_the_real_pages_series():
    sim = SimVllm("normal", start=1000.0)
    for _ in range(50):
        sim.step(0.1)
    text = sim.page()
    p = parse(text)
    assert p.malformed == 0
    assert series_shape(text) == series_shape(page("after_pressure.txt"))
    assert template_page() == page("after_pressure.txt")  # the shipped template is the real capture
    snap = normalize(p, 0)
    assert snap.missing_required() == []
    assert snap.models == {"llama-3.1-70b-instruct"}


def test_upgrade_scenario_switches_from_old_to_new_names():
    sim = SimVllm("upgrade", start=1000.0)
    sim.scenario.onset = 2
    sim.step(0.5)
    old = normalize(parse(sim.page()), 0)
    assert old.resolved["kv_usage"] == "vllm:gpu_cache_usage_perc"
    for _ in range(10):
        sim.step(0.5)
    new = normalize(parse(sim.page()), 0)
    assert new.resolved["kv_usage"] == "vllm:kv_cache_usage_perc"
    assert new.process_start != old.process_start


def run_sidecar_on(scenario, seconds, onset=10, **cfg_kw):
    gpus = make_gpus(2)
    sim = SimVllm(scenario, gpus=gpus, start=1000.0)
    sim.scenario.onset = onset
    cfg = config.build({"window": 20, "poll_interval": 1, "stall_seconds": 10, "baseline_min_seconds": 20, **cfg_kw}, {})
    sc = Sidecar(cfg, sim.page, NvmlSource(FakeNvml(gpus)), clock=lambda: sim.now)
    sc.baseline.spacing = 1
    history = []
    for _ in range(seconds):
        for _ in range(10):
            sim.step(0.1)
        try:
            pub = sc.poll_once()
        except ConnectionError:
            raise
        history.append((sim.elapsed, pub))
    return history


def flagged_at(history, name, **labels):
    for t, pub in history:
        if value(pub, name, **labels) == 1.0:
            return t
    return None


def test_long_prompt_storm_is_caught_by_pressure_long_prompts_and_busy_low():
    h = run_sidecar_on("long-prompt-storm", 90, onset=40)
    before = [pub for t, pub in h if 25 <= t < 40]
    assert all((value(p, "kv_cache_pressure_level", model_name="llama-3.1-70b-instruct") or 0) < 2 for p in before)
    assert flagged_at(h, "gpu_busy_low_throughput", model_name="llama-3.1-70b-instruct") > 40
    after = h[-1][1]
    assert value(after, "long_prompt_requests_per_second", model_name="llama-3.1-70b-instruct") > 0.05
    assert value(after, "kv_cache_pressure_level", model_name="llama-3.1-70b-instruct") >= 2


@pytest.mark.parametrize("scenario,signal", [("stall", "engine_stalled"), ("gpu-busy-low", "gpu_busy_low_throughput"),
                                             ("kv-thrashing", None)])
def test_scenarios_raise_their_signal(scenario, signal):
    h = run_sidecar_on(scenario, 70, onset=35)
    m = "llama-3.1-70b-instruct"
    quiet = [pub for t, pub in h if t < 35]
    if signal:
        assert all(value(p, signal, model_name=m) in (None, 0.0) for p in quiet)
        assert flagged_at(h, signal, model_name=m) is not None
    else:
        assert value(h[-1][1], "kv_cache_pressure_level", model_name=m) == 3
        assert value(h[-1][1], "preemptions_per_second", model_name=m) > 0


def test_normal_day_flags_nothing():
    h = run_sidecar_on("normal", 90)
    m = "llama-3.1-70b-instruct"
    for _, pub in h:
        assert value(pub, "gpu_busy_low_throughput", model_name=m) in (None, 0.0)
        assert value(pub, "engine_stalled", model_name=m) in (None, 0.0)
        assert (value(pub, "kv_cache_pressure_level", model_name=m) or 0) < 3


def test_restart_scenario_recovers_without_negative_rates():
    gpus = make_gpus(1)
    sim = SimVllm("restart", gpus=gpus, start=1000.0)
    sim.scenario.onset = 20
    cfg = config.build({"window": 20, "poll_interval": 1}, {})
    from exporter.runtime.fetch import FetchError

    def fetch():
        try:
            return sim.page()
        except ConnectionError:
            raise FetchError("refused", "simulated vLLM down") from None
    sc = Sidecar(cfg, fetch, NvmlSource(FakeNvml(gpus)), clock=lambda: sim.now)
    downs = 0
    for _ in range(60):
        for _ in range(10):
            sim.step(0.1)
        pub = sc.poll_once()
        downs += dict(pub.up)["vllm"] is False
        assert all(p.value >= 0 for p in points(pub) if p.name.endswith("_per_second"))
    assert downs >= 5 and pub.vllm_restarts_total == 1 and dict(pub.up)["vllm"]


def test_demo_command_shows_the_signals_and_a_summary():
    out = io.StringIO()
    rc = run_demo("stall", duration=22, onset=4, listen="127.0.0.1:0", with_prometheus=False, refresh=2, tty=False, out=out)
    text = out.getvalue()
    assert rc == 0
    assert "scenario stall" in text and "/22s" in text
    assert "engine      stalled: YES" in text
    assert "engine stalled" in text.split("What the sidecar flagged")[1]


@pytest.mark.prometheus
def test_demo_with_prometheus_shows_alerts_firing():
    out = io.StringIO()
    # the run ends once the stall's alert fired (about 30 s here), 150 s at most on a starved machine
    rc = run_demo("stall", duration=150, onset=3, listen="127.0.0.1:0", with_prometheus=True, refresh=2, tty=False,
                  out=out, until_fired=("VLLMEngineStalled",))
    text = out.getvalue()
    assert rc == 0
    assert "alerts      firing:" in text
    fired = text.split("Alerts that fired:")[1]
    assert "VLLMEngineStalled" in fired, text[-2500:]
    lasted = float(text.split("the run lasted ")[1].split("s")[0])
    assert lasted < 150, "the run did not end when the alert fired"


def test_each_simulator_has_its_own_scenario():
    """Setting one instance's onset changes neither the scenario table nor another instance."""
    from exporter.harness.simulate import SCENARIOS

    table_onset = SCENARIOS["stall"].onset
    a = SimVllm("stall", start=0.0)
    b = SimVllm("stall", start=0.0, onset=5.0)
    a.scenario.onset = 1.0
    assert b.scenario.onset == 5.0
    assert SCENARIOS["stall"].onset == table_onset
    assert SimVllm("stall", start=0.0).scenario.onset == table_onset


def test_demo_starts_alertmanager_only_with_a_config_and_a_binary():
    from pathlib import Path

    from exporter.harness.demo import should_start_alertmanager

    has_am = lambda name: "/usr/bin/" + name if name == "alertmanager" else None  # noqa: E731
    nothing = lambda name: None  # noqa: E731
    assert should_start_alertmanager(None, which=has_am) is False  # was True: start_alertmanager(None)
    assert should_start_alertmanager(Path("am.yml"), which=has_am) is True
    assert should_start_alertmanager(Path("am.yml"), which=nothing) is False


@pytest.mark.parametrize("scenario", ["kv-thrashing", "long-prompt-storm"])
def test_long_steps_preempt_only_running_requests_and_keep_the_counts(scenario):
    """With steps of seconds (a fleet of simulated pods stepped every few seconds), requests that
    finish in a step leave the batch before the cache is checked: they are never preempted (the
    newest could both finish and be preempted, and removing it raised ValueError), and every
    request is accounted for: finished, running or waiting."""
    sim = SimVllm(scenario, start=1000.0, onset=0.0)
    for _ in range(400):
        sim.step(5.0)
        assert sim.kv_used() <= sim.kv_tokens or len(sim.running) <= 1
        assert len({id(r) for r in sim.running}) == len(sim.running)
    assert sim.c["preempt"] > 0, "the scenario never filled the cache: the check above checked nothing"
    finished = sim.c["stop"] + sim.c["length"]
    assert finished > 0 and sim.h["preempt"].count == finished


def test_demo_until_fired_needs_prometheus(capsys):
    from exporter.cli.demo import main

    assert main(["--until-fired", "VLLMEngineStalled"], {}) == 2
    assert "--until-fired needs --with-prometheus" in capsys.readouterr().err
