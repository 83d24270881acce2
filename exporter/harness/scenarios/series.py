"""A book of time series on a regular grid, as a scrape would have stored them: each series a
value per step, missing (``None``: not scraped) or ``STALE`` (Prometheus' staleness marker, written
when a target or series disappears).

Writers: promtool's unit-test input (``input_series`` with ``_`` and ``stale``) and OpenMetrics
text with a timestamp on every sample (what ``promtool tsdb create-blocks-from openmetrics`` and
``backtest --file`` read; OpenMetrics has no staleness marker, so a stale series simply ends).
"""

from __future__ import annotations

import math
from typing import Dict, Iterator, List, Optional, Sequence, Tuple, Union

Labels = Tuple[Tuple[str, str], ...]
Key = Tuple[str, Labels]


class _Stale:
    def __repr__(self) -> str:
        return "STALE"


STALE = _Stale()
Value = Union[None, float, _Stale]


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


class Book:
    """Series on the grid ``start + i * step`` for ``i`` in ``range(n)``."""

    def __init__(self, start: float, step: float, n: int) -> None:
        self.start = float(start)
        self.step = float(step)
        self.n = int(n)
        self.series: Dict[Key, List[Value]] = {}

    def t(self, i: int) -> float:
        return self.start + i * self.step

    def set(self, name: str, labels: Dict[str, str], i: int, value: Value) -> None:
        key = (name, labels_of(labels))
        row = self.series.get(key)
        if row is None:
            row = self.series[key] = [None] * self.n
        row[i] = value

    def end(self, i: int, match: Dict[str, str]) -> None:
        """Write a staleness marker at step ``i`` for every series of a target (``match``) that
        had a value at ``i - 1`` and has none at ``i``: what Prometheus does when a target
        disappears or a scrape fails."""
        if i >= self.n:
            return
        items = tuple(match.items())
        for (name, labels), row in self.series.items():
            if all(kv in labels for kv in items) and i > 0 and row[i - 1] not in (None, STALE) and row[i] is None:
                row[i] = STALE

    def keys(self) -> List[Key]:
        return sorted(self.series)

    # -- writers ------------------------------------------------------------------------------
    def promtool_input(self) -> List[Dict[str, str]]:
        """``input_series`` for ``promtool test rules`` (interval = step, time 0 = start)."""
        out = []
        for name, labels in self.keys():
            row = self.series[(name, labels)]
            vals = " ".join("_" if v is None else "stale" if v is STALE else _num(v) for v in row)
            out.append({"series": fmt_labels(name, labels), "values": vals})
        return out

    def openmetrics(self) -> Iterator[str]:
        """OpenMetrics lines (untyped families, timestamps in seconds), ending with ``# EOF``."""
        by_name: Dict[str, List[Labels]] = {}
        for name, labels in self.keys():
            by_name.setdefault(name, []).append(labels)
        for name in sorted(by_name):
            yield f"# TYPE {name} unknown\n"
            rows = [(labels, self.series[(name, labels)]) for labels in by_name[name]]
            for i in range(self.n):
                ts = self.t(i)
                for labels, row in rows:
                    v = row[i]
                    if v is None or v is STALE:
                        continue
                    yield f"{fmt_labels(name, labels)} {_num(v)} {ts:.3f}\n"
        yield "# EOF\n"

    def values(self, name: str, **match: str) -> List[Tuple[Labels, Sequence[Value]]]:
        items = tuple(match.items())
        return [(labels, row) for (n, labels), row in self.series.items()
                if n == name and all(kv in labels for kv in items)]
