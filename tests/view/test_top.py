"""`vllm-sidecar-exporter top`: the demo's view of a real vLLM page server (the real vLLM pages of
tests/fixtures/vllm, counters advancing) through an in-process sidecar, and of a running sidecar
through its /metrics read back into the same state; in a pipe without escape codes, on a
terminal redrawn; one clear line when there is nothing to read."""

import os
import pty
import select
import signal
import subprocess
import sys
import threading
import time

import pytest
from prometheus_client import generate_latest

from conftest import ROOT, page
from exporter.harness import pagetransform as pt
from exporter.harness.fakenvml import FakeNvml, make_gpus
from exporter.harness.localstack import SidecarThread, wait_until
from exporter.harness.pageserver import PageServer
from exporter.harness.simulate import SimVllm
from exporter.runtime import config
from exporter.runtime.collectors import DERIVED, POD_DERIVED
from exporter.runtime.collectors.readback import (
    CAUSE,
    CEILING,
    DISTRIBUTIONS,
    FINISHED,
    MAPPINGS,
    OTHER,
    SCALARS,
    published_from_exposition,
)
from exporter.runtime.gpu import GpuReading, GpuState
from exporter.runtime.nvml import NvmlSource
from exporter.runtime.server import make_registry
from exporter.runtime.sidecar import Sidecar
from exporter.runtime.signals import (
    BusyLow,
    Caches,
    Distribution,
    KvQueue,
    KvTransfer,
    Latency,
    Lora,
    LoraAdapter,
    ModelSignals,
    Prompts,
    Signals,
    Throughput,
)
from exporter.runtime.state import Published
from exporter.view.console import Screen
from shared import run_cli

# the KV line a saturated replica shows: usage 97%, six requests waiting, all for KV capacity
KV_LINE = "  KV cache    usage 97%   pressure saturated   waiting 6 (for KV 6, cache full)"


def vllm_script():
    """A real vLLM page (after the KV-pressure run) whose counters keep growing, with the queue
    waiting for capacity: what a saturated replica serves."""
    base = page("after_pressure.txt")
    t0 = time.monotonic()

    def script():
        text = pt.scale_counters(base, 1 + 0.05 * (time.monotonic() - t0))
        text = pt.set_values(text, {"vllm:num_requests_waiting": 6, "vllm:kv_cache_usage_perc": 0.97})
        return pt.set_values(text, {"vllm:num_requests_waiting_by_reason": 6}, 'reason="capacity"')
    return script


@pytest.fixture
def vllm():
    server = PageServer(vllm_script()).start()
    yield server
    server.stop()


def top(*args, timeout=60):
    return run_cli("top", *args, timeout=timeout)


# -- the sidecar's /metrics read back ---------------------------------------------------------------

def dist(base):
    return Distribution(((0.5, base), (0.95, base * 3), (0.99, base * 5)), count=1234.0, sum=base * 1000)


def full_state() -> Published:
    """A state with every field the page can carry set (two models, two GPUs)."""
    def model(name, k):
        return ModelSignals(
            model=name,
            throughput=Throughput(generation_tokens_per_second=812.5 * k, prompt_tokens_per_second=9000.25 * k,
                                  preemptions_per_second=0.5, corrupted_requests_per_second=0.01,
                                  admission_rejections_per_second=0.2, finished_per_second={"stop": 3.5, "length": 0.25},
                                  error_ratio=0.02),
            kv=KvQueue(usage=0.93, pressure_level=3, seconds_to_full=42.0, running=16.0, waiting=6.0,
                       waiting_for_capacity=4.0),
            latency=Latency(ttft=dist(0.4), ttft_mean=0.61, itl=dist(0.02), e2e=dist(3.0), queue_time=dist(0.1),
                            ttft_slo_attainment=0.875, itl_slo_attainment=0.9375),
            prompts=Prompts(length=dist(900.0), long_per_second=0.75, long_ratio=0.125),
            caches=Caches(prefix_cache_hit_ratio=0.3, spec_decode_acceptance_ratio=0.6,
                          spec_decode_mean_accepted_length=2.25, spec_decode_position_acceptance={"0": 0.75, "1": 0.5}),
            stalled=k > 1, busy_low=BusyLow(baseline=1500.0, threshold=450.0, flagged=k > 1),
            kv_transfer=KvTransfer(failure_ratio=0.125, failures_per_second={"transfer": 0.5, "notification": 0.25},
                                   transfer_seconds=dist(0.05), post_seconds=dist(0.001), bytes_per_second=2.5e9,
                                   transfers_per_second=12.0, expired_per_second=0.125,
                                   notifications_after_expiry_per_second=0.0625,
                                   waiting_fetch={"in_progress": 3.0, "waiting_to_start": 1.0, "completed_waiting": 0.0},
                                   prompt_tokens_transferred_ratio=0.875, external_prefix_cache_hit_ratio=0.5),
            sleep_level=k - 1)

    gpus = [GpuReading(index=i, uuid=f"GPU-{i}", name="NVIDIA H100 80GB HBM3", utilization=0.97, memory_used_bytes=7.1e10,
                       memory_total_bytes=8.5e10, power_watts=640.5, power_limit_watts=700.0, temperature_celsius=81.0,
                       sm_clock_hertz=1.98e9, throttle_reasons=0x24 if i else 0x1, ecc_corrected_total=3.0,
                       ecc_uncorrected_total=0.0, energy_joules_total=1.5e7, sm_activity=0.8, sm_occupancy=0.4)
            for i in range(2)]
    return Published(
        t=1_800_000_000.0,
        signals=Signals(gpu_mean_utilization=0.97, models=(model("llama-3.1-70b", 1), model("llama-3.1-8b", 2)),
                        lora=Lora(max_adapters=2, adapters=(LoraAdapter("docs-lora", True), LoraAdapter("sql-lora", False)),
                                  known=2, active=1), role="decode", role_conflicts=("no_kv_consumer",)),
        up=(("gpu", True), ("vllm", True)),
        last_success=(("gpu", 1_799_999_999.5), ("vllm", 1_799_999_999.25)),
        errors_total=((("gpu", "nvml"), 1), (("vllm", "refused"), 0), (("vllm", "timeout"), 4)),
        input_missing=(("vllm:kv_cache_usage_perc", False), ("vllm:num_requests_running", False)),
        input_resolved=(("kv_usage", "vllm:kv_cache_usage_perc"), ("running", "vllm:num_requests_running")),
        gpu=GpuState(ok=True, gpus=gpus, driver_version="550.54.15", xid_totals={(1, "GPU-1", 79): 2}),
        malformed_lines_total=3, malformed_by_reason=(("syntax", 2), ("too_long", 1)), vllm_restarts_total=2,
        poll_seconds=(("gpu", 0.004), ("vllm", 0.031)), page_bytes=45678, gpu_source="nvml")


def test_every_derived_series_is_read_back():
    """The console's table is the collectors' own: a new derived series with a field path is read
    back into that field; only these are read apart, by hand."""
    assert set(OTHER) == {"engine_stalled", "throughput_baseline_tokens_per_second",
                          "throughput_low_threshold_tokens_per_second", "gpu_busy_low_throughput", "engine_sleep_level"}
    assert FINISHED in MAPPINGS  # a field path with one extra label: read back generically
    assert set(DERIVED) == set(SCALARS) | set(DISTRIBUTIONS) | set(MAPPINGS) | set(OTHER) | {CAUSE, CEILING}
    assert set(POD_DERIVED) == {"gpu_mean_utilization_ratio", "role_info", "role_conflict"} | {
        n for n in POD_DERIVED if n.startswith("lora_")}


def test_a_full_state_survives_the_round_trip_through_the_page():
    pub = full_state()
    text = generate_latest(make_registry(lambda: pub)).decode()
    back = published_from_exposition(text, pub.t)
    assert back.signals == pub.signals
    assert back == pub
    view = Screen(None, False)
    assert view.render(back) == view.render(pub)


def test_a_simulated_incident_survives_the_round_trip():
    """The sidecar's real state during the simulated long-prompt storm, with simulated GPUs."""
    gpus = make_gpus(2)
    sim = SimVllm("long-prompt-storm", gpus=gpus, start=1000.0, onset=10)
    cfg = config.build({"window": 20, "poll_interval": 1}, {})
    sc = Sidecar(cfg, sim.page, NvmlSource(FakeNvml(gpus)), clock=lambda: sim.now)
    for _ in range(40):
        for _ in range(10):
            sim.step(0.1)
        pub = sc.poll_once()
    assert pub.signals.models and pub.gpu and pub.gpu.gpus
    back = published_from_exposition(generate_latest(make_registry(lambda: pub)).decode(), pub.t)
    assert back.signals == pub.signals
    assert back.gpu.gpus == pub.gpu.gpus and back.up == pub.up
    assert Screen(None, False).render(back) == Screen(None, False).render(pub)


# -- top against a real page server and a running sidecar ---------------------------------------------

def test_top_once_runs_a_sidecar_on_a_real_vllm_page(vllm):
    r = top("--vllm-url", vllm.url, "--poll-interval", "0.5", "--window", "3", "--gpu", "none", "--once")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "\x1b" not in out  # a pipe: no escape codes
    assert f"vLLM {vllm.url}/metrics · sidecar in this process (poll 0.5s, window 3s)" in out
    assert "  vLLM        up   restarts seen 0" in out
    assert "  model       tiny-llama" in out
    assert KV_LINE in out
    tput = next(line for line in out.splitlines() if line.startswith("  throughput"))
    assert "tok/s out" in tput and not tput.startswith("  throughput  —"), tput
    assert "KV pressure saturated" in out.split("flagged")[-1]
    assert r.stderr == ""


def test_top_reads_a_running_sidecar_and_shows_the_same_view(vllm):
    sidecar = SidecarThread({"vllm_url": vllm.url, "poll_interval": 0.5, "window": 3, "gpu": "none"})
    try:
        wait_until(lambda: sidecar.sidecar.published.signals.models, 120, what="the sidecar's first model")
        r = top("--sidecar-url", f"http://{sidecar.address}", "--once")
        assert r.returncode == 0, r.stderr
        out = r.stdout
        assert f"sidecar http://{sidecar.address}/metrics" in out
        assert "  model       tiny-llama" in out and KV_LINE in out
        # the screen the sidecar's own state gives, line for line (the rates move between polls)
        mine = Screen(None, False).render(sidecar.sidecar.published).splitlines()
        shown = [line for line in out.splitlines() if line.startswith("  ")]
        assert [line[:14] for line in shown[:len(mine)]] == [line[:14] for line in mine]
        assert KV_LINE in "\n".join(mine)
    finally:
        sidecar.close()


def test_top_in_a_pipe_prints_one_block_per_refresh_until_interrupted(vllm):
    p = subprocess.Popen([sys.executable, "-m", "exporter", "top", "--vllm-url", vllm.url, "--poll-interval", "0.5",
                          "--window", "3", "--gpu", "none", "--refresh", "0.5"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, cwd=ROOT)
    lines: list = []
    reader = threading.Thread(target=lambda: lines.extend(iter(p.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        # until three blocks are out, the last with the KV line (a loaded machine starts slowly)
        end = time.monotonic() + 60
        while time.monotonic() < end:
            text = "".join(lines)
            if text.count("vllm-sidecar-exporter top · ") >= 4 and KV_LINE in text:
                break
            time.sleep(0.2)
    finally:
        p.send_signal(signal.SIGINT)
        p.wait(timeout=20)
        reader.join(5)
    err = p.stderr.read()
    out = "".join(lines)
    assert p.returncode == 0, err
    blocks = [b for b in out.split("\n\n") if b.strip()]
    assert len(blocks) >= 3, out
    assert all(b.startswith("vllm-sidecar-exporter top · ") for b in blocks)
    assert "\x1b" not in out
    assert any(KV_LINE in b for b in blocks[-2:])


def test_top_on_a_terminal_redraws_the_screen(vllm):
    master, slave = pty.openpty()
    p = subprocess.Popen([sys.executable, "-m", "exporter", "top", "--vllm-url", vllm.url, "--poll-interval", "0.5",
                          "--window", "3", "--gpu", "none", "--refresh", "0.5"], stdout=slave, stderr=subprocess.PIPE,
                         cwd=ROOT)
    os.close(slave)
    got = b""
    try:
        end = time.monotonic() + 30
        while time.monotonic() < end and got.count(b"\x1b[H\x1b[2J") < 3:
            if select.select([master], [], [], 0.5)[0]:
                try:
                    got += os.read(master, 65536)
                except OSError:
                    break
    finally:
        p.send_signal(signal.SIGINT)
        p.wait(20)
        os.close(master)
    assert got.count(b"\x1b[H\x1b[2J") >= 3, got[-2000:]
    assert b"Ctrl-C to stop" in got
    assert p.returncode == 0


def test_top_says_in_one_line_what_it_cannot_read():
    from exporter.harness.localstack import free_port

    port = free_port()
    r = top("--vllm-url", f"http://127.0.0.1:{port}", "--poll-interval", "0.5", "--window", "3", "--gpu", "none", "--once")
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        f"vllm-sidecar-exporter top: error: cannot read vLLM at http://127.0.0.1:{port}/metrics: refused"]
    assert "  vLLM        DOWN" in r.stdout
    r = top("--sidecar-url", f"http://127.0.0.1:{port}", "--once")
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    assert "cannot read the sidecar" in r.stderr and "connection refused" in r.stderr
    r = top("--sidecar-url", f"http://127.0.0.1:{port}", "--window", "5")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "--window" in r.stderr
    import socket

    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    try:
        r = top("--vllm-url", f"http://127.0.0.1:{port}", "--listen", f"127.0.0.1:{busy.getsockname()[1]}", "--once")
    finally:
        busy.close()
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "listen" in r.stderr, r.stderr
    r = top("--vllm-url", "ftp://x", "--once")
    assert r.returncode == 2 and r.stderr.startswith("vllm-sidecar-exporter top: error: vllm_url")
