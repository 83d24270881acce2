"""What each rule's expression costs a quiet Prometheus, over the data a ``bench_pack.py --keep``
run left behind: the low-noise companion of ``bench_pack.py``.

    python bench/bench_rule_cost.py --data DIR/pack/data [--rules NAME=FILE ...] [--repeat 15]
                                    [--at UNIX_SECONDS] [--top 25] [--json FILE]

``bench_pack.py`` measures the rule group of a Prometheus that scrapes a simulated fleet beside
three other Prometheus on the same machine; on two cores its group times vary by a third between
runs of the same rules. Here one Prometheus (the installed one) is started on a copy of a kept
data directory (no scrape targets, no rule files), and every rule expression of every ``--rules``
file is asked as an instant query at one moment inside the kept data (``--at``; by default a
minute before the head's last sample), ``--repeat`` times, the files' rules interleaved so that
drift hits every file alike. Each figure is Prometheus' own ``evalTotalTime`` from
``stats=all`` (selecting and evaluating; not parsing, which comes before its timer, nor the
queue), the median of the repeats. The copy is opened with ``--storage.tsdb.max-block-duration``
at its minimum, so no compaction of the kept blocks runs while it is timed.

What it leaves out, and ``bench_pack.py`` keeps: writing the recorded series, the alerts' state
and their annotation templates (the ``query`` calls in descriptions run only for firing alerts).
What it needs: the data of the instance that ran the rules (its recorded series are what later
rules read), so it compares rule files that record the same names, and the naive rules.

Every process started here is stopped by its process group at the end. Not a test.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import urllib.parse
from pathlib import Path
from typing import Dict, List, Tuple

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_pack import EVAL_INTERVAL, Instance, Proc, _ready, api, get, group_intervals, load_rules, rule_id  # noqa: E402
from exporter.harness.localstack import free_port  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NAIVE = ROOT / "exporter" / "harness" / "data" / "naive.rules.yml"
PACK = ROOT / "rules" / "vllm.rules.yml"


def query_ms(base: str, expr: str, at: float) -> float:
    q = urllib.parse.urlencode({"query": expr, "time": f"{at:.3f}", "stats": "all"})
    data = json.loads(get(f"{base}/api/v1/query?{q}", 60))
    if data.get("status") != "success":
        raise RuntimeError(f"{expr[:80]}: {data}")
    return float(data["data"]["stats"]["timings"]["evalTotalTime"]) * 1000.0


def head_max_s(base: str) -> float:
    stats = api(base, "/api/v1/status/tsdb")
    return int(stats["headStats"]["maxTime"]) / 1000.0


def series_touched(base: str, expr: str, at: float) -> int:
    """The series the expression's selectors select at ``at`` (each selector counted on its own,
    a range selector over its range, a subquery's selectors once): what a rule's time follows."""
    from exporter.analysis.promql.ast import MatrixSelector, VectorSelector, walk
    from exporter.analysis.promql.parser import parse

    total = 0
    nodes = list(walk(parse(expr)))
    inner = {id(n.selector) for n in nodes if isinstance(n, MatrixSelector)}
    for node in nodes:
        if isinstance(node, MatrixSelector):
            sel = f"last_over_time({node})"
        elif isinstance(node, VectorSelector) and id(node) not in inner:
            sel = str(node)
        else:
            continue
        q = urllib.parse.urlencode({"query": f"count({sel})", "time": f"{at:.3f}"})
        res = json.loads(get(f"{base}/api/v1/query?{q}", 60))["data"]["result"]
        total += int(float(res[0]["value"][1])) if res else 0
    return total


def measure(base: str, files: Dict[str, List[dict]], at: float, repeat: int) -> Dict[str, List[Tuple[str, float]]]:
    times: Dict[Tuple[str, int], List[float]] = {}
    for _ in range(repeat):
        for name, rules in files.items():
            for i, r in enumerate(rules):
                times.setdefault((name, i), []).append(query_ms(base, r["expr"], at))
    return {name: [(rule_id(r, rules), statistics.median(times[(name, i)])) for i, r in enumerate(rules)]
            for name, rules in files.items()}


def quiet_costs(data: Path, files: Dict[str, Path], repeat: int = 15, at: float = 0.0) -> dict:
    """Every rule expression of ``files`` (name -> rule file) asked ``repeat`` times of one
    Prometheus started on a copy of ``data``: per rule file, each rule's median ``evalTotalTime``
    (ms) and the series its selectors select, with their sums."""
    rules = {name: load_rules(Path(path)) for name, path in files.items()}
    work = Path(tempfile.mkdtemp(prefix="rule-cost-"))
    proc = None
    try:
        shutil.copytree(data, work / "data")
        (work / "prometheus.yml").write_text(yaml.safe_dump({"global": {"scrape_interval": "15s"}}))
        port = free_port()
        proc = Proc("prometheus", ["prometheus", f"--config.file={work / 'prometheus.yml'}",
                                   f"--storage.tsdb.path={work / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                                   "--storage.tsdb.retention.time=30d", "--storage.tsdb.max-block-duration=2h",
                                   "--log.level=warn"], work / "prometheus.log")
        _ready([Instance("quiet", [], port=port, proc=proc)], work)  # bench_pack's wait, its WAL replayed
        base = f"http://127.0.0.1:{port}"
        at = at or head_max_s(base) - 60
        measure(base, rules, at, 1)  # warm the caches once
        res = measure(base, rules, at, repeat)
        touched = {name: {rule_id(r, rs): series_touched(base, r["expr"], at) for r in rs}
                   for name, rs in rules.items()}
    finally:
        if proc:
            proc.stop()
        shutil.rmtree(work, ignore_errors=True)
    weights = {name: {g: EVAL_INTERVAL / s for g, s in group_intervals([path]).items()} for name, path in files.items()}

    def weight(name: str, rid: str) -> float:
        rule = next(r for r in rules[name] if rule_id(r, rules[name]) == rid)
        return weights[name].get(rule["_group"], 1.0)

    out = {}
    for name, rows in res.items():
        rs = [{"rule": rid, "ms": ms, "series": touched[name][rid], "weight": weight(name, rid)} for rid, ms in rows]
        # per evaluation interval: a rule of a group evaluated every 2 minutes counts a quarter
        out[name] = {"rules": rs, "total_ms": sum(x["ms"] * x["weight"] for x in rs),
                     "series": round(sum(x["series"] * x["weight"] for x in rs)),
                     "total_ms_every_rule": sum(x["ms"] for x in rs), "series_every_rule": sum(x["series"] for x in rs)}
    return {"at": at, "repeat": repeat, "files": out}


def report(costs: dict, say, top: int = 0) -> None:
    files = costs["files"]
    first = next(iter(files))
    for name, f in files.items():
        ratio = (f", {f['total_ms'] / files[first]['total_ms']:.1f}x {first}"
                 if name != first and files[first]["total_ms"] else "")
        every = ("" if f["total_ms_every_rule"] == f["total_ms"] else
                 f"; {f['total_ms_every_rule']:.1f} ms and {f['series_every_rule']:,} series when every group runs")
        say(f"{name}: {len(f['rules'])} rules, {f['total_ms']:.1f} ms per evaluation interval (sum of per-rule medians, "
            f"each rule weighed by how often its group runs{ratio}), {f['series']:,} series selected{every}")
        for x in sorted(f["rules"], key=lambda x: -x["ms"])[:top]:
            say(f"  {x['ms']:7.2f} ms  {x['series']:6,} series  {x['rule']}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="a kept Prometheus data directory (copied, not changed)")
    ap.add_argument("--rules", action="append", default=[], help="NAME=RULEFILE (default: naive and pack)")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--at", type=float, default=0.0)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--json", default="")
    args = ap.parse_args(argv)
    pairs = [s.split("=", 1) for s in args.rules] or [["naive", str(NAIVE)], ["pack", str(PACK)]]
    costs = quiet_costs(Path(args.data), {name: Path(path) for name, path in pairs}, args.repeat, args.at)
    report(costs, print, args.top)
    if args.json:
        Path(args.json).write_text(json.dumps(costs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
