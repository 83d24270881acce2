"""The detection matrix: every scenario x replicas {1, 2, 3, 8} x scrape interval {5, 15, 30, 60 s}
x history {none, 1 h, 1 day}, rules evaluated every 30 s, each cell judged against its
expectations and against the user's naive rules on the same series.

A cell's series are rendered once per scenario and history at a base step (5 s for 5 s cells,
15 s for the others) with the most replicas of the matrix, then cut to the cell: the first
``replicas`` replica slots (the affected replica is always slot 0) and the samples a Prometheus
scraping every ``scrape`` seconds would have kept (``thin``). The sidecar's series in them are the
runtime's own derivations over pages at its 2 s poll (``scenarios.sidecar_sim``), so each interval
reads the same sidecar, as it would in a real deployment. vLLM's series of a pod that has sidecar
series carry the SLO's ``sidecar_target_label`` (``sidecar_labelled``), as the deploy monitors write
it; the cells without the sidecar (``without_sidecar``) carry neither.

History: ``none`` means Prometheus and the sidecar start at the onset (a new deployment on its
first incident: nothing learned, no rate window full), ``1h`` an hour of normal traffic before it,
``1d`` a day (every baseline window full). Recordings of the real CPU vLLM have their own replicas
(one) and history; only their scrape interval varies: the first recordings (5 s scrapes) thinned to
each interval, those recorded at real intervals read at the 15 s and 30 s their own Prometheus
servers stored in the same run (and 60 s thinned from 30 s; ``RECORDED_SCRAPES``).

Expectations (``expect``): the scenario's own (a warning within 1 min and a page within 5 for the
night, silence for healthy and rollout, a burn page for errors, at most 2 episodes a day and one
per overload for chronic overload), and never a first loud alert later than the naive rules' first.
``EXCUSED`` lists the cells that cannot meet one, with the reason docs/detection.md prints.
"""

from __future__ import annotations

import hashlib
import math
import os
import pickle
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np

from ..slo import defaults as slo_defaults
from .scenarios import catalog, catalog29, pd_catalog
from .scenarios.catalog import Scenario
from .scenarios.fleet import REPLICA_INDEX
from .scenarios.judge import LOUD, Timeline, Verdict, backtest_timeline, judge
from .scenarios.series import Book, labels_of

REPLICAS = (1, 2, 3, 8)
# the label the built-in SLO file's pack expects on the vLLM targets of pods with a sidecar
SIDECAR_LABEL: str = slo_defaults().get("sidecar_target_label") or ""
SCRAPES = (5, 15, 30, 60)
HISTORIES = {"none": 0.0, "1h": 1.0, "1d": 24.0}


@dataclass(frozen=True)
class Cell:
    scenario: str
    replicas: int
    scrape: int
    history: str

    def __str__(self) -> str:
        return f"{self.scenario} x{self.replicas} @{self.scrape}s hist={self.history}"


# scenario -> builder(history_h, step, pods): the synthetic scenarios, each over the matrix
# (issue 28's P/D fleet and issue 29's shapes last)
SYNTHETIC: Dict[str, Callable[..., Scenario]] = {
    "seed-night": catalog.seed_night,
    "capacity-bound-flood": catalog.capacity_bound_flood,
    "busy-healthy-day": lambda history_h, step, pods: catalog.busy_healthy_day(history_h, step, pods, after_h=0.75),
    "rolling-deploy": catalog.rolling_deploy,
    "churn-error-burst": catalog.churn_error_burst,
    "stream-errors": catalog.stream_errors,
    "chronic-overload": lambda history_h, step, pods: catalog.chronic_overload(history_h, step, pods, hours=2.0),
    "chronic-overload-old-release": lambda history_h, step, pods: catalog.chronic_overload_old_release(
        history_h, 8.0, step, pods),
    "production-trace-conv": lambda history_h, step, pods: catalog.production_trace("conv", history_h, step, pods),
    "production-trace-code": lambda history_h, step, pods: catalog.production_trace("code", history_h, step, pods),
    **pd_catalog.PD_SCENARIOS,
    **catalog29.SCENARIOS29,
}
# the replica counts, scrape intervals and histories of the scenarios not judged over the whole grid
CELLS: Dict[str, Dict[str, Tuple]] = {
    **{name: {"replicas": r} for name, r in pd_catalog.PD_REPLICAS.items()},
    **catalog29.CELLS29,
}
RECORDED: Dict[str, Callable[[float], Scenario]] = {
    "recorded-long-prompt-flood": catalog.recorded_flood,
    "recorded-busy-healthy": catalog.recorded_busy_healthy,
    "recorded-busy-overloaded": catalog.recorded_busy_overloaded,
    "recorded-fill-flood": catalog.recorded_fill_flood,
    "recorded-capacity-bound-flood": catalog.recorded_capacity_bound_flood,
    "recorded-steady-busy": catalog.recorded_steady_busy,
}
# the scrape intervals of each recording's cells: the first recordings were scraped every 5 s and
# are thinned to every interval; those recorded at real intervals are read at the 15 s and 30 s
# their own Prometheus servers stored, and at 60 s thinned from the 30 s one (never 5 s)
RECORDED_SCRAPES: Dict[str, Tuple[int, ...]] = {
    "recorded-fill-flood": (15, 30, 60),
    "recorded-capacity-bound-flood": (15, 30, 60),
    "recorded-steady-busy": (15, 30, 60),
}
# cells that cannot meet an expectation, and why (docs/detection.md prints it)
EXCUSED: Dict[Tuple[str, str], str] = {
    ("capacity-bound-flood", "none"): (
        "the sidecar and Prometheus start in the middle of the flood: no batch was ever seen uncontended, so the "
        "waits (at 0.55-0.68 usage) cannot be told from a full batch, and a flood's batch is never learned as the "
        "ceiling; give the ceiling (`kv_cache.max_num_seqs`, the sidecar's `--max-num-seqs`) and it pages at once"),
    ("pd-spec-acceptance-halved", "none"): (
        "nothing learned: Prometheus and the sidecar start with the acceptance already halved, and the halved "
        "draft still yields 2.0 tokens per verify step, above the 1.7x the SLO file plans; the warning is due "
        "against a learned level (history 1h, 1d), or at once where the fleet's other decode instances give one"),
}


def grid(scenario: str, axis: str) -> Tuple:
    """The replicas, scrapes or histories a synthetic scenario's cells cover."""
    return CELLS.get(scenario, {}).get(axis) or {"replicas": REPLICAS, "scrapes": SCRAPES,
                                                  "histories": tuple(HISTORIES)}[axis]


def all_cells() -> List[Cell]:
    out = [Cell(s, r, i, h) for s in SYNTHETIC for r in grid(s, "replicas") for i in grid(s, "scrapes")
           for h in grid(s, "histories")]
    out += [Cell(s, 1, i, "recorded") for s in RECORDED for i in RECORDED_SCRAPES.get(s, SCRAPES)]
    return out


def base_step(scrape: int) -> float:
    return 5.0 if scrape % 15 else 15.0


@lru_cache(maxsize=1)
def _code_digest() -> str:
    """What a render depends on: the scenarios' and the runtime's source (never the rules)."""
    h = hashlib.sha256()
    root = Path(__file__).resolve().parent.parent
    for sub in ("harness/scenarios", "runtime"):
        for f in sorted((root / sub).rglob("*.py")):
            h.update(str(f.relative_to(root)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def render_cache() -> Optional[Path]:
    """Where renders are kept between runs (``VLLM_SIDECAR_MATRIX_CACHE``; unset: nowhere). A
    render depends only on the scenario code and the sidecar's runtime, so evaluating a changed
    pack over the whole matrix again costs only the evaluations."""
    d = os.environ.get("VLLM_SIDECAR_MATRIX_CACHE", "")
    return Path(d) if d else None


def prune_render_cache() -> int:
    """Remove the renders of any other code from the cache (and leftovers of an interrupted write):
    a render is tens of megabytes and a full matrix a thousand of them, so renders of code that
    has since changed would fill the disk run after run. Returns how many files went."""
    cache = render_cache()
    if cache is None or not cache.is_dir():
        return 0
    keep = f"-{_code_digest()}.pickle"
    gone = 0
    for f in cache.iterdir():
        if f.is_file() and (f.name.endswith(".tmp") or (f.name.endswith(".pickle") and not f.name.endswith(keep))):
            f.unlink(missing_ok=True)
            gone += 1
    return gone


@lru_cache(maxsize=4)
def _rendered(scenario: str, history: str, step: float, pods: int) -> Scenario:
    cache = render_cache()
    if cache is None:
        return SYNTHETIC[scenario](HISTORIES[history], step, pods)
    path = cache / f"{scenario}-{history}-{step:g}s-{pods}p-{_code_digest()}.pickle"
    if path.exists():
        with path.open("rb") as f:
            sc, slots = pickle.load(f)
        REPLICA_INDEX.update(slots)  # which replica slot each pod fills: what cut() reads
        return sc
    sc = SYNTHETIC[scenario](HISTORIES[history], step, pods)
    names = {dict(labels).get("pod") for _name, labels in sc.book.series}
    slots = {p: REPLICA_INDEX[p] for p in names if p in REPLICA_INDEX}
    cache.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    with tmp.open("wb") as f:
        pickle.dump((sc, slots), f, protocol=pickle.HIGHEST_PROTOCOL)
    tmp.replace(path)
    return sc


def cut(sc: Scenario, replicas: int, scrape: float) -> Scenario:
    """The scenario as a Prometheus scraping every ``scrape`` s stored it, with only the first
    ``replicas`` replica slots."""
    book = sc.book
    k = int(round(scrape / book.step))
    if k < 1 or abs(k * book.step - scrape) > 1e-6:
        raise ValueError(f"scrape {scrape} s is not a multiple of the rendered step {book.step} s")
    idx = np.arange(0, book.n, k)
    out = Book(book.start, book.step * k, len(idx))
    for (name, labels), row in book.series.items():
        pod = dict(labels).get("pod")
        if pod is not None and REPLICA_INDEX.get(pod, 0) >= replicas:
            continue
        r = out.row(name, dict(labels))
        r.v[:] = row.v[idx]
        if row.stale.any():  # a marker between two kept scrapes falls on the next one
            where = np.nonzero(row.stale)[0]
            slot = np.minimum((where + k - 1) // k, len(idx) - 1)
            r.stale[slot] = True
            r.stale &= np.isnan(r.v)
    pods = max(1, sc.replicas)
    expect = {a: n * replicas // pods for a, n in sc.expect_episodes.items()}
    return replace(sc, book=out, onset=int(math.ceil(sc.onset / k)), replicas=replicas, expect_episodes=expect)


def scenario_for(cell: Cell, exact: bool = False) -> Scenario:
    """The cell's scenario; ``exact``: rendered with exactly the cell's replicas (tests: fewer pods
    to simulate) instead of cut from the matrix's largest fleet."""
    if cell.history == "recorded":
        return sidecar_labelled(RECORDED[cell.scenario](float(cell.scrape)))
    step = base_step(cell.scrape)
    pods = cell.replicas if exact or cell.replicas == 1 else max(grid(cell.scenario, "replicas"))
    return sidecar_labelled(cut(_rendered(cell.scenario, cell.history, step, pods), cell.replicas, float(cell.scrape)))


def _sidecar_series(name: str, labels) -> bool:
    return name.startswith("vllm_sidecar_") or (name == "up" and dict(labels).get("job", "").endswith("sidecar"))


def without_sidecar(sc: Scenario) -> Scenario:
    """The same fleet with no sidecar series at all: what the fallback on raw vLLM series sees
    (pods without a sidecar, so their vLLM targets carry no sidecar label either)."""
    book = sc.book
    label = SIDECAR_LABEL
    out = Book(book.start, book.step, book.n)
    for (name, labels), row in book.series.items():
        if _sidecar_series(name, labels):
            continue
        out.series[(name, tuple(kv for kv in labels if kv[0] != label))] = row
    return replace(sc, book=out, name=sc.name + "-raw-only")


def sidecar_labelled(sc: Scenario) -> Scenario:
    """The fleet as deploy/kubernetes scrapes it: every series of the vLLM target of a pod that has
    sidecar series carries the SLO's ``sidecar_target_label`` (``vllm_sidecar="true"``, written by
    the vLLM PodMonitor's relabeling), so the pack reads such pods through their sidecar and the
    raw path only for pods without one."""
    book, label = sc.book, SIDECAR_LABEL
    if book is None or not label:
        return sc
    pods = {(d.get("namespace"), d.get("pod")) for name, labels in book.series
            for d in (dict(labels),) if _sidecar_series(name, labels) and d.get("pod")}
    out = Book(book.start, book.step, book.n)
    for (name, labels), row in book.series.items():
        d = dict(labels)
        if not _sidecar_series(name, labels) and (d.get("namespace"), d.get("pod")) in pods:
            d[label] = "true"
            labels = labels_of(d)
        out.series[(name, labels)] = row
    return replace(sc, book=out)


@dataclass
class Result:
    cell: Cell
    scenario: Scenario
    pack: Verdict
    naive: Verdict
    pack_tl: Timeline
    naive_tl: Timeline
    problems: List[str]
    excused: str = ""

    @property
    def ok(self) -> bool:
        return not self.problems


def first_loud(sc: Scenario, tl: Timeline) -> Optional[float]:
    """Minutes after the onset of the first warning or critical alert firing (at or after it)."""
    onset = sc.onset_s
    firsts = [min(t for t in tr.firing_at if t >= onset) for tr in tl.loud() if any(t >= onset for t in tr.firing_at)]
    return (min(firsts) - onset) / 60.0 if firsts else None


def episodes_per_day(sc: Scenario, tl: Timeline) -> Dict[str, float]:
    """Per loud alert, its most episodes per replica per day of scenario."""
    days = max(1.0, (sc.book.n * sc.book.step if sc.book is not None else sc.end - sc.start) / 86400.0)
    out: Dict[str, float] = {}
    for tr in tl.loud():
        n = len(tr.episodes(tl.interval)) / days
        out[tr.alert] = max(out.get(tr.alert, 0.0), n)
    return out


def evaluate(cell: Cell, pack_rules: Path, naive_rules: Path, exact: bool = False,
             raw_only: bool = False) -> Result:
    sc = scenario_for(cell, exact)
    if raw_only:
        sc = without_sidecar(sc)
    ptl = backtest_timeline(sc, pack_rules)
    ntl = backtest_timeline(sc, naive_rules)
    pv, nv = judge(sc, ptl), judge(sc, ntl)
    problems = list(pv.problems)
    ours, theirs = first_loud(sc, ptl), first_loud(sc, ntl)
    if theirs is not None and not sc.quiet and (ours is None or ours > theirs + 1e-9):
        problems.append(f"later than the naive rules: {ours} against {theirs} min")
    if sc.max_per_day is not None:  # an overload that lasts hours: at most this many a day
        for a, n in episodes_per_day(sc, ptl).items():
            if n > sc.max_per_day:
                problems.append(f"{a}: {n:g} episodes a day")
    why = EXCUSED.get((cell.scenario, cell.history), "")
    if why and problems and not raw_only:
        return Result(cell, sc, pv, nv, ptl, ntl, [], why + " (not met: " + "; ".join(problems) + ")")
    return Result(cell, sc, pv, nv, ptl, ntl, problems)


def loud_alerts(tl: Timeline) -> List[str]:
    return sorted({tr.alert for tr in tl.tracks if tr.labels.get("severity") in LOUD})
