"""The in-process poll at several git revisions against the obvious poller, in one process and
the same rounds (the before/after of a change to the poll, issue 29 item 3).

    python bench/ab_poll.py REV [REV ...] [--polls 300] [--rounds 9]

Each revision's ``exporter`` package is exported from git into a temporary folder under a name
of its own (``exporter_<rev>``; relative imports keep it apart from the working tree's), one
sidecar of each (default shape: 60 s window, a poll every 2 s) reads the same page sequence as
``bench_poll.py`` (the real vLLM page, counters advancing), the page handed over in-process.
``HEAD`` may be given as ``.``: the working tree. Rounds alternate (a different one first each
round); each round's CPU per poll is a ratio to the obvious poller (``prometheus_client``'s
parser over the same pages) measured in that round; the medians and every round are printed.
"""

from __future__ import annotations

import argparse
import importlib
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

import bench.bench_poll as bp  # noqa: E402


def load(rev: str):
    """(config, Sidecar) of ``exporter`` at ``rev`` (``.``: the working tree)."""
    if rev == ".":
        return importlib.import_module("exporter.runtime.config"), importlib.import_module(
            "exporter.runtime.sidecar").Sidecar
    name = "exporter_" + re.sub(r"\W", "_", rev)
    tmp = Path(tempfile.mkdtemp())
    tar = subprocess.run(["git", "archive", rev, "exporter"], cwd=ROOT, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tmp)], input=tar, check=True)
    (tmp / "exporter").rename(tmp / name)
    for py in (tmp / name).rglob("*.py"):
        src = py.read_text()
        new = re.sub(r"\b(from|import) exporter\b", rf"\1 {name}", src)
        if new != src:
            py.write_text(new)
    sys.path.insert(0, str(tmp))
    return importlib.import_module(f"{name}.runtime.config"), importlib.import_module(f"{name}.runtime.sidecar").Sidecar


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("revs", nargs="+")
    ap.add_argument("--polls", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--sleep", type=float, default=0.0, help="seconds asleep before each poll (not counted: "
                    "a poll that starts cold, as a real one every 2 s does)")
    args = ap.parse_args()
    texts = bp.pages()
    runs = {}
    obvious = bp.Cycle(texts)
    runs["obvious"] = lambda: list(text_string_to_metric_families(obvious()))
    for rev in args.revs:
        config, Sidecar = load(rev)
        cfg = config.build({"poll_interval": 2.0, "window": 60.0, "gpu": "none"}, {})
        clock = bp.Clock()
        sc = Sidecar(cfg, bp.Cycle(texts), None, clock=clock)

        def poll(sc=sc, clock=clock):
            sc.poll_once()
            clock.t += 2.0
        runs[rev] = poll
    for fn in runs.values():
        for _ in range(60):
            fn()
    if args.sleep > 0:
        runs = {k: (lambda f=f: (time.sleep(args.sleep), f())) for k, f in runs.items()}
    names = list(runs)
    cpu = {k: [] for k in names}
    for r in range(args.rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for k in order:
            cpu[k].append(bp.cpu_per_call(runs[k], max(20, args.polls // 8) if k == "obvious" else args.polls))
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, {args.rounds} rounds of {args.polls} polls, in-process, "
          + (f"{args.sleep * 1e3:.0f} ms asleep before each, " if args.sleep > 0 else "")
          + "CPU per poll (median ms) and / obvious poller (median; each round)")
    first = names[1]
    print(f"{'':>10} {'ms':>10}  / obvious [range]      / {first} [range]   / obvious, each round")
    for k in names:
        ratios = [a / b for a, b in zip(cpu[k], cpu["obvious"])]
        paired = [a / b for a, b in zip(cpu[k], cpu[first])]  # against the first revision, round by round
        print(f"{k:>10} {statistics.median(cpu[k]) * 1e3:7.3f} ms  {statistics.median(ratios):.3f} "
              f"[{min(ratios):.3f}-{max(ratios):.3f}]  {statistics.median(paired):.3f} "
              f"[{min(paired):.3f}-{max(paired):.3f}]  " + ", ".join(f"{x:.3f}" for x in ratios))


if __name__ == "__main__":
    main()
