"""``vllm-sidecar-exporter demo``: the sidecar on the built-in simulated vLLM and GPUs."""

from __future__ import annotations

import shutil
import sys
from typing import Mapping, Sequence

from .parsing import PROG, OneLineParser, fail


def main(argv: Sequence[str], env: Mapping[str, str]) -> int:
    from ..harness.demo import run_demo
    from ..harness.simulate import SCENARIOS

    p = OneLineParser(prog=f"{PROG} demo", description="The sidecar on a built-in simulated vLLM and simulated GPUs.")
    p.add_argument("--scenario", choices=sorted(SCENARIOS), default="long-prompt-storm",
                   help="what happens to the simulated replica (default: the long-prompt storm of the incident)")
    p.add_argument("--duration", type=float, default=150.0, help="seconds to run; 0 runs until Ctrl-C (default 150)")
    p.add_argument("--onset", type=float, default=None,
                   help="seconds before the scenario's trouble starts (default 15)")
    p.add_argument("--listen", default="127.0.0.1:0", help="where the sidecar serves (default: a free port)")
    p.add_argument("--with-prometheus", action="store_true",
                   help="also run Prometheus (and Alertmanager) with the rules pack and show the alerts")
    p.add_argument("--until-fired", action="append", default=[], metavar="ALERT",
                   help="with --with-prometheus: end as soon as this alert has fired (repeatable: all of them), "
                        "--duration still the longest run")
    p.add_argument("--refresh", type=float, default=1.0, help="seconds between screen updates")
    p.add_argument("--plain", action="store_true", help="print updates one after another instead of redrawing")
    ns = p.parse_args(list(argv))
    if ns.duration < 0 or ns.refresh <= 0 or (ns.onset is not None and ns.onset < 0):
        return fail("demo", "--duration and --onset must be >= 0 and --refresh > 0")
    if ns.until_fired and not ns.with_prometheus:
        return fail("demo", "--until-fired needs --with-prometheus (alerts come from Prometheus)")
    if ns.with_prometheus and not shutil.which("prometheus"):
        return fail("demo", "--with-prometheus needs the prometheus binary "
                            "(Debian: apt-get install prometheus prometheus-alertmanager)")
    return run_demo(ns.scenario, ns.duration, ns.onset, ns.listen, ns.with_prometheus, ns.refresh,
                    tty=sys.stdout.isatty() and not ns.plain, until_fired=ns.until_fired)
