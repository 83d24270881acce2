"""What the sidecar of this commit serves that a recording's own sidecar did not.

A recording (``tests/fixtures/recordings/NAME``) holds what a real Prometheus stored from the real
vLLM and the sidecar of the commit that recorded it, and vLLM's page as the recorder kept it
(every second, or at each of the sidecar's polls). A series added to the sidecar since is missing
from the export, so the rules that read it would fall back to their raw path on a pod that in fact
runs a sidecar. ``with_current_sidecar`` replays the recorded pages through this repository's
sidecar (its real poll code, with the recording's sidecar arguments, at its poll interval, or
once a page where the recorder kept them further apart; no GPU) and adds each series it serves
that the export lacks at the recorded sidecar target's scrape times, with that target's labels:
the sidecar's output made by the project's own code on the real pages. Series the recording has
are left as the real sidecar served them.
"""

from __future__ import annotations

import json
import tarfile
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

PREFIX = "vllm_sidecar_"


def _pages(recording: Path, meta: dict) -> List[Tuple[float, str]]:
    """(time, page) of every page the recorder kept, in time order."""
    pages = meta.get("pages")
    name = pages.get("file") if isinstance(pages, dict) else None
    path = recording / (name or "pages.tar.gz")
    if not path.exists():
        return []
    out = []
    with tarfile.open(path) as tar:
        for member in tar.getmembers():
            stem = Path(member.name).name
            if member.isfile() and stem.endswith(".prom"):
                f = tar.extractfile(member)
                if f is not None:
                    out.append((float(stem[:-len(".prom")]), f.read().decode("utf-8", errors="replace")))
    return sorted(out)


def _flags(args: Sequence[str]) -> Dict[str, str]:
    """The recording's sidecar arguments (``--key value`` pairs) as configuration keys."""
    out: Dict[str, str] = {}
    it = iter(args)
    for a in it:
        if a.startswith("--"):
            out[a[2:].replace("-", "_")] = next(it, "")
    return out


def _replay(pages: List[Tuple[float, str]], args: Sequence[str]):
    """The sidecar's signals after each of its polls: (time, signals), polling at its interval and
    reading the page the recorder kept last at that time."""
    from ...runtime import config
    from ...runtime.sidecar import Sidecar

    cfg = config.build({**_flags(args), "gpu": "none", "log_level": "error"}, {})
    state = {"i": 0, "t": pages[0][0]}
    sidecar = Sidecar(cfg, lambda: pages[state["i"]][1], None, clock=lambda: state["t"])
    # pages kept further apart than the sidecar polled (older recordings: every 5 s) are read
    # once each, never the same page as several polls
    gaps = sorted(b[0] - a[0] for a, b in zip(pages, pages[1:]))
    step = max(cfg.poll_interval, gaps[len(gaps) // 2] if gaps else 0.0)
    out = []
    t, i = pages[0][0], 0
    while t <= pages[-1][0] + 1e-6:
        while i + 1 < len(pages) and pages[i + 1][0] <= t + 1e-6:
            i += 1
        state["i"], state["t"] = i, t
        out.append((t, sidecar.poll_once().signals))
        t += step
    return out


def with_current_sidecar(store, recording: Path):
    """``store`` (a recording's export) with the series this sidecar serves that it lacks (see the
    module docstring); the store itself where nothing is missing or the recording kept no pages."""
    import numpy as np

    from ...runtime.collectors.vllm import signal_points

    meta = json.loads((recording / "meta.json").read_text())
    target = (meta.get("target_labels") or {}).get("sidecar")
    pages = _pages(recording, meta) if target else []
    if not pages:
        return store
    scrapes = _scrape_times(store, target)
    if not len(scrapes):
        return store
    have = set(store.names())
    polls = _replay(pages, meta.get("sidecar_args") or [])
    poll_t = np.array([t for t, _ in polls])
    added: Dict[Tuple[Tuple[str, str], ...], List[Tuple[int, float]]] = {}
    for ts in scrapes:
        k = int(np.searchsorted(poll_t, ts / 1000.0, side="right")) - 1
        if k < 0:
            continue
        for p in signal_points(polls[k][1]):
            name = PREFIX + p.name
            if name in have:
                continue
            labels = tuple(sorted({"__name__": name, **target, **p.labels}.items()))
            added.setdefault(labels, []).append((int(ts), p.value))
    for labels, samples in added.items():
        t = np.array([s[0] for s in samples], dtype=np.int64)
        store.add(labels, t, np.array([s[1] for s in samples], dtype=float), np.zeros(len(t), dtype=bool))
    return store


def _scrape_times(store, target: Dict[str, str]) -> "Optional[object]":
    """The times (ms) the recorded Prometheus scraped the sidecar's target: its ``up`` series."""
    import numpy as np

    want = {"__name__": "up", **target}
    for s in store:
        if dict(s.labels) == want:
            return s.t
    return np.array([], dtype=np.int64)
