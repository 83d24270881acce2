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


def run_sidecar(cfg: Config, env: Mapping[str, str], stop: Optional[threading.Event] = None,
                nvml=None, on_ready=None) -> int:
    log = setup(cfg.log_format, cfg.log_level)
    gpu = make_gpu_source(cfg, env, nvml)
    client = PageFetcher(cfg.metrics_url, cfg.vllm_timeout, cfg.vllm_max_page_bytes,
                         cfg.vllm_bearer_token, cfg.vllm_bearer_token_file)
    sidecar = Sidecar(cfg, client.fetch, gpu, page_bytes=lambda: client.last_bytes)
    host, port = cfg.listen_host_port
    try:
        server = SidecarServer(host, port, lambda: sidecar.published, sidecar.healthy)
    except OSError as exc:
        sys.stderr.write(f"{PROG}: error: listen: cannot serve on {cfg.listen}: {exc.strerror or exc}\n")
        return 2
    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    server.start()
    poller = threading.Thread(target=sidecar.run, args=(stop,), name="poll", daemon=True)
    poller.start()
    h, p = server.address
    log.info("serving on http://%s:%d/metrics, reading %s every %gs (window %gs, gpu %s)", h, p,
             client.safe_url, cfg.poll_interval, cfg.window, "on" if gpu else "off",
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
