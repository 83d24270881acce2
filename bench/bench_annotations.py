"""What an active alert's annotations cost a Prometheus at every evaluation.

    python bench/bench_annotations.py [--alerts 60] [--interval 5] [--samples 30] [--json FILE]

Prometheus expands every label and annotation template of every pending or firing alert at every
evaluation of its group, one template expander each (and a description's ``query`` runs its query
there; the text timed here has none, so for such an alert the figures are a lower bound). ``bench_pack.py``'s
live group time holds that; ``bench_rule_cost.py``'s quiet figures do not (they ask each
expression alone). Here one Prometheus (the installed one, no scrape targets, no data) evaluates
groups of one rule each, every ``--interval`` seconds, each rule the same expression returning
``--alerts`` series: a recording rule (the expression and the write, no alert), an alert with one
label and no annotation (the naive rules' shape), alerts with each one of the pack's four
annotations (``summary``, ``description``, ``runbook``, ``runbook_url``, the text of the pack's
``VLLMTTFTHigh``), all four, and four one-letter annotations (what the expansion costs whatever
the text). Each group's ``evaluationTime`` from ``/api/v1/rules`` is sampled ``--samples`` times,
one interval apart, and the median and minimum reported, with the difference to the bare alert per
annotation and per alert. Every group runs in the same Prometheus at the same time, so machine
noise hits all alike; the ratios are the figure, not the milliseconds.

Every process started here is stopped by its process group at the end. Not a test.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_pack import Instance, Proc, _ready, api  # noqa: E402
from exporter.harness.localstack import free_port  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PACK = ROOT / "rules" / "vllm.rules.yml"
KEYS = ("summary", "description", "runbook", "runbook_url")


def rule_file(alerts: int, interval: int, pack_alert: str = "VLLMTTFTHigh") -> dict:
    """The groups: one rule each, the same ``alerts`` series each."""
    pack = next(r for g in yaml.safe_load(PACK.read_text())["groups"] for r in g["rules"]
                if r.get("alert") == pack_alert)
    expr = "(" + " or ".join(f'label_replace(vector({i}), "pod", "p{i}", "", "")' for i in range(1, alerts + 1)) + ") > 0"
    shapes: Dict[str, Optional[dict]] = {"record": None, "bare": {}}
    missing = [k for k in KEYS if k not in pack["annotations"]]
    if missing:  # e.g. no runbook steps: the file was rendered with a runbook_base_url
        raise SystemExit(f"{PACK}: {pack_alert} has no {', '.join(missing)} annotation to time")
    shapes.update({k: {k: pack["annotations"][k]} for k in KEYS})
    shapes["all four"] = {k: pack["annotations"][k] for k in KEYS}
    shapes["four one-letter"] = {"a": "a", "b": "b", "c": "c", "d": "d"}
    groups = []
    for name, ann in shapes.items():
        rule = ({"record": "bench:annotations:record", "expr": expr} if ann is None else
                {"alert": "Bench" + name.title().replace(" ", "").replace("_", ""), "expr": expr,
                 "labels": {"severity": "warning"}, **({"annotations": ann} if ann else {})})
        groups.append({"name": name, "interval": f"{interval}s", "rules": [rule]})
    return {"groups": groups}


def sample(base: str, samples: int, interval: int) -> Tuple[Dict[str, List[float]], Dict[str, int]]:
    """Each group's evaluation time (ms), ``samples`` times, and the fewest alerts each alerting
    group had active (pending or firing) at any sample."""
    out: Dict[str, List[float]] = {}
    active: Dict[str, int] = {}
    for _ in range(samples):
        for g in api(base, "/api/v1/rules")["groups"]:
            out.setdefault(g["name"], []).append(g["evaluationTime"] * 1000.0)
            if g["rules"][0]["type"] == "alerting":
                n = len(g["rules"][0].get("alerts") or [])
                active[g["name"]] = min(active.get(g["name"], n), n)
        time.sleep(interval)
    return out, active


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--alerts", type=int, default=60)
    ap.add_argument("--interval", type=int, default=5)
    ap.add_argument("--samples", type=int, default=30)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-annotations-"))
    proc = None
    try:
        (work / "rules.yml").write_text(yaml.safe_dump(rule_file(args.alerts, args.interval), width=10_000))
        (work / "prometheus.yml").write_text(yaml.safe_dump({"global": {"evaluation_interval": f"{args.interval}s"},
                                                            "rule_files": [str(work / "rules.yml")]}))
        port = free_port()
        proc = Proc("prometheus", ["prometheus", f"--config.file={work / 'prometheus.yml'}",
                                   f"--storage.tsdb.path={work / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                                   "--log.level=warn"], work / "prometheus.log")
        _ready([Instance("annotations", [], port=port, proc=proc)], work)
        base = f"http://127.0.0.1:{port}"
        time.sleep(3 * args.interval)  # every group evaluated, every alert active
        got, active = sample(base, args.samples, args.interval)
    finally:
        if proc:
            proc.stop()
        shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in got.items()}
    low = {k: min(v) for k, v in got.items()}
    print(f"{args.alerts} alerts per group (the fewest active at a sample: {min(active.values())}), "
          f"each group every {args.interval} s, {args.samples} samples")
    print(f"{'group':18} {'median ms':>10} {'min ms':>8}   {'per alert above bare, us (median / min)':>40}")
    for k in med:
        per = ""
        if k not in ("record", "bare"):
            n = 4 if k in ("all four", "four one-letter") else 1
            per = (f"{(med[k] - med['bare']) * 1000 / args.alerts / n:8.1f} / "
                   f"{(low[k] - low['bare']) * 1000 / args.alerts / n:6.1f} per annotation")
        elif k == "bare":
            per = (f"{(med[k] - med['record']) * 1000 / args.alerts:8.1f} / "
                   f"{(low[k] - low['record']) * 1000 / args.alerts:6.1f} an alert's state, above the record")
        print(f"{k:18} {med[k]:10.2f} {low[k]:8.2f}   {per}")
    if args.json:
        Path(args.json).write_text(json.dumps({"alerts": args.alerts, "interval": args.interval,
                                               "samples": got, "active": active, "median": med, "min": low},
                                              indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
