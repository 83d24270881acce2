"""The postmortem of an incident from sidecars' flight records: the order of first events as the
sidecar saw them, the alerts the pack fires at poll resolution beside the alerts at Prometheus'
resolution, a timeline and the runbook steps of what fired. Nothing here prints or fetches:
``exporter.cli.postmortem`` does.

The second alert column (``Coarse``) is one of, by what the command was given:

- ``alerts``: what Prometheus itself had, its ``ALERTS{alertstate="firing"}`` samples over the
  record's window (``fired_from_alerts``), for the pack's alerts it evaluates;
- ``server``: for the pack's alerts it does not evaluate, the pack evaluated by that Prometheus
  over what it stored (``backtest --engine server``);
- ``resample``: without a Prometheus, the record resampled as a scrape every N s would have stored
  it (``resample``), and the pack evaluated over that: a stand-in, said so in the report.

Records from several pods merge: each carries its pod's labels (``namespace``, ``pod``).

The first events, per pod (from the record alone):

- long prompts arriving: the first poll after the record's first quarter where
  ``vllm_sidecar_prompt_tokens_per_second`` is above twice its median over that quarter, and stays
  there for ``SUSTAIN`` polls in a row (an event's record starts with the calm before it: the
  flood seen in prompt-token throughput, before any long request finishes), and
  the first poll where ``vllm_sidecar_long_prompt_requests_per_second`` is above 0 (finished
  requests over the long-prompt threshold);
- the first capacity wait: ``vllm_sidecar_requests_waiting_for_capacity`` above 0;
- the first preemption: vLLM's own ``vllm:num_preemptions_total`` higher than on the poll
  before (as read, any engine);
- peak KV: the highest ``vllm:kv_cache_usage_perc`` (or ``vllm:gpu_cache_usage_perc``) read;
- the first SLO miss: TTFT p95 (``vllm_sidecar_ttft_seconds{quantile="0.95"}``) over the SLO's
  objective.
"""

from __future__ import annotations

import gzip
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..runtime.gpu import THERMAL_REASONS
from .promql.labels import NAME, make
from .series import Store
from .sources import load_openmetrics

PROMETHEUS_SCRAPE_MS = 15_000
SUSTAIN = 3  # polls in a row over twice the calm's median: long prompts arriving
RUNBOOKS = Path(__file__).resolve().parent.parent.parent / "docs" / "runbooks"


@dataclass
class FirstEvent:
    what: str
    pod: str
    t_ms: int
    value: float
    detail: str = ""


@dataclass
class AlertRow:
    alertname: str
    identity: str
    severity: str
    first_sidecar_ms: Optional[int]
    first_prometheus_ms: Optional[int]
    firing_sidecar_ms: int = 0
    firing_prometheus_ms: int = 0


@dataclass
class Fired:
    """One alert series that fired: its name, the labels that tell it apart (the rule's own and
    ``alertstate`` left out), its severity, its first firing evaluation, how long it fired."""

    alertname: str
    labels: Dict[str, str]
    severity: str
    first_ms: int
    firing_ms: int


@dataclass
class Coarse:
    """Where the second alert column comes from: ``kind`` (alerts, server, resample, or a mix:
    ``alerts+server``), its header, and what the report says of it."""

    kind: str
    header: str
    note: str
    fired: List[Fired] = field(default_factory=list)


@dataclass
class Postmortem:
    pods: List[str]
    start_ms: int
    end_ms: int
    poll_ms: int
    samples: int
    series: int
    first_events: List[FirstEvent]
    alerts: List[AlertRow]
    runbooks: Dict[str, List[str]] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)
    coarse: Optional[Coarse] = None


def merge_records(records: Sequence[Tuple[str, bytes]]) -> Store:
    """Several OpenMetrics records (name, bytes; gzip allowed) into one store; a record of a
    sidecar older than the pack gets the one-series summaries its alerts read (``_summaries``)."""
    store = Store()
    for name, data in records:
        loaded = load_openmetrics(data, name)
        for s in loaded.store:
            t, v = s.without_stale()
            store.add(s.labels, list(t), list(v))
    _summaries(store)
    return store


# (what an older sidecar served, its label, which values count, the one series a newer one serves,
#  how they combine): VLLMSidecarInputMissing and GPUThermalThrottling read the latter only
_SUMMARIES = (
    ("vllm_sidecar_input_missing", "metric", None, "vllm_sidecar_inputs_missing", np.add),
    ("vllm_sidecar_gpu_clock_throttle_active", "reason", set(THERMAL_REASONS),
     "vllm_sidecar_gpu_thermal_throttle_active", np.maximum),
)


def _summaries(store: Store) -> None:
    """Add each summary series a record lacks, from the per-input or per-reason series at the same
    polls (a sidecar writes them together), so the pack's alerts see an older sidecar's record as
    a newer one's; a record that has them is left as it is."""
    for source, label, kept, target, combine in _SUMMARIES:
        if target in store.names():
            continue
        groups: Dict[tuple, Dict[int, float]] = {}
        for s in list(store):
            d = dict(s.labels)
            if d.get(NAME) != source or (kept is not None and d.get(label) not in kept):
                continue
            key = make({**d, NAME: target, label: ""})
            acc = groups.setdefault(key, {})
            t, v = s.without_stale()
            for ms, x in zip(t.tolist(), v.tolist()):
                acc[ms] = float(combine(acc[ms], x)) if ms in acc else x
        for key, acc in groups.items():
            times = sorted(acc)
            store.add(key, times, [acc[ms] for ms in times])


def write_openmetrics(store: Store, path: Path) -> None:
    """A store as OpenMetrics with timestamps (what backtest --file and promtool take), gzip."""
    fams: Dict[str, list] = {}
    for s in store:
        fams.setdefault(dict(s.labels)[NAME], []).append(s)
    with gzip.open(path, "wt", encoding="utf-8", compresslevel=5) as fh:
        for name in sorted(fams):
            fh.write(f"# TYPE {name} unknown\n")
            for s in sorted(fams[name], key=lambda s: s.labels):
                lab = ",".join(f'{k}="{_esc(v)}"' for k, v in s.labels if k != NAME)
                head = f"{name}{{{lab}}} " if lab else f"{name} "
                t, v = s.without_stale()
                fh.write("".join(f"{head}{_fmt(x)} {ms / 1000:.3f}\n" for ms, x in zip(t.tolist(), v.tolist())))
        fh.write("# EOF\n")


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _fmt(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


def resample(store: Store, step_ms: int = PROMETHEUS_SCRAPE_MS) -> Store:
    """What a scrape every ``step_ms`` would have stored: at each grid time the newest sample at or
    before it (the value the sidecar served then)."""
    out = Store()
    first, last = store.time_range()
    if first is None:
        return out
    grid = np.arange(-(-first // step_ms) * step_ms, last + 1, step_ms, dtype=np.int64)
    for s in store:
        t, v = s.without_stale()
        if not len(t):
            continue
        idx = np.searchsorted(t, grid, side="right") - 1
        ok = idx >= 0
        # a series that vanished is not scraped forever: only up to one poll gap after its last sample
        gap = np.diff(t).max() if len(t) > 1 else step_ms
        ok &= grid - t[np.clip(idx, 0, None)] <= max(gap, step_ms)
        if ok.any():
            out.add(s.labels, grid[ok].tolist(), v[idx[ok]].tolist())
    return out


def poll_interval_ms(store: Store) -> int:
    diffs = []
    for s in store:
        t, _ = s.without_stale()
        if len(t) > 2:
            diffs.append(int(np.median(np.diff(t))))
        if len(diffs) > 50:
            break
    return max(1, int(np.median(diffs))) if diffs else 1000


def _pod(labels) -> str:
    d = dict(labels)
    return "/".join(x for x in (d.get("namespace", ""), d.get("pod", "")) if x) or "(no pod label)"


def _series(store: Store, name: str, **match) -> List[Tuple[str, np.ndarray, np.ndarray, dict]]:
    out = []
    for s in store:
        d = dict(s.labels)
        if d.get(NAME) != name or any(d.get(k) != v for k, v in match.items()):
            continue
        t, v = s.without_stale()
        out.append((_pod(s.labels), t, v, d))
    return out


def _first(store, name, pred, what, detail="", **match) -> List[FirstEvent]:
    best: Dict[str, FirstEvent] = {}
    for pod, t, v, _d in _series(store, name, **match):
        hit = np.nonzero(pred(t, v))[0]
        if len(hit):
            i = int(hit[0])
            if pod not in best or t[i] < best[pod].t_ms:
                best[pod] = FirstEvent(what, pod, int(t[i]), float(v[i]), detail)
    return list(best.values())


def first_events(store: Store, slo: dict) -> List[FirstEvent]:
    out: List[FirstEvent] = []
    for pod, t, v, _ in _series(store, "vllm_sidecar_prompt_tokens_per_second"):
        ref = max(1, len(v) // 4)
        med = float(np.median(v[:ref])) if len(v) else 0.0
        over = v > 2 * med if med > 0 else v > 0
        # after the reference quarter, and for SUSTAIN polls in a row: the calm's own fluctuation
        # (seen on the real CPU vLLM: one poll at twice the median 24 s into the calm) is no flood
        run = np.convolve(over.astype(np.int64), np.ones(SUSTAIN, dtype=np.int64), "full")[:len(v)]
        hit = np.nonzero(run[ref:] >= SUSTAIN)[0]
        hit = hit + ref - (SUSTAIN - 1) if len(hit) else hit
        if len(hit):
            i = int(hit[0])
            out.append(FirstEvent("long prompts arriving (prompt tokens/s over twice the first quarter's median)",
                                  pod, int(t[i]), float(v[i]), f"median {med:.0f} tokens/s"))
    out += _first(store, "vllm_sidecar_long_prompt_requests_per_second", lambda t, v: v > 0,
                  "long prompts finished (over the long-prompt threshold)")
    out += _first(store, "vllm_sidecar_requests_waiting_for_capacity", lambda t, v: v > 0,
                  "first request waiting for KV capacity")
    out += _first(store, "vllm:num_preemptions_total",
                  lambda t, v: np.concatenate([[False], np.diff(v) > 0]), "first preemption (vLLM's counter rose)")
    for name in ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"):
        peaks: Dict[str, FirstEvent] = {}
        for pod, t, v, _ in _series(store, name):
            if len(v):
                i = int(np.argmax(v))
                if pod not in peaks or v[i] > peaks[pod].value:
                    peaks[pod] = FirstEvent("peak KV-cache usage (as vLLM reported it)", pod, int(t[i]), float(v[i]))
        out += list(peaks.values())
        if peaks:
            break
    objective = float(slo.get("objectives", {}).get("ttft_p95_seconds", math.inf))
    out += _first(store, "vllm_sidecar_ttft_seconds", lambda t, v: v > objective,
                  "first SLO miss (TTFT p95 over the objective)", f"objective {objective:g} s", quantile="0.95")
    out.sort(key=lambda e: (e.t_ms, e.pod, e.what))
    return out


def runbook_steps(alertname: str) -> List[str]:
    """The ``## Act`` bullets of the alert's runbook (docs/runbooks), first lines only."""
    path = RUNBOOKS / f"{alertname}.md"
    if not path.exists():
        return []
    text = path.read_text()
    m = re.search(r"^## Act\s*\n(.*?)(?=^## |\Z)", text, re.S | re.M)
    if not m:
        return []
    return [ln[2:].strip() for ln in m.group(1).splitlines() if ln.startswith("- ")]


def fired_from_summary(summary, names: Optional[set] = None) -> List[Fired]:
    """The alerts of a backtest's summary that fired (only ``names`` when given)."""
    out = []
    for a in summary.alerts:
        if a.episodes and (names is None or a.alertname in names):
            out.append(Fired(a.alertname, dict(a.identity), a.severity, a.episodes[0].start_ms, a.firing_ms))
    return out


def fired_from_alerts(result: Sequence[dict], own: Dict[str, set], names: Optional[set] = None) -> List[Fired]:
    """Prometheus' ``ALERTS{alertstate="firing"}[range]`` (an instant query's matrix: the samples its
    rule evaluations wrote) -> what fired: the first sample, and samples x their median spacing
    (one evaluation interval) as the time firing. ``own``: alertname -> the rule's static labels
    (left out of the identity, as the backtest's summary does); ``names``: only these alerts."""
    out = []
    for item in result:
        m = dict(item.get("metric") or {})
        name = m.get("alertname", "")
        if names is not None and name not in names:
            continue
        ts = sorted(float(p[0]) for p in item.get("values") or [])
        if not ts:
            continue
        gap = float(np.median(np.diff(ts))) if len(ts) > 1 else 0.0
        severity = m.get("severity", "")
        skip = {"__name__", "alertname", "alertstate"} | own.get(name, set())
        labels = {k: v for k, v in m.items() if k not in skip}
        out.append(Fired(name, labels, severity, int(round(ts[0] * 1000)), int(round(len(ts) * gap * 1000))))
    return out


def _ident(labels: Dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(labels.items()))


def _alert_rows(sidecar: Sequence[Fired], coarse: Sequence[Fired]) -> List[AlertRow]:
    """One row per alert series: the sidecar's, and the coarse one it matches (same alert, one's
    labels a subset of the other's: Prometheus adds its own, job and instance, to what the record
    holds); a coarse one that matches none is a row of its own."""
    rows: List[Tuple[Dict[str, str], AlertRow]] = []
    for f in sidecar:
        rows.append((f.labels, AlertRow(f.alertname, _ident(f.labels), f.severity, f.first_ms, None, f.firing_ms)))
    for f in coarse:
        hit = None
        for labels, row in rows:
            if row.alertname != f.alertname or row.first_prometheus_ms is not None:
                continue
            a, b = set(labels.items()), set(f.labels.items())
            if a <= b or b <= a:
                hit = row
                break
        if hit is None:
            hit = AlertRow(f.alertname, _ident(f.labels), f.severity, None, None)
            rows.append((f.labels, hit))
        hit.first_prometheus_ms, hit.firing_prometheus_ms = f.first_ms, f.firing_ms
    return sorted((r for _, r in rows), key=lambda r: (min(x for x in (r.first_sidecar_ms, r.first_prometheus_ms)
                                                           if x is not None), r.alertname, r.identity))


def build(store: Store, sidecar_result, coarse: Coarse, slo: dict) -> Postmortem:
    first, last = store.time_range()
    pods = sorted({_pod(s.labels) for s in store})
    rows = _alert_rows(fired_from_summary(sidecar_result.summary), coarse.fired)
    books = {r.alertname: runbook_steps(r.alertname) for r in rows}
    return Postmortem(pods, int(first or 0), int(last or 0), poll_interval_ms(store),
                      sum(len(s) for s in store), len(store), first_events(store, slo), rows, books, coarse=coarse)


def _when(ms: Optional[int], t0: int) -> str:
    if ms is None:
        return "—"
    import datetime as dt

    stamp = dt.datetime.fromtimestamp(ms / 1000, dt.timezone.utc).strftime("%H:%M:%S")
    return f"{stamp} ({(ms - t0) / 1000:+.0f} s)"


def markdown(pm: Postmortem, png: Optional[str], sources: Sequence[str], context: Sequence[str] = ()) -> str:
    import datetime as dt

    t0 = pm.start_ms
    day = dt.datetime.fromtimestamp(t0 / 1000, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    out = ["# Postmortem", "",
           f"Record: {', '.join(sources)}; {len(pm.pods)} pod(s) ({', '.join(pm.pods)}); from {day}, "
           f"{(pm.end_ms - pm.start_ms) / 1000:.0f} s at one poll every {pm.poll_ms / 1000:g} s "
           f"({pm.series} series, {pm.samples} samples). Times are UTC, with seconds since the record's start.", ""]
    if png:
        out += [f"![timeline]({png})", ""]
    out += ["## The order of first events (as the sidecar saw them)", "",
            "| when | pod | event | value | |", "| --- | --- | --- | ---: | --- |"]
    for e in pm.first_events:
        out.append(f"| {_when(e.t_ms, t0)} | {e.pod} | {e.what} | {e.value:.4g} | {e.detail} |")
    if not pm.first_events:
        out.append("| | | nothing out of the ordinary in the record | | |")
    coarse = pm.coarse or Coarse("resample", f"resampled to {PROMETHEUS_SCRAPE_MS // 1000} s", "")
    out += ["", "## Alerts: at the sidecar's resolution and at Prometheus'", "",
            f"Poll resolution: the pack evaluated over the record at every poll ({pm.poll_ms / 1000:g} s). "
            f"{coarse.header[0].upper() + coarse.header[1:]}: {coarse.note} An alert in one column and not the other "
            "is what the resolution hides.", "",
            f"| alert | series | severity | first firing, poll resolution | first firing, {coarse.header} | "
            f"firing s (poll / {'resampled' if coarse.kind == 'resample' else 'Prometheus'}) |",
            "| --- | --- | --- | --- | --- | ---: |"]
    for r in pm.alerts:
        out.append(f"| {r.alertname} | {r.identity} | {r.severity} | {_when(r.first_sidecar_ms, t0)} | "
                   f"{_when(r.first_prometheus_ms, t0)} | {r.firing_sidecar_ms / 1000:.0f} / "
                   f"{r.firing_prometheus_ms / 1000:.0f} |")
    if not pm.alerts:
        out.append("| no alert fired | | | | | |")
    if context:
        out += ["", "## Fleet context (Prometheus)", ""] + [f"- {c}" for c in context]
    out += ["", "## What to do: the runbooks of what fired", ""]
    for name, steps in pm.runbooks.items():
        out += [f"### {name}", "", f"Runbook: docs/runbooks/{name}.md", ""]
        out += [f"- {s}" for s in steps] or ["- (no Act section)"]
        out.append("")
    if not pm.runbooks:
        out.append("Nothing fired.")
    out += pm.notes
    return "\n".join(out).rstrip() + "\n"


def timeline_exprs(slo: dict) -> List[str]:
    """The panels: KV usage, waits, preemptions, prompt lengths, TTFT, tokens/s per pod."""
    return ["vllm_sidecar_kv_cache_usage_ratio", "vllm:kv_cache_usage_perc",
            "vllm_sidecar_requests_waiting_for_capacity",
            "vllm_sidecar_preemptions_per_second",
            'vllm_sidecar_prompt_length_tokens{quantile="0.95"}',
            'vllm_sidecar_ttft_seconds{quantile="0.95"}',
            "vllm_sidecar_generation_tokens_per_second"]


__all__ = ["Coarse", "Fired", "Postmortem", "build", "fired_from_alerts", "fired_from_summary",
            "markdown", "merge_records", "resample", "write_openmetrics", "make"]
