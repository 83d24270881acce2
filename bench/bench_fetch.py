"""Fetch benchmark: CPU per read of a real vLLM page, this project's client against ``requests``.

Reports ratios measured in the same run (never absolute timings as a pass/fail):

    python bench/bench_fetch.py [--n 200] [--repeat 3]

The page server runs in another process, so the CPU measured (``time.process_time``) is the
client's alone. ``requests`` is driven the way the sidecar drove it before (one Session, one
kept-alive connection, ``stream=True``, the body read in chunks, decoded). Each case is run
``--repeat`` times and the best kept. Also "fetch + parse": ``requests`` + prometheus_client's
parser against this client + this project's parser (warm, as the sidecar polls).
"""

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import requests  # noqa: E402  (a benchmark-only dependency: pip install requests)
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from requests.adapters import HTTPAdapter  # noqa: E402

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


def cpu_per_call(fn, n: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.process_time()
        for _ in range(n):
            fn()
        best = min(best, (time.process_time() - t0) / n)
    return best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--page", default=str(ROOT / "tests/fixtures/vllm/after_pressure.txt"))
    args = ap.parse_args()
    text = Path(args.page).read_text()
    print(f"page {Path(args.page).name}: {len(text.encode())} bytes; CPU per call, best of {args.repeat} x {args.n}")
    print(f"{'case':34} {'requests us':>12} {'this us':>9} {'this/requests':>14}")
    for gz in (False, True):
        proc = subprocess.Popen([sys.executable, "-c", SERVER.format(page=args.page, gzip=gz)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            port = int(proc.stdout.readline())
            url = f"http://127.0.0.1:{port}/metrics"
            old, new = RequestsFetcher(url), PageFetcher(url, 5.0, 64 << 20)
            assert old.fetch() == new.fetch() == text
            label = "gzip" if gz else "identity"
            r = cpu_per_call(old.fetch, args.n, args.repeat)
            t = cpu_per_call(new.fetch, args.n, args.repeat)
            print(f"{'fetch (' + label + ')':34} {r * 1e6:12.0f} {t * 1e6:9.0f} {t / r:14.2f}")
            parser = Parser()

            def old_total(old=old):
                list(text_string_to_metric_families(old.fetch()))

            def new_total(parser=parser, new=new):
                parser.parse(new.fetch())

            r = cpu_per_call(old_total, max(10, args.n // 10), args.repeat)
            t = cpu_per_call(new_total, max(10, args.n // 10), args.repeat)
            print(f"{'fetch + parse (' + label + ')':34} {r * 1e6:12.0f} {t * 1e6:9.0f} {t / r:14.2f}")
            assert new.connections == 1, "one kept-alive connection"
        finally:
            proc.stdin.close()
            proc.wait(10)
    print(f"(python {sys.version.split()[0]}, requests {requests.__version__}, pid {os.getpid()})")


if __name__ == "__main__":
    main()
