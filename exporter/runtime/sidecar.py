"""The poll loop: sources -> samples -> windows -> derived signals -> one published state.

``Sidecar.poll_once`` reads vLLM and the GPUs once, updates the windows and publishes a new
immutable ``Published`` object by swapping one reference; the collector only ever reads the
latest ``Published``, so a scrape never waits on vLLM or NVML. Polls run one after another on
one thread, so they never overlap; the clock is passed in.

A poll costs work in proportion to the page, never to the window: the reader parses only the
series the inputs route (cached per series text), the windows keep running totals
(``windows``), the GPU mean keeps a running sum and the learned baseline sorts once per new
sample.

No frozen or wrong number: any failure of a poll, whatever raised it, counts a reason in
``vllm_sidecar_poll_errors_total{target="vllm"}`` (the fetcher's reasons, or ``internal`` for
an exception inside the sidecar, its type logged once per change), sets
``target_up{target="vllm"}`` to 0 and publishes no derived series; after an internal failure
the windows start again from a clean state. Values that cannot be right never reach the windows
(``inputs``); a page from a second vLLM process behind the same URL is reported
(``vllm_sidecar_vllm_multiple_processes``), not counted as a restart.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Deque, Dict, Optional, Tuple

from .config import Config
from .exposition import MALFORMED_REASONS
from .fetch import REASONS as VLLM_REASONS
from .fetch import FetchError
from .gpu import GpuState, GpuUnavailable
from .inputs import INPUTS, Caps, Reader, Snapshot
from .logs import StateLog, summarize
from .rolling import Windows
from .signals import Baseline, Signals, counter_for, derive_view, learnable, tracker_for
from .state import Published

log = logging.getLogger("vllm_sidecar")

GPU_REASONS = ("nvml_init", "nvml", "gpu_lost")
# Failures of a poll that are not the fetcher's: an exception inside the sidecar.
SIDECAR_REASONS = ("internal",)
# Why samples were left out of a page: the caps on models, engines, extra label values.
CAP_REASONS = ("max_models", "max_engines", "max_label_values")
# What each reason of vllm_sidecar_role_conflict means, for the log line
_ROLE_WHY = {"no_kv_consumer": "no vllm:num_requests_kv_fetch_by_stage series (this vLLM is no KV consumer)",
             "receives_kv": "prompt tokens arrive by KV transfer (source external_kv_transfer)"}


@dataclass
class Counters:
    errors: Dict[Tuple[str, str], int] = field(default_factory=dict)
    malformed: Dict[str, int] = field(default_factory=lambda: {r: 0 for r in MALFORMED_REASONS})
    dropped: Dict[str, int] = field(default_factory=lambda: {r: 0 for r in CAP_REASONS})
    restarts: int = 0


class _Mean:
    """Mean of (t, value) over the last ``window`` seconds with a running sum."""

    def __init__(self, window: float) -> None:
        self.window = window
        self.points: Deque[Tuple[float, float]] = deque()
        self.total = 0.0
        self.pops = 0

    def add(self, t: float, v: float) -> None:
        self.points.append((t, v))
        self.total += v

    def mean(self, now: float) -> Optional[float]:
        pts = self.points
        while pts and pts[0][0] < now - self.window:
            self.total -= pts.popleft()[1]
            self.pops += 1
        if self.pops >= max(16, len(pts)):
            self.total = math.fsum(v for _, v in pts)  # now and then from scratch: no drift
            self.pops = 0
        if not pts:
            return None
        return self.total / len(pts)

    def clear(self) -> None:
        self.points.clear()
        self.total = 0.0


class Sidecar:
    def __init__(
        self,
        cfg: Config,
        fetch: Callable[[], str],
        gpu_source=None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        page_bytes: Callable[[], int] = lambda: 0,
        recorder=None,
    ) -> None:
        self.cfg = cfg
        self.fetch = fetch
        self.gpu_source = gpu_source
        self.clock = clock
        self.monotonic = monotonic
        self.page_bytes = page_bytes
        self.recorder = recorder  # flight.Recorder or None: every poll kept for /debug/flight
        self._rows = None  # the routed rows of the last page read, for the recorder
        self.retention = max(cfg.window, cfg.stall_seconds) + 3 * cfg.poll_interval
        self.caps = Caps(cfg.max_models, cfg.max_engines, cfg.max_label_values)
        self.reader = Reader(self.caps, memory=self.retention, http_handlers=cfg.http_handlers)
        self.windows = Windows(cfg.window, self.retention, cfg.poll_interval)
        self.baseline = Baseline(horizon=cfg.baseline_horizon, spacing=max(cfg.poll_interval, 10.0))
        self.util = _Mean(cfg.window)
        self.capacity = tracker_for(cfg)
        self.counted = counter_for(cfg)  # the availability SLI's counters: kept through failures
        self.counters = Counters()
        # known failure reasons start at 0, so rate() and increase() see the first failure
        for reason in (*VLLM_REASONS, *SIDECAR_REASONS):
            self.counters.errors[("vllm", reason)] = 0
        if gpu_source is not None:
            for reason in getattr(gpu_source, "reasons", GPU_REASONS):
                self.counters.errors[("gpu", reason)] = 0
        self.up: Dict[str, bool] = {}
        self.last_success: Dict[str, float] = {}
        self.last_gpu: Optional[GpuState] = None
        self.last_missing: Tuple[Tuple[str, bool], ...] = ()
        self.last_resolved: Tuple[Tuple[str, str], ...] = ()
        self.last_capped: Tuple[Tuple[str, int], ...] = ()
        self.poll_seconds: Dict[str, float] = {}
        self.states = StateLog(log)
        self.heartbeat = monotonic()
        self._published = Published(t=clock())
        self.polls = 0
        self.recorder_lock = threading.Lock()  # the poll thread records, the listener reads

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
        """Read and sort one vLLM page; None when it failed (counted). Exceptions other than the
        fetcher's are the caller's to count (``internal``)."""
        t0 = self.monotonic()
        try:
            text = self.fetch()
        except FetchError as exc:
            self._error("vllm", exc.reason, exc.message)
            return None
        finally:
            self.poll_seconds["vllm"] = self.monotonic() - t0
        if isinstance(text, (bytes, bytearray)):
            text = bytes(text).decode("utf-8", errors="replace")
        page, snap = self.reader.read(text, now)
        self._rows = page.selected
        bad = dict(page.reasons)
        for reason, n in snap.rejected.items():
            bad[reason] = bad.get(reason, 0) + n
        for reason, n in bad.items():
            self.counters.malformed[reason] = self.counters.malformed.get(reason, 0) + n
        first = page.first_error or snap.rejected_detail
        self.states.change(("malformed",), tuple(sorted(bad)), logging.WARNING if bad else logging.INFO,
                           (f"vLLM page has lines left out ({', '.join(f'{r}: {n}' for r, n in sorted(bad.items()))}); "
                            f"first: {first}") if bad else "vLLM page read without a bad line",
                           quiet_first=True)
        for reason, n in snap.dropped.items():
            self.counters.dropped[reason] = self.counters.dropped.get(reason, 0) + n
        self.last_capped = tuple(sorted((r, len(v)) for r, v in snap.dropped_names.items()))
        self.states.change(("capped",), tuple(sorted(snap.dropped_names.items())),
                           logging.WARNING if snap.dropped_names else logging.INFO,
                           ("vLLM page over the sidecar's caps, left out: " + "; ".join(
                               f"{r} ({getattr(self.caps, r)}): {summarize(v)}" for r, v in sorted(snap.dropped_names.items())))
                           if snap.dropped_names else "vLLM page within the caps again", quiet_first=True)
        if snap.vllm_samples == 0:
            what = "no vllm: metrics" if (page.lines - page.malformed) > 0 else "nothing readable"
            self._error("vllm", "parse", f"the page has {what} ({len(text)} characters, "
                                         f"{page.malformed} unreadable lines)")
            return None
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
        for reason, _message in state.errors:
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

    def _internal(self, exc: BaseException) -> None:
        """A failure inside the sidecar: counted and shown like any failed read; the windows
        start again from a clean state, so nothing half-updated is ever derived from."""
        name = type(exc).__name__
        if self.states.note(("internal",), name):
            log.error("poll failed inside the sidecar (%s: %s); vLLM shown down until a poll succeeds",
                      name, str(exc)[:200], exc_info=exc)
        self._error("vllm", "internal", f"{name} inside the sidecar")
        self.windows.reset()
        self.capacity.reset()
        self.reader = Reader(self.caps, memory=self.retention, http_handlers=self.cfg.http_handlers)
        self.util.clear()

    def _take(self, snap: Snapshot, now: float) -> None:
        """Feed the windows with a good snapshot and note what changed."""
        result = self.windows.add(snap)
        self.capacity.observe(snap)
        self.counted.observe(self.windows, snap.models)
        if result.rejected:
            self.counters.malformed["invalid_value"] = self.counters.malformed.get("invalid_value", 0) + result.rejected
        if result.restart:
            self.counters.restarts += 1
            log.info("vLLM restarted (process start time changed); counters continue from zero")
        multiple = self.windows.multiple_processes(now)
        self.states.change(("multiple",), multiple, logging.WARNING if multiple else logging.INFO,
                           "two servers behind one URL: pages alternate between vLLM processes with different "
                           "start times (a Service, not the pod); point the sidecar at the pod's own port"
                           if multiple else "one vLLM process behind the URL again", quiet_first=True)
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

    def poll_once(self) -> Published:
        now = self.clock()
        self.heartbeat = self.monotonic()
        snap = None
        self._rows = None
        try:
            snap = self.poll_vllm(now)
            if snap is not None:
                self._take(snap, now)
        except Exception as exc:  # noqa: BLE001 - whatever it is, it is counted and shown
            self._internal(exc)
            snap = None
        gpu = self.poll_gpu(now)
        if gpu is not None:
            self.last_gpu = gpu
            util = gpu.mean_utilization()
            if util is not None:
                self.util.add(now, util)
        elif self.gpu_source is not None:
            self.last_gpu = None
        mean_util = self.util.mean(now)

        signals = Signals()
        if snap is not None:
            try:
                signals = derive_view(self.windows.view(now), self.cfg, mean_util, self.baseline, self.capacity,
                                      self.counted)
                self._learn(signals, now)
                self._say_role(signals)
                self._ok("vllm", now)
            except Exception as exc:  # noqa: BLE001
                self._internal(exc)
                snap = None
                signals = Signals()
        self.heartbeat = self.monotonic()
        self.polls += 1
        up = self.up.get("vllm")
        pub = Published(
            t=now,
            signals=signals,
            up=tuple(sorted(self.up.items())),
            last_success=tuple(sorted(self.last_success.items())),
            errors_total=tuple(sorted(self.counters.errors.items())),
            input_missing=self.last_missing if up else (),
            input_resolved=self.last_resolved if up else (),
            gpu=self.last_gpu,
            malformed_lines_total=sum(self.counters.malformed.values()),
            malformed_by_reason=tuple(sorted(self.counters.malformed.items())),
            dropped_by_reason=tuple(sorted(self.counters.dropped.items())),
            capped_now=self.last_capped if up else (),
            vllm_restarts_total=self.counters.restarts,
            vllm_multiple_processes=self.windows.multiple_processes(now) if up else None,
            poll_seconds=tuple(sorted(self.poll_seconds.items())),
            page_bytes=self.page_bytes() if snap is not None else 0,
            gpu_source=getattr(self.gpu_source, "kind", ""),
            flight_events_total=tuple(sorted(self.recorder.events_total.items())) if self.recorder else (),
        )
        self._published = pub
        if self.recorder is not None:
            self._record(now, self._rows if snap is not None else None, pub)
        return pub

    def _record(self, now: float, rows, pub: Published) -> None:
        """Keep the poll in the flight recorder; a failure there never fails the poll."""
        try:
            with self.recorder_lock:
                self.recorder.record(now, rows, pub)
        except Exception as exc:  # noqa: BLE001 - logged once per kind, the poll goes on
            name = type(exc).__name__
            if self.states.note(("flight",), name):  # said once per kind, with its traceback
                log.error("flight recorder failed (%s: %s); polls go on", name, str(exc)[:200], exc_info=exc)

    def _learn(self, signals: Signals, now: float) -> None:
        """Feed the baseline with busy-time throughput of the replica's work, never from a poll
        the sidecar reports as degraded (``signals.learnable``: KV pressure, requests held back,
        a long-prompt surge, stalled, sleeping, flagged), nor while two vLLM processes answer one
        URL (their rates are not this pod's)."""
        if self.polls % 64 == 0:
            self.baseline.forget_old(now, self.cfg.max_models)
        util = signals.gpu_mean_utilization
        if util is None or util < self.cfg.busy_utilization or self.windows.multiple_processes(now):
            return
        for m in signals.models:
            rate = learnable(m, util, self.cfg.busy_utilization, self.cfg.role, self.cfg.long_prompt_surge_per_second)
            if rate is not None:
                self.baseline.record(m.model, now, rate)

    def _say_role(self, signals: Signals) -> None:
        """One line when vLLM's page starts or stops contradicting the role given."""
        why = signals.role_conflicts
        role = self.cfg.role
        self.states.change(("role",), why, logging.WARNING if why else logging.INFO,
                           (f"vLLM's page contradicts role {role}: " + ", ".join(_ROLE_WHY.get(r, r) for r in why))
                           if why else f"vLLM's page agrees with role {role}", quiet_first=True, role=role)

    # -- the loop --------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Poll every ``poll_interval`` until ``stop`` is set; a slow poll delays the next."""
        next_at = self.monotonic()
        while not stop.is_set():
            try:
                self.poll_once()
            except Exception:  # poll_once counts its own failures; this is the last resort
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
