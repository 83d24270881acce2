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
from typing import Dict, List, Optional, Sequence, TextIO

from ..view.console import Screen
from .simulate import SimRunner, SimVllm

# seconds before the scenario's trouble starts when --onset is not given: a short normal stretch
# (enough for the first rates and quantiles), then the trouble
DEFAULT_ONSET = 15.0


def run_demo(scenario: str, duration: float, onset: Optional[float], listen: str, with_prometheus: bool,
             refresh: float, tty: bool, out: TextIO = sys.stdout, until_fired: Sequence[str] = ()) -> int:
    """Run the demo for ``duration`` seconds (0: until a stop signal); with ``until_fired`` (and
    Prometheus) it also ends as soon as every alert named there has fired, so a script or a slow
    machine waits for what it came to see instead of a fixed time."""
    from ..pack.rules import render_plain
    from ..slo import load_slo
    from .fakenvml import FakeNvml, make_gpus
    from .localstack import SidecarThread, Stack
    from .pageserver import PageServer

    gpus = make_gpus(2)
    sim = SimVllm(scenario, gpus=gpus)
    sim.scenario.onset = DEFAULT_ONSET if onset is None else onset
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
    view = Screen(out, tty)
    alerts_seen: Dict[str, str] = {}
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
        elapsed = 0.0
        while not stop.is_set():
            elapsed = time.monotonic() - start
            alerts = None
            if stack is not None:
                try:
                    alerts = stack.alerts()
                except Exception:  # noqa: BLE001 - Prometheus busy: show the rest
                    alerts = []
            pub = sidecar.sidecar.published
            view.trouble(pub, elapsed)
            view.show(view.render(pub, header(sim, elapsed, duration, urls), alert_lines(alerts, alerts_seen, elapsed, urls)))
            if duration and elapsed >= duration:
                break
            if until_fired and all(a in alerts_seen for a in until_fired):
                break
            stop.wait(refresh)
    finally:
        if stack is not None:
            stack.close()
        sidecar.close()
        vllm.stop()
        runner.close()
        shutil.rmtree(workdir, ignore_errors=True)
    out.write("\n" + "\n".join(summary(sim.scenario.name, sim.scenario.onset, elapsed, view.first_seen,
                                        alerts_seen if with_prometheus else None)) + "\n")
    out.flush()
    return 0


def summary(scenario: str, onset: float, ran: float, flagged: Dict[str, float],
            alerts: Optional[Dict[str, str]]) -> List[str]:
    """What happened in the run, as it happened: whether the trouble began before the run ended,
    what the sidecar flagged and when (before or after the onset), and the alerts that fired."""
    items = sorted(flagged.items(), key=lambda x: x[1])
    lines: List[str] = []
    if scenario == "normal":
        lines.append(f"Scenario normal: no trouble was scheduled; the run lasted {ran:.0f}s.")
        lines += ["What the sidecar flagged on a normal day (seconds after start):"] + \
            [f"  {t:5.0f}s  {what}" for what, t in items] if items else ["The sidecar flagged nothing."]
    elif ran < onset:
        lines.append(f"Stopped at {ran:.0f}s, before the trouble began (onset {onset:.0f}s): "
                     f"the run saw only normal traffic.")
        lines += ["What the sidecar flagged anyway (seconds after start):"] + \
            [f"  {t:5.0f}s  {what}" for what, t in items] if items else ["The sidecar flagged nothing."]
    else:
        lines.append(f"The trouble ({scenario}) began at {onset:.0f}s; the run lasted {ran:.0f}s "
                     f"({ran - onset:.0f}s of it in trouble).")
        if items:
            lines.append("What the sidecar flagged (seconds after start):")
            for what, t in items:
                when = f"{t - onset:.0f}s after the onset" if t >= onset else "before the onset"
                lines.append(f"  {t:5.0f}s  {what}  ({when})")
        if not any(t >= onset for _, t in items):
            lines.append(f"Nothing was flagged after the onset ({ran - onset:.0f}s of trouble watched).")
    if alerts is not None:
        lines.append("Alerts that fired: " + (", ".join(f"{a} at {t}" for a, t in alerts.items()) or "none"))
    return lines


def header(sim: SimVllm, elapsed: float, duration: float, urls: Dict[str, str]) -> List[str]:
    width = 30
    frac = min(1.0, elapsed / duration) if duration else 0.0
    bar = "#" * int(frac * width) + "." * (width - int(frac * width))
    prog = f"[{bar}] {elapsed:4.0f}/{duration:.0f}s" if duration else f"{elapsed:4.0f}s (Ctrl-C to stop)"
    return [f"vllm-sidecar-exporter demo · scenario {sim.scenario.name}: {sim.scenario.doc}",
            f"{prog}   phase: {sim.phase()}   sidecar {urls['sidecar']}"]


def alert_lines(alerts: Optional[List[dict]], seen: Dict[str, str], elapsed: float, urls: Dict[str, str]) -> List[str]:
    if alerts is None:
        return []
    firing = sorted({a["labels"]["alertname"] for a in alerts if a["state"] == "firing"})
    pending = sorted({a["labels"]["alertname"] for a in alerts if a["state"] == "pending"})
    for a in firing:
        seen.setdefault(a, f"{elapsed:.0f}s")
    return [f"  alerts      firing: {', '.join(firing) or 'none'}   pending: {', '.join(pending) or 'none'}"
            f"   (Prometheus {urls.get('prometheus', '')})"]


def should_start_alertmanager(config: Optional[Path], which=shutil.which) -> bool:
    """Alertmanager runs beside the demo's Prometheus when its example config exists and a binary
    is installed (Debian names it prometheus-alertmanager)."""
    return config is not None and bool(which("prometheus-alertmanager") or which("alertmanager"))


def _alertmanager_example() -> Optional[Path]:
    here = Path(__file__).resolve().parents[2] / "deploy" / "alertmanager" / "alertmanager.yml"
    return here if here.exists() else None
