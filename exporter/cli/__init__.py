"""The command line: the front door above the wings. ``vllm-sidecar-exporter [flags]`` runs the
sidecar; subcommands ``demo``, ``top``, ``rules``, ``dashboards``, ``backtest``, ``capacity``,
``gate`` and ``postmortem``. Each subcommand's module parses its flags and calls into a wing; no wing imports this
package. A bad flag or configuration value exits 2 with one line that names the problem."""

from __future__ import annotations

import os
import sys
from typing import Callable, Dict, Mapping, Optional, Sequence


def _subcommands() -> Dict[str, Callable[[Sequence[str], Mapping[str, str]], int]]:
    from . import backtest, capacity, demo, gate, pack, postmortem, serve, top

    return {
        "serve": serve.main,
        "demo": demo.main,
        "top": top.main,
        "rules": pack.rules_main,
        "dashboards": pack.dashboards_main,
        "backtest": backtest.main,
        "capacity": capacity.main,
        "gate": gate.main,
        "postmortem": postmortem.main,
    }


def main(argv: Optional[Sequence[str]] = None, env: Optional[Mapping[str, str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    env = dict(os.environ if env is None else env)
    subs = _subcommands()
    if argv and argv[0] in subs:
        return subs[argv[0]](argv[1:], env)
    return subs["serve"](argv, env)
