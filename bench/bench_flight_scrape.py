"""Is a /metrics scrape slowed by a large /debug/flight? Scrape latency with and without
concurrent flight-record downloads, from the same sidecar in the same run.

    python bench/bench_flight_scrape.py [--minutes 30] [--rounds 4] [--seconds 15] [--downloaders 2]
        [--max-encoders N] [--encoders child,inprocess]

The sidecar: the real ``Sidecar`` with its flight recorder, 2 stand-in GPUs and a real vLLM page
(tests/fixtures/vllm/after_load.txt, counters advancing); its recorder is first filled with
``--minutes`` of polls at one per second (a fake clock: the record a pod holds after that long),
then a poll thread goes on polling every second on the real clock while the real listener
(``SidecarServer`` with its ``FlightService``) serves, all in this process (one GIL, as in a pod).

The load, from child processes (their own GIL, as Prometheus and kubectl are): one scraper asks
for /metrics every 50 ms (Prometheus' Accept and Accept-Encoding headers, keep-alive) and records
each latency; in the "downloads" rounds ``--downloaders`` processes also fetch the whole
/debug/flight (gzip) back to back, the worst an on-call engineer and a postmortem loop can do.
Rounds alternate quiet / downloads, so the machine's load drifts the same for both; the download
rounds take turns between the encoders of ``--encoders``: ``child`` (the ``FlightService`` as it
is: the encoding in a child process) and ``inprocess`` (``InProcess`` below: the encoder as it was
before, in the sidecar's interpreter, paced, one at a time), so both are measured in the same run
against the same quiet rounds. A downloader answered 503 waits the ``Retry-After`` it was given.

Reported: scrape latency p50/p95/p99/max per kind of round, the ratio downloads/quiet, the
record's size and the download times, the polls the sidecar missed, and what a download costs the
sidecar's own interpreter (the snapshot and the child's request, timed once before the rounds;
the encoding itself runs in the ``FlightService``'s child process). Not a test: nothing asserts.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ACCEPT = ("application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.4,*/*;q=0.1")


def _scraper(url, seconds, out):
    import requests

    s = requests.Session()
    lat = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        r = s.get(url + "/metrics", headers={"Accept": ACCEPT, "Accept-Encoding": "gzip"}, timeout=30)
        lat.append(time.perf_counter() - t0)
        assert r.status_code == 200
        time.sleep(0.05)
    out.put(("scrape", lat))


def _downloader(url, seconds, out):
    import requests

    s = requests.Session()
    got = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        r = s.get(url + "/debug/flight", headers={"Accept-Encoding": "gzip"}, timeout=600, stream=True)
        n = sum(len(c) for c in r.raw.stream(1 << 16, decode_content=False))
        got.append((time.perf_counter() - t0, n, r.status_code))
        if r.status_code == 503:
            time.sleep(float(r.headers.get("Retry-After", "1")))
    out.put(("download", got))


def in_process_service():
    """The FlightService with the encoder as it was before the child process: in this interpreter,
    in 16 KB chunks with a pause after each as long as it took (pace 1.0), one at a time."""
    from exporter.runtime.flight import FlightService
    from exporter.runtime.flight_encode import encoded, unpack

    class InProcess(FlightService):
        def _run(self, job, payload):
            blocks, start, end, labels, gz, _ = unpack(payload)
            out = []
            t = time.perf_counter()
            for part in encoded(blocks, start, end, labels, gz, 1 << 14):
                out.append(part)
                now = time.perf_counter()
                time.sleep(now - t)
                t = time.perf_counter()
            return b"".join(out)

    return InProcess


def q(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=30.0, help="minutes of polls in the record (default 30)")
    ap.add_argument("--rounds", type=int, default=4, help="rounds of each kind (default 4)")
    ap.add_argument("--seconds", type=float, default=15.0, help="seconds per round (default 15)")
    ap.add_argument("--downloaders", type=int, default=2)
    ap.add_argument("--max-encoders", type=int, default=None, help="FlightService's encoders at once (default: its own)")
    ap.add_argument("--encoders", default="child,inprocess", help="the encoders the download rounds take turns with")
    ns = ap.parse_args()

    from exporter.runtime.flight import FlightService
    from exporter.runtime.server import SidecarServer

    sc, rec, live, fill_s = filled_sidecar(ns.minutes)
    live[0] = True
    stats = rec.stats()
    kw = {"max_encoders": ns.max_encoders} if ns.max_encoders is not None else {}
    labels = (("namespace", "bench"), ("pod", "vllm-0"))
    kinds = [k.strip() for k in ns.encoders.split(",") if k.strip()]
    services = {"child": FlightService(rec, sc.recorder_lock, labels, **kw),
                "inprocess": in_process_service()(rec, sc.recorder_lock, labels, max_encoders=1)}
    services = {k: services[k] for k in kinds}
    flight = services[kinds[0]]
    from exporter.runtime.flight_encode import pack

    t1 = time.perf_counter()
    with sc.recorder_lock:
        blocks, _ = rec.snapshot()
    payload = pack([(b.schema.packed, b.times.tobytes(), b.data) for b in blocks], -1e300, 1e300, flight.labels, True)
    parent_ms = (time.perf_counter() - t1) * 1000
    if "child" in services:
        print(f"FlightService: {services['child'].max_encoders} encoder(s) at once, in child processes; the sidecar's "
              f"own share of a download: {parent_ms:.1f} ms (snapshot, the child's request of "
              f"{len(payload) / 2**20:.2f} MiB)")
    srv = SidecarServer("127.0.0.1", 0, lambda: sc.published, lambda: True, flight=flight)
    srv.start()
    url = f"http://127.0.0.1:{srv.address[1]}"
    stop = threading.Event()
    missed = [0, 0]  # polls, polls started more than 1.5 s after the previous one

    def poller():
        last = time.monotonic()
        while not stop.wait(max(0.0, 1.0 - (time.monotonic() - last))):
            now = time.monotonic()
            missed[0] += 1
            missed[1] += now - last > 1.5
            last = now
            sc.poll_once()

    th = threading.Thread(target=poller, daemon=True)
    th.start()
    ctx = mp.get_context("spawn")
    res = {"quiet": [], **{k: [] for k in kinds}}
    downloads = {k: [] for k in kinds}
    cpu = {k: [0.0, 0.0] for k in res}  # this process' CPU seconds (the sidecar, its listener), wall seconds
    try:
        for r in range(ns.rounds * len(kinds) * 2):
            kind = "quiet" if r % 2 == 0 else kinds[(r // 2) % len(kinds)]
            if kind != "quiet":
                srv.flight = services[kind]
            out = ctx.Queue()
            procs = [ctx.Process(target=_scraper, args=(url, ns.seconds, out))]
            if kind != "quiet":
                procs += [ctx.Process(target=_downloader, args=(url, ns.seconds, out)) for _ in range(ns.downloaders)]
            c0, w0 = time.process_time(), time.monotonic()
            for p in procs:
                p.start()
            for _ in procs:
                what, data = out.get(timeout=ns.seconds + 900)
                (res[kind] if what == "scrape" else downloads[kind]).extend(data)
            for p in procs:
                p.join(60)
            cpu[kind][0] += time.process_time() - c0
            cpu[kind][1] += time.monotonic() - w0
            print(f"round {r + 1}: {kind}: {len(res[kind])} scrapes so far", file=sys.stderr)
    finally:
        stop.set()
        th.join(5)
        srv.stop()
        for f in services.values():
            f.close()

    print(f"record: {stats['polls']} polls ({ns.minutes:g} min at 1 s), {stats['bytes'] / 2**20:.2f} MiB held, "
          f"filled in {fill_s:.0f} s")
    print_rounds(res, downloads, cpu, missed, kinds, services)


def filled_sidecar(minutes: float):
    """A real sidecar (simulated GPUs) with its flight recorder, polled once a simulated second for
    ``minutes`` over a real vLLM page whose counters grow; its clock turns to the wall clock when
    the returned ``live[0]`` is set. Returns (sidecar, recorder, live, seconds the filling took)."""
    from exporter.harness import pagetransform as pt
    from exporter.harness.fakenvml import FakeNvml, make_gpus
    from exporter.runtime import config
    from exporter.runtime.flight import Recorder
    from exporter.runtime.nvml import NvmlSource
    from exporter.runtime.sidecar import Sidecar

    base = (ROOT / "tests" / "fixtures" / "vllm" / "after_load.txt").read_text()
    n = [0]

    def page():
        n[0] += 1
        return pt.scale_counters(base, 1 + n[0] * 0.001)

    polls = int(minutes * 60)
    clock = [time.time() - polls]
    live = [False]
    cfg = config.build({"poll_interval": 1, "window": 60, "gpu": "nvml"}, {})
    rec = Recorder(minutes=minutes + 5)
    sc = Sidecar(cfg, page, NvmlSource(FakeNvml(make_gpus(2))), clock=lambda: time.time() if live[0] else clock[0],
                 recorder=rec)
    t0 = time.perf_counter()
    for _ in range(polls):
        sc.poll_once()
        clock[0] += 1
    return sc, rec, live, time.perf_counter() - t0


def print_rounds(res, downloads, cpu, missed, kinds, services) -> None:
    """What the rounds measured: the downloads, the polls' lateness, the sidecar's CPU and the
    scrape latency table per kind of round, with the ratios to the quiet rounds."""
    def row(kind):
        xs = res[kind]
        return (f"| {kind} | {len(xs)} | {q(xs, 0.5) * 1000:.1f} | {q(xs, 0.95) * 1000:.1f} | "
                f"{q(xs, 0.99) * 1000:.1f} | {max(xs) * 1000:.1f} |")

    for k in kinds:
        ok = [d for d in downloads[k] if d[2] == 200]
        busy = [d for d in downloads[k] if d[2] == 503]
        print(f"{k}: {len(ok)} downloads of the whole record, gzip {statistics.median([d[1] for d in ok]) / 2**20:.1f} "
              f"MiB each, {statistics.median([d[0] for d in ok]):.1f} s median (max {max(d[0] for d in ok):.1f} s); "
              f"{len(busy)} answered 503 ({services[k].max_encoders} at once)" if ok else f"{k}: no download finished")
    print(f"polls during the rounds: {missed[0]}, late by more than 0.5 s: {missed[1]}")
    print("the sidecar process' own CPU (its interpreter: polls, listener, encoder when in-process; not the "
          "encoder children): " + ", ".join(f"{k} {c / w * 100:.0f} % of a core" for k, (c, w) in cpu.items() if w))
    print()
    print("| rounds | scrapes | p50 ms | p95 ms | p99 ms | max ms |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    print(row("quiet"))
    for k in kinds:
        print(row(k))
    a = res["quiet"]
    for k in kinds:
        b = res[k]
        print(f"\nratio {k} downloads/quiet: p50 {q(b, .5) / q(a, .5):.2f}, p95 {q(b, .95) / q(a, .95):.2f}, "
              f"p99 {q(b, .99) / q(a, .99):.2f}")


if __name__ == "__main__":
    main()
