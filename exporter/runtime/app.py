"""Wiring one sidecar together: the sources its configuration asks for, the poll loop, the
server, and the signals. ``run_sidecar`` is what ``vllm-sidecar-exporter`` runs; the demo and
the tests run the same function in a thread (then no signal is handled: the caller stops it).

Signals, as a daemon handles them (each logged in one line naming it; nothing dies silently):

- SIGTERM, SIGINT, SIGQUIT: stop cleanly (the server closes, the poll loop ends), exit 0;
- SIGHUP: re-read the bearer token file now (it is also re-read whenever it changes); the
  rest of the configuration is not reloaded: restart to change it;
- SIGUSR1, SIGUSR2, SIGPIPE: ignored. SIGPIPE comes from a write to a connection the peer
  closed, which fails with EPIPE and is handled where it happens. Each logged once, then at
  most once a minute with how many came in between.

A handler only queues the signal; the main thread logs and acts on it.
"""

from __future__ import annotations

import logging
import queue
import signal
import sys
import threading
import time
from typing import Dict, Mapping, Optional

from .. import __version__
from ..errors import ConfigError
from .config import Config
from .fetch import PageFetcher
from .logs import add_secret, setup
from .server import SidecarServer
from .sidecar import Sidecar
from .webconfig import WebConfigWatcher

PROG = "vllm-sidecar-exporter"


def make_gpu_source(cfg: Config, env: Mapping[str, str], nvml=None):
    """The GPU source the configuration asks for, or None."""
    from .gpu import GpuUnavailable
    from .nvml import NvmlSource, load_nvml, visible_devices_from_env

    log = logging.getLogger("vllm_sidecar")
    if cfg.gpu == "none":
        return None
    if cfg.gpu == "dcgm":
        from .dcgm import DcgmSource

        return DcgmSource(cfg.dcgm_url, cfg.pod_name, cfg.pod_namespace, timeout=cfg.vllm_timeout,
                          max_bytes=2 * cfg.vllm_max_page_bytes)
    devices = list(cfg.gpu_devices) or visible_devices_from_env(env)
    if nvml is None:
        try:
            nvml = load_nvml()
        except ImportError as exc:
            if cfg.gpu == "auto":
                log.info("NVML bindings not installed (%s): running without GPU series", exc)
                return None
            raise ConfigError("gpu: nvml asked for but the nvidia-ml-py package is not installed") from None
    src = NvmlSource(nvml, devices)
    if cfg.gpu == "auto":
        try:
            src.open()
        except GpuUnavailable as exc:
            log.info("%s: running without GPU series (gpu=auto)", exc)
            return None
    return src


def make_recorder(cfg: Config):
    """The flight recorder the configuration asks for, or None (``flight_minutes`` 0)."""
    if cfg.flight_minutes <= 0:
        return None
    from .flight import Recorder

    return Recorder(cfg.flight_minutes, cfg.flight_max_bytes, event_before=cfg.flight_event_before,
                    event_after=cfg.flight_event_after, max_events=cfg.flight_max_events)


def flight_labels(cfg: Config):
    """The labels /debug/flight adds to every series: ``flight_labels``, else the pod's own."""
    from .config import parse_labels

    if cfg.flight_labels:
        return parse_labels(cfg.flight_labels)
    out = []
    if cfg.pod_namespace:
        out.append(("namespace", cfg.pod_namespace))
    if cfg.pod_name:
        out.append(("pod", cfg.pod_name))
    return tuple(out)


STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGQUIT")
RELOAD_SIGNALS = ("SIGHUP",)
IGNORED_SIGNALS = ("SIGUSR1", "SIGUSR2", "SIGPIPE")
IGNORED_LOG_EVERY = 60.0  # seconds between two lines about the same ignored signal


def _token_on_command_line(argv) -> bool:
    return any(a == "--vllm-bearer-token" or a.startswith("--vllm-bearer-token=") for a in argv)


class _Signals:
    """Queues the signals the process handles; the main thread takes them from the queue."""

    def __init__(self) -> None:
        self.queue: "queue.SimpleQueue[int]" = queue.SimpleQueue()
        self._previous: Dict[int, object] = {}
        self._ignored_last: Dict[str, float] = {}
        self._ignored_since: Dict[str, int] = {}

    def install(self) -> None:
        for name in STOP_SIGNALS + RELOAD_SIGNALS + IGNORED_SIGNALS:
            sig = getattr(signal, name, None)
            if sig is not None:
                self._previous[sig] = signal.signal(sig, self._handler)

    def _handler(self, signum, _frame) -> None:
        self.queue.put(signum)  # SimpleQueue.put is safe in a signal handler

    def restore(self) -> None:
        for sig, old in self._previous.items():
            signal.signal(sig, old)

    def ignored(self, log: logging.Logger, name: str) -> None:
        now = time.monotonic()
        last = self._ignored_last.get(name)
        if last is not None and now - last < IGNORED_LOG_EVERY:
            self._ignored_since[name] = self._ignored_since.get(name, 0) + 1
            return
        more = self._ignored_since.pop(name, 0)
        self._ignored_last[name] = now
        why = ("a write to a connection the peer closed; the write fails and is handled there"
               if name == "SIGPIPE" else "SIGHUP re-reads the token file and the web config; SIGTERM, SIGINT, "
               "SIGQUIT stop")
        log.info("%s received: ignored (%s)%s", name, why,
                 f"; {more} more since the last line" if more else "", extra={"fields": {"signal": name}})


def _listener_summary(web: WebConfigWatcher) -> str:
    cfg = web.cfg
    if not web.enabled:
        return "no web config"
    bits = [f"TLS, client_auth_type {cfg.tls.client_auth}" if cfg.tls else "no TLS",
            f"basic auth for {len(cfg.users)} user(s)" if cfg.users else "no basic auth"]
    return ", ".join(bits)


def run_sidecar(cfg: Config, env: Mapping[str, str], stop: Optional[threading.Event] = None,
                nvml=None, on_ready=None) -> int:
    log = setup(cfg.log_format, cfg.log_level)
    try:  # checked before anything starts: a bad web config is exit 2 with one line
        web = WebConfigWatcher(cfg.web_config_file)
    except ConfigError as exc:
        sys.stderr.write(f"{PROG}: error: {exc}\n")
        return 2
    for note in web.cfg.notes:
        log.warning("web config %s: %s", cfg.web_config_file, note)
    add_secret(cfg.vllm_bearer_token)
    in_main = threading.current_thread() is threading.main_thread()
    if cfg.vllm_bearer_token and in_main and _token_on_command_line(sys.argv):
        log.warning("the bearer token was given on the command line, where every process on the host "
                    "can read it (/proc/PID/cmdline, ps); prefer VLLM_SIDECAR_VLLM_BEARER_TOKEN_FILE or "
                    "VLLM_SIDECAR_VLLM_BEARER_TOKEN")
    if cfg.metrics_url_note:
        log.info(cfg.metrics_url_note)
    try:
        client = PageFetcher(cfg.metrics_url, cfg.vllm_timeout, cfg.vllm_max_page_bytes,
                             cfg.vllm_bearer_token, cfg.vllm_bearer_token_file, ca_file=cfg.vllm_ca_file)
    except (OSError, ValueError) as exc:  # an unreadable CA file
        sys.stderr.write(f"{PROG}: error: vllm_ca_file: cannot load {cfg.vllm_ca_file}: "
                         f"{getattr(exc, 'strerror', None) or exc}\n")
        return 2
    gpu = make_gpu_source(cfg, env, nvml)
    recorder = make_recorder(cfg)
    sidecar = Sidecar(cfg, client.fetch, gpu, page_bytes=lambda: client.last_bytes, recorder=recorder)
    host, port = cfg.listen_host_port
    flight = None
    if recorder is not None:
        from .flight import FlightService

        flight = FlightService(recorder, sidecar.recorder_lock, flight_labels(cfg))
    try:
        server = SidecarServer(host, port, lambda: sidecar.published, sidecar.healthy, web=web, flight=flight,
                               max_requests=cfg.web_max_requests, max_connections=cfg.web_max_connections,
                               header_timeout=cfg.web_header_timeout, idle_timeout=cfg.web_idle_timeout)
    except OSError as exc:
        sys.stderr.write(f"{PROG}: error: listen: cannot serve on {cfg.listen}: {exc.strerror or exc}\n")
        return 2
    stop = stop or threading.Event()
    signals = _Signals()
    if in_main:
        signals.install()
    try:
        server.start()
        poller = threading.Thread(target=sidecar.run, args=(stop,), name="poll", daemon=True)
        poller.start()
        h, p = server.address
        log.info("serving on %s://%s:%d/metrics (%s), reading %s every %gs (window %gs, gpu %s)", server.scheme,
                 f"[{h}]" if ":" in h else h, p, _listener_summary(web), client.safe_url, cfg.poll_interval,
                 cfg.window, "on" if gpu else "off", extra={"fields": {"version": __version__}})
        if on_ready:
            on_ready(server, sidecar)
        why = ""
        while not stop.is_set():
            try:
                signum = signals.queue.get(timeout=0.2)
            except queue.Empty:
                continue
            name = signal.Signals(signum).name
            if name in STOP_SIGNALS:
                why = f" on {name}"
                stop.set()
            elif name in RELOAD_SIGNALS:
                ok, what = client.reload_token()
                log.log(logging.INFO if ok else logging.WARNING, "%s: %s", name, what,
                        extra={"fields": {"signal": name}})
                web.force()  # and --web.config.file now (it is also re-read when it changes)
            else:
                signals.ignored(log, name)
        log.info("stopping%s", why)
    finally:
        signals.restore()
    server.stop()
    if flight is not None:
        flight.close()
    poller.join(timeout=0.5)  # a read in flight is abandoned: the thread is a daemon
    client.close()
    if gpu is not None:
        try:
            gpu.close()
        except Exception:  # noqa: BLE001 - shutting down anyway
            pass
    return 0
