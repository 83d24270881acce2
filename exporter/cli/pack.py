"""``rules`` and ``dashboards``: render the pack from an SLO file. Both share one front: ``--slo``
parsing and the one-line error."""

from __future__ import annotations

import os
import sys
from typing import Any, Dict, Mapping, Optional, Sequence, Tuple

from ..errors import ConfigError
from ..slo import load_slo
from .parsing import PROG, OneLineParser


def parse_slo_command(sub: str, description: str, argv: Sequence[str], add_arguments) -> Tuple[Any, Optional[Dict[str, Any]]]:
    """Parse a pack subcommand's flags (``--slo`` plus what ``add_arguments(parser)`` adds) and
    load the SLO file. The SLO is None after a one-line error on stderr (the caller exits 2)."""
    p = OneLineParser(prog=f"{PROG} {sub}", description=description)
    p.add_argument("--slo", metavar="FILE", help="SLO file (YAML); defaults apply to what it leaves out")
    add_arguments(p)
    ns = p.parse_args(list(argv))
    try:
        return ns, load_slo(ns.slo)
    except ConfigError as exc:
        sys.stderr.write(f"{PROG} {sub}: error: {exc}\n")
        return ns, None


def rules_main(argv: Sequence[str], env: Mapping[str, str]) -> int:
    from ..pack.rules import OPERATOR_PATH, PLAIN_PATH, render_operator, render_plain, write_all
    from ..pack.vmalert import VMALERT_PATH, render_vmalert

    def add(p) -> None:
        p.add_argument("--out-dir", metavar="DIR",
                       help=f"write {PLAIN_PATH}, {VMALERT_PATH} and {OPERATOR_PATH} under DIR; without it, print "
                            "the plain rule file")
        p.add_argument("--format", choices=("prometheus", "operator"), default="prometheus",
                       help="what to print without --out-dir")
        p.add_argument("--target", choices=("prometheus", "vmalert"), default="prometheus",
                       help="the rule engine: prometheus (also Thanos Ruler, Mimir's and Cortex's rulers) or "
                            "vmalert (VictoriaMetrics; keep_firing_for kept by helper rules)")
        p.add_argument("--interval", metavar="DURATION", default=None,
                       help="--target vmalert: the group's evaluation interval (its helpers count evaluations; "
                            "default: the SLO file's evaluation_interval, 1m)")

    ns, slo = parse_slo_command("rules", "Render the alerting pack from an SLO file.", argv, add)
    if slo is None:
        return 2
    if ns.target == "vmalert" and not ns.out_dir:
        from ..slo import seconds

        try:
            ok = ns.interval is None or seconds(ns.interval) > 0
        except ValueError:
            ok = False
        if not ok:
            sys.stderr.write(f"{PROG} rules: error: --interval: {ns.interval!r} is not a duration like 1m\n")
            return 2
        sys.stdout.write(render_vmalert(slo, ns.interval))
        return 0
    if ns.out_dir:
        for path in write_all(slo, ns.out_dir):
            sys.stderr.write(f"wrote {path}\n")
        return 0
    sys.stdout.write(render_plain(slo) if ns.format == "prometheus" else render_operator(slo))
    return 0


def dashboards_main(argv: Sequence[str], env: Mapping[str, str]) -> int:
    from ..pack.dashboards import K8S_PATH, OPERATOR_PATH, render_all, render_configmaps, render_operator

    def add(p) -> None:
        p.add_argument("--out-dir", metavar="DIR", default="dashboards",
                       help="where to write the JSON files (default dashboards)")
        p.add_argument("--k8s-out", metavar="FILE",
                       help=f"also write them as ConfigMaps for Grafana's sidecar (e.g. {K8S_PATH})")
        p.add_argument("--operator-out", metavar="FILE",
                       help=f"also write grafana-operator GrafanaDashboards reading those ConfigMaps "
                            f"(e.g. {OPERATOR_PATH})")

    ns, slo = parse_slo_command("dashboards", "Render the Grafana dashboards from an SLO file.", argv, add)
    if slo is None:
        return 2
    os.makedirs(ns.out_dir, exist_ok=True)
    rendered = render_all(slo)
    for name, text in rendered.items():
        with open(os.path.join(ns.out_dir, name), "w", encoding="utf-8") as fh:
            fh.write(text)
        sys.stderr.write(f"wrote {os.path.join(ns.out_dir, name)}\n")
    if ns.k8s_out:
        with open(ns.k8s_out, "w", encoding="utf-8") as fh:
            fh.write(render_configmaps(rendered))
        sys.stderr.write(f"wrote {ns.k8s_out}\n")
    if ns.operator_out:
        with open(ns.operator_out, "w", encoding="utf-8") as fh:
            fh.write(render_operator(rendered))
        sys.stderr.write(f"wrote {ns.operator_out}\n")
    return 0
