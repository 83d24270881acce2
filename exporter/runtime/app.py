"""Wiring one sidecar together: the sources its configuration asks for, the poll loop, the
server, and the signals that stop it. ``run_sidecar`` is what ``vllm-sidecar-exporter`` runs;
the demo and the tests run the same function in a thread."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from typing import Mapping, Optional

from .. import __version__
from ..errors import ConfigError
from .config import Config
from .fetch import PageFetcher
from .logs import setup
from .server import SidecarServer
from .sidecar import Sidecar
from .webconfig import WebConfigWatcher

PROG = "vllm-sidecar-exporter"


def make_gpu_source(cfg: Config, env: Mapping[str, str], nvml=None):
    """The GPU source the configuration asks for, or None."""
    from .nvml import NvmlSource, load_nvml, visible_devices_from_env
    from .gpu import GpuUnavailable

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
    gpu = make_gpu_source(cfg, env, nvml)
    client = PageFetcher(cfg.metrics_url, cfg.vllm_timeout, cfg.vllm_max_page_bytes,
                         cfg.vllm_bearer_token, cfg.vllm_bearer_token_file)
    sidecar = Sidecar(cfg, client.fetch, gpu, page_bytes=lambda: client.last_bytes)
    host, port = cfg.listen_host_port
    try:
        server = SidecarServer(host, port, lambda: sidecar.published, sidecar.healthy, web=web,
                               max_requests=cfg.web_max_requests, max_connections=cfg.web_max_connections,
                               header_timeout=cfg.web_header_timeout, idle_timeout=cfg.web_idle_timeout)
    except OSError as exc:
        sys.stderr.write(f"{PROG}: error: listen: cannot serve on {cfg.listen}: {exc.strerror or exc}\n")
        return 2
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        if hasattr(signal, "SIGHUP"):  # re-read --web.config.file now (it is also re-read on change)
            signal.signal(signal.SIGHUP, lambda *_: web.force())
    server.start()
    poller = threading.Thread(target=sidecar.run, args=(stop,), name="poll", daemon=True)
    poller.start()
    h, p = server.address
    log.info("serving on %s://%s:%d/metrics (%s), reading %s every %gs (window %gs, gpu %s)", server.scheme,
             f"[{h}]" if ":" in h else h, p, _listener_summary(web), client.safe_url, cfg.poll_interval, cfg.window, "on" if gpu else "off",
             extra={"fields": {"version": __version__}})
    if on_ready:
        on_ready(server, sidecar)
    while not stop.wait(0.2):
        pass
    log.info("stopping")
    server.stop()
    poller.join(timeout=0.5)  # a read in flight is abandoned: the thread is a daemon
    client.close()
    if gpu is not None:
        try:
            gpu.close()
        except Exception:  # noqa: BLE001 - shutting down anyway
            pass
    return 0
