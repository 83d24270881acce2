"""A day of polling with the clock injected, over changing pages (shared by tests/runtime/test_soak.py
and bench/soak.py).

The page is the real ``after_load.txt`` cut down to the families the sidecar reads (so a day
of polls stays quick), its values advanced every poll. Over the day: models come and go (a new
``model_name`` every two hours, the old one gone), label churn (a new ``finished_reason`` value
appears lazily every hour, the older ones disappear), and vLLM restarts every six hours (a new
process start time, counters from zero).
"""

from __future__ import annotations

import gc
import tracemalloc
from dataclasses import dataclass
from pathlib import Path
from typing import List, Tuple

from exporter.runtime import config
from exporter.runtime.sidecar import Sidecar

FAMILIES = ("vllm:generation_tokens_total", "vllm:prompt_tokens_total", "vllm:num_preemptions_total",
            "vllm:request_success_total", "vllm:kv_cache_usage_perc", "vllm:num_requests_running",
            "vllm:num_requests_waiting", "vllm:time_to_first_token_seconds", "process_start_time_seconds")
PAGE = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "vllm" / "after_load.txt"


def template() -> List[Tuple[str, float]]:
    """(series text, value) of the real page, only the families read."""
    out = []
    for line in PAGE.read_text().split("\n"):
        if not line or line.startswith("#") or not line.startswith(FAMILIES):
            continue
        head, _, val = line.rpartition(" ")
        if "finished_reason" in head and 'finished_reason="length"' not in head:
            continue  # the churn below makes its own
        out.append((head, float(val)))
    return out


@dataclass
class SoakResult:
    polls: int
    up_polls: int
    restarts: int
    series_max: int
    totals_max: int
    ring_max: int
    cache_bytes_max: int
    traced_after_warmup: int
    traced_end: int
    models_last: Tuple[str, ...]


def run(polls: int = 43_200, interval: float = 2.0, traced_polls: int = 0) -> SoakResult:
    """``traced_polls``: trace allocations (tracemalloc) over the last this many polls only (it
    slows Python down several times); 0 traces the whole run."""
    rows = template()
    cfg = config.build({"poll_interval": interval, "window": 60, "gpu": "none"}, {})
    clock = [1_800_000_000.0]
    state = {"text": ""}
    sc = Sidecar(cfg, lambda: state["text"], None, clock=lambda: clock[0])
    series_max = totals_max = ring_max = cache_max = up = 0
    traced_warm = 0
    gc.collect()
    trace_from = polls - traced_polls if traced_polls else 0
    try:
        for i in range(polls):
            if i == trace_from:
                gc.collect()
                tracemalloc.start()
                traced_warm = tracemalloc.get_traced_memory()[0]
            t = i * interval
            epoch = int(t // (6 * 3600))  # a restart every six hours
            since = t - epoch * 6 * 3600
            model = f"model-{int(t // 7200)}"
            reason = f"r{int(t // 3600)}"
            k = since / 10.0  # counters grow with the process's age
            lines = []
            for head, v in rows:
                head = head.replace('model_name="tiny-llama"', f'model_name="{model}"')
                if head.startswith("process_start_time_seconds"):
                    val = 1_800_000_000.0 + epoch * 6 * 3600
                elif head.startswith(("vllm:kv_cache", "vllm:num_requests")):
                    val = (i % 7) / 10.0 if "kv_cache" in head else float(i % 5)
                elif "finished_reason" in head:
                    lines.append(f"{head} {float(int(k))}")
                    lines.append(f"{head.replace('length', reason)} {float(int(since // 60))}")
                    continue
                else:
                    val = float(int(v * (1 + k / 100.0))) if not head.endswith("_sum") else v * (1 + k / 100.0)
                lines.append(f"{head} {val}")
            state["text"] = "\n".join(lines) + "\n"
            pub = sc.poll_once()
            clock[0] += interval
            up += 1 if dict(pub.up).get("vllm") else 0
            w = sc.windows
            series_max = max(series_max, w.series_count())
            totals_max = max(totals_max, w.totals_count())
            ring_max = max(ring_max, w.ring_length())
            cache_max = max(cache_max, sc.reader.parser.cache_bytes)
            if not traced_polls and i == min(polls - 1, 4 * 3600 // int(interval)):
                gc.collect()
                traced_warm = tracemalloc.get_traced_memory()[0]
        gc.collect()
        traced_end = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return SoakResult(polls, up, sc.counters.restarts, series_max, totals_max, ring_max, cache_max,
                      traced_warm, traced_end, tuple(m.model for m in pub.signals.models))
