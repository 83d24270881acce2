"""The poll loop: sources -> samples -> windows -> derived signals -> one published state.

``Sidecar.poll_once`` reads vLLM and the GPUs once, updates the windows and publishes a new
immutable ``Published`` object by swapping one reference; the collector only ever reads the
latest ``Published``, so a scrape never waits on vLLM or NVML. Polls run one after another on
one thread, so they never overlap; the clock is passed in.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

from .config import Config
from .fetch import REASONS as VLLM_REASONS, FetchError
from .gpu import GpuState, GpuUnavailable
from .inputs import INPUTS, Snapshot, normalize
from .logs import StateLog, summarize
from .parser import Parser
from .signals import Baseline, Signals, derive
from .state import Published
from .windows import History, restarted

log = logging.getLogger("vllm_sidecar")

GPU_REASONS = ("nvml_init", "nvml", "gpu_lost")


@dataclass
class Counters:
    errors: Dict[Tuple[str, str], int] = field(default_factory=dict)
    malformed: int = 0
    restarts: int = 0


class Sidecar:
    def __init__(
        self,
        cfg: Config,
        fetch: Callable[[], str],
        gpu_source=None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        page_bytes: Callable[[], int] = lambda: 0,
    ) -> None:
        self.cfg = cfg
        self.fetch = fetch
        self.gpu_source = gpu_source
        self.clock = clock
        self.monotonic = monotonic
        self.page_bytes = page_bytes
        self.parser = Parser()
        retention = max(cfg.window, cfg.stall_seconds) + 3 * cfg.poll_interval
        self.history = History(retention)
        self.baseline = Baseline(horizon=cfg.baseline_horizon, spacing=max(cfg.poll_interval, 10.0))
        self.util_history: List[Tuple[float, float]] = []
        self.counters = Counters()
        # known failure reasons start at 0, so rate() and increase() see the first failure
        for reason in VLLM_REASONS:
            self.counters.errors[("vllm", reason)] = 0
        if gpu_source is not None:
            for reason in getattr(gpu_source, "reasons", GPU_REASONS):
                self.counters.errors[("gpu", reason)] = 0
        self.up: Dict[str, bool] = {}
        self.last_success: Dict[str, float] = {}
        self.last_gpu: Optional[GpuState] = None
        self.last_missing: Tuple[Tuple[str, bool], ...] = ()
        self.last_resolved: Tuple[Tuple[str, str], ...] = ()
        self.poll_seconds: Dict[str, float] = {}
        self.states = StateLog(log)
        self.heartbeat = monotonic()
        self._published = Published(t=clock())
        self.polls = 0

    # -- state -----------------------------------------------------------------------------
    @property
    def published(self) -> Published:
        return self._published

    def _error(self, target: str, reason: str, message: str) -> None:
        key = (target, reason)
        self.counters.errors[key] = self.counters.errors.get(key, 0) + 1
        was_up = self.up.get(target)
        self.up[target] = False
        # one line per change of state: going down, or a new reason while down
        msg = f"{target} unreachable: {message}" if was_up is not False else \
            f"{target} still unreachable, now {reason}: {message}"
        self.states.change(("up", target), ("down", reason), logging.WARNING, msg, target=target, reason=reason)

    def _ok(self, target: str, now: float) -> None:
        self.last_success[target] = now
        if self.up.get(target) is not True:
            self.states.change(("up", target), ("up",), logging.INFO, f"{target} reachable", target=target)
        self.up[target] = True

    # -- one poll --------------------------------------------------------------------------
    def poll_vllm(self, now: float) -> Optional[Snapshot]:
        t0 = self.monotonic()
        try:
            text = self.fetch()
        except FetchError as exc:
            self._error("vllm", exc.reason, exc.message)
            return None
        finally:
            self.poll_seconds["vllm"] = self.monotonic() - t0
        page = self.parser.parse(text)
        self.counters.malformed += page.malformed
        if page.malformed:
            self.states.change(("malformed",), page.first_error, logging.WARNING,
                               f"vLLM page has {page.malformed} unreadable lines; first: {page.first_error}")
        snap = normalize(page, now)
        if snap.vllm_samples == 0:
            what = "no vllm: metrics" if page.samples else "nothing readable"
            self._error("vllm", "parse", f"the page has {what} ({len(text)} bytes, "
                                         f"{page.malformed} unreadable lines)")
            return None
        self._ok("vllm", now)
        return snap

    def poll_gpu(self, now: float) -> Optional[GpuState]:
        if self.gpu_source is None:
            return None
        t0 = self.monotonic()
        try:
            state = self.gpu_source.read()
        except GpuUnavailable as exc:
            self._error("gpu", exc.reason, str(exc))
            return None
        except Exception as exc:  # an NVML error outside a single GPU (events, init)
            self._error("gpu", "nvml", f"NVML read failed: {exc}")
            return None
        finally:
            self.poll_seconds["gpu"] = self.monotonic() - t0
        for reason, message in state.errors:
            key = ("gpu", reason)
            self.counters.errors[key] = self.counters.errors.get(key, 0) + 1
        failing = tuple(sorted(m for _, m in state.errors))
        self.states.change(("gpu_errors",), failing, logging.WARNING if failing else logging.INFO,
                           ("GPU read problems: " + "; ".join(failing)) if failing else "all GPUs read again",
                           quiet_first=True)
        if state.ok:
            self._ok("gpu", now)
        else:
            self.up["gpu"] = False
            if state.gpus:
                # some GPUs still answer: their series stay, the target shows the failure
                self.last_success["gpu"] = now
        return state

    def poll_once(self) -> Published:
        now = self.clock()
        self.heartbeat = self.monotonic()
        snap = self.poll_vllm(now)
        if snap is not None:
            prev = self.history.latest()
            if prev is not None and restarted(prev, snap):
                self.counters.restarts += 1
                log.info("vLLM restarted (process start time changed); counters continue from zero")
            self.history.add(snap)
            missing = set(snap.missing_required())
            self.last_missing = tuple(sorted(
                (i.names[0], i.names[0] in missing) for i in INPUTS if i.required))
            self.last_resolved = tuple(sorted(snap.resolved.items()))
            self.states.change(("missing",), tuple(sorted(missing)),
                               logging.WARNING if missing else logging.INFO,
                               ("vLLM inputs missing under every known name: " + ", ".join(sorted(missing)))
                               if missing else "every required vLLM input present", quiet_first=True)
            self.states.change(("models",), tuple(sorted(snap.models)), logging.INFO,
                               "models served: " + summarize(sorted(snap.models)))
        gpu = self.poll_gpu(now)
        if gpu is not None:
            self.last_gpu = gpu
            util = gpu.mean_utilization()
            if util is not None:
                self.util_history.append((now, util))
        elif self.gpu_source is not None:
            self.last_gpu = None
        horizon = now - max(self.cfg.window, 1.0) - self.cfg.poll_interval
        self.util_history = [p for p in self.util_history if p[0] >= horizon]

        signals = Signals()
        if snap is not None:
            window = self.history.window(now, self.cfg.window)
            stall = self.history.window(now, self.history.retention)
            signals = derive(window, stall, now, self.cfg, self.util_history, self.baseline)
            self._learn(signals, now)
        self.heartbeat = self.monotonic()
        self.polls += 1
        pub = Published(
            t=now,
            signals=signals,
            up=tuple(sorted(self.up.items())),
            last_success=tuple(sorted(self.last_success.items())),
            errors_total=tuple(sorted(self.counters.errors.items())),
            input_missing=self.last_missing if self.up.get("vllm") else (),
            input_resolved=self.last_resolved if self.up.get("vllm") else (),
            gpu=self.last_gpu,
            malformed_lines_total=self.counters.malformed,
            vllm_restarts_total=self.counters.restarts,
            poll_seconds=tuple(sorted(self.poll_seconds.items())),
            page_bytes=self.page_bytes() if snap is not None else 0,
            gpu_source=getattr(self.gpu_source, "kind", ""),
        )
        self._published = pub
        return pub

    def _learn(self, signals: Signals, now: float) -> None:
        """Feed the baseline with busy-time throughput, never with flagged (bad) samples."""
        util = signals.gpu_mean_utilization
        if util is None or util < self.cfg.busy_utilization:
            return
        for m in signals.models:
            gen = m.throughput.generation_tokens_per_second
            if gen is not None and not (m.busy_low and m.busy_low.flagged):
                self.baseline.record(m.model, now, gen)

    # -- the loop --------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Poll every ``poll_interval`` until ``stop`` is set; a slow poll delays the next."""
        next_at = self.monotonic()
        while not stop.is_set():
            try:
                self.poll_once()
            except Exception:  # a bug must not kill the loop: say it, keep serving
                log.exception("poll failed unexpectedly")
                self.heartbeat = self.monotonic()
            next_at += self.cfg.poll_interval
            delay = next_at - self.monotonic()
            if delay < 0:  # fell behind: start again from now instead of bursting
                next_at = self.monotonic()
                delay = 0
            stop.wait(delay)

    def healthy(self) -> bool:
        """The loop is alive: it made progress recently enough."""
        limit = self.cfg.poll_interval + 2 * self.cfg.vllm_timeout + 10.0
        return self.monotonic() - self.heartbeat <= limit
