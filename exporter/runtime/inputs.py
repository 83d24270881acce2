"""What the derivations read from a vLLM page, under every name vLLM has used for it.

vLLM renames metrics between releases (``gpu_cache_usage_perc`` became ``kv_cache_usage_perc``,
``gpu_prefix_cache_*`` became ``prefix_cache_*``, ``time_per_output_token_seconds`` became
``inter_token_latency_seconds``; pre-V1 pages have no ``engine`` label). Each logical input
below lists its names newest first; the first one present on a page is used. A required input
that is present under no name is reported in ``vllm_sidecar_input_missing{metric}`` and the
signals that need it are left out, never reported as 0.

A page becomes a ``Snapshot``: plain dictionaries keyed by ``(input, model_name, engine,
extra)`` (and indexed by ``(input, model_name)``), so that the windows and derivations never look
at metric names again. ``Reader`` does it for the poll loop: its parser keeps only the series
routed here (``route``), and per series the routing is worked out once and cached with the
series text. ``normalize`` does the same for a page parsed in full (tests, the simulator).

Every value is checked before it is used (``invalid_value``): counters, histogram buckets, sums
and counts must be finite and not negative, ``_created`` and the process start time finite and
positive, gauges inside their range (KV usage 0-1, queue lengths not negative). A histogram with
one bad part is left out whole. A series that occurs twice on a page is rejected
(``duplicate``, the first kept). Rejected values never reach the windows, so they never feed a
rate or the learned baseline.

LoRA (optional, not an ``Input``): vLLM's ``vllm:lora_requests_info{max_lora,
running_lora_adapters, waiting_lora_adapters}`` (adapter names joined by commas, no model_name or
engine label) is set to the current unix time for the label combination of the moment, and the
series of earlier combinations stay on the page: the newest value is the state now, and every
series together names the adapters that had requests since vLLM started. ``Snapshot.lora`` keeps
the series as read (``LoraSeries``) and the adapter names admitted under the cap; the signals
read it from there (``signals.lora``).

KV connectors (prefill/decode disaggregation): the NIXL connector's ``vllm:nixl_*`` series are
read, and Mooncake's ``vllm:mooncake_*`` as aliases of the same inputs where they mean the same
(transfer time, bytes, failed transfers, expired leases; Mooncake has no post time, no failed
notifications and no notifications after expiry, and its ``num_failed_recvs`` is not read).
``vllm:num_requests_kv_fetch_by_stage`` exists only on KV consumers (and ``kv_both`` instances);
``vllm:prompt_tokens_by_source`` and ``vllm:external_prefix_cache_*`` are filled by every
connector. ``vllm:engine_sleep_state`` and ``vllm:iteration_tokens_total`` (of which only the
count is read: the engine's steps) are on every V1 page.

HTTP answers (optional, not an ``Input``): the OpenAI server's ``http_requests_total{handler,
method, status}`` (no model_name, no engine; created at a handler's first answer) is read only
when the reader is given the SLO's ``http_handlers`` (a regular expression, matched whole, as
Prometheus matches ``=~``): the answers of those handlers are added up by status into the
counter input ``http_requests`` (``HTTP_KEY``; model_name and engine "", an extra label value per
status, at most ``max_label_values`` statuses), which the windows count like vLLM's counters, for
the availability SLI's requests and failures (``signals.availability``).

``Builder.build`` goes through a page's rows once, in jobs: the newest name of each input
(``_best_names``), the caps (``Builder._admit``), each sample checked and sorted (``_Work``), then
the values indexed by model (``_index_values``) and the histograms checked whole
(``_assemble_hists``).

Caps (``Caps``): at most ``max_models`` models, ``max_engines`` engines and ``max_label_values``
values of an extra label (finished_reason, reason) per input and model are taken from a page,
and as many LoRA adapter names (the adapters of the newest series first, then by name).
Models and engines already taken keep their place while they come back within the memory of
the windows; the excess is left out, counted by reason (``dropped``) and named
(``dropped_names``) so the poll loop can say which once.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import partial
from itertools import repeat
from operator import add, itemgetter, le
from typing import Any, Dict, FrozenSet, List, NamedTuple, Optional, Pattern, Tuple

from .exposition import COUNT, DEFAULT_LIMITS, Limits, Page, Parser, _getter

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
    Input("iterations", COUNTER, ("vllm:iteration_tokens_total_count",), False,
          doc="engine steps: the count of vLLM's tokens-per-step histogram (a wedged engine makes none); "
              "only the count is read, not the buckets"),
    # speculative decoding, beyond the acceptance ratio above
    Input("spec_drafts", COUNTER, ("vllm:spec_decode_num_drafts_total",), False),
    Input("spec_accepted_per_pos", COUNTER, ("vllm:spec_decode_num_accepted_tokens_per_pos_total",), False,
          extra_label="position"),
    Input("sleep_state", GAUGE, ("vllm:engine_sleep_state",), False, extra_label="sleep_state",
          doc="1 on the engine's state now: awake, weights_offloaded (level 1) or discard_all (level 2)"),
    # KV connectors (prefill/decode disaggregation): NIXL's series, Mooncake's where they match
    Input("kv_xfer_time", HISTOGRAM, ("vllm:nixl_xfer_time_seconds", "vllm:mooncake_xfer_time_seconds"), False),
    Input("kv_post_time", HISTOGRAM, ("vllm:nixl_post_time_seconds",), False),
    Input("kv_bytes", HISTOGRAM, ("vllm:nixl_bytes_transferred", "vllm:mooncake_bytes_transferred"), False),
    Input("kv_failed_transfers", COUNTER,
          ("vllm:nixl_num_failed_transfers_total", "vllm:mooncake_num_failed_transfers_total"), False,
          doc="failed KV transfers (NIXL: handshake and notification failures included)"),
    Input("kv_failed_notifications", COUNTER, ("vllm:nixl_num_failed_notifications_total",), False),
    Input("kv_expired", COUNTER, ("vllm:nixl_num_kv_expired_reqs_total", "vllm:mooncake_num_kv_expired_reqs_total"),
          False, doc="requests whose KV lease expired on the producer before the consumer read it"),
    Input("kv_notifications_after_expiry", COUNTER, ("vllm:nixl_num_notifications_after_expiry_total",), False),
    Input("kv_fetch_by_stage", GAUGE, ("vllm:num_requests_kv_fetch_by_stage",), False, extra_label="stage",
          doc="waiting requests by async KV load stage (KV consumers and kv_both only)"),
    Input("prompt_tokens_by_source", COUNTER, ("vllm:prompt_tokens_by_source_total",), False,
          extra_label="source", doc="local_compute, local_cache_hit, external_kv_transfer"),
    Input("external_prefix_cache_queries", COUNTER, ("vllm:external_prefix_cache_queries_total",), False),
    Input("external_prefix_cache_hits", COUNTER, ("vllm:external_prefix_cache_hits_total",), False),
)
INPUT_BY_KEY: Dict[str, Input] = {i.key: i for i in INPUTS}

# The range a gauge input's value must lie in.
GAUGE_RANGE: Dict[str, Tuple[float, float]] = {
    "kv_usage": (0.0, 1.0),
    "prefix_cache_hit_rate_legacy": (0.0, 1.0),
    "spec_acceptance_legacy": (0.0, 1.0),
    "running": (0.0, math.inf),
    "waiting": (0.0, math.inf),
    "waiting_by_reason": (0.0, math.inf),
    "swapped": (0.0, math.inf),
    "sleep_state": (0.0, 1.0),
    "kv_fetch_by_stage": (0.0, math.inf),
}

PROCESS_START = "process_start_time_seconds"
LORA_INFO = "vllm:lora_requests_info"

SeriesKey = Tuple[str, str, str, str]  # input, model_name, engine, extra label value
HistKey = Tuple[str, str, str]  # input, model_name, engine


class Route(NamedTuple):
    """Where one series of a page goes; worked out once per series text and cached."""

    input: Optional[Input]  # None for the process start time
    role: str  # value, bucket, sum, count, created, start
    prio: int
    model: str
    engine: str
    extra: str
    le: float  # bucket bound (NaN when not a bucket)
    lo: float  # the value must lie in [lo, hi] (NaN and infinities never do)
    hi: float
    key: tuple = ()  # where its value goes: (input, model, engine, extra); a histogram's part (input, model, engine)


class LoraRoute(NamedTuple):
    """A ``vllm:lora_requests_info`` series, its labels split once per series text."""

    max_lora: str
    running: Tuple[str, ...]  # adapter names, as vLLM lists them
    waiting: Tuple[str, ...]
    input = None  # not one of INPUTS: the Builder keeps it apart
    role = "lora"


HTTP_REQUESTS = "http_requests_total"
HTTP_CREATED = "http_requests_created"


class HttpRoute(NamedTuple):
    """An ``http_requests_total`` series of a handler the availability SLI counts (role
    ``http``), or its ``http_requests_created`` (role ``http_created``: when the server created it)."""

    role: str
    status: str  # as the server writes it: "2xx", "5xx" (grouped) or "200", "503"
    labels: Tuple[Tuple[str, str], ...]  # every label as read (the flight recorder writes them back)
    input = None  # not one of INPUTS: the Builder keeps it apart

    @property
    def name(self) -> str:
        return HTTP_REQUESTS if self.role == "http" else HTTP_CREATED


HTTP_KEY = "http_requests"  # the counter input the answers are added up into, by status


class LoraSeries(NamedTuple):
    """One series of ``vllm:lora_requests_info`` on a page; ``t`` is its value (unix time)."""

    max_lora: str
    running: Tuple[str, ...]
    waiting: Tuple[str, ...]
    t: float


@dataclass(frozen=True)
class LoraPage:
    """vLLM's LoRA series on one page and the adapter names taken under the cap."""

    series: Tuple[LoraSeries, ...]
    adapters: Tuple[str, ...]  # admitted (at most max_label_values), sorted
    adapters_total: int  # every adapter name on the page, the ones over the cap included


def lora_newest(series) -> Tuple[LoraSeries, ...]:
    """The series of the state now: the highest value, wherever it stands on the page (several
    when they tie, e.g. two engines writing in the same instant)."""
    if not series:
        return ()
    top = max(s.t for s in series)
    return tuple(s for s in series if s.t == top)


def _adapters(value: str) -> Tuple[str, ...]:
    return tuple(dict.fromkeys(a for a in value.split(",") if a))


def _lora_route(labels) -> LoraRoute:
    d = dict(labels)
    return LoraRoute(d.get("max_lora", ""), _adapters(d.get("running_lora_adapters", "")),
                     _adapters(d.get("waiting_lora_adapters", "")))


# Where each name leads: sample name -> (input, role, priority)
_ROUTES: Dict[str, Tuple[Input, str, int]] = {}
for _inp in INPUTS:
    for _prio, _name in enumerate(_inp.names):
        if _inp.kind == HISTOGRAM:
            _ROUTES[_name + "_bucket"] = (_inp, "bucket", _prio)
            _ROUTES[_name + "_sum"] = (_inp, "sum", _prio)
            _ROUTES[_name + "_count"] = (_inp, "count", _prio)
            _ROUTES[_name + "_created"] = (_inp, "created", _prio)
        else:
            _ROUTES[_name] = (_inp, "value", _prio)
            if _inp.kind == COUNTER and _name.endswith("_total"):
                _ROUTES[_name[: -len("_total")] + "_created"] = (_inp, "created", _prio)

_BIG = 1.7976931348623157e308  # the largest float: infinity is never a valid value
_TINY = 5e-324
_START = Route(None, "start", 0, "", "", "", math.nan, _TINY, _BIG)


def route(name: str, labels, http: Optional[Pattern[str]] = None) -> object:
    """The Route of one series (a ``LoraRoute`` for vLLM's LoRA info, an ``HttpRoute`` for the
    answers of a handler ``http`` matches), ``COUNT`` for another ``vllm:`` series, None for the
    rest."""
    r = _ROUTES.get(name)
    if r is None:
        if name == PROCESS_START:
            return _START if not labels else None
        if name == LORA_INFO:
            return _lora_route(labels)
        if name in (HTTP_REQUESTS, HTTP_CREATED) and http is not None:
            d = dict(labels)
            if not http.fullmatch(d.get("handler", "")):
                return None
            return HttpRoute("http" if name == HTTP_REQUESTS else "http_created", d.get("status", ""),
                             tuple(sorted(d.items())))
        return COUNT if name.startswith("vllm:") else None
    inp, role, prio = r
    model = engine = extra = ""
    le = math.nan
    for k, v in labels:
        if k == "model_name":
            model = v
        elif k == "engine":
            engine = v
        elif k == "le":
            if role != "bucket":
                continue
            try:
                le = float(v)
            except ValueError:
                return None  # a bucket without a readable bound: not a series we can use
            if math.isnan(le):
                return None
        elif k == inp.extra_label:
            extra = v
    if role == "bucket" and math.isnan(le):
        return None
    if role == "created":
        lo, hi = _TINY, _BIG
    elif inp.kind == GAUGE:
        lo, hi = GAUGE_RANGE.get(inp.key, (-_BIG, _BIG))
    else:
        lo, hi = 0.0, _BIG
    key = (inp.key, model, engine) if role in ("bucket", "sum", "count") else (inp.key, model, engine, extra)
    return Route(inp, role, prio, model, engine, extra, le, lo, min(hi, _BIG), key)


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
    created: Dict[SeriesKey, float] = field(default_factory=dict)  # histograms: extra ""
    resolved: Dict[str, str] = field(default_factory=dict)  # input key -> name used
    models: FrozenSet[str] = frozenset()
    process_start: Optional[float] = None
    vllm_samples: int = 0
    rejected: Dict[str, int] = field(default_factory=dict)  # invalid values by reason
    rejected_detail: Optional[str] = None  # the first rejected value, for the log
    dropped: Dict[str, int] = field(default_factory=dict)  # samples over a cap, by cap
    dropped_names: Dict[str, Tuple[str, ...]] = field(default_factory=dict)  # which models/engines
    by_model: Dict[Tuple[str, str], List[Tuple[str, str, float]]] = field(default_factory=dict)
    hists_by_model: Dict[Tuple[str, str], List[Hist]] = field(default_factory=dict)
    lora: Optional[LoraPage] = None  # None: no vllm:lora_requests_info sample on the page

    def present(self, key: str) -> bool:
        return key in self.resolved

    def missing_required(self) -> List[str]:
        """Required inputs absent under every name, reported by their newest name."""
        return sorted(i.names[0] for i in INPUTS if i.required and i.key not in self.resolved)

    def gauge(self, key: str, model: str) -> List[float]:
        """Every engine's value of an input for one model (extra labels kept apart)."""
        return [v for _e, _x, v in self.by_model.get((key, model), ())]


@dataclass(frozen=True)
class Caps:
    max_models: int = 16
    max_engines: int = 64
    max_label_values: int = 32


class _Admission:
    """First come, first kept: what is taken keeps its place while seen within ``memory`` s."""

    def __init__(self, cap: int, memory: float) -> None:
        self.cap = cap
        self.memory = memory
        self.seen: Dict[str, float] = {}

    def expire(self, t: float) -> None:
        if self.seen:
            old = [k for k, last in self.seen.items() if last < t - self.memory or last > t]
            for k in old:
                del self.seen[k]

    def admit(self, name: str, t: float) -> bool:
        seen = self.seen
        if name in seen:
            seen[name] = t
            return True
        if len(seen) >= self.cap:
            return False
        seen[name] = t
        return True


def _best_names(rows) -> Dict[str, int]:
    """Per input, the priority of the newest of its names present on the page."""
    best: Dict[str, int] = {}
    for r, _v in rows:
        inp = r.input
        if inp is not None:
            p = best.get(inp.key)
            if p is None or r.prio < p:
                best[inp.key] = r.prio
    return best


class _Work:
    """What one ``Builder.build`` collects while it goes through a page's rows."""

    def __init__(self, snap: Snapshot, max_extra: int) -> None:
        self.snap = snap
        self.max_extra = max_extra
        self.dropped_names: Dict[str, set] = {}
        self.hist_parts: Dict[HistKey, list] = {}
        self.bad_hists: set = set()
        self.extras: Dict[Tuple[str, str], set] = {}
        self.models: set = set()
        self.admitted_models: Dict[str, bool] = {}
        self.admitted_engines: Dict[str, bool] = {}
        self.lora: List[LoraSeries] = []
        self.http_statuses: set = set()  # the HTTP statuses taken (capped as an extra label)

    def drop(self, cap: str, name: str) -> None:
        dropped = self.snap.dropped
        dropped[cap] = dropped.get(cap, 0) + 1
        self.dropped_names.setdefault(cap, set()).add(name)

    def reject(self, detail: str) -> None:
        snap = self.snap
        snap.rejected["invalid_value"] = snap.rejected.get("invalid_value", 0) + 1
        if snap.rejected_detail is None:
            snap.rejected_detail = detail

    def other(self, r, v: float) -> None:
        """A row of no input: vLLM's LoRA info, an HTTP answer count or the process start time."""
        if r.role == "http_created":
            # the status's creation time: its first handler's (a status new since the last poll
            # counts from zero in the windows); only for a status whose answers are taken
            if not _TINY <= v <= _BIG:
                self.reject(f"{r.name}{dict(r.labels)!r} = {v!r}")
            elif r.status in self.http_statuses or len(self.http_statuses) < self.max_extra:
                created, key = self.snap.created, (HTTP_KEY, "", "", r.status)
                created[key] = min(v, created.get(key, v))
        elif r.role == "http":
            if not 0.0 <= v <= _BIG:  # a counter: finite, not negative
                self.reject(f"{r.name}{dict(r.labels)!r} = {v!r}")
                return
            values, key, statuses = self.snap.values, (HTTP_KEY, "", "", r.status), self.http_statuses
            if r.status not in statuses:
                if len(statuses) >= self.max_extra:
                    self.drop("max_label_values", f"status={r.status}")
                    return
                statuses.add(r.status)
            values[key] = values.get(key, 0.0) + v  # every handler and method of the status
        elif r.role == "lora":
            if _TINY <= v <= _BIG:  # a unix time: finite and positive
                self.lora.append(LoraSeries(r.max_lora, r.running, r.waiting, v))
            else:
                self.reject(f"{LORA_INFO} = {v!r}")
        elif r.lo <= v <= r.hi:
            self.snap.process_start = v
        else:
            self.reject(f"{PROCESS_START} = {v!r}")

    def take(self, r: Route, v: float) -> None:
        """One admitted sample of an input: checked, then into values, created or a histogram."""
        if not r.lo <= v <= r.hi:
            inp, role = r.input, r.role
            self.reject(f"{inp.names[r.prio]} ({role}, model {r.model!r}, engine {r.engine!r}) = {v!r}")
            if inp.kind == HISTOGRAM and role != "created":
                self.bad_hists.add((inp.key, r.model, r.engine))
            return
        self.models.add(r.model)
        role, key = r.role, r.key
        if role == "value":
            values = self.snap.values
            # labels this table folds (none on vLLM's pages today): add them up
            values[key] = values.get(key, 0.0) + v
        elif role == "created":
            created = self.snap.created
            created[key] = min(v, created.get(key, v))
        else:
            parts = self.hist_parts.get(key)
            if parts is None:
                parts = self.hist_parts[key] = [{}, None, None]
            if role == "bucket":
                b = parts[0]
                b[r.le] = b.get(r.le, 0.0) + v
            elif role == "sum":
                parts[1] = (parts[1] or 0.0) + v
            else:
                parts[2] = (parts[2] or 0.0) + v


def _index_values(snap: Snapshot) -> None:
    """``by_model``: every value of one input and model, (engine, extra, value)."""
    by_model = snap.by_model
    for (k, m, e, x), v in snap.values.items():
        lst = by_model.get((k, m))
        if lst is None:
            lst = by_model[(k, m)] = []
        lst.append((e, x, v))


def _reject_hist(snap: Snapshot, detail: str) -> None:
    snap.rejected["invalid_value"] = snap.rejected.get("invalid_value", 0) + 1
    if snap.rejected_detail is None:
        snap.rejected_detail = detail


def _assemble_hists(snap: Snapshot, hist_parts: Dict[HistKey, list], bad_hists: set) -> None:
    """The histograms whose every part was valid, checked whole: a sum present and not negative,
    bucket counts that grow with the bound and end at the count."""
    hists_by = snap.hists_by_model
    for hkey, (b, hsum, hcount) in hist_parts.items():
        if not b or hkey in bad_hists:
            continue
        buckets = tuple(sorted(b.items()))
        top = buckets[-1][1] if math.isinf(buckets[-1][0]) else None
        if hcount is None:
            hcount = top if top is not None else 0.0
        if hsum is None or hsum < 0:
            # a histogram without its sum (a line lost) or with an impossible one: left out
            # whole, so the window keeps the last good one instead of a sum of zero
            _reject_hist(snap, f"histogram {hkey[0]} of model {hkey[1]!r} has no valid _sum")
            continue
        if (top is not None and hcount != top) or any(
                buckets[i][1] > buckets[i + 1][1] for i in range(len(buckets) - 1)):
            # not a histogram: counts must grow with the bound and end at the count
            _reject_hist(snap, f"histogram {hkey[0]} of model {hkey[1]!r} is not cumulative")
            continue
        h = snap.hists[hkey] = Hist(buckets=buckets, sum=hsum, count=hcount)
        lst = hists_by.get(hkey[:2])
        if lst is None:
            lst = hists_by[hkey[:2]] = []
        lst.append(h)


class _Program:
    """What ``Builder.build`` does with the rows of one page shape, worked out once: which rows
    it takes (the newest name of each input), where each value goes, the models, engines and
    extra label values they bring. ``ok`` is False when the shape is one the per-row loop must
    read (two rows adding up under one key, an extra label over its cap)."""

    def __init__(self, rows, best: Dict[str, int], max_extra: int) -> None:
        self.ok = False
        self.other: List[int] = []  # rows of no input (LoRA info, process start), in page order
        self.routed = 0
        take: List[int] = []
        models: Dict[str, None] = {}  # in order of first sight, as the loop admits them
        engines: Dict[str, None] = {}
        extras: Dict[Tuple[str, str], set] = {}
        value_rows, value_keys, created_rows, created_keys = [], [], [], []
        hists: Dict[HistKey, list] = {}  # [bucket rows, their bounds, sum row, count row]
        for i, (r, _v) in enumerate(rows):
            inp = r.input
            if inp is None:
                if r.role == "lora":
                    self.routed += 1
                self.other.append(i)
                continue
            self.routed += 1
            if r.prio != best[inp.key]:
                continue
            take.append(i)
            models[r.model] = None
            engines[r.engine] = None
            if r.extra:
                extras.setdefault((inp.key, r.model), set()).add(r.extra)
            role = r.role
            if role == "value":
                value_rows.append(i)
                value_keys.append(r.key)
            elif role == "created":
                created_rows.append(i)
                created_keys.append(r.key)
            else:
                h = hists.get(r.key)
                if h is None:
                    h = hists[r.key] = [[], [], None, None]
                if role == "bucket":
                    h[0].append(i)
                    h[1].append(r.le)
                elif h[2 if role == "sum" else 3] is not None:
                    return  # a sum or count twice: added up by the loop
                else:
                    h[2 if role == "sum" else 3] = i
        if len(set(value_keys)) < len(value_keys) or len(set(created_keys)) < len(created_keys) or any(
                len(set(h[1])) < len(h[1]) for h in hists.values()):
            return  # values that add up under one key: the loop's work
        if any(len(x) > max_extra for x in extras.values()):
            return  # the extra label's cap decides row by row
        self.get_take = _getter(take)
        self.lo = [rows[i][0].lo for i in take]
        self.hi = [rows[i][0].hi for i in take]
        self.models = tuple(models)
        self.engines = tuple(engines)
        self.model_set = frozenset(models)
        self.value_keys, self.get_values = value_keys, _getter(value_rows)
        self.created_keys, self.get_created = created_keys, _getter(created_rows)
        self.hists = [(k, h[1], _getter(h[0]), h[2], h[3]) for k, h in hists.items()]
        self.ok = True


def _admit_all(adm: "_Admission", names: Tuple[str, ...], t: float) -> bool:
    """``adm.admit(name, t)`` for every name in order when every one would be admitted (the
    state then is what those calls leave); otherwise nothing changes and the answer is False."""
    seen = adm.seen
    new = 0
    for name in names:
        if name not in seen:
            new += 1
    if new and len(seen) + new > adm.cap:
        return False
    for name in names:
        seen[name] = t
    return True


class Builder:
    """Sorts routed samples into a Snapshot, applying the caps (state: what was admitted).

    Rows of a page shape seen before (``shape``) are sorted by the shape's ``_Program``, with
    whole-list operations, when every value lies in its range and every model and engine is
    admitted; then the snapshot is the one the per-row loop makes (the same dictionaries in the
    same order, ``0.0 + v`` where the loop adds to 0.0). Anything else goes through the loop.
    """

    def __init__(self, caps: Caps = Caps(), memory: float = 300.0) -> None:
        self.caps = caps
        self.models = _Admission(caps.max_models, memory)
        self.engines = _Admission(caps.max_engines, memory)
        self._shape: Any = None  # the page shape ``best`` and the program were worked out for
        self._best: Dict[str, int] = {}
        self._program: Optional[_Program] = None

    def build(self, rows, t: float, counted: int = 0, shape: Any = None) -> Snapshot:
        """``rows``: (Route, value) pairs in page order. ``shape``: an object that stands for the
        sequence of routes in ``rows`` (the parser's kept page shape, ``Page.shape``): the same
        object, the same routes, so the names each input is read under are not worked out again."""
        self.models.expire(t)
        self.engines.expire(t)
        if shape is not None and shape is self._shape:
            best, program = self._best, self._program
        else:
            best = _best_names(rows)
            program = _Program(rows, best, self.caps.max_label_values) if shape is not None else None
            self._shape, self._best, self._program = shape, best, program
        snap = Snapshot(t=t)
        work = _Work(snap, self.caps.max_label_values)
        if program is not None and program.ok and self._run(program, rows, t, work):
            routed = program.routed
        else:
            routed = self._loop(rows, t, best, work)
        _index_values(snap)
        _assemble_hists(snap, work.hist_parts, work.bad_hists)
        if work.lora:
            snap.lora = self._lora(work.lora, snap.dropped, work.dropped_names)
        snap.resolved = {k: INPUT_BY_KEY[k].names[p] for k, p in best.items()}
        snap.models = frozenset(work.models)
        snap.vllm_samples = routed + counted
        snap.dropped_names = {k: tuple(sorted(v)) for k, v in work.dropped_names.items()}
        return snap

    def _loop(self, rows, t: float, best: Dict[str, int], work: "_Work") -> int:
        """Every row in page order (the caps, the ranges); the rows routed."""
        routed = 0
        models, engines, take = work.admitted_models, work.admitted_engines, work.take
        for r, v in rows:
            inp = r.input
            if inp is None:
                if r.role == "lora":
                    routed += 1
                work.other(r, v)
                continue
            routed += 1
            if r.prio != best[inp.key]:
                continue
            if (models.get(r.model) and engines.get(r.engine) and not r.extra) or self._admit(r, t, work):
                take(r, v)  # (the first test: a model and engine already admitted, no extra label)
        return routed

    def _run(self, p: _Program, rows, t: float, work: "_Work") -> bool:
        """The rows through the shape's program; False, with nothing changed, when a value is out
        of its range or a model or engine would not be admitted (the loop then decides)."""
        vals = list(map(itemgetter(1), rows))
        taken = p.get_take(vals)
        if not (all(map(le, p.lo, taken)) and all(map(le, taken, p.hi))):
            return False
        models, engines = self.models, self.engines
        seen_m, seen_e = models.seen, engines.seen
        new_m = sum(1 for m in p.models if m not in seen_m)
        new_e = sum(1 for e in p.engines if e not in seen_e)
        if (new_m and len(seen_m) + new_m > models.cap) or (new_e and len(seen_e) + new_e > engines.cap):
            return False
        _admit_all(models, p.models, t)
        _admit_all(engines, p.engines, t)
        snap = work.snap
        snap.values = dict(zip(p.value_keys, map(add, repeat(0.0), p.get_values(vals))))
        snap.created = dict(zip(p.created_keys, p.get_created(vals)))
        parts = work.hist_parts
        for key, les, get_buckets, s, c in p.hists:
            parts[key] = [dict(zip(les, map(add, repeat(0.0), get_buckets(vals)))),
                          None if s is None else 0.0 + vals[s], None if c is None else 0.0 + vals[c]]
        work.models = set(p.model_set)
        for i in p.other:
            r, v = rows[i]
            work.other(r, v)
        return True

    def _admit(self, r: Route, t: float, work: "_Work") -> bool:
        """Whether the series' model, engine and extra label value fit under the caps (the
        admissions are decided once per page and name)."""
        model = r.model
        ok = work.admitted_models.get(model)
        if ok is None:
            ok = work.admitted_models[model] = self.models.admit(model, t)
        if not ok:
            work.drop("max_models", model)
            return False
        engine = r.engine
        ok = work.admitted_engines.get(engine)
        if ok is None:
            ok = work.admitted_engines[engine] = self.engines.admit(engine, t)
        if not ok:
            work.drop("max_engines", engine)
            return False
        if r.extra:
            seen = work.extras.setdefault((r.input.key, model), set())
            if r.extra not in seen:
                if len(seen) >= work.max_extra:
                    work.drop("max_label_values", f"{r.input.extra_label}={r.extra}")
                    return False
                seen.add(r.extra)
        return True

    def _lora(self, series: List[LoraSeries], dropped: Dict[str, int],
              dropped_names: Dict[str, set]) -> LoraPage:
        """The LoRA series and the adapter names under the cap: those of the state now first (the
        ones a reader most needs), then the others by name; one sample dropped per name left out."""
        now = {a for s in lora_newest(series) for a in (*s.running, *s.waiting)}
        every = {a for s in series for a in (*s.running, *s.waiting)}
        order = sorted(every, key=lambda a: (a not in now, a))
        cap = self.caps.max_label_values
        for a in order[cap:]:
            dropped["max_label_values"] = dropped.get("max_label_values", 0) + 1
            dropped_names.setdefault("max_label_values", set()).add(f"adapter={a}")
        return LoraPage(series=tuple(series), adapters=tuple(sorted(order[:cap])), adapters_total=len(every))


def http_pattern(handlers: str) -> Optional[Pattern[str]]:
    """The compiled ``http_handlers`` expression (None: HTTP answers are not read)."""
    return re.compile(handlers) if handlers else None


def normalize(page: Page, t: float, builder: Optional[Builder] = None, http_handlers: str = "") -> Snapshot:
    """Sort the samples of a page parsed in full into a Snapshot taken at time ``t``."""
    rows = []
    counted = 0
    seen = set()
    duplicates = 0
    http = http_pattern(http_handlers)
    for s in page.samples:
        r = route(s.name, s.labels, http)
        if r is None:
            continue
        if r is COUNT:
            counted += 1
            continue
        ident = (s.name, tuple(sorted(s.labels)))
        if ident in seen:
            duplicates += 1
            continue
        seen.add(ident)
        rows.append((r, s.value))
    snap = (builder or Builder()).build(rows, t, counted)
    if duplicates:
        snap.rejected["duplicate"] = duplicates
    return snap


class Reader:
    """Page text -> Snapshot for the poll loop: a parser that keeps only the routed series."""

    def __init__(self, caps: Caps = Caps(), memory: float = 300.0, limits: Limits = DEFAULT_LIMITS,
                 http_handlers: str = "") -> None:
        http = http_pattern(http_handlers)
        self.parser = Parser(select=route if http is None else partial(route, http=http), limits=limits)
        self.builder = Builder(caps, memory)

    def read(self, text: str, t: float) -> Tuple[Page, Snapshot]:
        page = self.parser.parse(text)
        snap = self.builder.build(page.selected, t, page.counted, page.shape)
        return page, snap
