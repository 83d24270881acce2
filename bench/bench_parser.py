"""Parser benchmark: this project's parser against prometheus_client's, on the real vLLM pages.

Reports ratios measured in the same run (never absolute timings as a pass/fail):

    python bench/bench_parser.py [--repeat N]

"cold" parses each page with a fresh parser (nothing remembered); "warm" reuses one parser, as
the sidecar does from poll to poll (the series text of a page is the same every poll, only the
values change, so label parsing becomes a look-up).
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from exporter.harness import pagetransform as pt  # noqa: E402
from exporter.runtime.exposition import Parser, parse  # noqa: E402


def best_of(fn, repeat):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=30)
    args = ap.parse_args()
    pages = {p.name: p.read_text() for p in sorted((ROOT / "tests/fixtures/vllm").glob("*.txt"))}
    base = pages["after_pressure.txt"]
    pages["4 engines (derived)"] = pt.with_engines(base, [1.0, 0.9, 0.8, 0.7])
    print(f"{'page':24} {'bytes':>8} {'client ms':>10} {'cold ms':>8} {'warm ms':>8} {'cold x':>7} {'warm x':>7}")
    for name, text in pages.items():
        ref, _ = best_of(lambda text=text: list(text_string_to_metric_families(text)), max(3, args.repeat // 5))
        cold, _ = best_of(lambda text=text: parse(text), args.repeat)
        p = Parser()
        p.parse(text)
        warm, _ = best_of(lambda p=p, text=text: p.parse(text), args.repeat)
        print(f"{name:24} {len(text):8d} {ref*1e3:10.2f} {cold*1e3:8.2f} {warm*1e3:8.2f} {ref/cold:7.1f} {ref/warm:7.1f}")


if __name__ == "__main__":
    main()
