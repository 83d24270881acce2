"""The long soak: days of polling over changing pages, clock injected (see exporter/harness/soak.py).

    python bench/soak.py [--days N] [--interval S]
"""

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from exporter.harness.soak import run  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--days", type=float, default=7.0)
    ap.add_argument("--interval", type=float, default=2.0)
    a = ap.parse_args()
    t0 = time.process_time()
    r = run(int(a.days * 86400 / a.interval), a.interval)
    print(f"{r.polls} polls ({a.days:g} days at {a.interval:g} s) in {time.process_time() - t0:.0f} s CPU: "
          f"series <= {r.series_max}, totals <= {r.totals_max}, ring <= {r.ring_max}, "
          f"cache <= {r.cache_bytes_max} bytes, traced memory {r.traced_after_warmup / 1e6:.2f} MB after 4 h, "
          f"{r.traced_end / 1e6:.2f} MB at the end, {r.restarts} restarts")


if __name__ == "__main__":
    main()
