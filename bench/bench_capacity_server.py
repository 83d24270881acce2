"""``capacity`` and ``gate`` against a real Prometheus, both paths: raw series read into this
process (``--engine local``) against the server evaluating what reads raw series (``--engine
server``).

    python bench/bench_capacity_server.py [--pods 200] [--hours 24] [--scrape 60] [--step 60]
                                          [--tsdb DIR] [--limit 1500]

The fleet is bench_backtest's, backfilled into Prometheus' TSDB the way bench_backtest_server.py
does it (2-hour chunks of OpenMetrics, one promtool run each; with ``--tsdb`` the directory that
script left is reused). Each path runs as its own ``vllm-sidecar-exporter capacity`` process over
the whole range, then ``gate`` over two halves of it (the first 12 hours against the last 12, so
both ranges are past ``--engine auto``'s 6 hours); wall time and peak RSS (the process's VmHWM,
polled while it runs) are measured, and the two paths' JSON reports must be equal (the gate's
save the note naming the server). CPU heavy: run it once, on an idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from bench_backtest import fleet  # noqa: E402
from bench_backtest_server import backfill_chunked, read_names, server_hwm_mib  # noqa: E402

CHILD = r"""
import json, sys, time
from exporter.cli import main
t0 = time.perf_counter()
rc = main(sys.argv[1:])
hwm = [int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM:")][0]
sys.stderr.write("\nBENCH " + json.dumps({"rc": rc, "wall": time.perf_counter() - t0, "rss_mib": hwm / 1024}) + "\n")
"""


def run(argv, out_json: Path, limit_s: float) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    errf = out_json.with_suffix(".err")
    t0 = time.perf_counter()
    with errf.open("w") as err:
        proc = subprocess.Popen([sys.executable, "-c", CHILD, *argv, "--json", str(out_json)], stdout=subprocess.DEVNULL,
                                stderr=err, env=env, start_new_session=True)
        hwm = 0.0
        while proc.poll() is None:
            try:
                for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        hwm = max(hwm, int(line.split()[1]) / 1024)
            except OSError:
                pass
            if time.perf_counter() - t0 > limit_s:
                os.killpg(proc.pid, 9)
                proc.wait()
                return {"done": False, "wall": time.perf_counter() - t0, "rss_mib": hwm, "log": "stopped"}
            time.sleep(0.5)
    text = errf.read_text()
    m = re.search(r"BENCH (\{.*\})", text)
    if not m:
        raise SystemExit(f"{argv[0]}: no result\n{text[-3000:]}")
    got = json.loads(m.group(1))
    got["done"] = True
    lines = [x for x in text.strip().splitlines() if x.startswith("vllm-sidecar-exporter")]
    got["log"] = lines[0] if lines else ""
    if got["rc"] not in (0, 1):
        raise SystemExit(f"{argv[0]}: rc {got['rc']}\n{text[-3000:]}")
    return got


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pods", type=int, default=200)
    ap.add_argument("--hours", type=float, default=24)
    ap.add_argument("--scrape", type=int, default=60)
    ap.add_argument("--step", type=int, default=60)
    ap.add_argument("--limit", type=float, default=1500, help="stop a path after this many seconds (s)")
    ap.add_argument("--tsdb", metavar="DIR", help="the backfilled TSDB to use (made here when it lacks this fleet)")
    args = ap.parse_args()
    from promtsdb import prometheus_serving

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        data = Path(args.tsdb) if args.tsdb else tmp / "tsdb"
        spec = {"pods": args.pods, "hours": args.hours, "scrape": args.scrape}
        marker = data / "bench-fleet.json"
        if not (marker.exists() and json.loads(marker.read_text())["spec"] == spec):
            store = fleet(args.pods, args.hours / 24, args.scrape)
            first = int(min(s.t[0] for s in store)) // 1000
            last = int(max(s.t[-1] for s in store)) // 1000
            data.mkdir(parents=True, exist_ok=True)
            samples, nseries, _, _ = backfill_chunked(store, data, tmp, names=read_names())
            del store
            marker.write_text(json.dumps({"spec": spec, "samples": samples, "series": nseries, "first": first,
                                          "last": last}))
        got = json.loads(marker.read_text())
        first, last = got["first"], got["last"]
        start = -(-first // args.step) * args.step
        mid = start + (last - start) // 2
        print(f"fleet: {args.pods} pods, {got['series']} series, {got['samples'] / 1e6:.1f}M samples at "
              f"{args.scrape}s over {args.hours:g}h (Prometheus TSDB in {data})", flush=True)
        with prometheus_serving(data, tmp, ready_seconds=600) as url:
            port = int(url.rsplit(":", 1)[1])
            jobs = {
                "capacity": ["capacity", "--prometheus-url", url, "--start", str(start), "--end", str(last),
                             "--step", f"{args.step}s"],
                "gate": ["gate", "--prometheus-url", url, "--baseline-range", f"{start}/{mid}",
                         "--candidate-range", f"{mid}/{last}"],
            }
            for name, argv in jobs.items():
                res = {}
                for engine in ("server", "local"):
                    res[engine] = r = run(argv + ["--engine", engine], tmp / f"{name}-{engine}.json", args.limit)
                    if r["done"]:
                        print(f"{name} --engine {engine}: {r['wall']:.1f}s wall, peak RSS {r['rss_mib']:.0f} MiB"
                              + (f" ({r['log']})" if r["log"] else ""), flush=True)
                    else:
                        print(f"{name} --engine {engine}: stopped after {r['wall']:.0f}s, peak RSS "
                              f"{r['rss_mib']:.0f} MiB by then: lower bounds", flush=True)
                if res["local"]["done"]:
                    a = json.loads((tmp / f"{name}-local.json").read_text())
                    b = json.loads((tmp / f"{name}-server.json").read_text())
                    if "notes" in b and isinstance(b["notes"], list):
                        b["notes"] = [n for n in b["notes"] if "evaluated by the server" not in n]
                    print(f"{name}: the two reports are " + ("identical" if a == b else "DIFFERENT"), flush=True)
                print(f"{name}: memory {res['server']['rss_mib']:.0f} MiB against {res['local']['rss_mib']:.0f} MiB "
                      f"({res['local']['rss_mib'] / res['server']['rss_mib']:.1f}x); time {res['server']['wall']:.0f}s "
                      f"against {res['local']['wall']:.0f}s", flush=True)
            print(f"prometheus peak RSS (VmHWM) over all: {server_hwm_mib(port):.0f} MiB", flush=True)


if __name__ == "__main__":
    main()
