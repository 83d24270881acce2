"""The command line: ``vllm-sidecar-exporter [flags]`` runs the sidecar; subcommands ``demo`` and
``rules``. A bad flag or configuration value exits 2 with one line that names the problem."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from typing import Any, Dict, Mapping, Optional, Sequence

from . import __version__
from . import config as config_mod
from .config import FIELDS, Config, ConfigError

PROG = "vllm-sidecar-exporter"


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr and exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)


def add_config_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", default=None,
                   help=f"YAML file with any of the keys below (env {config_mod.env_name('config')})")
    for f in FIELDS:
        if not f.flag:
            continue
        kw: Dict[str, Any] = {"dest": f.key, "default": None,
                              "help": f"{f.doc} [env {config_mod.env_name(f.key)}; default "
                                      f"{'(none)' if f.secret or f.default in ('', []) else f.default}]".replace("%", "%%")}
        if f.kind == "choice":
            kw["metavar"] = "|".join(f.choices)
        else:
            kw["metavar"] = f.key.split("_")[-1].upper()
        p.add_argument(config_mod.flag_name(f.key), **kw)


def serve_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog=PROG,
        description="Prometheus sidecar for vLLM: reads vLLM's /metrics and the pod's GPUs, serves "
                    "derived signals. Subcommands: demo (simulated vLLM and GPU), rules (render the "
                    "alerting pack from an SLO file), dashboards (render the Grafana dashboards).",
    )
    p.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    add_config_flags(p)
    return p


def load_config(ns: argparse.Namespace, env: Mapping[str, str]) -> Config:
    flags = {k: v for k, v in vars(ns).items() if v is not None}
    return config_mod.build(flags, env)


def make_gpu_source(cfg: Config, env: Mapping[str, str], nvml=None):
    """The GPU source the configuration asks for, or None."""
    from .gpu import GpuUnavailable, NvmlSource, load_nvml, visible_devices_from_env

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
    from .logs import setup
    from .server import SidecarServer
    from .sidecar import Sidecar
    from .vllm_client import VllmClient

    log = setup(cfg.log_format, cfg.log_level)
    gpu = make_gpu_source(cfg, env, nvml)
    client = VllmClient(cfg.metrics_url, cfg.vllm_timeout, cfg.vllm_max_page_bytes,
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


def main(argv: Optional[Sequence[str]] = None, env: Optional[Mapping[str, str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    env = dict(os.environ if env is None else env)
    if argv and argv[0] == "demo":
        from .demo import main as demo_main

        return demo_main(argv[1:], env)
    if argv and argv[0] == "rules":
        from .rules import main as rules_main

        return rules_main(argv[1:], env)
    if argv and argv[0] == "dashboards":
        from .dashboards import main as dashboards_main

        return dashboards_main(argv[1:], env)
    if argv and argv[0] == "serve":
        argv = argv[1:]
    ns = serve_parser().parse_args(argv)
    try:
        cfg = load_config(ns, env)
    except ConfigError as exc:
        sys.stderr.write(f"{PROG}: error: {exc}\n")
        return 2
    return run_sidecar(cfg, env)
