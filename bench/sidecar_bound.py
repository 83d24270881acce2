"""How far "the sidecar serves what an alert reads" could take the pack's quiet cost, bounded over
the data a ``bench_pack.py --keep`` run left behind.

    python bench/sidecar_bound.py --data DIR/pack/data [--rules rules/vllm.rules.yml] [--repeat 15]

A first quiet pass (``bench_rule_cost.quiet_costs``) counts the series each rule of the pack
selects. Two rule files are then made from the pack, neither a pack (no alert in them means
anything): each rule of the alerting group that selects more than ``--above`` series replaced by
one read of one sidecar series a pod (a per-model rule: a model), as if the sidecar served that
rule's figure; ``records``: the per-pod recording rules only, ``all``: every such rule, the alerts
among them. A second pass asks the naive rules, the pack and both, interleaved, and prints their
totals. Every process started here is stopped by its process group (``quiet_costs``). Not a test.
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
from pathlib import Path
from typing import Dict

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_rule_cost import NAIVE, PACK, quiet_costs, report  # noqa: E402
from exporter.pack.ruleyaml import GROUP  # noqa: E402

ONE_READ = "max by (cluster, namespace, {level}) (vllm_sidecar_kv_cache_capacity_wait_poll_ratio)"


def bounded(rules: dict, series: Dict[str, int], above: int, alerts_too: bool) -> dict:
    """``rules`` (a rule file's mapping) with each rule of the alerting group that selects more than
    ``above`` series (``series``: rule name or id -> series selected) replaced by one sidecar read."""
    out = copy.deepcopy(rules)
    for group in out["groups"]:
        if group["name"] != GROUP:
            continue
        for r in group["rules"]:
            name = r.get("record") or r.get("alert")
            selected = max((n for rid, n in series.items() if rid == name or rid.startswith(name + "{")), default=0)
            per_pod_record = str(r.get("record", "")).startswith("namespace_pod_model:")
            if selected <= above or not (alerts_too or per_pod_record):
                continue
            level = "model_name" if str(r.get("record", "")).startswith("namespace_model:") else "pod, model_name"
            r["expr"] = ONE_READ.format(level=level) + (" > 2" if "alert" in r else "")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True)
    ap.add_argument("--rules", default=str(PACK))
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--above", type=int, default=100)
    args = ap.parse_args(argv)
    pack = Path(args.rules)
    first = quiet_costs(Path(args.data), {"pack": pack}, repeat=1)
    series = {x["rule"]: x["series"] for x in first["files"]["pack"]["rules"]}
    rules = yaml.safe_load(pack.read_text())
    work = Path(tempfile.mkdtemp(prefix="sidecar-bound-"))
    files = {"naive": NAIVE, "pack": pack}
    for name, alerts_too in (("records", False), ("all", True)):
        path = work / f"{name}.rules.yml"
        path.write_text(yaml.safe_dump(bounded(rules, series, args.above, alerts_too), width=10_000))
        files[name] = path
    report(quiet_costs(Path(args.data), files, args.repeat), print)
    return 0


if __name__ == "__main__":
    sys.exit(main())
