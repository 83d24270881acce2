"""The regression gate: a candidate's figures against a baseline's, with noise handled honestly,
and the sidecar's signals during each run beside them so a regression comes with a likely cause.

Figures come from ``vllm bench serve --save-result`` files (``benchfile``) or from two time
ranges of one Prometheus (``range_run``: the same figures from vLLM's own counters and
histograms over each range, from raw samples here or evaluated by the server: ``ServerRanges``).
Each figure knows which way is worse: latencies up, throughputs down, the failed share up.

The rule, per figure, with the baseline runs B and candidate runs C (one or more each):

- compare the medians: ``worse = median C - median B`` in the figure's bad direction, and its
  share of ``|median B|``;
- the run-to-run spread is the standard deviation between runs of the same side (pooled over
  both sides; on the log scale, so it is relative: 0.2 = runs differ by about 20 %). The
  difference must exceed what that spread allows with this many runs: a one-sided Student t
  test at the confidence level (95 %): ``diff > t(0.95, n + m - 2) x spread x sqrt(1/n + 1/m)``.
  Its false-alarm rate stays at about 5 % per figure whatever the noise, and its power grows
  with the number of runs. With one run a side the spread is unknown: only the threshold and the
  minimum effect remain, and the report says so;
- **regressed** when the worse share exceeds the threshold (10 % by default, the SLO's
  ``gate.max_regression``), the difference clears the spread, and, for latencies, ``worse`` is at
  least ``gate.min_effect_ms`` (so a 0.3 ms change of a 2 ms ITL is not a regression);
- **within noise** when the share exceeds the threshold but the difference does not clear the
  spread or the minimum effect; **improved** the same the other way; **ok** otherwise.

The gate fails when any chosen figure regressed. The comparison is pure. Where the runs come from
is decided here too (``load_runs``: result files, checked for the same load; ``open_ranges``:
which engine reads the Prometheus ranges, and the store of raw samples for the local one); the
command line parses flags, prints and picks the exit status.
"""

from __future__ import annotations

import fnmatch
import math
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..slo import defaults
from .benchfile import LATENCY_KEY, BenchFileError, BenchRun, load_differences
from .benchfile import load as load_bench_file
from .promql.vector import Vec
from .stats import t_cdf

STAT_WORDS = {"mean": "mean", "median": "p50"}
METRIC_WORDS = {"ttft": "TTFT", "tpot": "TPOT", "itl": "ITL", "e2el": "E2E latency"}
OTHER = {
    "request_throughput": ("request throughput", "req/s", +1),
    "request_goodput": ("request goodput", "req/s", +1),
    "output_throughput": ("output token throughput", "tokens/s", +1),
    "total_token_throughput": ("total token throughput", "tokens/s", +1),
    "failed_ratio": ("failed requests", "share", -1),
}


@dataclass(frozen=True)
class FigureSpec:
    key: str
    label: str
    unit: str
    direction: int      # +1: higher is better; -1: lower is better
    latency: bool


def spec(key: str) -> Optional[FigureSpec]:
    if key in OTHER:
        label, unit, d = OTHER[key]
        return FigureSpec(key, label, unit, d, False)
    m = LATENCY_KEY.fullmatch(key)
    if not m:
        return None
    stat, metric = m.groups()
    return FigureSpec(key, f"{METRIC_WORDS[metric]} {STAT_WORDS.get(stat, stat)}", "ms", -1, True)


def _order(key: str) -> Tuple:
    if key in OTHER:
        return (0, list(OTHER).index(key), 0.0)
    m = LATENCY_KEY.fullmatch(key)
    stat, metric = m.groups() if m else ("", "")
    rank = -1.0 if stat == "mean" else 50.0 if stat == "median" else float(stat[1:] or 0)
    return (1 + list(METRIC_WORDS).index(metric) if metric in METRIC_WORDS else 9, rank, 0.0)


@dataclass(frozen=True)
class Settings:
    threshold: float = 0.10          # the SLO's gate.max_regression
    min_effect_ms: float = 1.0       # the SLO's gate.min_effect_ms
    figures: Sequence[str] = ()      # fnmatch patterns of the figures that gate; empty: all
    confidence: float = 0.95         # of the one-sided test against the run-to-run spread


@dataclass(frozen=True)
class Noise:
    """The run-to-run spread of one figure and what it says about the difference."""

    sd: float                   # pooled standard deviation between runs of the same side
    relative: bool              # sd of log values (a share of the figure) or in the figure's unit
    p: float                    # one-sided p-value of "the candidate is worse"
    p_better: float             # ... of "the candidate is better"


@dataclass(frozen=True)
class Row:
    spec: FigureSpec
    baseline: List[float]
    candidate: List[float]
    baseline_median: float
    candidate_median: float
    change: float               # (candidate - baseline) / |baseline|, signed as the numbers go
    worse: float                # the difference in the bad direction (negative: better)
    noise: Optional[Noise]      # None with one run a side
    gated: bool
    verdict: str                # regressed | within noise | improved | ok | not gated


@dataclass
class Comparison:
    rows: List[Row]
    settings: Settings
    notes: List[str] = field(default_factory=list)

    @property
    def regressed(self) -> List[Row]:
        return [r for r in self.rows if r.verdict == "regressed"]

    @property
    def passed(self) -> bool:
        return not self.regressed


def median(xs: Sequence[float]) -> float:
    return float(np.median(np.asarray(xs, dtype=float)))


def relative(new: float, old: float) -> float:
    if old == 0:
        return 0.0 if new == 0 else math.copysign(math.inf, new)
    return (new - old) / abs(old)


def noise(direction: int, base: Sequence[float], cand: Sequence[float]) -> Optional[Noise]:
    """Pooled run-to-run spread and the one-sided t test of the difference (log scale when every
    value is positive, so the spread is relative); None without at least three runs in all."""
    n, m = len(base), len(cand)
    if n + m < 3:
        return None
    b, c = np.asarray(base, dtype=float), np.asarray(cand, dtype=float)
    rel = bool((b > 0).all() and (c > 0).all())
    if rel:
        b, c = np.log(b), np.log(c)
    df = n + m - 2
    sd = math.sqrt((((b - b.mean()) ** 2).sum() + ((c - c.mean()) ** 2).sum()) / df)
    diff = -direction * (c.mean() - b.mean())  # in the bad direction
    se = sd * math.sqrt(1 / n + 1 / m)
    if se == 0:
        p = 0.0 if diff > 0 else 1.0
        q = 0.0 if diff < 0 else 1.0
    else:
        p = 1 - t_cdf(diff / se, df)
        q = 1 - t_cdf(-diff / se, df)
    return Noise(sd, rel, p, q)


def judge(s: FigureSpec, base: Sequence[float], cand: Sequence[float], st: Settings, gated: bool = True) -> Row:
    mb, mc = median(base), median(cand)
    worse = -s.direction * (mc - mb)
    share = worse / abs(mb) if mb else (0.0 if worse == 0 else math.copysign(math.inf, worse))
    nz = noise(s.direction, base, cand)
    alpha = 1 - st.confidence
    floor = st.min_effect_ms if s.latency else 0.0
    if not gated:
        verdict = "not gated"
    elif share > st.threshold:
        clear = nz is None or nz.p < alpha
        verdict = "regressed" if clear and worse >= floor and worse > 0 else "within noise"
    elif -share > st.threshold and (nz is None or nz.p_better < alpha) and -worse >= floor:
        verdict = "improved"
    else:
        verdict = "ok"
    return Row(s, list(base), list(cand), mb, mc, relative(mc, mb), worse, nz, gated, verdict)


def chosen(key: str, patterns: Sequence[str]) -> bool:
    return not patterns or any(fnmatch.fnmatchcase(key, p) for p in patterns)


def compare(baseline: Sequence[BenchRun], candidate: Sequence[BenchRun], st: Settings) -> Comparison:
    """Every figure both sides have (in every run), judged; figures outside ``st.figures`` are
    shown but do not gate."""
    if not baseline or not candidate:
        raise ValueError("the gate needs at least one baseline run and one candidate run")
    keys = set.intersection(*(set(r.figures) for r in list(baseline) + list(candidate)))
    rows = []
    for k in sorted(keys, key=_order):
        s = spec(k)
        if s is None:
            continue
        rows.append(judge(s, [r.figures[k] for r in baseline], [r.figures[k] for r in candidate], st,
                          chosen(k, st.figures)))
    out = Comparison(rows, st)
    if st.figures and not any(r.gated for r in rows):
        raise ValueError(f"no figure matches {', '.join(st.figures)} (figures: {', '.join(r.spec.key for r in rows)})")
    if len(baseline) + len(candidate) < 3:
        out.notes.append("one run a side: the run-to-run spread is unknown, so only the threshold and the minimum "
                         "effect separate a regression from noise; give several --baseline and --candidate runs "
                         "(alternated on the same machine) to measure it")
    return out


def unmatched_patterns(rows: Sequence[Row], patterns: Sequence[str]) -> List[str]:
    return [p for p in patterns if not any(fnmatch.fnmatchcase(r.spec.key, p) for r in rows)]


# -- the same figures from Prometheus ------------------------------------------------------------------

QUANTILES = (("median", 0.5), ("p90", 0.9), ("p95", 0.95), ("p99", 0.99))
HISTOGRAMS = (("ttft", ("vllm:time_to_first_token_seconds",)),
              ("tpot", ("vllm:request_time_per_output_token_seconds",)),
              ("itl", ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")),
              ("e2el", ("vllm:e2e_request_latency_seconds",)))


def range_exprs(selector: str, range_s: float) -> Dict[str, str]:
    """PromQL for each figure over one range, evaluated at the range's end: what the benchmark
    measures, from vLLM's own counters and histograms (quantiles interpolated in its buckets)."""
    s = "{" + selector + "}" if selector else ""
    r = f"{max(int(round(range_s * 1000)), 1)}ms"

    def inc(metric: str, extra: str = "") -> str:
        m = "{" + ", ".join(x for x in (extra, selector) if x) + "}" if (extra or selector) else ""
        return f"sum(increase({metric}{m}[{r}]))"

    out = {
        "request_throughput": f"{inc('vllm:request_success_total')} / {range_s:g}",
        "output_throughput": f"{inc('vllm:generation_tokens_total')} / {range_s:g}",
        "total_token_throughput": f"({inc('vllm:generation_tokens_total')} + {inc('vllm:prompt_tokens_total')}) / "
                                  f"{range_s:g}",
        "failed_ratio": f"({inc('vllm:request_success_total', 'finished_reason=' + chr(34) + 'error' + chr(34))} "
                        f"or {inc('vllm:request_success_total')} * 0) / ({inc('vllm:request_success_total')} > 0)",
    }
    for short, names in HISTOGRAMS:
        out[f"mean_{short}_ms"] = " or ".join(f"1000 * {inc(n + '_sum')} / ({inc(n + '_count')} > 0)" for n in names)
        for word, q in QUANTILES:
            out[f"{word}_{short}_ms"] = " or ".join(
                f"1000 * histogram_quantile({q}, sum by (le) (increase({n}_bucket{s}[{r}])))" for n in names)
    return out


# -- the sidecar's signals during a run ---------------------------------------------------------------

@dataclass(frozen=True)
class Signals:
    """What the sidecar (and vLLM's own gauges) said during one run, every replica pooled."""

    preemptions: Optional[float] = None              # vLLM's counter, increase over the run
    kv_usage_max: Optional[float] = None
    kv_pressure_max: Optional[float] = None          # 0 ok, 1 elevated, 2 saturated, 3 thrashing
    kv_saturated_share: Optional[float] = None       # share of samples at level 2 or 3
    waiting_for_capacity_max: Optional[float] = None
    waiting_mean: Optional[float] = None
    running_mean: Optional[float] = None
    running_max: Optional[float] = None
    busy_low_share: Optional[float] = None           # GPU busy, tokens low
    stalled_share: Optional[float] = None
    down_share: Optional[float] = None               # the sidecar could not read vLLM

    def known(self) -> bool:
        return any(v is not None for v in vars(self).values())


# (field, metric, how): how is max, mean, share>=N (share of samples at or above N), down (share of 0)
SIGNAL_SERIES = (
    ("kv_usage_max", "vllm_sidecar_kv_cache_usage_ratio", "max"),
    ("kv_pressure_max", "vllm_sidecar_kv_cache_pressure_level", "max"),
    ("kv_saturated_share", "vllm_sidecar_kv_cache_pressure_level", "share>=2"),
    ("waiting_for_capacity_max", "vllm_sidecar_requests_waiting_for_capacity", "max"),
    ("waiting_mean", "vllm_sidecar_requests_waiting", "mean"),
    ("running_mean", "vllm_sidecar_requests_running", "mean"),
    ("running_max", "vllm_sidecar_requests_running", "max"),
    ("busy_low_share", "vllm_sidecar_gpu_busy_low_throughput", "share>=1"),
    ("stalled_share", "vllm_sidecar_engine_stalled", "share>=1"),
    ("down_share", 'vllm_sidecar_target_up{target="vllm"}', "down"),
)


def summarise(values: np.ndarray, how: str) -> Optional[float]:
    """One signal over the samples of a run (every replica pooled)."""
    v = values[np.isfinite(values)]
    if not len(v):
        return None
    if how == "max":
        return float(v.max())
    if how == "mean":
        return float(v.mean())
    if how == "down":
        return float((v == 0).mean())
    m = re.fullmatch(r"share>=(\d+(?:\.\d+)?)", how)
    if m:
        return float((v >= float(m.group(1))).mean())
    raise ValueError(f"unknown summary {how!r}")


def median_signals(runs: Sequence[Signals]) -> Signals:
    """Per signal, the median over the runs that have it."""
    out = {}
    for k in vars(Signals()):
        vs = [getattr(s, k) for s in runs if getattr(s, k) is not None]
        out[k] = median(vs) if vs else None
    return Signals(**out)


def likely_cause(base: Signals, cand: Signals, kv_warn: Optional[float] = None) -> str:
    """The sidecar's best explanation of a candidate that did worse, in words (a heuristic, in the
    order a person would check: vLLM reachable, engine alive, KV cache, GPU, batch). ``kv_warn``:
    the SLO file's ``kv_cache.warn`` (the built-in SLO's when not given).

    vLLM's ``num_requests_waiting_by_reason{reason="capacity"}`` means "waiting for scheduling
    capacity": a full KV cache, but also a full batch (``max-num-seqs``). So waiting for capacity
    (and the sidecar's pressure level built on it) is blamed on the KV cache only with preemptions
    or with the cache at least ``kv_warn`` full (the SLO's ``kv_cache.warn``)."""
    def v(s: Signals, k: str) -> float:
        x = getattr(s, k)
        return 0.0 if x is None else x

    if kv_warn is None:
        kv_warn = float(defaults()["kv_cache"]["warn"])
    if not cand.known():
        return "no sidecar signals for the candidate's run (no --prometheus-url, or nothing scraped then)"
    if v(cand, "down_share") > v(base, "down_share") + 0.1:
        return f"vLLM could not be read {v(cand, 'down_share'):.0%} of the run: it restarted or was unreachable"
    if v(cand, "stalled_share") > v(base, "stalled_share"):
        return f"the engine stalled ({v(cand, 'stalled_share'):.0%} of the run): requests running, no tokens"
    kv = []
    if v(cand, "preemptions") > v(base, "preemptions"):
        kv.append(f"{v(cand, 'preemptions'):.0f} preemptions (baseline {v(base, 'preemptions'):.0f})")
    full = v(cand, "kv_usage_max") >= kv_warn
    if full and v(cand, "waiting_for_capacity_max") > v(base, "waiting_for_capacity_max"):
        kv.append(f"up to {v(cand, 'waiting_for_capacity_max'):.0f} requests waiting with the cache "
                  f"{v(cand, 'kv_usage_max'):.0%} full")
    if kv:
        return "KV-cache pressure: " + ", ".join(kv) + " (a smaller KV cache, longer sequences or a bigger batch " \
               "than the cache holds)"
    if v(cand, "busy_low_share") > v(base, "busy_low_share"):
        return f"GPUs busy but tokens low {v(cand, 'busy_low_share'):.0%} of the run (throttling, a sick GPU, or " \
               f"slower kernels)"
    wb, wc = v(base, "waiting_mean"), v(cand, "waiting_mean")
    rb, rc = v(base, "running_max"), v(cand, "running_max")
    if wc > max(2 * wb, 0.5):
        kv_note = f", the KV cache at most {v(cand, 'kv_usage_max'):.0%} full" if cand.kv_usage_max is not None else ""
        if rc < rb:
            return f"requests queued behind a smaller batch: at most {rc:.0f} running (baseline {rb:.0f}) while " \
                   f"{wc:.1f} waited on average (baseline {wb:.1f}){kv_note}: a lower batch limit (max-num-seqs, " \
                   f"max-num-batched-tokens)"
        return f"requests queued ({wc:.1f} waiting on average, baseline {wb:.1f}) with the batch as large as " \
               f"before{kv_note}: each step is slower"
    return "no sidecar signal explains it: the engine itself (kernels, scheduling) or the client"


# -- reading a range of a Prometheus (or of a recorded store) ------------------------------------------

def _with(metric: str, selector: str) -> str:
    """``metric`` (which may carry matchers) narrowed by ``selector``."""
    if not selector:
        return metric
    if metric.endswith("}"):
        return metric[:-1] + ", " + selector + "}"
    return metric + "{" + selector + "}"


def range_selectors(selector: str, start_ms: int, end_ms: int) -> List[Tuple[str, int]]:
    """The raw selectors one range needs, each from the range's start (for ``fetch_prometheus``)."""
    from .promql.ast import VectorSelector, walk
    from .promql.parser import parse

    exprs = list(range_exprs(selector, max(end_ms - start_ms, 1) / 1000).values())
    exprs.append(f"increase({_with('vllm:num_preemptions_total', selector)}[1m])")
    sels = {n.selector_text() for e in exprs for n in walk(parse(e)) if isinstance(n, VectorSelector)}
    sels |= {_with(m, selector) for _, m, _ in SIGNAL_SERIES}
    return [(s, start_ms) for s in sorted(sels)]


def _value_at(store, expr: str, at_ms: int, lookback_ms: int) -> Optional[float]:
    from .promql.engine import Evaluator
    from .promql.parser import parse

    res = Evaluator(store, np.array([at_ms], dtype=np.int64), 1000, lookback_ms).eval(parse(expr))
    if isinstance(res, Vec):
        vals = [float(res.V[i, 0]) for i in range(res.n) if res.P[i, 0]]
        vals = [x for x in vals if math.isfinite(x)]
        return vals[0] if len(vals) == 1 else None
    v = float(np.asarray(res)[0])
    return v if math.isfinite(v) else None


def range_run(store, selector: str, start_ms: int, end_ms: int, source: str, lookback_ms: int = 300_000) -> BenchRun:
    """The figures of one range, as a ``BenchRun`` (figures vLLM's series do not give are left out)."""
    if end_ms <= start_ms:
        raise ValueError(f"{source}: the range ends before it starts")
    figs = {}
    for key, e in range_exprs(selector, (end_ms - start_ms) / 1000).items():
        v = _value_at(store, e, end_ms, lookback_ms)
        if v is not None:
            figs[key] = v
    return BenchRun(source, source, figs, {}, start_ms, end_ms)


def range_signals(store, selector: str, start_ms: int, end_ms: int, lookback_ms: int = 300_000,
                  only: Optional[Sequence[str]] = None) -> Signals:
    """The sidecar's signals over ``(start, end]``, every matching replica's samples pooled
    (``only``: just these fields, and no preemptions)."""
    from .promql.ast import VectorSelector
    from .promql.labels import MatcherSet
    from .promql.parser import parse

    out: Dict[str, Optional[float]] = {}
    r = f"{max(end_ms - start_ms, 1)}ms"
    if only is None:
        out["preemptions"] = _value_at(store, f"sum(increase({_with('vllm:num_preemptions_total', selector)}[{r}]))",
                                       end_ms, lookback_ms)
    for fld, metric, how in SIGNAL_SERIES:
        if only is not None and fld not in only:
            continue
        node = parse(_with(metric, selector))
        assert isinstance(node, VectorSelector)
        chunks = []
        for s in store.select(MatcherSet(node.matchers)):
            t, v = s.without_stale()
            keep = (t > start_ms) & (t <= end_ms)
            chunks.append(v[keep])
        out[fld] = summarise(np.concatenate(chunks), how) if chunks else None
    return Signals(**out)


# -- the same, evaluated by a Prometheus (gate --engine server) ----------------------------------------

def _server_how(how: str) -> bool:
    """Whether a server can summarise a signal's samples exactly: a max, a mean (sums and counts
    over the range); a share of samples at a level it cannot without a subquery, which resamples."""
    return how in ("max", "mean")


def server_signal_exprs(selector: str, start_ms: int, end_ms: int) -> Dict[str, str]:
    """PromQL, at ``end_ms``, for each signal a server can summarise over ``(start, end]`` (a range
    of ``end - start - 1`` ms: Prometheus 2's ranges include their left end)."""
    r = f"{max(end_ms - start_ms - 1, 1)}ms"
    out = {"preemptions": f"sum(increase({_with('vllm:num_preemptions_total', selector)}[{max(end_ms - start_ms, 1)}ms]))"}
    for fld, metric, how in SIGNAL_SERIES:
        sel = _with(metric, selector)
        if how == "max":
            out[fld] = f"max(max_over_time({sel}[{r}]))"
        elif how == "mean":
            out[fld] = f"sum(sum_over_time({sel}[{r}])) / sum(count_over_time({sel}[{r}]))"
    return out


def raw_signal_selectors(selector: str, start_ms: int) -> List[Tuple[str, int]]:
    """The signals' series a server cannot summarise (shares of samples at a level): read raw."""
    return [(_with(m, selector), start_ms) for _, m, how in SIGNAL_SERIES if not _server_how(how)]


class ServerRanges:
    """Figures and signals of time ranges evaluated by a Prometheus: each figure's expression an
    instant query at the range's end (the server sums every bucket of every replica; one number
    comes back), each max and mean signal likewise; only the share signals' own series (one per
    replica) are read raw. The same numbers as ``range_run`` and ``range_signals`` over a store
    of every raw sample (tests/analysis/test_gate_server.py, on a real Prometheus)."""

    def __init__(self, url: str, session=None, timeout_s: float = 300.0) -> None:
        import requests

        self.url, self.timeout_s = url, timeout_s
        self.session = session or requests.Session()
        self.queries = 0

    def value(self, expr: str, at_ms: int) -> Optional[float]:
        from .promapi import query

        result = query(self.session, self.url, expr, at_ms, self.timeout_s, post=True, expect="vector")
        self.queries += 1
        vals = [float(item["value"][1]) for item in result if item.get("value")]
        vals = [x for x in vals if math.isfinite(x)]
        return vals[0] if len(vals) == 1 else None

    def run(self, selector: str, start_ms: int, end_ms: int, source: str) -> BenchRun:
        if end_ms <= start_ms:
            raise ValueError(f"{source}: the range ends before it starts")
        figs = {}
        for key, e in range_exprs(selector, (end_ms - start_ms) / 1000).items():
            v = self.value(e, end_ms)
            if v is not None:
                figs[key] = v
        return BenchRun(source, source, figs, {}, start_ms, end_ms)

    def signals(self, selector: str, start_ms: int, end_ms: int) -> Signals:
        from .sources import fetch_prometheus

        out: Dict[str, Optional[float]] = {k: self.value(e, end_ms)
                                           for k, e in server_signal_exprs(selector, start_ms, end_ms).items()}
        raw = raw_signal_selectors(selector, start_ms)
        got = fetch_prometheus(self.url, raw, end_ms, session=self.session)
        self.queries += len(raw)
        shares = range_signals(got.store, selector, start_ms, end_ms,
                               only=[f for f, _, h in SIGNAL_SERIES if not _server_how(h)])
        for k, v in vars(shares).items():
            if k not in out:
                out[k] = v
        return Signals(**out)


# -- where the runs come from (the command line's flags, turned into runs here) ------------------------

class GateInputError(ValueError):
    """Runs that cannot be compared; one line."""


def load_runs(baseline_paths: Sequence[str], candidate_paths: Sequence[str], utc_offset_s: Optional[int],
              allow_different_load: bool) -> Tuple[List[BenchRun], List[BenchRun], List[str]]:
    """The result files of both sides, and notes; runs of a different load than the first
    baseline's are refused (``GateInputError``) unless ``allow_different_load``, then noted."""
    try:
        baseline = [load_bench_file(f, utc_offset_s) for f in baseline_paths]
        candidate = [load_bench_file(f, utc_offset_s) for f in candidate_paths]
    except BenchFileError as exc:
        raise GateInputError(str(exc)) from None
    notes: List[str] = []
    first = baseline[0]
    for other in baseline[1:] + candidate:
        diff = load_differences(first, other)
        if diff and not allow_different_load:
            k, a, b = diff[0]
            raise GateInputError(f"{other.source} ran a different load than {first.source}: {k} {b!r} against "
                                 f"{a!r} (--allow-different-load compares them anyway)")
        if diff:
            notes.append(f"{other.source} ran a different load: " +
                         ", ".join(f"{k} {b!r} against {a!r}" for k, a, b in diff))
    return baseline, candidate, notes


class StoreRanges:
    """Figures and signals of time ranges from a store of raw samples read here (``--engine local``):
    the same interface as ``ServerRanges``."""

    def __init__(self, store) -> None:
        self.store = store
        self.queries = 0

    def run(self, selector: str, start_ms: int, end_ms: int, source: str) -> BenchRun:
        return range_run(self.store, selector, start_ms, end_ms, source)

    def signals(self, selector: str, start_ms: int, end_ms: int) -> Signals:
        return range_signals(self.store, selector, start_ms, end_ms)


def pick_engine(engine: str, ranges: Sequence[Tuple[int, int]], local_max_ms: int) -> str:
    """``auto``: local when every range is at most ``local_max_ms`` long, else server."""
    if engine != "auto":
        return engine
    return "local" if all(b - a <= local_max_ms for a, b in ranges) else "server"


def open_ranges(url: str, engine: str, wanted: Sequence[Tuple[str, int, int]], local_max_ms: int):
    """The reader of ``wanted`` ((selector, start, end) each) at the Prometheus ``url``: a
    ``ServerRanges`` (the server evaluates) or a ``StoreRanges`` over every raw sample the ranges
    need, read now (``sources.SourceError`` when the server cannot be read)."""
    from .series import Store
    from .sources import fetch_prometheus

    if pick_engine(engine, [(a, b) for _, a, b in wanted], local_max_ms) == "server":
        return ServerRanges(url)
    store = Store()
    for sel, a, b in wanted:
        got = fetch_prometheus(url, range_selectors(sel, a, b), b)
        for s in got.store:
            t, v = s.without_stale()
            store.add(s.labels, t, v)
    return StoreRanges(store)
