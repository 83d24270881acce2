"""Listener benchmark: the sidecar's HTTP listener against the old one (http.server's
ThreadingHTTPServer, taken from git history into a temporary module), in the same run.

    python bench/bench_listener.py [--duration 20] [--rounds 2] [--scrapers 200] [--crowd 500] [--baseline-rev REV]

Each server runs in its own process inside a real sidecar (the poll loop and the server share
the process and its GIL) reading the demo's simulated vLLM (``SimVllm`` behind ``PageServer``,
a third process, as vLLM is). The load comes from this process, on one asyncio loop:

1. storm: ``--scrapers`` keep-alive scrapers ask for /metrics as fast as answers come (with
   Prometheus' Accept and Accept-Encoding headers) while ``--crowd`` connections are held open,
   half idle, half slowloris (a request head that never ends, a header line every 2 s; a
   connection the server closes is opened again). Sidecar polling every 1 s.
2. polling: 10 keep-alive scrapers while the sidecar polls 20 times a second.

Reported: p50, p99 and max latency of /metrics, answers by status, timeouts (no answer within
10 s), the server's thread count, its CPU time per answer (less sensitive to a busy machine than
latency) and the CPU shares of server and load generator, the sidecar's missed polls (reads of vLLM that failed while the
server hogged the GIL), and new/old ratios; in the storm also Prometheus' own scrape, one every
0.5 s on a keep-alive connection from a process of its own. Absolute numbers depend on the machine
(the load generator shares its cores); the ratios are the result. Not a test: nothing asserts.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROM_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
               "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
TIMEOUT = 10.0


# -- child processes ---------------------------------------------------------------------------

def child_sim() -> None:
    from exporter.harness.pageserver import PageServer
    from exporter.harness.simulate import SimRunner, SimVllm

    sim = SimVllm("normal")
    SimRunner(sim).start()
    vllm = PageServer(sim.page).start()
    print(f"port {vllm.port}", flush=True)
    sys.stdin.read()  # until the parent goes
    vllm.stop()


def child_server(which: str, vllm_url: str, poll: float, old_module: str) -> None:
    import importlib.util

    from exporter.runtime import config
    from exporter.runtime.fetch import PageFetcher
    from exporter.runtime.sidecar import Sidecar

    cfg = config.build({"vllm_url": vllm_url, "poll_interval": poll, "window": max(10.0, 4 * poll),
                        "gpu": "none", "log_level": "error", "listen": "127.0.0.1:0"}, {})
    client = PageFetcher(cfg.metrics_url, cfg.vllm_timeout, cfg.vllm_max_page_bytes, "", "")
    sidecar = Sidecar(cfg, client.fetch, None, page_bytes=lambda: client.last_bytes)
    sidecar.poll_once()
    stop = threading.Event()
    threading.Thread(target=sidecar.run, args=(stop,), name="poll", daemon=True).start()
    kw = dict(max_requests=cfg.web_max_requests, max_connections=cfg.web_max_connections,
              header_timeout=cfg.web_header_timeout, idle_timeout=cfg.web_idle_timeout)
    if which == "old":
        spec = importlib.util.spec_from_file_location("old_server", old_module)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        if hasattr(mod, "ThreadingHTTPServer"):
            kw = {}  # the http.server listener takes none of the limits
        server = mod.SidecarServer("127.0.0.1", 0, lambda: sidecar.published, sidecar.healthy, **kw)
    else:
        from exporter.runtime.server import SidecarServer

        server = SidecarServer("127.0.0.1", 0, lambda: sidecar.published, sidecar.healthy, **kw)
    server.start()
    print(f"port {server.address[1]}", flush=True)
    sys.stdin.read()
    stop.set()
    server.stop()


def child_probe(port: int, duration: float) -> None:
    """Prometheus' own scrape: one keep-alive connection, a scrape every 0.5 s, in a process of
    its own (so the load generator's event loop does not delay it)."""
    import http.client

    print("port 0", flush=True)
    lat, status, timeouts = [], {}, 0
    conn = None
    until = time.monotonic() + duration
    while time.monotonic() < until:
        t0 = time.monotonic()
        try:
            if conn is None:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
            conn.request("GET", "/metrics", headers={"Accept": PROM_ACCEPT, "Accept-Encoding": "gzip"})
            r = conn.getresponse()
            r.read()
            lat.append(time.monotonic() - t0)
            status[r.status] = status.get(r.status, 0) + 1
        except OSError:
            timeouts += 1
            conn.close()
            conn = None
        time.sleep(max(0.0, 0.5 - (time.monotonic() - t0)))
    print(json.dumps({"lat": lat, "status": status, "timeouts": timeouts}), flush=True)


def spawn(*args: str, quiet: bool = False) -> tuple:
    p = subprocess.Popen([sys.executable, __file__, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL if quiet else None, text=True, cwd=ROOT)
    line = p.stdout.readline()
    m = re.match(r"port (\d+)", line)
    if not m:
        p.kill()
        raise SystemExit(f"bench: child {args} did not start: {line!r}")
    return p, int(m.group(1))


def end(p: subprocess.Popen) -> None:
    try:
        p.stdin.close()
        p.wait(timeout=10)
    except Exception:  # noqa: BLE001
        p.kill()
        p.wait()


def threads_of(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Threads:"):
                return int(line.split()[1])
    except OSError:
        pass
    return -1


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def old_server_source(rev: str) -> str:
    """server.py as it was at ``rev``, or the newest revision still built on http.server."""
    if rev:
        revs = [rev]
    else:
        revs = subprocess.run(["git", "log", "--format=%H", "--", "exporter/runtime/server.py"], cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout.split()
    for r in revs:
        src = subprocess.run(["git", "show", f"{r}:exporter/runtime/server.py"], cwd=ROOT,
                             capture_output=True, text=True).stdout
        if "from http.server import" in src or (rev and "class SidecarServer" in src):
            src = re.sub(r"^from \.(\w+) import", r"from exporter.runtime.\1 import", src, flags=re.M)
            return src
    raise SystemExit("bench: no revision of exporter/runtime/server.py built on ThreadingHTTPServer")


# -- load ------------------------------------------------------------------------------------------

class Stats:
    def __init__(self) -> None:
        self.lat: list = []
        self.status: dict = {}
        self.timeouts = 0
        self.errors = 0

    def add(self, other: dict) -> None:
        self.lat += other["lat"]
        for k, v in other["status"].items():
            self.status[int(k)] = self.status.get(int(k), 0) + v
        self.timeouts += other.get("timeouts", 0)
        self.errors += other.get("errors", 0)

    def raw(self) -> dict:
        return {"lat": self.lat, "status": self.status, "timeouts": self.timeouts, "errors": self.errors}

    def summary(self) -> dict:
        lat = sorted(self.lat)

        def q(f: float) -> float:
            return lat[min(len(lat) - 1, int(f * len(lat)))] * 1000 if lat else float("nan")

        return {"answers": len(lat), "p50_ms": q(0.5), "p99_ms": q(0.99), "max_ms": q(1.0),
                "by_status": dict(sorted(self.status.items())), "timeouts": self.timeouts, "errors": self.errors}


async def _read_response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    m = re.search(rb"(?i)\r\ncontent-length: *(\d+)", head)
    if m:
        await reader.readexactly(int(m.group(1)))
    return status


async def scraper(port: int, until: float, stats: Stats) -> None:
    req = (f"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAccept: {PROM_ACCEPT}\r\n"
           "Accept-Encoding: gzip\r\nUser-Agent: bench\r\n\r\n").encode()
    reader = writer = None
    while time.monotonic() < until:
        t0 = time.monotonic()
        try:
            if writer is None:
                reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), TIMEOUT)
            writer.write(req)
            status = await asyncio.wait_for(_read_response(reader), TIMEOUT - (time.monotonic() - t0))
            stats.lat.append(time.monotonic() - t0)
            stats.status[status] = stats.status.get(status, 0) + 1
        except asyncio.TimeoutError:
            stats.timeouts += 1
            writer = _drop(writer)
        except (OSError, asyncio.IncompleteReadError, ValueError):
            stats.errors += 1
            writer = _drop(writer)
            await asyncio.sleep(0.05)
    _drop(writer)


def _drop(writer):
    if writer is not None:
        writer.transport.abort()
    return None


async def crowd_member(port: int, until: float, slow: bool, held: list) -> None:
    while time.monotonic() < until:
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 30)
        except (OSError, asyncio.TimeoutError):
            await asyncio.sleep(0.5)
            continue
        held[0] += 1
        try:
            if slow:
                writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            while time.monotonic() < until:
                if slow:
                    writer.write(b"X-Slow: 1\r\n")
                try:
                    if await asyncio.wait_for(reader.read(1024), 2.0) == b"":
                        break  # the server closed it: open another
                except asyncio.TimeoutError:
                    continue
        except OSError:
            pass
        finally:
            held[0] -= 1
            writer.transport.abort()


async def run_load(port: int, pid: int, duration: float, scrapers: int, crowd: int) -> dict:
    held = [0]
    crowd_until = time.monotonic() + duration + 5 + (10 if crowd else 0)
    tasks = [asyncio.create_task(crowd_member(port, crowd_until, i % 2 == 1, held)) for i in range(crowd)]
    if crowd:
        await asyncio.sleep(10)  # let the crowd settle in (the old server's backlog of 5 makes connects slow)
    stats = Stats()
    probe, _ = spawn("--child", "probe", str(port), str(duration)) if crowd else (None, 0)
    threads = [threads_of(pid)]
    held_seen = [held[0]]
    cpu0, own0 = cpu_seconds(pid), time.process_time()
    until = time.monotonic() + duration

    async def sample():
        while time.monotonic() < until:
            threads.append(threads_of(pid))
            held_seen.append(held[0])
            await asyncio.sleep(0.5)

    await asyncio.gather(sample(), *(scraper(port, until, stats) for _ in range(scrapers)))
    cpu, own = cpu_seconds(pid) - cpu0, time.process_time() - own0
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    out = {"load": stats.raw(), "threads": max(threads), "held": statistics.mean(held_seen) if crowd else 0,
           "cpu": cpu, "client_cpu": own, "seconds": duration}
    if probe is not None:
        out["probe"] = json.loads(probe.stdout.readline() or '{"lat": [], "status": {}}')
        end(probe)
    out["poll_errors"] = poll_errors(port)
    return out


def poll_errors(port: int) -> float:
    """The sidecar's failed reads of vLLM so far (a poll loop starved of the GIL misses reads)."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
            text = r.read().decode()
    except OSError:
        return float("nan")
    return sum(float(m.group(1)) for m in re.finditer(
        r'^vllm_sidecar_poll_errors_total\{[^}]*target="vllm"[^}]*\} (\S+)$', text, re.M))


# -- main ------------------------------------------------------------------------------------------

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--duration", type=float, default=20.0, help="seconds of load per scenario and server")
    ap.add_argument("--rounds", type=int, default=2, help="runs per scenario and server, old and new alternating")
    ap.add_argument("--scrapers", type=int, default=200)
    ap.add_argument("--crowd", type=int, default=500, help="idle and slowloris connections held open")
    ap.add_argument("--poll-scrapers", type=int, default=10)
    ap.add_argument("--baseline-rev", default="", help="git revision of the old server.py (default: the newest "
                                                       "built on http.server; any revision given is taken as "
                                                       "it is, e.g. the listener before a change)")
    ap.add_argument("--json", default="", help="also write the results here")
    ap.add_argument("--child", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        if args.child[0] == "sim":
            child_sim()
        elif args.child[0] == "probe":
            child_probe(int(args.child[1]), float(args.child[2]))
        else:
            child_server(args.child[1], args.child[2], float(args.child[3]), args.child[4])
        return
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 4096)), hard))
    except (ImportError, ValueError, OSError):
        pass

    tmp = tempfile.mkdtemp(prefix="bench-listener-")
    old_path = os.path.join(tmp, "old_server.py")
    Path(old_path).write_text(old_server_source(args.baseline_rev))
    sim, sim_port = spawn("--child", "sim", quiet=True)  # (it tells of every scrape the sidecar gave up on)
    vllm_url = f"http://127.0.0.1:{sim_port}"
    runs: dict = {}
    try:
        for scenario, poll, scrapers, crowd in (("storm", 1.0, args.scrapers, args.crowd),
                                                ("polling", 0.05, args.poll_scrapers, 0)):
            for rnd in range(args.rounds):  # old and new alternate, so a change in the machine's load hits both
                for which in (("old", "new") if rnd % 2 == 0 else ("new", "old")):
                    p, port = spawn("--child", "server", which, vllm_url, str(poll), old_path, quiet=True)
                    try:
                        time.sleep(1.0)
                        poll_errors(port)  # one scrape first, as Prometheus has scraped before a storm
                        r = asyncio.run(run_load(port, p.pid, args.duration / args.rounds, scrapers, crowd))
                    finally:
                        end(p)
                    runs.setdefault((scenario, which), []).append(r)
                    print(f"{scenario} {which} round {rnd + 1}: {json.dumps(Stats.summary(_stats([r['load']])))}",
                          flush=True)
    finally:
        end(sim)
        os.unlink(old_path)
        os.rmdir(tmp)

    results: dict = {}
    for (scenario, which), rs in runs.items():
        out = _stats([r["load"] for r in rs]).summary()
        out["server_threads_max"] = max(r["threads"] for r in rs)
        out["missed_polls"] = sum(r["poll_errors"] for r in rs)
        out["server_cpu_share"] = sum(r["cpu"] for r in rs) / sum(r["seconds"] for r in rs)
        out["client_cpu_share"] = sum(r["client_cpu"] for r in rs) / sum(r["seconds"] for r in rs)
        out["server_cpu_ms_per_answer"] = 1000 * sum(r["cpu"] for r in rs) / max(1, out["answers"])
        if scenario == "storm":
            out["crowd_held_mean"] = round(statistics.mean(r["held"] for r in rs))
            out["prometheus"] = _stats([r["probe"] for r in rs]).summary()
        results[f"{scenario}/{which}"] = out
    print()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores (the load generator shares them)")
    print(f"{'scenario':9} {'server':6} {'answers':>8} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>9} {'timeouts':>8} "
          f"{'threads':>7} {'missed polls':>12} {'CPU ms/answer':>13} {'server/client CPU':>17}  status")
    for key, r in results.items():
        scenario, which = key.split("/")
        print(f"{scenario:9} {which:6} {r['answers']:8d} {r['p50_ms']:9.1f} {r['p99_ms']:9.1f} {r['max_ms']:9.1f} "
              f"{r['timeouts']:8d} {r['server_threads_max']:7d} {r['missed_polls']:12.0f} "
              f"{r['server_cpu_ms_per_answer']:13.2f} {r['server_cpu_share']:8.2f}/{r['client_cpu_share']:.2f}  "
              f"{r['by_status']}")
    for which in ("old", "new"):
        pr = results[f"storm/{which}"]["prometheus"]
        print(f"Prometheus' own scrape during the storm, {which}: {pr['answers']} answers, p50 {pr['p50_ms']:.1f} ms, "
              f"max {pr['max_ms']:.1f} ms, {pr['by_status']}, timeouts {pr['timeouts']}")
    for scenario in ("storm", "polling"):
        o, n = results[f"{scenario}/old"], results[f"{scenario}/new"]
        print(f"{scenario}: old/new p50 {o['p50_ms'] / n['p50_ms']:.1f}x, p99 {o['p99_ms'] / n['p99_ms']:.1f}x, "
              f"max {o['max_ms'] / n['max_ms']:.1f}x, throughput new/old {n['answers'] / max(1, o['answers']):.1f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


def _stats(raws: list) -> Stats:
    st = Stats()
    for r in raws:
        st.add(r)
    return st


if __name__ == "__main__":
    main()
