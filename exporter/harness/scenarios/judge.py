"""Running a scenario through a rule engine and judging what fired: the firing alerts at every
evaluation, then per alert and replica the first firing after onset, the episodes and the
minutes firing.

Two engines give the same timeline: ``backtest_timeline`` (this project's backtest, proven equal
to promtool's rule engine in tests/analysis/test_backtest_promtool.py; fast enough for a day of a fleet)
and ``promtool_timeline`` (Prometheus' own: promtool is asked to expect no alert at every
evaluation, and the alerts it reports instead are the timeline, every label read back).
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, FrozenSet, List, Optional, Sequence, Tuple

import yaml

from .catalog import Scenario

Labels = FrozenSet[Tuple[str, str]]
LOUD = ("critical", "warning")


@dataclass
class Episode:
    start: float  # seconds
    end: float  # seconds (last evaluation firing + one interval)


@dataclass
class AlertTrack:
    alert: str
    labels: Dict[str, str]
    firing_at: List[float] = field(default_factory=list)  # evaluation times (s)

    def episodes(self, interval: float) -> List[Episode]:
        """Runs of consecutive evaluations firing."""
        out: List[Episode] = []
        for t in sorted(self.firing_at):
            if out and abs(t - out[-1].end) < 1e-6:
                out[-1].end = t + interval
            else:
                out.append(Episode(t, t + interval))
        return out


@dataclass
class Timeline:
    interval: float
    tracks: List[AlertTrack]

    def loud(self) -> List[AlertTrack]:
        return [t for t in self.tracks if t.labels.get("severity") in LOUD]


def promtool() -> str:
    p = shutil.which("promtool")
    if not p:
        raise RuntimeError("promtool is not installed (Debian: apt-get install prometheus)")
    return p


_BLOCK = re.compile(r"alertname: (\w+), time: ([0-9hms.]+),")
_ALERT = re.compile(r"Labels:\{(.*?)\}")
_PAIR = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def _seconds(text: str) -> float:
    total = 0.0
    for n, unit in re.findall(r"([0-9.]+)(h|m|s)", text):
        total += float(n) * {"h": 3600, "m": 60, "s": 1}[unit]
    return total


def backtest_timeline(scenario: Scenario, rules_file: Path, from_step: int = 0) -> Timeline:
    """Every alert firing at every evaluation from ``from_step`` on, per the backtest engine,
    evaluating at the scenario's scrape step from its first sample (as promtool does)."""
    import numpy as np

    from ...analysis.rulefile import load_rule_file
    from ...analysis.rulemanager import run as run_rules
    from ...analysis.series import Store
    book = scenario.book
    if book is None:  # a recording: what a real Prometheus stored
        from ...analysis.sources import load_file
        from .recorded_sidecar import with_current_sidecar

        store = with_current_sidecar(load_file(scenario.file).store, Path(scenario.file).parent)
        if scenario.scrape:  # what a Prometheus scraping at that interval would have kept
            store = thin(store, scenario.scrape)
        step_ms = int(scenario.step * 1000)
        times = np.arange(int(scenario.start * 1000), int(scenario.end * 1000) + 1, step_ms, dtype=np.int64)
        origin, interval = scenario.start, scenario.step
    else:
        scrape_t = np.array([int(round(book.t(i) * 1000)) for i in range(book.n)], dtype=np.int64)
        store = Store()
        for (name, labels), row in book.series.items():
            keep = ~np.isnan(row.v) | row.stale
            store.add(tuple(sorted((("__name__", name),) + labels)), scrape_t[keep], row.v[keep], row.stale[keep])
        step_ms = int(scenario.eval_step * 1000)
        times = np.arange(int(scrape_t[0]), int(scrape_t[-1]) + 1, step_ms, dtype=np.int64)
        origin, interval = book.start, scenario.eval_step
    run = run_rules(load_rule_file(str(rules_file)), store, times, step_ms)
    tracks: List[AlertTrack] = []
    for tr in run.alerts:
        firing = [(int(times[i]) / 1000.0) - origin for i in np.nonzero(tr.states.firing)[0]
              if (int(times[i]) / 1000.0) - origin >= from_step * scenario.scrape_interval]
        if firing:
            labels = {k: v for k, v in tr.labels if k != "alertname"}
            tracks.append(AlertTrack(tr.alertname, labels, firing))
    return Timeline(interval, sorted(tracks, key=lambda t: (t.alert, sorted(t.labels.items()))))


def thin(store, scrape: float):
    """A store with only the samples of each series nearest after each multiple of ``scrape``
    seconds: what a Prometheus scraping at that interval would have stored."""
    import numpy as np

    from ...analysis.series import Store

    out = Store()
    step = int(scrape * 1000)
    for s in store:
        if len(s.t) == 0:
            continue
        slot = s.t // step
        keep = np.ones(len(s.t), dtype=bool)
        keep[1:] = slot[1:] != slot[:-1]
        stale = s.stale[keep] if getattr(s, "stale", None) is not None else np.zeros(int(keep.sum()), dtype=bool)
        out.add(s.labels, s.t[keep], s.v[keep], stale)
    return out


def promtool_timeline(scenario: Scenario, rules_file: Path, alerts: Sequence[str],
                      from_step: int = 0, workdir: Optional[Path] = None) -> Timeline:
    """Every alert firing at every evaluation from ``from_step`` (a scrape step) on, per promtool."""
    import numpy as np

    book = scenario.book
    interval = scenario.eval_step
    end = (book.n - 1) * book.step
    evals = [{"eval_time": f"{int(t)}s", "alertname": a, "exp_alerts": []}
             for t in np.arange(from_step * book.step, end + 1e-6, interval) for a in alerts]
    doc = {"rule_files": [str(rules_file)], "evaluation_interval": f"{int(interval)}s",
           "tests": [{"interval": f"{int(book.step)}s", "input_series": book.promtool_input(),
                      "alert_rule_test": evals}]}
    tmp = Path(workdir or tempfile.mkdtemp(prefix="scenario-"))
    f = tmp / f"{scenario.name}.test.yml"
    f.write_text(yaml.safe_dump(doc, sort_keys=False, width=1 << 20))
    r = subprocess.run([promtool(), "test", "rules", str(f)], capture_output=True, text=True, timeout=3600)
    out = r.stdout + r.stderr
    if r.returncode != 0 and "FAILED" not in out:
        raise RuntimeError(f"promtool failed: {out[-3000:]}")
    tracks: Dict[Tuple[str, Labels], AlertTrack] = {}
    for block in re.split(r"\n\s*(?=alertname: )", out):
        m = _BLOCK.match(block.strip())
        if not m:
            continue
        name, t = m.group(1), _seconds(m.group(2))
        got = block.split("got:", 1)[1] if "got:" in block else ""
        for lab_text in _ALERT.findall(got):
            labels = dict(_PAIR.findall(lab_text))
            labels.pop("alertname", None)
            key = (name, frozenset(labels.items()))
            tr = tracks.setdefault(key, AlertTrack(name, labels))
            tr.firing_at.append(t)
    return Timeline(interval, sorted(tracks.values(), key=lambda t: (t.alert, sorted(t.labels.items()))))


_SELECTOR = re.compile(r'^(\w+)(?:\{(.*)\})?$')


def selector(text: str) -> Tuple[str, Dict[str, str]]:
    """An alert selector: ``Name`` or ``Name{label="value",...}`` (exact matches; the alert's own
    labels, severity included)."""
    m = _SELECTOR.match(text.strip())
    if not m:
        raise ValueError(f"not an alert selector: {text!r}")
    return m.group(1), dict(_PAIR.findall(m.group(2) or ""))


def matching(tl: Timeline, text: str) -> List[AlertTrack]:
    """The tracks of ``tl`` that the selector matches."""
    name, want = selector(text)
    return [tr for tr in tl.tracks if tr.alert == name and all(tr.labels.get(k) == v for k, v in want.items())]


@dataclass
class Verdict:
    scenario: str
    ok: bool
    problems: List[str]
    first_warning: Optional[float]  # minutes after onset
    first_page: Optional[float]
    rows: List[Tuple[str, str, float, int, float, float]]  # alert, replica, first (min), episodes, minutes, longest


def judge(scenario: Scenario, tl: Timeline) -> Verdict:
    onset = scenario.onset_s
    rows = []
    problems: List[str] = []
    first_warning = first_page = None
    for tr in tl.tracks:
        sev = tr.labels.get("severity", "")
        replica = tr.labels.get("pod", tr.labels.get("model_name", ""))
        eps = tr.episodes(tl.interval)
        first = (min(tr.firing_at) - onset) / 60.0
        minutes = len(tr.firing_at) * tl.interval / 60.0
        longest = max((e.end - e.start) for e in eps) / 60.0
        rows.append((tr.alert, replica, first, len(eps), minutes, longest))
        if sev in LOUD and min(tr.firing_at) >= onset:
            first_warning = first if first_warning is None else min(first_warning, first)
        if sev == "critical" and min(tr.firing_at) >= onset:
            first_page = first if first_page is None else min(first_page, first)
        limit = scenario.max_episodes.get(tr.alert)
        if limit is not None and sev in LOUD and len(eps) > limit:
            problems.append(f"{tr.alert} on {replica}: {len(eps)} episodes, at most {limit}")
    if scenario.quiet:
        loud = [f"{r[0]} on {r[1]} at {r[2]:+.1f}m" for r, tr in zip(rows, tl.tracks)
                if tr.labels.get("severity") in LOUD]
        if loud:
            problems.append("fired on a quiet scenario: " + ", ".join(loud))
    if scenario.no_page:
        pages = [f"{r[0]} on {r[1]} at {r[2]:+.1f}m" for r, tr in zip(rows, tl.tracks)
                 if tr.labels.get("severity") == "critical"]
        if pages:
            problems.append("paged where nothing may page: " + ", ".join(pages))
    for a, want in scenario.expect_episodes.items():
        got = sum(len(tr.episodes(tl.interval)) for tr in tl.tracks if tr.alert == a)
        if got != want:
            problems.append(f"{a}: {got} episodes in all, expected {want} (one per overload and replica)")
    for a in scenario.must_fire:
        if not matching(tl, a):
            problems.append(f"{a} never fired")
    for a in scenario.never:
        got = matching(tl, a)
        if got:
            problems.append(f"{a} fired (it must not): " + ", ".join(
                f"on {tr.labels.get('pod', '')} at {(min(tr.firing_at) - onset) / 60.0:+.1f}m" for tr in got))
    for a, minutes in scenario.within.items():
        deadline = math.ceil((onset + minutes * 60.0) / tl.interval - 1e-9) * tl.interval
        firsts = [min(t for t in tr.firing_at if t >= onset) for tr in matching(tl, a)
                  if any(t >= onset for t in tr.firing_at)]
        if not firsts or min(firsts) > deadline + 1e-6:
            when = f"{(min(firsts) - onset) / 60.0:+g}m" if firsts else "never"
            problems.append(f"{a}: first at {when}, needed by +{(deadline - onset) / 60.0:g}m")
    if scenario.first_warning is not None and (first_warning is None or first_warning > scenario.first_warning):
        problems.append(f"first warning at {first_warning}, needed by +{scenario.first_warning}m")
    if scenario.first_page is not None and (first_page is None or first_page > scenario.first_page):
        problems.append(f"first page at {first_page}, needed by +{scenario.first_page}m")
    return Verdict(scenario.name, not problems, problems, first_warning, first_page, rows)
