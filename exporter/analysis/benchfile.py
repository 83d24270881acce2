"""Reading the result files of ``vllm bench serve --save-result``: the figures a regression gate
compares, the load that produced them, and when the run happened.

Figures are the file's own keys: ``mean_/median_/pNN_`` of ``ttft``, ``tpot``, ``itl`` and
``e2el`` (milliseconds; ``std_`` is a spread, not a figure; ``p50_`` is ``median_`` again), ``request_throughput`` (requests/s),
``output_throughput`` and ``total_token_throughput`` (tokens/s), ``request_goodput`` when a
goodput SLO was given, and ``failed_ratio`` (failed over all requests, computed here).

When: the file's ``date`` is the local time the result was saved (``%Y%m%d-%H%M%S``, no zone),
right after the run; the run began ``duration`` seconds before. It is read in the local time
zone given (the machine that ran the benchmark).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, Dict, Optional

LATENCY_KEY = re.compile(r"(mean|median|p\d+(?:\.\d+)?)_(ttft|tpot|itl|e2el)_ms")
THROUGHPUT_KEYS = ("request_throughput", "output_throughput", "total_token_throughput", "request_goodput")
# what must be the same for two runs to be comparable (the benchmark's load, not the server)
LOAD_KEYS = ("backend", "endpoint_type", "model_id", "num_prompts", "request_rate", "burstiness", "max_concurrency",
             "ramp_up_strategy", "ramp_up_start_rps", "ramp_up_end_rps")


class BenchFileError(ValueError):
    """A result file that cannot be used; ``str()`` is one line naming the file."""


@dataclass(frozen=True)
class BenchRun:
    source: str                          # the file (or the Prometheus range it was read from)
    label: str
    figures: Dict[str, float]
    load: Dict[str, Any] = field(default_factory=dict)
    start_ms: Optional[int] = None
    end_ms: Optional[int] = None


def _finite(v: Any) -> Optional[float]:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def figures_of(doc: Dict[str, Any]) -> Dict[str, float]:
    out: Dict[str, float] = {}
    for k in THROUGHPUT_KEYS:
        v = _finite(doc.get(k))
        if v is not None:
            out[k] = v
    for k, v in doc.items():
        if LATENCY_KEY.fullmatch(k) and _finite(v) is not None:
            out[k] = float(v)
    for k in [k for k in out if k.startswith("p50_") and "median_" + k[4:] in out]:
        del out[k]  # the same number twice (--metric-percentiles 50)
    done, failed = _finite(doc.get("completed")), _finite(doc.get("failed"))
    if done is not None and failed is not None and done + failed > 0:
        out["failed_ratio"] = failed / (done + failed)
    return out


def when(doc: Dict[str, Any], utc_offset_s: Optional[int] = None):
    """(start_ms, end_ms) of the run from ``date`` and ``duration``; ``utc_offset_s`` None reads
    the date in this machine's local time zone."""
    date, dur = doc.get("date"), _finite(doc.get("duration"))
    if not isinstance(date, str) or dur is None:
        return None, None
    try:
        naive = _dt.datetime.strptime(date, "%Y%m%d-%H%M%S")
    except ValueError:
        return None, None
    if utc_offset_s is None:
        end = naive.timestamp()
    else:
        end = naive.replace(tzinfo=_dt.timezone(_dt.timedelta(seconds=utc_offset_s))).timestamp()
    return int(round((end - dur) * 1000)), int(round(end * 1000))


def parse(text: str, source: str, utc_offset_s: Optional[int] = None) -> BenchRun:
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise BenchFileError(f"{source}: not JSON ({exc})") from None
    if isinstance(doc, list) and doc and all(isinstance(d, dict) for d in doc):
        raise BenchFileError(f"{source}: a list of results; give one result per file")
    if not isinstance(doc, dict):
        raise BenchFileError(f"{source}: not a `vllm bench serve --save-result` file (expected a JSON object)")
    figs = figures_of(doc)
    if "completed" not in doc or not any(LATENCY_KEY.fullmatch(k) for k in figs):
        raise BenchFileError(f"{source}: not a `vllm bench serve --save-result` file (no completed count or "
                             f"latency figures)")
    if not doc.get("completed"):
        raise BenchFileError(f"{source}: no request completed in this run")
    load = {k: doc[k] for k in LOAD_KEYS if k in doc}
    start, end = when(doc, utc_offset_s)
    return BenchRun(source, str(doc.get("label") or ""), figs, load, start, end)


def load(path: str, utc_offset_s: Optional[int] = None) -> BenchRun:
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise BenchFileError(f"{path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise BenchFileError(f"{path}: not UTF-8 text") from None
    # --append-result writes one JSON document a line: the last one is the latest run
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if len(lines) > 1 and all(ln.lstrip().startswith("{") for ln in lines):
        try:
            json.loads(text)
        except ValueError:
            text = lines[-1]
    return parse(text, path, utc_offset_s)


def load_differences(a: BenchRun, b: BenchRun):
    """The load keys on which two runs differ: [(key, a's value, b's value)]."""
    return [(k, a.load.get(k), b.load.get(k)) for k in LOAD_KEYS
            if k in a.load or k in b.load if a.load.get(k) != b.load.get(k)]
