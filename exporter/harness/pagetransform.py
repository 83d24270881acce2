"""Rewriting real vLLM pages into the other shapes vLLM serves.

The simulator and the tests never write a vLLM page by hand: they start from a real page and
change only what differs between vLLM releases or deployments.

- ``legacy_names``: the naming of vLLM before the renames (``gpu_cache_usage_perc``,
  ``gpu_prefix_cache_*``, ``time_per_output_token_seconds``), without the ``engine`` label and
  without the series older releases lack (``num_requests_waiting_by_reason``,
  ``admission_rejections``).
- ``with_engines``: a data-parallel page, every ``engine="0"`` series repeated for more engines
  with its value scaled (counts stay whole and buckets stay cumulative).
- ``merge_models``: one page serving two models.
- ``scale_counters``: a later page of the same process (counters and histograms scaled).
- ``set_values``: change chosen series' values.
"""

from __future__ import annotations

import re
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..runtime.exposition import format_float

_SAMPLE_RE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?P<labels>\{.*\})?\s+(?P<value>\S+)(?P<ts>\s+\S+)?\s*$")


def split_families(text: str) -> List[Tuple[str, List[str], List[str]]]:
    """[(family name, comment lines, sample lines)] in page order."""
    fams: List[Tuple[str, List[str], List[str]]] = []
    current: Optional[Tuple[str, List[str], List[str]]] = None
    for line in text.splitlines():
        if line.startswith("# HELP ") or line.startswith("# TYPE "):
            name = line.split()[2]
            if current is None or current[0] != name or current[2]:
                current = (name, [], [])
                fams.append(current)
            current[1].append(line)
        elif line.strip():
            if current is None:
                current = ("", [], [])
                fams.append(current)
            current[2].append(line)
    return fams


def join_families(fams: Sequence[Tuple[str, List[str], List[str]]]) -> str:
    out: List[str] = []
    for _, comments, samples in fams:
        out.extend(comments)
        out.extend(samples)
    return "\n".join(out) + "\n"


def map_samples(text: str, fn: Callable[[str, str, float], Optional[List[Tuple[str, str, float]]]]) -> str:
    """Apply ``fn(name, labels_text, value) -> [(name, labels_text, value)]`` to each sample.

    ``labels_text`` includes the braces (or is ''). Returning None keeps the line unchanged;
    an empty list drops it.
    """
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            out.append(line)
            continue
        m = _SAMPLE_RE.match(line)
        if not m:
            out.append(line)
            continue
        res = fn(m.group("name"), m.group("labels") or "", float(m.group("value")))
        if res is None:
            out.append(line)
            continue
        for name, labels, value in res:
            out.append(f"{name}{labels} {format_float(value)}")
    return "\n".join(out) + ("\n" if text.endswith("\n") else "")


def _is_cumulative(name: str) -> bool:
    return name.endswith(("_total", "_bucket", "_sum", "_count"))


_RENAMES = (
    ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    ("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries"),
    ("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits"),
    ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
)
_LEGACY_ABSENT = ("vllm:num_requests_waiting_by_reason", "vllm:admission_rejections",
                  "vllm:request_time_per_output_token_seconds", "vllm:engine_sleep_state")


def legacy_names(text: str) -> str:
    """The page as a vLLM from before the renames would serve it."""
    out = []
    for line in text.splitlines():
        if any(a in line and (line.startswith("#") or line.startswith(a)) for a in _LEGACY_ABSENT):
            continue
        if "vllm:external_prefix_cache" not in line:
            for new, old in _RENAMES:
                line = re.sub(re.escape(new) + r"(?=[_{ ]|$)", old, line)
        line = line.replace('engine="0",', "").replace(',engine="0"', "").replace('{engine="0"}', "")
        out.append(line)
    return "\n".join(out) + "\n"


def with_engines(text: str, scales: Sequence[float]) -> str:
    """Engines 0..n-1, engine k's series being engine 0's scaled by ``scales[k]``.

    Cumulative series (counters, buckets, sums, counts) are scaled and rounded so that counts
    stay whole; gauges are scaled and capped at 1 for ratios.
    """
    def fn(name: str, labels: str, value: float):
        if 'engine="0"' not in labels:
            return None
        rows = []
        for k, s in enumerate(scales):
            v = value * s
            if name.endswith(("_total", "_bucket", "_count")):
                v = float(round(v))
            if name.endswith("_perc"):
                v = min(v, 1.0)
            if name.endswith("_created") or name.endswith("_info") or name == "vllm:engine_sleep_state":
                v = value
            rows.append((name, labels.replace('engine="0"', f'engine="{k}"'), v))
        return rows

    return map_samples(text, fn)


def rename_model(text: str, model: str) -> str:
    return re.sub(r'model_name="[^"]*"', f'model_name="{model}"', text)


def merge_models(text_a: str, text_b: str) -> str:
    """One page holding both pages' vllm: series (the second page's families merged in)."""
    fams_b = {name: samples for name, _c, samples in split_families(text_b)}
    merged = []
    for name, comments, samples in split_families(text_a):
        extra = fams_b.get(name, []) if name.startswith("vllm:") else []
        merged.append((name, comments, samples + [s for s in extra if s not in samples]))
    return join_families(merged)


def scale_counters(text: str, factor: float, only_prefix: str = "vllm:") -> str:
    """The same process later on: every cumulative vLLM series multiplied by ``factor``."""
    def fn(name: str, labels: str, value: float):
        if not name.startswith(only_prefix) or not _is_cumulative(name):
            return None
        v = value * factor
        if not name.endswith("_sum"):
            v = float(round(v))
        return [(name, labels, v)]

    return map_samples(text, fn)


def set_values(text: str, values: Dict[str, float], label_filter: str = "") -> str:
    """Set the value of every sample named in ``values`` (whose labels contain ``label_filter``)."""
    def fn(name: str, labels: str, value: float):
        if name in values and label_filter in labels:
            return [(name, labels, values[name])]
        return None

    return map_samples(text, fn)


def set_process_start(text: str, start: float) -> str:
    return set_values(text, {"process_start_time_seconds": start})
