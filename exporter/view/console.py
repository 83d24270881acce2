"""The live terminal view of one sidecar's signals: what the demo shows and what ``top`` shows
for a real vLLM. It reads the typed ``Published`` state, never metric names.

``Screen.render(pub, header, footer)`` returns the text of one screen; ``Screen.show`` redraws it on
a terminal or, in a plain pipe, prints one block after another (no escape codes). ``Screen.note``
keeps the first time each kind of trouble was seen, for the summary at the end.

``top`` feeds the same view from one of two sources, each giving a ``Published`` state:

- ``InProcessSidecar``: the sidecar itself (``app.run_sidecar``, the same wiring and flags)
  polling vLLM in a thread of this process;
- ``ScrapedSidecar``: a running sidecar's ``/metrics``, read back into a ``Published`` state by
  ``collectors.readback.published_from_exposition`` (the inverse of the collectors, field by field).

``run_top`` shows one screen per refresh until stopped, or one screen with ``once``.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, TextIO, Tuple

from ..runtime.collectors import PREFIX
from ..runtime.collectors.readback import published_from_exposition
from ..runtime.signals import Distribution, KvTransfer, Lora, ModelSignals
from ..runtime.state import Published

LEVELS = {0: "ok", 1: "elevated", 2: "saturated", 3: "thrashing"}
SLEEP = {1: "weights offloaded", 2: "weights and KV cache discarded"}
CAUSES = {"kv_usage": "cache full", "kv_batch": "batch below its ceiling, prompts do not fit",
          "batch_full": "batch at its ceiling"}


def fmt(v: Optional[float], unit: str = "", digits: int = 2) -> str:
    if v is None:
        return "—"
    if unit == "s":
        return f"{v * 1000:.0f}ms" if v < 1 else f"{v:.{digits}f}s"
    if unit == "%":
        return f"{v * 100:.0f}%"
    if abs(v) >= 100:
        return f"{v:,.0f}{unit}"
    return f"{v:.{digits}f}{unit}"


def _q(d: Optional[Distribution], q: float) -> Optional[float]:
    return d.at(q) if d is not None else None


def _yes(flag: Optional[bool]) -> str:
    return "—" if flag is None else ("YES" if flag else "no")


class Screen:
    """What the terminal shows, built from the sidecar's latest published state."""

    def __init__(self, out: TextIO, tty: bool) -> None:
        self.out = out
        self.tty = tty
        self.first_seen: Dict[str, float] = {}

    def note(self, what: str, elapsed: float) -> None:
        self.first_seen.setdefault(what, elapsed)

    def trouble(self, pub: Published, elapsed: float, long_prompt_rate: float = 0.05) -> None:
        """Remember when each kind of trouble was first seen."""
        up = dict(pub.up)
        for m in pub.signals.models:
            if m.sleeping:
                self.note("engine sleeping", elapsed)
            if m.busy_low is not None and m.busy_low.flagged:
                self.note("GPU busy, tokens low", elapsed)
            if m.stalled:
                self.note("engine stalled", elapsed)
            if m.kv.pressure_level is not None and m.kv.pressure_level >= 2:
                self.note(f"KV pressure {LEVELS[m.kv.pressure_level]}", elapsed)
            if (m.prompts.long_per_second or 0) > long_prompt_rate:
                self.note("long-prompt surge", elapsed)
        if pub.signals.role_conflicts:
            self.note("page contradicts the role", elapsed)
        if up.get("vllm") is False:
            self.note("vLLM unreachable", elapsed)
        if pub.vllm_restarts_total:
            self.note("vLLM restart seen", elapsed)

    def model_lines(self, m: ModelSignals) -> List[str]:
        tp, kv, lat, pr = m.throughput, m.kv, m.latency, m.prompts
        level = kv.pressure_level
        bl = m.busy_low
        # a sleeping engine is neither idle capacity nor "GPU busy, tokens low": it sleeps
        verdict = "— (sleeping)" if m.sleeping else _yes(bl.flagged if bl else None)
        lines = [
            f"  model       {m.model}",
            f"  throughput  {fmt(tp.generation_tokens_per_second, ' tok/s', 0)} out   "
            f"{fmt(tp.prompt_tokens_per_second, ' tok/s', 0)} in   baseline {fmt(bl.baseline if bl else None, ' tok/s', 0)}"
            f"   GPU busy + tokens low: {verdict}",
            f"  latency     TTFT p50 {fmt(_q(lat.ttft, 0.5), 's')} p95 {fmt(_q(lat.ttft, 0.95), 's')} "
            f"p99 {fmt(_q(lat.ttft, 0.99), 's')}   ITL p95 {fmt(_q(lat.itl, 0.95), 's')}"
            f"   e2e p95 {fmt(_q(lat.e2e, 0.95), 's')}",
            f"  KV cache    usage {fmt(kv.usage, '%')}   pressure {LEVELS.get(level, '?') if level is not None else '—'}"
            f"   waiting {fmt(kv.waiting, '', 0)} (for KV {fmt(kv.waiting_for_capacity, '', 0)}"
            f"{', ' + CAUSES.get(kv.wait_cause, kv.wait_cause) if kv.wait_cause not in (None, 'none') else ''})"
            f"   preemptions {fmt(tp.preemptions_per_second, '/s')}   full in {fmt(kv.seconds_to_full, 's', 0)}",
            f"  prompts     long {fmt(pr.long_per_second, '/s')} ({fmt(pr.long_ratio, '%')})"
            f"   length p95 {fmt(_q(pr.length, 0.95), ' tokens', 0)}"
            f"   prefix-cache hits {fmt(m.caches.prefix_cache_hit_ratio, '%')}",
            f"  SLO         TTFT within objective {fmt(lat.ttft_slo_attainment, '%')}   speed within objective "
            f"{fmt(lat.itl_slo_attainment, '%')}   errors {fmt(tp.error_ratio, '%')}",
            "  engine      " + (f"SLEEPING (level {m.sleep_level}: {SLEEP.get(m.sleep_level, '?')}; not spare "
                                 f"capacity, not stalled)" if m.sleeping else f"stalled: {_yes(m.stalled)}"),
        ]
        return lines + self.extra_lines(m)

    @staticmethod
    def extra_lines(m: ModelSignals) -> List[str]:
        """KV transfer and speculative decoding, only where vLLM serves them."""
        out = []
        x, c = m.kv_transfer, m.caches
        if x != KvTransfer():
            fetch = sum(x.waiting_fetch.values()) if x.waiting_fetch else None
            out.append(f"  KV transfer failed {fmt(x.failure_ratio, '%')}   p95 {fmt(_q(x.transfer_seconds, 0.95), 's')}"
                       f"   {fmt(x.transfers_per_second, '/s')}   waiting on fetch {fmt(fetch, '', 0)}"
                       f"   prompt tokens by transfer {fmt(x.prompt_tokens_transferred_ratio, '%')}"
                       f"   expired {fmt(x.expired_per_second, '/s')}")
        if c.spec_decode_acceptance_ratio is not None or c.spec_decode_mean_accepted_length is not None:
            out.append(f"  speculative acceptance {fmt(c.spec_decode_acceptance_ratio, '%')}"
                       f"   mean accepted length {fmt(c.spec_decode_mean_accepted_length)}")
        return out

    @staticmethod
    def lora_lines(lo: Lora) -> List[str]:
        """The adapters with requests now (vLLM says which, not how many), known and max_lora."""
        def names(flag: str) -> str:
            got = [a.name for a in lo.adapters if getattr(a, flag)]
            return ", ".join(got) if got else "none"

        slots = lo.max_adapters if lo.max_adapters is not None else "?"
        line = (f"  LoRA        {lo.active} of {lo.known} known adapters with requests (max {slots} per batch): "
                f"{names('active')}")
        if lo.distinguished:
            line += f"   running: {names('running')}   waiting: {names('waiting')}"
        return [line]

    def render(self, pub: Published, header: Sequence[str] = (), footer: Sequence[str] = ()) -> str:
        up = dict(pub.up)
        lines = list(header)
        sig = pub.signals
        role = f"   role {sig.role}" if sig.role and sig.role != "both" else ""
        if sig.role_conflicts:
            role += f" (the page contradicts it: {', '.join(sig.role_conflicts)})"
        lines.append(f"  vLLM        {'up' if up.get('vllm') else 'DOWN'}   restarts seen {pub.vllm_restarts_total}{role}")
        if not pub.signals.models:
            lines.append("  (no signals yet: rates and quantiles need two reads)")
        for m in pub.signals.models:
            lines += self.model_lines(m)
        if pub.signals.lora is not None:
            lines += self.lora_lines(pub.signals.lora)
        gpu = pub.gpu
        if gpu is not None and gpu.gpus:
            utils = " ".join(fmt(x.utilization, "%") for x in gpu.gpus)
            power = sum(x.power_watts or 0 for x in gpu.gpus)
            temps = max(x.temperature_celsius or 0 for x in gpu.gpus)
            thr = any((x.throttle_reasons or 0) & 0x60 for x in gpu.gpus)
            lines.append(f"  GPUs        {len(gpu.gpus)} × util {utils}   power {power:.0f} W   hottest {temps:.0f}°C"
                         f"   thermal throttling {'YES' if thr else 'no'}")
        lines += footer
        return "\n".join(lines)

    def show(self, text: str) -> None:
        if self.tty:
            self.out.write("\x1b[H\x1b[2J" + text + "\n")
        else:
            self.out.write(text + "\n\n")
        self.out.flush()


# -- top: the view of a real vLLM -------------------------------------------------------------------

class StartFailed(Exception):
    """The in-process sidecar did not start: ``rc`` its exit status; ``message`` empty when
    ``run_sidecar`` already said why in one line."""

    def __init__(self, rc: int, message: str) -> None:
        super().__init__(message)
        self.rc = rc
        self.message = message


class InProcessSidecar:
    """The sidecar (``app.run_sidecar``: its fetcher, GPU source, poll loop and /metrics server,
    configured by the same flags) in a thread of this process; ``read`` gives its latest state."""

    def __init__(self, cfg, env: Mapping[str, str], nvml=None, ready_timeout: float = 10.0) -> None:
        from ..runtime.app import run_sidecar

        self.cfg = cfg
        self.stop_event = threading.Event()
        self.ready: Dict[str, Any] = {}
        self.rc: List[int] = []

        def target() -> None:
            self.rc.append(run_sidecar(cfg, env, stop=self.stop_event, nvml=nvml,
                                       on_ready=lambda srv, sc: self.ready.update(server=srv, sidecar=sc)))

        self.thread = threading.Thread(target=target, name="sidecar", daemon=True)
        self.thread.start()
        end = time.monotonic() + ready_timeout
        while "sidecar" not in self.ready and not self.rc and time.monotonic() < end:
            time.sleep(0.02)
        if "sidecar" not in self.ready:
            self.stop_event.set()
            raise StartFailed(self.rc[0] if self.rc else 1,
                              "" if self.rc else f"the sidecar did not start within {ready_timeout:g}s")
        host, port = self.ready["server"].address
        self.metrics_address = f"http://{host}:{port}/metrics"

    @property
    def sidecar(self):
        return self.ready["sidecar"]

    def describe(self) -> str:
        from ..runtime.config import redact_url

        return (f"vLLM {redact_url(self.cfg.metrics_url)} · sidecar in this process (poll {self.cfg.poll_interval:g}s, "
                f"window {self.cfg.window:g}s), serving {self.metrics_address}")

    def wait_for_signals(self, timeout: Optional[float] = None) -> None:
        """Until two reads made the derived signals (or a read failed), for a single screen."""
        if timeout is None:
            timeout = 3 * self.cfg.poll_interval + 2 * self.cfg.vllm_timeout + 5
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            sc = self.sidecar
            pub = sc.published
            if sc.polls >= 1 and dict(pub.up).get("vllm") is False:
                return
            if sc.polls >= 2 and pub.signals.models:
                return
            time.sleep(0.05)

    def read(self) -> Tuple[Optional[Published], Optional[str]]:
        pub = self.sidecar.published
        if self.sidecar.polls == 0:
            return None, None
        if dict(pub.up).get("vllm") is False:
            return pub, self._last_vllm_error()
        return pub, None

    def _last_vllm_error(self) -> str:
        """The failure reason whose count rose last (``vllm_sidecar_poll_errors_total``)."""
        from ..runtime.config import redact_url

        counts = {r: n for (t, r), n in self.sidecar.published.errors_total if t == "vllm"}
        prev = getattr(self, "_prev_counts", {})
        rose = [r for r, n in counts.items() if n > prev.get(r, 0)]
        self._prev_counts = counts
        if rose:
            self._why = rose[0]
        why = getattr(self, "_why", None) or max(counts, key=counts.get, default="unreachable")
        return f"cannot read vLLM at {redact_url(self.cfg.metrics_url)}: {why}"

    def close(self) -> None:
        self.stop_event.set()
        self.thread.join(3)


class ScrapedSidecar:
    """A running sidecar's /metrics, read back into its ``Published`` state on every ``read``."""

    def __init__(self, url: str, timeout: float = 5.0, max_bytes: int = 16 * 1024 * 1024) -> None:
        from ..runtime.config import metrics_url
        from ..runtime.fetch import PageFetcher

        self.url = metrics_url(url)
        self.fetcher = PageFetcher(self.url, timeout, max_bytes)
        self.last: Optional[Published] = None

    def describe(self) -> str:
        return f"sidecar {self.fetcher.safe_url}"

    def wait_for_signals(self, timeout: Optional[float] = None) -> None:
        return None

    def read(self) -> Tuple[Optional[Published], Optional[str]]:
        from ..runtime.fetch import FetchError

        try:
            text = self.fetcher.fetch()
        except FetchError as exc:
            return self.last, f"cannot read the sidecar: {exc.message}"
        if PREFIX + "build_info" not in text:
            return self.last, f"cannot read the sidecar: {self.fetcher.safe_url} has no {PREFIX}build_info (not a sidecar?)"
        self.last = published_from_exposition(text, time.time())
        return self.last, None

    def close(self) -> None:
        self.fetcher.close()


def flagged_lines(first_seen: Mapping[str, float], start_wall: float) -> List[str]:
    if not first_seen:
        return ["  flagged     nothing so far"]
    items = sorted(first_seen.items(), key=lambda x: x[1])
    return ["  flagged     " + "   ".join(f"{what} (first at {time.strftime('%H:%M:%S', time.localtime(start_wall + t))})"
                                        for what, t in items)]


def run_top(source, out: TextIO, tty: bool, refresh: float, once: bool,
            stop: Optional[threading.Event] = None, clock: Callable[[], float] = time.monotonic) -> Optional[str]:
    """Show ``source``'s state every ``refresh`` seconds until ``stop`` is set (or once). Returns
    None, or with ``once`` the error when what ``source`` reads could not be read (it is on the
    screen too)."""
    stop = stop or threading.Event()
    view = Screen(out, tty and not once)
    start, start_wall = clock(), time.time()
    err: Optional[str] = None
    if once:
        source.wait_for_signals()
    while True:
        pub, err = source.read()
        elapsed = clock() - start
        head = [f"vllm-sidecar-exporter top · {source.describe()}",
                f"{time.strftime('%H:%M:%S')}   watching {elapsed:.0f}s" + ("" if once else f"   every {refresh:g}s")
                + ("" if once or not tty else "   (Ctrl-C to stop)")]
        if err:
            head.append(f"  ERROR       {err}")
        if pub is None:
            view.show("\n".join(head + ["  (no reading yet)"]))
        else:
            view.trouble(pub, elapsed)
            view.show(view.render(pub, head, flagged_lines(view.first_seen, start_wall)))
        if once or stop.wait(refresh):
            break
    return err if once else None
