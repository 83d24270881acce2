"""Fetch benchmark: CPU per read of a real vLLM page, this project's client against ``requests``.

Reports ratios measured in the same run (never absolute timings as a pass/fail):

    python bench/bench_fetch.py [--n 200] [--repeat 5] [--revs REV,...] [--nodelay]

The page server runs in another process, so the CPU measured (``time.process_time``) is the
client's alone. ``requests`` is driven the way the sidecar drove it before (one Session, one
kept-alive connection, ``stream=True``, the body read in chunks, decoded). Each case is run
``--repeat`` times, the clients taking turns; each repeat's ratio is to ``requests`` in the same
repeat, and the median is shown. ``--revs``: also ``fetch.py`` as it was at these git revisions
(e.g. the last framed by h11), in the same run. ``--nodelay``: the page server sets TCP_NODELAY,
as vLLM's uvicorn does; without it (``http.server``'s default) Nagle holds the body back until
the client's delayed ACK of the head. Also "fetch + parse": ``requests`` + prometheus_client's
parser against this client + this project's parser (warm, as the sidecar polls).
"""

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import requests  # noqa: E402  (a benchmark-only dependency: pip install requests)
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from requests.adapters import HTTPAdapter  # noqa: E402

from bench.bench_poll import _fetch_module  # noqa: E402
from exporter.runtime.exposition import Parser  # noqa: E402
from exporter.runtime.fetch import PageFetcher  # noqa: E402

# the page server: HTTP/1.1 keep-alive, the page (and its gzip) made once, so that the server's
# own work does not vary between the two clients
SERVER = """
import gzip, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
body = open({page!r}, "rb").read()
zipped = gzip.compress(body, 6)
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = {nodelay}
    def log_message(self, *a):
        pass
    def do_GET(self):
        z = {gzip} and "gzip" in self.headers.get("Accept-Encoding", "")
        data = zipped if z else body
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        if z:
            self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
s = ThreadingHTTPServer(("127.0.0.1", 0), H)
s.daemon_threads = True
print(s.server_address[1], flush=True)
threading.Thread(target=s.serve_forever, daemon=True).start()
sys.stdin.read()
"""


class RequestsFetcher:
    """The sidecar's former client, reduced to its hot path."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.session = requests.Session()
        self.session.trust_env = False
        self.session.mount("http://", HTTPAdapter(pool_connections=1, pool_maxsize=1, max_retries=0))
        self.headers = {"Accept": "text/plain;version=0.0.4;q=1,*/*;q=0.1", "Accept-Encoding": "gzip",
                        "User-Agent": "vllm-sidecar-exporter"}

    def fetch(self) -> str:
        resp = self.session.get(self.url, headers=self.headers, timeout=(30, 30), stream=True)
        chunks = []
        while True:
            chunk = resp.raw.read1(65536, decode_content=True)
            if not chunk:
                break
            chunks.append(chunk)
        resp.raw.release_conn()
        return b"".join(chunks).decode("utf-8")


def cpu_per_call(fn, n: int) -> float:
    t0 = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - t0) / n


def compare(cases: dict, n: int, repeat: int) -> dict:
    """CPU per call of each case, the cases taking turns, ``repeat`` times: {case: [seconds]}."""
    out = {k: [] for k in cases}
    names = list(cases)
    for r in range(repeat):
        for k in names[r % len(names):] + names[:r % len(names)]:
            out[k].append(cpu_per_call(cases[k], n))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--revs", default="", help="also fetch.py at these git revisions, comma-separated")
    ap.add_argument("--nodelay", action="store_true", help="TCP_NODELAY on the page server (as uvicorn)")
    ap.add_argument("--page", default=str(ROOT / "tests/fixtures/vllm/after_pressure.txt"))
    args = ap.parse_args()
    text = Path(args.page).read_text()
    kinds = [("this", PageFetcher)] + [(r, _fetch_module(r).PageFetcher) for r in args.revs.split(",") if r]
    print(f"page {Path(args.page).name}: {len(text.encode())} bytes; page server "
          f"{'TCP_NODELAY' if args.nodelay else 'Nagle on'}; CPU per call, median of {args.repeat} x {args.n}, "
          "ratios to requests in the same repeat")
    print(f"{'case':30} {'client':>10} {'us':>8} {'/requests':>10}  repeats")
    for gz in (False, True):
        proc = subprocess.Popen([sys.executable, "-c", SERVER.format(page=args.page, gzip=gz, nodelay=args.nodelay)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            port = int(proc.stdout.readline())
            url = f"http://127.0.0.1:{port}/metrics"
            old = RequestsFetcher(url)
            clients = {k: cls(url, 5.0, 64 << 20) for k, cls in kinds}
            assert old.fetch() == text and all(c.fetch() == text for c in clients.values())
            label = "gzip" if gz else "identity"
            fetches = {"requests": old.fetch} | {k: c.fetch for k, c in clients.items()}
            parser = Parser()
            totals = {"requests": lambda old=old: list(text_string_to_metric_families(old.fetch()))}
            for k, c in clients.items():
                totals[k] = lambda c=c, p=parser: p.parse(c.fetch())
            for what, cases, n in ((f"fetch ({label})", fetches, args.n),
                                   (f"fetch + parse ({label})", totals, max(10, args.n // 10))):
                got = compare(cases, n, args.repeat)
                for k, v in got.items():
                    ratios = [a / b for a, b in zip(v, got["requests"])]
                    print(f"{what:30} {k:>10} {statistics.median(v) * 1e6:8.0f} {statistics.median(ratios):10.3f}  "
                          + ", ".join(f"{x:.3f}" for x in ratios))
            assert all(c.connections == 1 for c in clients.values()), "one kept-alive connection"
        finally:
            proc.stdin.close()
            proc.wait(10)
    print(f"(python {sys.version.split()[0]}, requests {requests.__version__}, pid {os.getpid()})")


if __name__ == "__main__":
    main()
