"""``vllm-sidecar-exporter demo``: the sidecar on a built-in simulated vLLM and simulated GPUs.

Starts the simulator (a real vLLM 0.32.0 page with simulated values, see ``simulate.py``) behind
a local HTTP server, the stand-in NVML with two GPUs, and the real sidecar reading both; then
shows the key signals live in the terminal with a progress line. With ``--with-prometheus`` (when
``prometheus`` is installed) it also runs Prometheus with the rules pack rendered from a demo SLO
file with short ``for`` values, and Alertmanager with the example routing when it is installed,
and shows the alerts as they go pending and fire.
"""

from __future__ import annotations

import shutil
import signal
import sys
import tempfile
import threading
import time
from importlib import resources
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, TextIO

from .simulate import SCENARIOS, SimRunner, SimVllm


def _fmt(v: Optional[float], unit: str = "", digits: int = 2) -> str:
    if v is None:
        return "—"
    if unit == "s":
        return f"{v * 1000:.0f}ms" if v < 1 else f"{v:.{digits}f}s"
    if unit == "%":
        return f"{v * 100:.0f}%"
    if abs(v) >= 100:
        return f"{v:,.0f}{unit}"
    return f"{v:.{digits}f}{unit}"


LEVELS = {0: "ok", 1: "elevated", 2: "saturated", 3: "thrashing"}


class View:
    """What the terminal shows, built from the sidecar's latest published state."""

    def __init__(self, out: TextIO, tty: bool) -> None:
        self.out = out
        self.tty = tty
        self.first_seen: Dict[str, float] = {}
        self.alerts_seen: Dict[str, str] = {}

    def signals(self, pub) -> Dict[tuple, float]:
        return {(p.name, p.labels.get("quantile", ""), p.labels.get("finished_reason", "")): p.value for p in pub.points}

    def note(self, what: str, elapsed: float) -> None:
        self.first_seen.setdefault(what, elapsed)

    def render(self, sim: SimVllm, pub, elapsed: float, duration: float, urls: Dict[str, str],
               alerts: Optional[List[dict]]) -> str:
        d = self.signals(pub)
        g = lambda n, q="": d.get((n, q, ""))  # noqa: E731
        up = dict(pub.up)
        gpu = pub.gpu
        level = g("kv_cache_pressure_level")
        busy_low = g("gpu_busy_low_throughput")
        stalled = g("engine_stalled")
        if busy_low == 1:
            self.note("GPU busy, tokens low", elapsed)
        if stalled == 1:
            self.note("engine stalled", elapsed)
        if level is not None and level >= 2:
            self.note(f"KV pressure {LEVELS[int(level)]}", elapsed)
        if (g("long_prompt_requests_per_second") or 0) > 0.05:
            self.note("long-prompt surge", elapsed)
        if up.get("vllm") is False:
            self.note("vLLM unreachable", elapsed)
        if pub.vllm_restarts_total:
            self.note("vLLM restart seen", elapsed)
        width = 30
        frac = min(1.0, elapsed / duration) if duration else 0.0
        bar = "#" * int(frac * width) + "." * (width - int(frac * width))
        prog = f"[{bar}] {elapsed:4.0f}/{duration:.0f}s" if duration else f"{elapsed:4.0f}s (Ctrl-C to stop)"
        lines = [
            f"vllm-sidecar-exporter demo · scenario {sim.scenario.name}: {sim.scenario.doc}",
            f"{prog}   phase: {sim.phase()}",
            f"  vLLM        {'up' if up.get('vllm') else 'DOWN'}   model {sim.model}   restarts seen {pub.vllm_restarts_total}"
            f"   sidecar {urls['sidecar']}",
            f"  throughput  {_fmt(g('generation_tokens_per_second'), ' tok/s', 0)} out   "
            f"{_fmt(g('prompt_tokens_per_second'), ' tok/s', 0)} in   baseline {_fmt(g('throughput_baseline_tokens_per_second'), ' tok/s', 0)}"
            f"   GPU busy + tokens low: {'YES' if busy_low == 1 else 'no' if busy_low is not None else '—'}",
            f"  latency     TTFT p50 {_fmt(g('ttft_seconds', '0.5'), 's')} p95 {_fmt(g('ttft_seconds', '0.95'), 's')} "
            f"p99 {_fmt(g('ttft_seconds', '0.99'), 's')}   ITL p95 {_fmt(g('inter_token_latency_seconds', '0.95'), 's')}"
            f"   e2e p95 {_fmt(g('e2e_request_latency_seconds', '0.95'), 's')}",
            f"  KV cache    usage {_fmt(g('kv_cache_usage_ratio'), '%')}   pressure {LEVELS.get(int(level), '?') if level is not None else '—'}"
            f"   waiting {_fmt(g('requests_waiting'), '', 0)} (for capacity {_fmt(g('requests_waiting_for_capacity'), '', 0)})"
            f"   preemptions {_fmt(g('preemptions_per_second'), '/s')}   full in {_fmt(g('kv_cache_seconds_to_full'), 's', 0)}",
            f"  prompts     long {_fmt(g('long_prompt_requests_per_second'), '/s')} ({_fmt(g('long_prompt_request_ratio'), '%')})"
            f"   length p95 {_fmt(g('prompt_length_tokens', '0.95'), ' tokens', 0)}   prefix-cache hits {_fmt(g('prefix_cache_hit_ratio'), '%')}",
            f"  SLO         TTFT within objective {_fmt(g('ttft_slo_attainment_ratio'), '%')}   speed within objective "
            f"{_fmt(g('itl_slo_attainment_ratio'), '%')}",
            f"  engine      stalled: {'YES' if stalled == 1 else 'no' if stalled is not None else '—'}",
        ]
        if gpu is not None and gpu.gpus:
            utils = " ".join(_fmt(x.utilization, "%") for x in gpu.gpus)
            power = sum(x.power_watts or 0 for x in gpu.gpus)
            temps = max(x.temperature_celsius or 0 for x in gpu.gpus)
            thr = any((x.throttle_reasons or 0) & 0x60 for x in gpu.gpus)
            lines.append(f"  GPUs        {len(gpu.gpus)} × util {utils}   power {power:.0f} W   hottest {temps:.0f}°C"
                         f"   thermal throttling {'YES' if thr else 'no'}")
        if alerts is not None:
            firing = sorted({a["labels"]["alertname"] for a in alerts if a["state"] == "firing"})
            pending = sorted({a["labels"]["alertname"] for a in alerts if a["state"] == "pending"})
            for a in firing:
                self.alerts_seen.setdefault(a, f"{elapsed:.0f}s")
            lines.append(f"  alerts      firing: {', '.join(firing) or 'none'}   pending: {', '.join(pending) or 'none'}"
                         f"   (Prometheus {urls.get('prometheus', '')})")
        return "\n".join(lines)

    def show(self, text: str) -> None:
        if self.tty:
            self.out.write("\x1b[H\x1b[2J" + text + "\n")
        else:
            self.out.write(text + "\n\n")
        self.out.flush()


def run_demo(scenario: str, duration: float, onset: Optional[float], listen: str, with_prometheus: bool,
             refresh: float, tty: bool, out: TextIO = sys.stdout) -> int:
    from .fakenvml import FakeNvml, make_gpus
    from .localstack import SidecarThread, Stack
    from .pageserver import PageServer
    from ..pack.rules import render_plain
    from ..slo import load_slo

    gpus = make_gpus(2)
    sim = SimVllm(scenario, gpus=gpus)
    sim.scenario.onset = 45.0 if onset is None else onset
    runner = SimRunner(sim).start()
    vllm = PageServer(sim.page).start()
    sidecar = SidecarThread({"vllm_url": vllm.url, "listen": listen, "poll_interval": 1, "window": 20,
                             "stall_seconds": 10, "baseline_min_seconds": 20, "gpu": "nvml",
                             "log_level": "warning"}, nvml=FakeNvml(gpus))
    sidecar.sidecar.baseline.spacing = 2.0  # learn within the demo's minutes
    urls = {"vllm": vllm.url + "/metrics", "sidecar": f"http://{sidecar.address}/metrics"}
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    view = View(out, tty)
    workdir = tempfile.mkdtemp(prefix="vllm-sidecar-demo-")
    stack: Optional[Stack] = None
    try:
        if with_prometheus:
            stack = Stack(Path(workdir))
            slo_path = Path(workdir) / "demo-slo.yaml"
            slo_path.write_text(resources.files("exporter.harness").joinpath("data", "demo-slo.yaml").read_text())
            rules_path = Path(workdir) / "vllm.rules.yml"
            rules_path.write_text(render_plain(load_slo(str(slo_path))))
            am_config = _alertmanager_example()
            if should_start_alertmanager(am_config):
                stack.start_alertmanager(am_config)
            labels = {"namespace": "demo", "pod": "vllm-demo-0"}
            stack.start_prometheus([{"job": "vllm", "address": f"127.0.0.1:{vllm.port}", "labels": labels},
                                    {"job": "vllm-sidecar", "address": sidecar.address, "labels": labels}],
                                   [rules_path], interval="2s")
            urls["prometheus"] = stack.prom_url
        start = time.monotonic()
        while not stop.is_set():
            elapsed = time.monotonic() - start
            alerts = None
            if stack is not None:
                try:
                    alerts = stack.alerts()
                except Exception:  # noqa: BLE001 - Prometheus busy: show the rest
                    alerts = []
            view.show(view.render(sim, sidecar.sidecar.published, elapsed, duration, urls, alerts))
            if duration and elapsed >= duration:
                break
            stop.wait(refresh)
    finally:
        if stack is not None:
            stack.close()
        sidecar.close()
        vllm.stop()
        runner.close()
        shutil.rmtree(workdir, ignore_errors=True)
    out.write("\nWhat the sidecar flagged (seconds after start; trouble began at "
              f"{sim.scenario.onset:.0f}s):\n")
    if view.first_seen:
        for what, t in sorted(view.first_seen.items(), key=lambda x: x[1]):
            out.write(f"  {t:5.0f}s  {what}\n")
    else:
        out.write("  nothing: a quiet run\n")
    if with_prometheus:
        out.write("Alerts that fired: " + (", ".join(f"{a} at {t}" for a, t in view.alerts_seen.items()) or "none") + "\n")
    out.flush()
    return 0


def should_start_alertmanager(config: Optional[Path], which=shutil.which) -> bool:
    """Alertmanager runs beside the demo's Prometheus when its example config exists and a binary
    is installed (Debian names it prometheus-alertmanager)."""
    return config is not None and bool(which("prometheus-alertmanager") or which("alertmanager"))


def _alertmanager_example() -> Optional[Path]:
    here = Path(__file__).resolve().parents[2] / "deploy" / "alertmanager" / "alertmanager.yml"
    return here if here.exists() else None
