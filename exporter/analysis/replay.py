"""``top --replay``: the live view of ``top`` over a flight record, at any speed, so a team can walk
through an incident together.

A record (what ``/debug/flight`` serves or ``postmortem`` writes: OpenMetrics text with a
timestamp on every sample, gzip or plain, one pod or several merged) holds, for every poll, the
sidecar's own series with the values a scrape of ``/metrics`` showed then. ``load_record`` groups
them per pod (``namespace``/``pod`` labels) and per poll (the samples of one poll share its
timestamp) and reads each poll back into the ``Published`` state it was rendered from, with the
same inverse of the collectors ``top --sidecar-url`` uses (``console.published_from_exposition``):
a replayed screen is the screen ``top`` showed at that poll.

``run_replay`` shows the record from ``start`` to ``end``: each screen moves the record's clock
by ``refresh * speed`` seconds (at least one poll) and waits ``refresh`` seconds (``speed`` 0:
no waiting); every poll passed is looked at for trouble (``View.trouble``), and the flight
recorder's events (``vllm_sidecar_flight_events_total`` rising) are flagged too, each with its
record time, so a fast replay misses nothing. (An event is opened from the state published at
one poll and counted in the next poll's state, as a scrape sees it: it is flagged one poll
after the recorder's own ``time`` in ``/debug/flight/events``.) ``once`` prints only the screen at ``end``, with
everything flagged from ``start`` on.
"""

from __future__ import annotations

import datetime as dt
import threading
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, TextIO, Tuple

import numpy as np

from ..runtime.state import Published
from ..view.console import View, published_from_exposition
from .promql.labels import NAME
from .sources import load_openmetrics

SIDECAR = "vllm_sidecar_"
EVENTS = SIDECAR + "flight_events_total"
POD_LABELS = ("namespace", "pod")


@dataclass
class Frame:
    t: float  # the poll's time, unix seconds
    pub: Published
    events: Dict[str, float]  # vllm_sidecar_flight_events_total by kind


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def pod_of(labels: Dict[str, str]) -> str:
    return "/".join(labels[k] for k in POD_LABELS if labels.get(k)) or "(no pod label)"


def load_record(data: bytes, name: str = "<record>") -> Dict[str, List[Frame]]:
    """A record (bytes, gzip allowed) -> per pod, its polls in time order. SourceError (from
    ``sources``) when it is not a record."""
    store = load_openmetrics(data, name).store
    per_pod: Dict[str, list] = {}
    for s in store:
        d = dict(s.labels)
        metric = d.pop(NAME)
        if not metric.startswith(SIDECAR):
            continue  # vLLM's own series as read: the view is the sidecar's
        pod = pod_of(d)
        for k in POD_LABELS:
            d.pop(k, None)
        t, v = s.without_stale()
        if len(t):
            per_pod.setdefault(pod, []).append((metric, d, t, v))
    out: Dict[str, List[Frame]] = {}
    for pod, series in per_pod.items():
        times = np.unique(np.concatenate([t for _, _, t, _ in series]))
        lines: List[List[str]] = [[] for _ in times]
        events: List[Dict[str, float]] = [{} for _ in times]
        typed = set()
        for metric, labels, t, v in series:
            head = metric + ("{" + ",".join(f'{k}="{_esc(x)}"' for k, x in sorted(labels.items())) + "}"
                             if labels else "") + " "
            if metric == SIDECAR + "gpu_info":
                typed.add(metric)
            idx = np.searchsorted(times, t)
            for i, x in zip(idx.tolist(), v.tolist()):
                lines[i].append(f"{head}{x!r}")
                if metric == EVENTS:
                    events[i][labels.get("kind", "")] = x
        head = "".join(f"# TYPE {m} gauge\n" for m in sorted(typed))
        out[pod] = [Frame(ms / 1000.0, published_from_exposition(head + "\n".join(ln) + "\n", ms / 1000.0), ev)
                    for ms, ln, ev in zip(times.tolist(), lines, events)]
    return out


def _utc(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%H:%M:%S")


def poll_seconds(frames: Dict[str, List[Frame]]) -> float:
    gaps = [b.t - a.t for fr in frames.values() for a, b in zip(fr, fr[1:])]
    return float(np.median(gaps)) if gaps else 1.0


class _PodState:
    """One pod's place in the replay: the frames passed, what was flagged and when."""

    def __init__(self, frames: List[Frame], t0: float) -> None:
        self.frames = frames
        self.t0 = t0
        self.i = 0  # frames[:i] are passed
        self.view = View(None, False)
        self.events: Dict[str, float] = {}

    def advance(self, pos: float) -> Optional[Frame]:
        while self.i < len(self.frames) and self.frames[self.i].t <= pos:
            f = self.frames[self.i]
            self.view.trouble(f.pub, f.t - self.t0)
            for kind, n in f.events.items():
                if n > self.events.get(kind, n if self.i == 0 else 0.0):
                    self.view.note(f"flight event {kind}", f.t - self.t0)
                self.events[kind] = n
            self.i += 1
        return self.frames[self.i - 1] if self.i else None

    def flagged(self) -> str:
        if not self.view.first_seen:
            return "  flagged     nothing so far"
        items = sorted(self.view.first_seen.items(), key=lambda x: x[1])
        return "  flagged     " + "   ".join(f"{what} (first at {_utc(self.t0 + t)}, +{t:.0f}s)" for what, t in items)


def run_replay(frames: Dict[str, List[Frame]], out: TextIO, tty: bool, speed: float = 10.0, refresh: float = 1.0,
               once: bool = False, start: Optional[float] = None, end: Optional[float] = None,
               source: str = "record", stop: Optional[threading.Event] = None) -> int:
    """Replay ``frames`` (``load_record``'s) from ``start`` to ``end`` (unix seconds; the record's
    own ends when None). Returns the number of screens shown."""
    stop = stop or threading.Event()
    first = min(f[0].t for f in frames.values())
    last = max(f[-1].t for f in frames.values())
    start = first if start is None else max(start, first)
    end = last if end is None else min(end, last)
    poll = poll_seconds(frames)
    step = max(poll, refresh * speed) if speed > 0 else max(poll, refresh)
    wait = step / speed if speed > 0 else 0.0
    pods = {pod: _PodState(fr, first) for pod, fr in sorted(frames.items())}
    for p in pods.values():  # the polls before ``start`` are history: not flagged, but known
        p.advance(start - 1e-9)
        p.view.first_seen.clear()
    shower = View(out, tty and not once)
    pos = end if once else start
    shown = 0
    while True:
        pos = min(pos, end)
        head = [f"vllm-sidecar-exporter top · replay of {source} ({len(pods)} pod(s), one poll every {poll:g}s)",
                f"record {dt.datetime.fromtimestamp(pos, dt.timezone.utc).strftime('%Y-%m-%d %H:%M:%S')} UTC"
                f"   +{pos - first:.0f}s of {last - first:.0f}s"
                + ("" if once else f"   speed {speed:g}x" if speed > 0 else "   as fast as it prints")
                + ("" if once or not tty else "   (Ctrl-C to stop)")]
        body: List[str] = []
        for pod, p in pods.items():
            f = p.advance(pos)
            body.append(f"  pod         {pod}" + (f"   poll at {_utc(f.t)}" if f else ""))
            if f is None:
                body.append("  (no poll yet)")
            else:
                body.append(p.view.render(f.pub))
            body.append(p.flagged())
        shower.show("\n".join(head + body))
        shown += 1
        if once or pos >= end or (wait and stop.wait(wait)) or stop.is_set():
            break
        pos += step
    return shown


def pods_matching(frames: Dict[str, List[Frame]], wanted: Sequence[str]) -> Tuple[Dict[str, List[Frame]], List[str]]:
    """Only the pods named (``ns/pod`` or just ``pod``); the names that matched none."""
    if not wanted:
        return frames, []
    keep, missing = {}, []
    for w in wanted:
        hit = {p: f for p, f in frames.items() if p == w or p.split("/")[-1] == w}
        if not hit:
            missing.append(w)
        keep.update(hit)
    return keep, missing
