"""``top --replay``: the live view of ``top`` over a flight record, at any speed, so a team can walk
through an incident together.

A record (what ``/debug/flight`` serves or ``postmortem`` writes: OpenMetrics text with a
timestamp on every sample, gzip or plain, one pod or several merged) holds, for every poll, the
sidecar's own series with the values a scrape of ``/metrics`` showed then. ``load_record`` groups
them per pod (``namespace``/``pod`` labels) and per poll (the samples of one poll share its
timestamp) and reads each poll back into the ``Published`` state it was rendered from, with the
same inverse of the collectors ``top --sidecar-url`` uses (``collectors.readback``): a replayed
screen is the screen ``top`` showed at that poll. Showing the frames is the view's:
``view/playback.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import numpy as np

from ..runtime.collectors.readback import published_from_exposition
from ..runtime.state import Published
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
