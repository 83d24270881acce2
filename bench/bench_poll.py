"""Poll-loop benchmark: the sidecar's whole poll against the obvious poller, same run, same pages.

    python bench/bench_poll.py [--polls N] [--write docs/performance.md]

The obvious poller is what anyone would write first: fetch the page (``requests``) and parse
it with ``prometheus_client``'s text parser, deriving nothing. Every figure is a ratio against
it, measured in the same run on the same page sequence (a real vLLM 0.32.0 page,
``tests/fixtures/vllm/after_pressure.txt``, 62 KB, with counters and histograms advancing every
poll), never an absolute timing alone.

Measured as CPU time of this process (``time.process_time``: user + system, every thread) per
poll, after the window is full:

- in-process: the page text handed over by a function (the parse and everything after it);
- end to end: the page served by a local HTTP server in another process (its CPU is not
  counted), read with ``http.client`` on one kept-alive connection (what the fetcher is being
  rewritten to) and, for reference, with the current ``requests``-based fetcher.

Shapes: the default (60 s window, a poll every 2 s: 30 polls in the window) and 20 polls per
second (1,200 polls in the same window). The clock is injected, so the windows fill without
waiting. Memory: the resident set (VmRSS) after the window is full and again after many more
polls, at 20 polls/s. Finally a profile (cProfile) of the poll loop, top functions by own time.
"""

from __future__ import annotations

import argparse
import cProfile
import http.client
import io
import multiprocessing
import os
import platform
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from exporter.harness import pagetransform as pt  # noqa: E402
from exporter.runtime import config  # noqa: E402
from exporter.runtime.sidecar import Sidecar  # noqa: E402

PAGE = (ROOT / "tests/fixtures/vllm/after_pressure.txt").read_text()
VARIANTS = 120


def pages(n: int = VARIANTS):
    """Successive pages of one process: counters and histograms a little higher each time."""
    return [pt.scale_counters(PAGE, 1.0 + i * 0.002) for i in range(n)]


class Cycle:
    def __init__(self, texts):
        self.texts = texts
        self.i = 0

    def __call__(self):
        self.i += 1
        return self.texts[self.i % len(self.texts)]


class Clock:
    def __init__(self, t=1_800_000_000.0):
        self.t = t

    def __call__(self):
        return self.t


def cpu_per_call(fn, n):
    t0 = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - t0) / n


def sidecar(fetch, poll_interval, window=60.0):
    cfg = config.build({"poll_interval": poll_interval, "window": window, "gpu": "none"}, {})
    clock = Clock()
    sc = Sidecar(cfg, fetch, None, clock=clock)

    def poll():
        sc.poll_once()
        clock.t += poll_interval
    return sc, poll


def rss_mb():
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


# -- a page server in another process ---------------------------------------------------------

def _serve(port_q, texts, nodelay=False):
    """``nodelay``: TCP_NODELAY on the server's connections, as vLLM's uvicorn has them (asyncio
    sets it on every TCP connection). Without it (``http.server``'s default, what this benchmark
    always ran) the head and the body go out as two writes and Nagle holds the body back until the
    client's delayed ACK of the head: about 40 ms of waiting in every read, for every client."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    bodies = [t.encode() for t in texts]
    state = {"i": 0}

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = nodelay

        def do_GET(self):
            state["i"] += 1
            body = bodies[state["i"] % len(bodies)]
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    port_q.put(srv.server_address[1])
    srv.serve_forever()


class HttpClientFetch:
    """One kept-alive http.client connection (the shape of the fetcher being written)."""

    def __init__(self, port):
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)

    def __call__(self):
        self.conn.request("GET", "/metrics", headers={"Accept": "text/plain"})
        r = self.conn.getresponse()
        return r.read().decode("utf-8")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--polls", type=int, default=600, help="polls measured per figure")
    ap.add_argument("--soak-polls", type=int, default=20_000, help="polls between the two RSS readings")
    ap.add_argument("--write", default="", help="write the sections into this markdown file")
    ap.add_argument("--flight-only", action="store_true", help="only the flight recorder's section")
    ap.add_argument("--fetch-only", action="store_true", help="only the end-to-end poll by fetcher (issue 29)")
    ap.add_argument("--rounds", type=int, default=5, help="--fetch-only: alternating rounds (medians)")
    ap.add_argument("--fetch-revs", default="", help="--fetch-only: also fetch.py at these git revisions, "
                    "comma-separated (e.g. the last one framed by h11)")
    ap.add_argument("--poll-revs", default="", help="--fetch-only: also the whole sidecar (exporter/) at these git "
                    "revisions with this fetcher, comma-separated (the poll's work before a change)")
    args = ap.parse_args()
    if args.fetch_only:
        text = fetch_section(args.polls, args.rounds, [r for r in args.fetch_revs.split(",") if r],
                             [r for r in args.poll_revs.split(",") if r])
        print(text)
        if args.write:
            write_sections(Path(args.write), text, (FETCH_HEADING,))
        return
    if args.flight_only:
        text = flight_section()
        print(text)
        if args.write:
            write_sections(Path(args.write), text, ("## Flight recorder",))
        return
    texts = pages()
    n = args.polls
    rows = cpu_rows(texts, n)
    memory = memory_figures(texts, args.soak_polls)
    top = profile_top(texts)
    lines = poll_report(n, rows, top, memory, args.soak_polls)
    text = "\n".join(lines) + "\n"
    if args.write:
        write_sections(Path(args.write), text, ("## Poll loop", "## Flight recorder", "## Memory"))
        print(f"wrote {args.write}")


def cpu_rows(texts, n: int) -> list:
    """CPU per poll of the sidecar and of the obvious poller, in process and end to end (the page
    from a server in another process): (how the page arrives, shape, obvious, sidecar) rows."""
    rows = []
    # in-process ---------------------------------------------------------------------------
    obvious = Cycle(texts)
    base = cpu_per_call(lambda: list(text_string_to_metric_families(obvious())), max(50, n // 4))
    for label, interval in (("default: 60 s window, poll every 2 s", 2.0), ("20 polls/s, 60 s window", 0.05)):
        sc, poll = sidecar(Cycle(texts), interval)
        for _ in range(int(60 / interval) + 20):  # fill the window
            poll()
        ours = cpu_per_call(poll, n)
        rows.append(("in-process", label, base, ours))

    # end to end ----------------------------------------------------------------------------
    q = multiprocessing.Queue()
    server = multiprocessing.Process(target=_serve, args=(q, texts), daemon=True)
    server.start()
    port = q.get(timeout=10)
    try:
        import requests

        session = requests.Session()
        url = f"http://127.0.0.1:{port}/metrics"
        base_e2e = cpu_per_call(lambda: list(text_string_to_metric_families(session.get(url).text)),
                                max(50, n // 4))
        for label, interval in (("default: 60 s window, poll every 2 s", 2.0), ("20 polls/s, 60 s window", 0.05)):
            sc, poll = sidecar(HttpClientFetch(port), interval)
            for _ in range(int(60 / interval) + 20):
                poll()
            rows.append(("end to end, http.client", label, base_e2e, cpu_per_call(poll, n)))
        from exporter.runtime.fetch import PageFetcher

        fetcher = PageFetcher(url, 5.0, 8 << 20)
        sc, poll = sidecar(fetcher.fetch, 2.0)
        for _ in range(50):
            poll()
        rows.append(("end to end, the sidecar's fetcher (fetch.py)", "default: 60 s window, poll every 2 s", base_e2e,
                     cpu_per_call(poll, n)))
    finally:
        server.terminate()
    return rows


def memory_figures(texts, soak_polls: int) -> tuple:
    """The resident set at 20 polls/s once the window is full and ``soak_polls`` later, with the
    ring's length and the number of running totals."""
    sc, poll = sidecar(Cycle(texts), 0.05)
    for _ in range(1200 + 100):
        poll()
    rss_full = rss_mb()
    for _ in range(soak_polls):
        poll()
    rss_after = rss_mb()
    ring = sc.windows.ring_length()
    totals = sc.windows.totals_count()
    return rss_full, rss_after, ring, totals


def profile_top(texts) -> list:
    """The poll loop's top 10 functions by own time (in process, default shape, 300 polls):
    (function, share of the loop's time, calls per poll)."""
    sc, poll = sidecar(Cycle(texts), 2.0)
    for _ in range(50):
        poll()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(300):
        poll()
    prof.disable()
    buf = io.StringIO()
    st = pstats.Stats(prof, stream=buf)
    st.sort_stats("tottime")
    top = []
    total = sum(v[2] for v in st.stats.values())
    for (fname, lineno, func), (_cc, nc, tt, _ct, _callers) in sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:10]:
        where = f"{Path(fname).name}:{lineno}" if fname != "~" else "builtin"
        top.append((f"`{func}` ({where})", tt / total if total else 0.0, nc / 300))
    return top


def poll_report(n: int, rows: list, top: list, memory: tuple, soak_polls: int) -> list:
    """The sections "Poll loop", "Flight recorder" (measured here) and "Memory", printed as they
    are made; returns their lines."""
    rss_full, rss_after, ring, totals = memory
    lines = []

    def say(s=""):
        print(s, flush=True)
        lines.append(s)

    say("## Poll loop")
    say()
    say(f"`make bench` (`bench/bench_poll.py --polls {n}`), {time.strftime('%Y-%m-%d')}: "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Linux {platform.release()}, "
        f"Python {platform.python_version()}, prometheus_client {_version('prometheus_client')}.")
    say("The page: a real vLLM 0.32.0 `/metrics` (62 KB, 510 samples) advancing every poll. CPU time of the "
        "whole process per poll, as a ratio to the obvious poller (fetch + `prometheus_client` parse, deriving "
        "nothing) measured in the same run; the target is 0.1 or less.")
    say()
    say("| how the page arrives | shape | obvious poller, ms | sidecar, ms | sidecar / obvious |")
    say("| --- | --- | ---: | ---: | ---: |")
    for how, label, b, o in rows:
        say(f"| {how} | {label} | {b * 1e3:.2f} | {o * 1e3:.3f} | **{o / b:.3f}** |")
    say()
    say("End to end, reading 62 KB over HTTP costs the sidecar's process about as much CPU as everything else in "
        "its poll. Two readers are measured: a plain kept-alive `http.client` connection (the least a Python "
        "reader can do) and the sidecar's own fetcher (`fetch.py`: one socket, a deadline over every read, caps "
        "on headers, chunks and the page before and after gzip), which is what the sidecar runs.")
    say()
    say("The sidecar's cost does not depend on how many polls the window holds (the two shapes above): each "
        "poll parses the page once (series text looked up in a cache, only the series the inputs read turned "
        "into samples), adds each series' increase to a running total and copies the totals into a ring; a "
        "window's increase is one subtraction per total.")
    say()
    say("Profile of the poll loop (in-process, default shape, 300 polls), top functions by own time:")
    say()
    say("| function | share of the loop's time | calls per poll |")
    say("| --- | ---: | ---: |")
    for name, share, calls in top:
        say(f"| {name} | {share * 100:.1f} % | {calls:.0f} |")
    say()
    say(flight_section())
    say("## Memory")
    say()
    say(f"Resident set of the benchmark process at 20 polls/s (60 s window: {ring} snapshots of {totals} running "
        f"totals in the ring): {rss_full:.1f} MB once the window is full, {rss_after:.1f} MB after "
        f"{soak_polls:,} more polls (flat: the ring is a fixed number of `array('d')` rows, series and "
        "caches are bounded). The target is 60 MB or less and flat. The day-long soak with changing pages "
        "(`tests/runtime/test_soak.py`, `bench/soak.py` for the long variant) checks the same with tracemalloc.")
    say()
    return lines


def flight_section(polls: int = 300, rounds: int = 5) -> str:
    """The flight recorder's cost: the same sidecar with it off and on, alternating rounds on the
    same pages (medians), the codecs measured on one real block, and the memory after a
    simulated day of polls every 2 s."""
    import lzma
    import statistics
    import zlib
    from array import array

    from exporter.runtime.flight import Recorder, _shuffle, compress_rows

    texts = pages()

    def make(rec):
        cfg = config.build({"poll_interval": 2.0, "window": 60.0, "gpu": "none"}, {})
        clock = Clock()
        sc = Sidecar(cfg, Cycle(texts), None, clock=clock, recorder=rec)

        def poll():
            sc.poll_once()
            clock.t += 2.0
        for _ in range(50):
            poll()
        return sc, poll

    off_sc, off = make(None)
    on_sc, on = make(Recorder())
    offs, ons = [], []
    for _ in range(rounds):
        offs.append(cpu_per_call(off, polls))
        ons.append(cpu_per_call(on, polls))
    m_off, m_on = statistics.median(offs), statistics.median(ons)
    # one block of 64 real polls, every codec
    rec = Recorder(block_polls=10_000, block_seconds=1e12)
    sc, poll = make(rec)
    rec.flush()
    for _ in range(64):
        poll()
    rows, width = list(rec._rows), rec._width
    flat = array("d")
    for r in rows:
        flat.extend(r)
    cols = array("d")
    for j in range(width):
        cols.extend(flat[j::width])
    rb, cb = flat.tobytes(), cols.tobytes()
    codecs = [("zlib 6, poll by poll (row-major)", lambda: zlib.compress(rb, 6)),
              ("zlib 6, series by series (column-major)", lambda: zlib.compress(cb, 6)),
              ("zlib 1, column-major, byte-shuffled", lambda: zlib.compress(_shuffle(cb), 1)),
              ("**zlib 6, column-major, byte-shuffled (used)**", lambda: compress_rows(rows, width, 6)),
              ("lzma 1, column-major, byte-shuffled", lambda: lzma.compress(_shuffle(cb), preset=1))]
    table = []
    for name, fn in codecs:
        t0 = time.process_time()
        for _ in range(10):
            out = fn()
        dt = (time.process_time() - t0) / 10
        table.append((name, len(out) / (len(rows) * width), dt / len(rows)))
    # Gorilla (Prometheus' XOR chunks) in pure Python: the per-value work alone, no bit writer
    import struct

    def gorilla():
        bits = 0
        n = len(rows)
        for j in range(width):
            prev = struct.unpack("<Q", struct.pack("<d", cols[j * n]))[0]
            for v in cols[j * n + 1:(j + 1) * n]:
                cur = struct.unpack("<Q", struct.pack("<d", v))[0]
                x = cur ^ prev
                if x == 0:
                    bits += 1
                else:
                    lz = 64 - x.bit_length()
                    tz = (x & -x).bit_length() - 1
                    bits += 2 + 5 + 6 + (64 - lz - tz)
                prev = cur
        return b"\0" * (bits // 8)
    t0 = time.process_time()
    for _ in range(5):
        g = gorilla()
    table.append(("Gorilla XOR floats, pure Python (bit count only, no packing)", len(g) / (len(rows) * width),
                  (time.process_time() - t0) / 5 / len(rows)))
    # a simulated day: polls every 2 s, the page's counters moving
    day = Recorder()
    reader_rows = on_sc._rows
    pub = on_sc.published
    t = 1_800_000_000.0
    peak = 0
    for i in range(43_200):
        grown = [(r, v * (1 + (i % 997) * 1e-4)) for r, v in reader_rows]
        day.record(t, grown, pub)
        t += 2.0
        if i % 500 == 0:
            peak = max(peak, day.nbytes)
    lines = ["## Flight recorder", "",
             f"`bench/bench_poll.py --flight-only`, {time.strftime('%Y-%m-%d')}: the default shape (a poll every 2 s, "
             f"60 s window, the 62 KB vLLM page), CPU per poll with the recorder off and on, {rounds} alternating "
             f"rounds of {polls} polls (medians; the machine is shared, so single rounds vary by 10 % and more):", "",
             "| recorder | CPU per poll, ms | rounds, ms |", "| --- | ---: | --- |",
             f"| off | {m_off * 1e3:.3f} | {', '.join(f'{x * 1e3:.2f}' for x in offs)} |",
             f"| on (30 min, 16 MB cap) | {m_on * 1e3:.3f} | {', '.join(f'{x * 1e3:.2f}' for x in ons)} |", "",
             f"**{(m_on / m_off - 1) * 100:+.1f} %** CPU per poll (the target: at most +10 %).", "",
             f"The codecs on one block of {len(rows)} real polls ({width} series: {len(on_sc._rows)} vLLM inputs as "
             "read, the rest the sidecar's own series), bytes per sample (a raw double is 8) and CPU per poll:", "",
             "| codec | bytes per sample | CPU per poll, ms |", "| --- | ---: | ---: |"]
    lines += [f"| {n} | {b:.3f} | {c * 1e3:.3f} |" for n, b, c in table]
    lines += ["", "Columnar blocks with a byte shuffle and zlib win on both counts: Gorilla's per-value work in pure "
              "Python costs more than the whole of zlib's path before a single bit is written, and compresses "
              "worse here (most of a block's series hardly move: zlib finds the repeats across polls).", "",
              f"Memory after a simulated day (43,200 polls every 2 s, counters moving): {day.nbytes / 1e6:.2f} MB held "
              f"(peak {peak / 1e6:.2f} MB, cap {day.max_bytes / 1e6:.1f} MB), {day.stats()['polls']} polls in "
              f"{len(day.blocks)} blocks: the 30-minute ring, flat.", ""]
    return "\n".join(lines)


def _version(dist: str) -> str:
    from importlib.metadata import version
    return version(dist)


FETCH_HEADING = "## Reading vLLM's page: the fetcher's share of a poll"


def _fetch_module(rev: str):
    """``exporter/runtime/fetch.py`` as it was at git revision ``rev``, as a module of its own."""
    import importlib.util
    import re
    import subprocess
    import tempfile

    src = subprocess.run(["git", "show", f"{rev}:exporter/runtime/fetch.py"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    src = re.sub(r"^from \.\. import", "from exporter import", src, flags=re.M)
    src = re.sub(r"^from \.(\w+) import", r"from exporter.runtime.\1 import", src, flags=re.M)
    path = Path(tempfile.mkdtemp()) / f"fetch_{rev}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(f"fetch_{rev}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _sidecar_at(rev: str, fetch, poll_interval: float = 2.0):
    """A poll of the sidecar (``exporter/``) as it was at git revision ``rev`` (``bench/ab_poll.py``)."""
    from bench.ab_poll import load

    config_mod, sidecar_cls = load(rev)
    cfg = config_mod.build({"poll_interval": poll_interval, "window": 60.0, "gpu": "none"}, {})
    clock = Clock()
    sc = sidecar_cls(cfg, fetch, None, clock=clock)

    def poll():
        sc.poll_once()
        clock.t += poll_interval
    return poll


def fetch_section(polls: int, rounds: int, revs, poll_revs=()) -> str:
    """The whole poll end to end (the page from a server in another process), this fetcher and
    fetch.py at ``revs`` against the obvious poller (``requests`` + prometheus_client's parser), and
    the poll with the page handed over in-process (no fetch at all) for the floor; in alternating
    rounds, each round's ratios to the obvious poller of that round, medians over the rounds. Two
    page servers: ``http.server`` as this benchmark always ran it (Nagle on) and with TCP_NODELAY,
    as vLLM's uvicorn serves."""
    import statistics

    import requests

    from exporter.runtime.fetch import PageFetcher

    texts = pages()
    kinds = [("this fetcher (fetch.py)", PageFetcher)] + [(f"fetch.py at {r}", _fetch_module(r).PageFetcher)
                                                         for r in revs]
    out = [FETCH_HEADING, ""]
    out.append(f"`python bench/bench_poll.py --fetch-only --polls {polls} --rounds {rounds}"
               + (f" --fetch-revs {','.join(revs)}" if revs else "")
               + (f" --poll-revs {','.join(poll_revs)}`" if poll_revs else "`")
               + f", {time.strftime('%Y-%m-%d %H:%M')}: {platform.machine()}, {os.cpu_count()} cores, load average "
               f"{os.getloadavg()[0]:.1f} at the start, Python {platform.python_version()}, "
               f"requests {requests.__version__}, prometheus_client {_version('prometheus_client')}, "
               f"httptools {_version('httptools')}, h11 {_version('h11')}.")
    out.append("")
    out.append("CPU time of this process per poll (default shape: 60 s window, a poll every 2 s), as a ratio "
               "to the obvious poller measured in the same round; medians over the rounds (\"rounds\": each "
               "round's ratio).")
    out.append("")
    paired_notes = []
    out.append("| page server | poll | ms per poll | / obvious poller | rounds |")
    out.append("| --- | --- | ---: | ---: | --- |")
    for nodelay in (False, True):
        q = multiprocessing.Queue()
        server = multiprocessing.Process(target=_serve, args=(q, texts, nodelay), daemon=True)
        server.start()
        port = q.get(timeout=10)
        url = f"http://127.0.0.1:{port}/metrics"
        try:
            session = requests.Session()
            runs = {"obvious": lambda s=session, u=url: list(text_string_to_metric_families(s.get(u).text))}
            for label, cls in kinds:
                fetcher = cls(url, 5.0, 8 << 20)
                _sc, poll = sidecar(fetcher.fetch, 2.0)
                runs[label] = poll
            for rev in poll_revs:
                runs[f"the sidecar at {rev}, this fetcher"] = _sidecar_at(rev, PageFetcher(url, 5.0, 8 << 20).fetch)
            _sc, poll = sidecar(Cycle(texts), 2.0)
            runs["in-process, no fetch (the floor)"] = poll
            for rev in poll_revs:
                runs[f"the sidecar at {rev}, in-process (its floor)"] = _sidecar_at(rev, Cycle(texts))
            for fn in runs.values():  # warm: windows full, connections open, caches filled
                for _ in range(40):
                    fn()
            cpu = {k: [] for k in runs}
            names = list(runs)
            for r in range(rounds):
                order = names[r % len(names):] + names[:r % len(names)]  # a different one first each round
                for k in order:
                    cpu[k].append(cpu_per_call(runs[k], max(20, polls // 6) if k == "obvious" else polls))
        finally:
            server.terminate()
        where = "TCP_NODELAY (as vLLM's uvicorn)" if nodelay else "`http.server`, Nagle on (as before)"
        base = cpu["obvious"]
        for k in names:
            ratios = [a / b for a, b in zip(cpu[k], base)]
            shown = "" if k == "obvious" else ", ".join(f"{x:.3f}" for x in ratios)
            ratio = "1" if k == "obvious" else f"**{statistics.median(ratios):.3f}**"
            out.append(f"| {where} | {k if k != 'obvious' else 'obvious poller'} | "
                       f"{statistics.median(cpu[k]) * 1e3:.3f} | {ratio} | {shown} |")
        for rev in poll_revs:  # this sidecar against the one at rev, round by round
            for ours_k, theirs_k in (("this fetcher (fetch.py)", f"the sidecar at {rev}, this fetcher"),
                                     ("in-process, no fetch (the floor)", f"the sidecar at {rev}, in-process (its floor)")):
                paired = [a / b for a, b in zip(cpu[ours_k], cpu[theirs_k])]
                paired_notes.append(f"{where}, {ours_k}: this sidecar / the sidecar at {rev} = "
                                    f"**{statistics.median(paired):.3f}** (rounds {min(paired):.3f}-{max(paired):.3f})")
    if paired_notes:
        out.append("")
        out += [f"- {n}" for n in paired_notes]
    return "\n".join(out) + "\n"


def write_sections(path: Path, text: str, headings) -> None:
    """Replace (or add) this benchmark's sections in ``path``, leaving every other section as it is."""
    old = path.read_text() if path.exists() else "# Performance\n\n"
    kept = []
    skipping = placed = False
    for line in old.splitlines():
        if line.startswith("## "):
            skipping = line.strip() in headings
            if skipping and not placed:  # the new text where the first of its old sections was
                kept.append(text.rstrip() + "\n")
                placed = True
        if not skipping:
            kept.append(line)
    body = "\n".join(kept).rstrip() + "\n"
    if not placed:
        body += "\n" + text
    path.write_text(body.rstrip() + "\n")


if __name__ == "__main__":
    main()
