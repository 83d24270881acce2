"""A flight record of a simulated incident, made by the real sidecar on a fake clock: the
simulator (``simulate.SimVllm``) steps one poll interval at a time, the sidecar (with its flight
recorder) reads its page and the stand-in NVML, and the record comes out as ``/debug/flight``
serves it. Minutes of incident in seconds of CPU; for the postmortem's tests and docs."""

from __future__ import annotations

from typing import Callable, Optional, Tuple

from ..runtime import config
from ..runtime.flight import Recorder, openmetrics
from ..runtime.nvml import NvmlSource
from ..runtime.sidecar import Sidecar
from .fakenvml import FakeNvml, make_gpus
from .simulate import SimVllm


def simulated_record(scenario: str = "long-prompt-storm", seconds: float = 600.0, onset: float = 120.0,
                     poll: float = 1.0, t0: float = 1_800_000_000.0,
                     labels: Tuple[Tuple[str, str], ...] = (("namespace", "demo"), ("pod", "vllm-demo-0")),
                     on_poll: Optional[Callable] = None) -> Tuple[str, Recorder]:
    """The record's text and the recorder; ``on_poll(published)`` is called after every poll (what a
    live ``top`` showed then)."""
    gpus = make_gpus(2)
    sim = SimVllm(scenario, gpus=gpus)
    sim.scenario.onset = onset
    clock = [t0]
    cfg = config.build({"poll_interval": poll, "window": 20, "stall_seconds": 10, "baseline_min_seconds": 20,
                        "gpu": "nvml"}, {})
    rec = Recorder(minutes=seconds / 60 + 5)
    sc = Sidecar(cfg, sim.page, NvmlSource(FakeNvml(gpus)), clock=lambda: clock[0], recorder=rec)
    sc.baseline.spacing = 2.0
    for _ in range(int(seconds / poll)):
        sim.step(poll)
        pub = sc.poll_once()
        if on_poll is not None:
            on_poll(pub)
        clock[0] += poll
    blocks, _ = rec.snapshot()
    return "".join(openmetrics(blocks, labels=labels)), rec
