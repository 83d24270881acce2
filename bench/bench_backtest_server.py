"""The backtest against a server, both paths: raw series read into this process (``--engine
local``) against the alerts evaluated by the server (``--engine server``).

    python bench/bench_backtest_server.py [--pods 200] [--hours 24] [--scrape 60] [--step 60]
                                          [--server prometheus|victoria] [--write docs/performance.md]

The fleet is bench_backtest's (every series the pack reads, real vLLM names and histogram bounds,
a daily load cycle, a long-prompt flood, a restart, a stalled engine). It is backfilled into a real
Prometheus or imported into VictoriaMetrics. Prometheus is backfilled in time chunks: each 2 hours
of the series the rules read written as one OpenMetrics file, turned into one block by ``promtool
tsdb create-blocks-from openmetrics`` (niced, while the next chunk is written) in the same TSDB
directory, then deleted; Prometheus is started over the blocks (tests/promtsdb.py). One file of a
day's fleet (7 GB) did not convert within 10 minutes here; 2-hour files of 0.57 GB each took
about 40 s apiece (promtool appears to pass over its whole input once per 2-hour block it writes).
``--tsdb DIR`` keeps the TSDB for another run (bench_capacity_server.py reads the same one). Each path then runs as its own
``vllm-sidecar-exporter backtest`` process over the whole range; its wall time and peak RSS (the
process's VmHWM) are measured, and the two reports must list the same alert episodes
(on Prometheus; on VictoriaMetrics the documented MetricsQL differences are printed). Prometheus'
own peak memory (VmHWM) is reported too. CPU heavy: run it once, on an idle machine.
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

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from bench_backtest import fleet  # noqa: E402

SECTION = "## Backtest against a server: raw series against server-side evaluation"

CHILD = r"""
import json, sys, time
from exporter.cli import main
t0 = time.perf_counter()
rc = main(["backtest", *sys.argv[1:]])
# VmHWM, not ru_maxrss: ru_maxrss survives exec and starts at the forking parent's size
hwm = [int(x.split()[1]) for x in open("/proc/self/status") if x.startswith("VmHWM:")][0]
sys.stderr.write("\nBENCH " + json.dumps({"rc": rc, "wall": time.perf_counter() - t0, "rss_mib": hwm / 1024}) + "\n")
"""


def write_openmetrics(store, path: Path) -> int:
    """The store as OpenMetrics text with timestamps (seconds); returns the number of samples."""
    n = 0
    with path.open("w") as fh:
        for s in store:
            labels = dict(s.labels)
            name = labels.pop("__name__")
            head = name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
            ts = (s.t // 1000).astype(np.int64)
            vals = s.v
            fh.write("".join(f"{head} {v!r} {t}\n" for v, t in zip(vals.tolist(), ts.tolist())))
            n += len(ts)
        fh.write("# EOF\n")
    return n


def read_names(slo=None) -> set:
    """The metric names the pack's rules (and the capacity model) read: all a backfill needs."""
    from exporter.analysis import capacity as cap
    from exporter.analysis.backtest import raw_selectors
    from exporter.analysis.promql.parser import parse
    from exporter.analysis.rulefile import groups_from_data
    from exporter.pack.rules import render_groups
    from exporter.slo import load_slo

    slo = slo or load_slo(None)
    sels, _ = raw_selectors(groups_from_data(render_groups(slo), "pack"), [], 300_000)
    csels, _ = cap.selectors(cap.Options(slo, 0, 86_400_000))
    names = set()
    for sel in list(sels) + [s for s, _ in csels]:
        node = parse(sel)
        for m in node.matchers:
            if m.name == "__name__" and m.op == "=":
                names.add(m.value)
    return names


def backfill_chunked(store, data: Path, tmp: Path, chunk_ms: int = 2 * 3600_000, names=None, say=print) -> tuple:
    """The store into the TSDB directory ``data`` one time chunk at a time: the samples of each
    ``chunk_ms`` (aligned to unix time 0, as promtool aligns its 2-hour blocks) written as one
    OpenMetrics file, turned into a block by promtool (niced) while the next chunk is written,
    then deleted. One promtool pass per block instead of one pass of the whole file per block,
    and one chunk's text on disk at a time. Only series named in ``names`` (what the rules
    read), when given. Returns (samples, series, seconds writing, seconds waiting on promtool)."""
    series = [s for s in store if names is None or dict(s.labels)["__name__"] in names]
    first = min(int(s.t[0]) for s in series)
    last = max(int(s.t[-1]) for s in series)
    heads = []
    for s in series:
        labels = dict(s.labels)
        name = labels.pop("__name__")
        heads.append(name + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}")
    total = 0
    t_write = t_wait = 0.0
    pending = None  # (process, file)
    a = first // chunk_ms * chunk_ms
    k = 0
    while a <= last:
        b = a + chunk_ms
        path = tmp / f"chunk-{k}.om"
        t0 = time.perf_counter()
        with path.open("w") as fh:
            for head, s in zip(heads, series):
                i, j = np.searchsorted(s.t, [a, b])
                if i == j:
                    continue
                ts = (s.t[i:j] // 1000).tolist()
                fh.write("".join(f"{head} {v!r} {t}\n" for v, t in zip(s.v[i:j].tolist(), ts)))
                total += int(j - i)
            fh.write("# EOF\n")
        t_write += time.perf_counter() - t0
        t0 = time.perf_counter()
        if pending is not None:
            _finish(*pending)
        t_wait += time.perf_counter() - t0
        proc = subprocess.Popen(["nice", "-n", "10", "promtool", "tsdb", "create-blocks-from", "openmetrics", "-q",
                                 str(path), str(data)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        pending = (proc, path)
        say(f"  chunk {k}: {path.stat().st_size / 1e6:.0f} MB of OpenMetrics, {total / 1e6:.1f}M samples so far")
        a, k = b, k + 1
    t0 = time.perf_counter()
    if pending is not None:
        _finish(*pending)
    t_wait += time.perf_counter() - t0
    return total, len(series), t_write, t_wait


def _finish(proc, path: Path) -> None:
    _, err = proc.communicate()
    path.unlink()
    if proc.returncode != 0:
        raise SystemExit(f"promtool on {path.name}: {err.decode(errors='replace')[-2000:]}")


def run_path(url: str, engine: str, start_s: int, end_s: int, step_s: int, out_json: Path, limit_s: float,
             server_chunk: str = "6h") -> dict:
    """One backtest process; its wall time and peak RSS. Past ``limit_s`` it is stopped and the
    figures are lower bounds (``done`` False): the peak is polled from /proc while it runs."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-c", CHILD, "--prometheus-url", url, "--engine", engine, "--start", str(start_s),
            "--end", str(end_s), "--step", f"{step_s}s", "--json", str(out_json)]
    if engine == "server":
        argv += ["--server-chunk", server_chunk]
    errf = out_json.with_suffix(".err")
    t0 = time.perf_counter()
    with errf.open("w") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err, env=env, start_new_session=True)
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
        raise SystemExit(f"{engine}: no result\n{text[-3000:]}")
    got = json.loads(m.group(1))
    got["done"] = True
    got["log"] = text.strip().splitlines()[0] if text.strip() else ""
    if got["rc"] != 0:
        raise SystemExit(f"{engine}: rc {got['rc']}\n{text[-3000:]}")
    return got


def episodes(path: Path) -> dict:
    rep = json.loads(path.read_text())
    return {(a["alertname"], json.dumps(a["labels"], sort_keys=True)):
            [(s["start_ms"], s["seconds"]) for s in a["episode_spans"]] for a in rep["alerts"]}


def server_hwm_mib(port: int) -> float:
    """Peak RSS (VmHWM) of the process listening on ``port`` (the server under test)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if f":{port}" not in cmd or ("prometheus" not in cmd and "victoria" not in cmd):
                continue
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
        except OSError:
            continue
    return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pods", type=int, default=200)
    ap.add_argument("--hours", type=float, default=24)
    ap.add_argument("--scrape", type=int, default=60, help="scrape interval of the fleet (s)")
    ap.add_argument("--step", type=int, default=60, help="evaluation interval (s)")
    ap.add_argument("--server", choices=("prometheus", "victoria"), default="prometheus")
    ap.add_argument("--limit", type=float, default=300, help="stop a path after this many seconds (s)")
    ap.add_argument("--server-chunk", default="6h", help="--engine server: the range of one query (default 6h)")
    ap.add_argument("--tsdb", metavar="DIR", help="--server prometheus: keep the backfilled TSDB here, and reuse it "
                    "when it holds this fleet already (bench_capacity_server.py reads it too)")
    ap.add_argument("--write", metavar="FILE", help="replace this script's section of FILE with the results")
    args = ap.parse_args()

    t0 = time.perf_counter()
    lines = []
    imported = 0.0

    def say(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if args.server == "prometheus":
            from promtsdb import prometheus_serving

            data = Path(args.tsdb) if args.tsdb else tmp / "tsdb"
            spec = {"pods": args.pods, "hours": args.hours, "scrape": args.scrape}
            marker = data / "bench-fleet.json"
            if marker.exists() and json.loads(marker.read_text())["spec"] == spec:
                got = json.loads(marker.read_text())
                samples, nseries, first, last = got["samples"], got["series"], got["first"], got["last"]
                gen = load = 0.0
                say(f"(the TSDB in {data} holds this fleet already: reused)")
            else:
                store = fleet(args.pods, args.hours / 24, args.scrape)
                first = int(min(s.t[0] for s in store)) // 1000
                last = int(max(s.t[-1] for s in store)) // 1000
                gen = time.perf_counter() - t0
                if data.exists():
                    import shutil
                    shutil.rmtree(data)
                data.mkdir(parents=True)
                samples, nseries, t_write, t_wait = backfill_chunked(store, data, tmp, names=read_names(), say=say)
                del store
                load = t_write + t_wait
                marker.write_text(json.dumps({"spec": spec, "samples": samples, "series": nseries, "first": first,
                                              "last": last}))
                say(f"backfill: {t_write:.0f}s writing 2-hour chunks of OpenMetrics, {t_wait:.0f}s more waiting on "
                    "promtool (each chunk converted while the next was written)")
            ctx = prometheus_serving(data, tmp, ready_seconds=600)
        else:
            from exporter.harness.victoria import VictoriaMetrics

            store = fleet(args.pods, args.hours / 24, args.scrape)
            first = int(min(s.t[0] for s in store)) // 1000
            last = int(max(s.t[-1] for s in store)) // 1000
            samples, nseries = sum(len(s) for s in store), len(store)
            gen = time.perf_counter() - t0
            t_imp = time.perf_counter()
            vm = VictoriaMetrics(tmp / "vm")
            vm.import_store(store)
            del store  # the children measured next must not start from this process's size
            imported = time.perf_counter() - t_imp

            class _Ctx:
                def __enter__(self):
                    return vm.url

                def __exit__(self, *exc):
                    vm.close()
            ctx = _Ctx()
        start = -(-first // args.step) * args.step
        t1 = time.perf_counter()
        with ctx as url:
            if args.server == "victoria":
                load = time.perf_counter() - t1 + imported
            port = int(url.rsplit(":", 1)[1])
            say(f"fleet: {args.pods} pods, {nseries} series, {samples / 1e6:.1f}M samples at {args.scrape}s over "
                f"{args.hours:g}h; generated and written in {gen:.0f}s, backfilled into {args.server} in {load:.0f}s")
            res = {}
            for engine in ("server", "local"):
                res[engine] = run_path(url, engine, start, last, args.step, tmp / f"{engine}.json", args.limit,
                                       args.server_chunk)
                r = res[engine]
                if r["done"]:
                    say(f"--engine {engine}: {r['wall']:.1f}s wall, peak RSS {r['rss_mib']:.0f} MiB ({r['log']})")
                else:
                    say(f"--engine {engine}: stopped after {r['wall']:.0f}s (--limit), peak RSS {r['rss_mib']:.0f} MiB "
                        "by then: lower bounds")
            say(f"{args.server} peak RSS (VmHWM) over both: {server_hwm_mib(port):.0f} MiB")
            b = episodes(tmp / "server.json")
            a = episodes(tmp / "local.json") if res["local"]["done"] else b
            same = a == b
            say(f"alert episodes: {sum(len(v) for v in b.values())} over {len(b)} alert label sets; server and local "
                + (("identical" if same else "DIFFER") if res["local"]["done"] else "not compared (local stopped)"))
            if not same:
                for k in sorted(set(a) | set(b)):
                    if a.get(k) != b.get(k):
                        say(f"  {k[0]} {k[1]}: local {a.get(k)}, server {b.get(k)}")
            bound = "" if res["local"]["done"] else "at least: "
            say(bound + f"memory: the server path held {res['server']['rss_mib']:.0f} MiB against "
                f"{res['local']['rss_mib']:.0f} MiB ({res['local']['rss_mib'] / res['server']['rss_mib']:.1f}x); "
                f"time {res['server']['wall']:.0f}s against {res['local']['wall']:.0f}s")
    if args.write:
        path = Path(args.write)
        text = path.read_text()
        body = (f"{SECTION}\n\n`python bench/bench_backtest_server.py --pods {args.pods} --hours {args.hours:g} "
                f"--scrape {args.scrape} --step {args.step} --server {args.server}` (one run, on the machine the "
                f"tests run on):\n\n```\n" + "\n".join(lines) + "\n```\n")
        if SECTION in text:
            head, rest = text.split(SECTION, 1)
            nxt = rest.find("\n## ")
            text = head + body + (rest[nxt + 1:] if nxt >= 0 else "")
        else:
            text = text.rstrip("\n") + "\n\n" + body
        path.write_text(text)


if __name__ == "__main__":
    main()
