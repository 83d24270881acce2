"""``vllm-sidecar-exporter [serve] [flags]``: run the sidecar. The flags, their environment
variables and the configuration file all come from ``runtime.config.FIELDS``."""

from __future__ import annotations

import argparse
from typing import Any, Dict, Mapping, Sequence

from ..errors import ConfigError
from ..runtime import config as config_mod
from ..runtime.config import FIELDS, Config
from .parsing import PROG, OneLineParser, fail


def add_config_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", metavar="FILE", default=None,
                   help=f"YAML file with any of the keys below (env {config_mod.env_name('config')})")
    for f in FIELDS:
        if not f.flag:
            continue
        kw: Dict[str, Any] = {"dest": f.key, "default": None,
                              "help": f"{f.doc} [env {config_mod.env_name(f.key)}; default "
                                      f"{config_mod.default_text(f)}]".replace("%", "%%")}
        if f.kind == "choice":
            kw["metavar"] = "|".join(f.choices)
        else:
            kw["metavar"] = f.key.split("_")[-1].upper()
        p.add_argument(config_mod.flag_name(f.key), *config_mod.flag_aliases(f.key), **kw)


def serve_parser() -> argparse.ArgumentParser:
    from .. import __version__

    p = OneLineParser(
        prog=PROG,
        description="Prometheus sidecar for vLLM: reads vLLM's /metrics and the pod's GPUs, serves "
                    "derived signals. Subcommands (each with its own --help): demo (simulated vLLM "
                    "and GPU), top (a live terminal view), rules and dashboards (render the pack from "
                    "an SLO file), backtest (would the pack have paged over recorded or Prometheus "
                    "history), capacity (the capacity model from history), gate (a regression gate "
                    "for a vLLM change), postmortem (replay sidecars' flight records).",
    )
    p.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    add_config_flags(p)
    return p


def load_config(ns: argparse.Namespace, env: Mapping[str, str]) -> Config:
    flags = {k: v for k, v in vars(ns).items() if v is not None}
    return config_mod.build(flags, env)


def main(argv: Sequence[str], env: Mapping[str, str]) -> int:
    from ..runtime.app import run_sidecar

    ns = serve_parser().parse_args(list(argv))
    try:
        cfg = load_config(ns, env)
    except ConfigError as exc:
        return fail("", str(exc))
    return run_sidecar(cfg, env)
