"""What the derivations read from a vLLM page, under every name vLLM has used for it.

vLLM renames metrics between releases (``gpu_cache_usage_perc`` became ``kv_cache_usage_perc``,
``gpu_prefix_cache_*`` became ``prefix_cache_*``, ``time_per_output_token_seconds`` became
``inter_token_latency_seconds``; pre-V1 pages have no ``engine`` label). Each logical input
below lists its names newest first; the first one present on a page is used. A required input
that is present under no name is reported in ``vllm_sidecar_input_missing{metric}`` and the
signals that need it are left out, never reported as 0.

``normalize`` turns a parsed page into a ``Snapshot``: plain dictionaries keyed by
``(input, model_name, engine, extra)`` so that the windows and derivations never look at
metric names again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Dict, FrozenSet, List, Optional, Tuple

from .parser import Page

COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"


@dataclass(frozen=True)
class Input:
    key: str
    kind: str
    names: Tuple[str, ...]  # newest first; counters with their ``_total``; histogram base names
    required: bool
    extra_label: Optional[str] = None  # one more label kept apart (finished_reason, reason…)
    doc: str = ""


INPUTS: Tuple[Input, ...] = (
    Input("generation_tokens", COUNTER, ("vllm:generation_tokens_total",), True,
          doc="output tokens"),
    Input("prompt_tokens", COUNTER, ("vllm:prompt_tokens_total",), True, doc="prefill tokens"),
    Input("preemptions", COUNTER, ("vllm:num_preemptions_total",), True, doc="preemptions"),
    Input("request_success", COUNTER, ("vllm:request_success_total",), True,
          extra_label="finished_reason", doc="finished requests by reason"),
    Input("corrupted_requests", COUNTER, ("vllm:corrupted_requests_total",), False,
          doc="requests with NaN logits (only with VLLM_COMPUTE_NANS_IN_LOGITS)"),
    Input("prefix_cache_queries", COUNTER,
          ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total"), False),
    Input("prefix_cache_hits", COUNTER,
          ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total"), False),
    Input("prefix_cache_hit_rate_legacy", GAUGE, ("vllm:gpu_prefix_cache_hit_rate",), False,
          doc="pre-V1 lifetime hit-rate gauge, used only when the counters are absent"),
    Input("spec_draft_tokens", COUNTER, ("vllm:spec_decode_num_draft_tokens_total",), False),
    Input("spec_accepted_tokens", COUNTER, ("vllm:spec_decode_num_accepted_tokens_total",), False),
    Input("spec_acceptance_legacy", GAUGE, ("vllm:spec_decode_draft_acceptance_rate",), False),
    Input("admission_rejections", COUNTER, ("vllm:admission_rejections_total",), False,
          extra_label="reason"),
    Input("kv_usage", GAUGE, ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"), True,
          doc="KV-cache usage 0-1"),
    Input("running", GAUGE, ("vllm:num_requests_running",), True),
    Input("waiting", GAUGE, ("vllm:num_requests_waiting",), True),
    Input("waiting_by_reason", GAUGE, ("vllm:num_requests_waiting_by_reason",), False,
          extra_label="reason"),
    Input("swapped", GAUGE, ("vllm:num_requests_swapped",), False),
    Input("ttft", HISTOGRAM, ("vllm:time_to_first_token_seconds",), True),
    Input("itl", HISTOGRAM,
          ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"), True),
    Input("tpot_request", HISTOGRAM, ("vllm:request_time_per_output_token_seconds",), False),
    Input("e2e", HISTOGRAM, ("vllm:e2e_request_latency_seconds",), True),
    Input("queue_time", HISTOGRAM, ("vllm:request_queue_time_seconds",), False),
    Input("prompt_length", HISTOGRAM, ("vllm:request_prompt_tokens",), True),
    Input("generation_length", HISTOGRAM, ("vllm:request_generation_tokens",), False),
)
INPUT_BY_KEY: Dict[str, Input] = {i.key: i for i in INPUTS}

# Where each name leads: sample name -> (input, role, priority)
_ROUTES: Dict[str, Tuple[Input, str, int]] = {}
for _inp in INPUTS:
    for _prio, _name in enumerate(_inp.names):
        if _inp.kind == HISTOGRAM:
            _ROUTES[_name + "_bucket"] = (_inp, "bucket", _prio)
            _ROUTES[_name + "_sum"] = (_inp, "sum", _prio)
            _ROUTES[_name + "_count"] = (_inp, "count", _prio)
        else:
            _ROUTES[_name] = (_inp, "value", _prio)

PROCESS_START = "process_start_time_seconds"

SeriesKey = Tuple[str, str, str, str]  # input, model_name, engine, extra label value
HistKey = Tuple[str, str, str]  # input, model_name, engine


@dataclass(frozen=True)
class Hist:
    """One histogram series: cumulative bucket counts by upper bound, sum and count."""

    buckets: Tuple[Tuple[float, float], ...]  # (le, cumulative count) sorted by le
    sum: float
    count: float


@dataclass
class Snapshot:
    t: float
    values: Dict[SeriesKey, float] = field(default_factory=dict)
    hists: Dict[HistKey, Hist] = field(default_factory=dict)
    resolved: Dict[str, str] = field(default_factory=dict)  # input key -> name used
    models: FrozenSet[str] = frozenset()
    process_start: Optional[float] = None
    vllm_samples: int = 0

    def present(self, key: str) -> bool:
        return key in self.resolved

    def missing_required(self) -> List[str]:
        """Required inputs absent under every name, reported by their newest name."""
        return sorted(i.names[0] for i in INPUTS if i.required and i.key not in self.resolved)


def normalize(page: Page, t: float) -> Snapshot:
    """Sort the samples of one page into a Snapshot taken at time ``t``."""
    # name chosen per input: lowest priority number present on the page
    best: Dict[str, int] = {}
    hits: List[Tuple[Input, str, int, object]] = []
    process_start = None
    vllm_samples = 0
    for s in page.samples:
        route = _ROUTES.get(s.name)
        if route is None:
            if s.name == PROCESS_START and not s.labels:
                process_start = s.value
            elif s.name.startswith("vllm:"):
                vllm_samples += 1
            continue
        vllm_samples += 1
        inp, role, prio = route
        prev = best.get(inp.key)
        if prev is None or prio < prev:
            best[inp.key] = prio
        hits.append((inp, role, prio, s))

    snap = Snapshot(t=t, process_start=process_start, vllm_samples=vllm_samples)
    values = snap.values
    hist_parts: Dict[HistKey, Dict[str, object]] = {}
    models = set()
    for inp, role, prio, s in hits:
        if prio != best[inp.key]:
            continue
        model = engine = extra = ""
        le = None
        for k, v in s.labels:
            if k == "model_name":
                model = v
            elif k == "engine":
                engine = v
            elif k == "le":
                le = v
            elif k == inp.extra_label:
                extra = v
        models.add(model)
        if role == "value":
            key = (inp.key, model, engine, extra)
            # same series twice (should not happen) or labels we fold: add them up
            values[key] = values.get(key, 0.0) + s.value
            continue
        parts = hist_parts.setdefault((inp.key, model, engine), {"b": {}})
        if role == "bucket":
            if le is None:
                continue
            try:
                bound = float(le)
            except ValueError:
                continue
            b = parts["b"]
            b[bound] = b.get(bound, 0.0) + s.value
        else:
            parts[role] = parts.get(role, 0.0) + s.value
    for hkey, parts in hist_parts.items():
        b = parts["b"]
        if not b:
            continue
        buckets = tuple(sorted(b.items()))
        count = parts.get("count", buckets[-1][1] if math.isinf(buckets[-1][0]) else 0.0)
        snap.hists[hkey] = Hist(buckets=buckets, sum=parts.get("sum", 0.0), count=count)
    snap.resolved = {k: INPUT_BY_KEY[k].names[p] for k, p in best.items()}
    snap.models = frozenset(models)
    return snap

