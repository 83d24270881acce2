"""Where in each interval a Prometheus evaluates a rule group, and rule-file names that put the
compared instances' alerting groups at moments of the same kind.

Prometheus evaluates a group at a fixed offset within its interval: the hash of the group's
labels ``{file=<the rule file's path>, name=<the group's name>}`` modulo the interval in
nanoseconds (``rules.Group.EvalTimestamp``; the hash is ``labels.Labels.Hash``, xxhash64 of each
label's name and value, sorted by name, each followed by the byte 0xff). ``bench_pack.py`` runs
several Prometheus beside one simulated fleet on two cores; the four instances' scrapes and the
fleet's ticks load some moments of every 30 s more than others, so the same rules measured 8-20 %
apart between two instances of one run, each at its own hashed moment (docs/performance.md). A
copy of each rule file under a name that puts its alerting group at a chosen offset (spread over
the interval, whole multiples of the fleet's tick apart, so that no two instances evaluate at
once and each sees the fleet at the same point of its tick), its later groups (every minute or
two) at that point of the tick too and never at the moment of another group, makes the instances'
environments alike. ``observed`` reads the offsets back from a running Prometheus: the bench prints both.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

try:
    import xxhash
except ImportError:  # the test extra installs it; without it the offsets are left to Prometheus
    xxhash = None


def available() -> bool:
    return xxhash is not None


def group_offset_s(path: str, group: str, interval_s: float) -> float:
    """The offset (seconds) within each ``interval_s`` at which Prometheus evaluates ``group`` of
    the rule file at ``path`` (the path as its configuration names it: absolute here)."""
    key = b"file\xff" + path.encode() + b"\xffname\xff" + group.encode() + b"\xff"
    return (xxhash.xxh64_intdigest(key) % int(round(interval_s * 1e9))) / 1e9


def targets(n: int, interval_s: float, tick_s: float) -> List[float]:
    """``n`` offsets spread over the interval, each a whole number of ticks."""
    ticks = max(1, int(round(interval_s / tick_s)))
    return [round(k * ticks / n) % ticks * tick_s for k in range(n)]


def _distance(a: float, b: float, interval_s: float) -> float:
    d = abs(a - b) % interval_s
    return min(d, interval_s - d)


def _collide(a: Tuple[float, float], b: Tuple[float, float], apart_s: float) -> bool:
    """Whether two groups, each (offset, interval) in seconds, are ever evaluated within ``apart_s``
    of each other: their offsets within the greatest common divisor of their intervals."""
    g = math.gcd(int(round(a[1] * 1000)), int(round(b[1] * 1000))) / 1000
    return _distance(a[0] % g, b[0] % g, g) < apart_s


def placed_copy(src: Path, into: Path, group: str, target_s: float, interval_s: float,
                tolerance_s: float = 0.05, tries: int = 20_000_000, later: Sequence[Tuple[str, float]] = (),
                tick_s: float = 0.0, taken: Sequence[Tuple[float, float]] = (), apart_s: float = 1.0) -> Path:
    """A copy of ``src`` in ``into`` named so that ``group`` is evaluated within ``tolerance_s``
    of ``target_s`` into every interval, and each of its ``later`` groups (name, interval) at the
    same point of the fleet's tick (``tick_s``; within half a second) and never within ``apart_s``
    of a group in ``taken`` (offset, interval) or of another of them: a group left where the hash
    puts it can meet the fleet's busy moment, or another instance's group, and measure twice as
    slow as the same rules elsewhere."""
    into.mkdir(parents=True, exist_ok=True)
    phase = target_s % tick_s if tick_s else 0.0
    base = into.resolve()  # once: a path resolved at every try costs more than its hash
    for i in range(tries):
        p = base / f"{src.stem}-{i}.yml"
        if _distance(group_offset_s(str(p), group, interval_s), target_s, interval_s) > tolerance_s:
            continue
        placed = [(target_s, interval_s)]
        for name, every in later:
            at = (group_offset_s(str(p), name, every), every)
            if _distance(at[0] % tick_s, phase, tick_s) > 0.5 or any(_collide(at, t, apart_s)
                                                                   for t in list(taken) + placed):
                break
            placed.append(at)
        else:
            p.write_text(src.read_text())
            return p
    raise RuntimeError(f"no name for {src} puts {group!r} at {target_s} s in {tries} tries")


def observed(groups: Sequence[dict], interval_s: float) -> Dict[str, Optional[float]]:
    """Each group's last evaluation (``/api/v1/rules``' ``lastEvaluation``) as an offset within the
    interval, by group name (None before its first evaluation)."""
    from exporter.harness.localstack import unix_time

    out: Dict[str, Optional[float]] = {}
    for g in groups:
        text = g.get("lastEvaluation") or ""
        t = unix_time(text) if text else 0.0
        out[g["name"]] = t % interval_s if t else None
    return out
