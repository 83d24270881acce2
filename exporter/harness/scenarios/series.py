"""A book of time series on a regular grid, as a scrape would have stored them: each series a
value per step, missing (not scraped) or stale (Prometheus' staleness marker, written when a
target or series disappears).

A row is a numpy array of values (NaN where missing) and a boolean array of stale markers.

Writers: promtool's unit-test input (``input_series`` with ``_`` and ``stale``) and OpenMetrics
text with a timestamp on every sample (what ``promtool tsdb create-blocks-from openmetrics`` and
``backtest --file`` read; OpenMetrics has no staleness marker, so a stale series simply ends).
"""

from __future__ import annotations

import math
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

Labels = Tuple[Tuple[str, str], ...]
Key = Tuple[str, Labels]


def labels_of(d: Dict[str, str]) -> Labels:
    return tuple(sorted(d.items()))


def fmt_labels(name: str, labels: Labels) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in labels)
    return f"{name}{{{inner}}}" if inner else name


def _num(v: float) -> str:
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if math.isnan(v):
        return "NaN"
    if float(v).is_integer() and abs(v) < 1e15:
        return str(int(v))
    return repr(round(float(v), 9))


class Row:
    __slots__ = ("v", "stale")

    def __init__(self, n: int) -> None:
        self.v = np.full(n, np.nan)
        self.stale = np.zeros(n, dtype=bool)

    def present(self) -> np.ndarray:
        return ~np.isnan(self.v)


class Book:
    """Series on the grid ``start + i * step`` for ``i`` in ``range(n)``."""

    def __init__(self, start: float, step: float, n: int) -> None:
        self.start = float(start)
        self.step = float(step)
        self.n = int(n)
        self.series: Dict[Key, Row] = {}

    def t(self, i: int) -> float:
        return self.start + i * self.step

    def row(self, name: str, labels: Dict[str, str]) -> Row:
        key = (name, labels_of(labels))
        r = self.series.get(key)
        if r is None:
            r = self.series[key] = Row(self.n)
        return r

    def put(self, name: str, labels: Dict[str, str], where: np.ndarray, values) -> None:
        """Set the series' values at the steps ``where`` (a boolean mask) to ``values`` (an array
        over all steps, or a number)."""
        r = self.row(name, labels)
        vals = np.broadcast_to(np.asarray(values, dtype=float), (self.n,))
        r.v[where] = vals[where]

    def end_where(self, name_filter, labels_filter, at: np.ndarray) -> None:
        """Staleness markers at the steps in ``at`` (boolean mask) for every matching series that had
        a value the step before and has none at that step."""
        idx = np.nonzero(at)[0]
        idx = idx[idx > 0]
        if not len(idx):
            return
        for (name, labels), r in self.series.items():
            if not name_filter(name) or not labels_filter(dict(labels)):
                continue
            hit = idx[~np.isnan(r.v[idx - 1]) & np.isnan(r.v[idx]) & ~r.stale[idx - 1]]
            r.stale[hit] = True

    def keys(self) -> List[Key]:
        return sorted(self.series)

    # -- writers ------------------------------------------------------------------------------
    def promtool_input(self) -> List[Dict[str, str]]:
        """``input_series`` for ``promtool test rules`` (interval = step, time 0 = start)."""
        out = []
        for name, labels in self.keys():
            r = self.series[(name, labels)]
            vals = " ".join("stale" if s else "_" if math.isnan(v) else _num(v) for v, s in zip(r.v, r.stale))
            out.append({"series": fmt_labels(name, labels), "values": vals})
        return out

    def openmetrics(self) -> Iterator[str]:
        """OpenMetrics lines (untyped families, timestamps in seconds), ending with ``# EOF``."""
        by_name: Dict[str, List[Labels]] = {}
        for name, labels in self.keys():
            by_name.setdefault(name, []).append(labels)
        for name in sorted(by_name):
            yield f"# TYPE {name} unknown\n"
            for labels in by_name[name]:
                r = self.series[(name, labels)]
                head = fmt_labels(name, labels)
                for i in np.nonzero(~np.isnan(r.v))[0]:
                    yield f"{head} {_num(float(r.v[i]))} {self.t(int(i)):.3f}\n"
        yield "# EOF\n"

    def values(self, name: str, **match: str) -> List[Tuple[Labels, Sequence[Optional[float]]]]:
        items = tuple(match.items())
        return [(labels, [None if math.isnan(x) else float(x) for x in r.v]) for (n, labels), r in self.series.items()
                if n == name and all(kv in labels for kv in items)]
