"""The series store: every sample the rules read, raw (loaded from a source) or recorded (written
by recording rules), with Prometheus' stale markers.

A series is sorted, strictly increasing millisecond timestamps and float values; a stale marker
is a sample flagged ``stale`` (Prometheus' special NaN): it ends the series for instant selectors
and is skipped by range selectors. Identical timestamp arrays are shared between series (a fleet
scraped together has one), which halves the memory of a week of data and lets the engine
compute one window per group of series instead of one per series.

Recorded series grow as the rules run; ``append`` takes one evaluation block at a time and the
first sample written at a timestamp wins, as in Prometheus' TSDB (a later rule writing the same
series at the same time gets "duplicate sample" and is dropped).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from .promql.labels import NAME, Labels, MatcherSet, get


class SeriesError(ValueError):
    """Samples that cannot be stored (out of order, mismatched lengths)."""


@dataclass
class Series:
    labels: Labels
    _t: np.ndarray
    _v: np.ndarray
    _stale: Optional[np.ndarray] = None  # bool, None when the series has no stale marker
    _n: int = -1
    _clean: Optional[Tuple[np.ndarray, np.ndarray]] = field(default=None, repr=False)
    _keys: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if self._n < 0:
            self._n = len(self._t)

    @property
    def t(self) -> np.ndarray:
        return self._t[: self._n]

    @property
    def v(self) -> np.ndarray:
        return self._v[: self._n]

    @property
    def stale(self) -> Optional[np.ndarray]:
        return None if self._stale is None else self._stale[: self._n]

    def __len__(self) -> int:
        return self._n

    def time_key(self, clean: bool = False) -> tuple:
        """Equal for series with the same (stale-free, when ``clean``) timestamps: the engine
        computes one window per group of such series."""
        st = self.stale
        if not self._t.flags.writeable and (st is None or (clean and not st.any())):
            return (id(self._t), self._n)  # an interned array: its identity is its content
        key = self._keys.get(clean)
        if key is None:
            t = self.without_stale()[0] if clean else self.t
            if st is not None and not clean and st.any():
                key = ("own", id(self))
            else:
                key = ("content", len(t), hashlib.blake2b(t.tobytes(), digest_size=16).digest())
            self._keys[clean] = key
        return key

    def without_stale(self) -> Tuple[np.ndarray, np.ndarray]:
        """Timestamps and values with the stale markers taken out (what range selectors see)."""
        if self._clean is None:
            st = self.stale
            if st is None or not st.any():
                self._clean = (self.t, self.v)
            else:
                keep = ~st
                self._clean = (self.t[keep], self.v[keep])
        return self._clean

    def append(self, t: np.ndarray, v: np.ndarray, stale: np.ndarray) -> None:
        """Add samples after the last one (recorded series grow at the end only)."""
        if not len(t):
            return
        if self._n and t[0] <= self._t[self._n - 1]:
            raise SeriesError(f"{self.labels}: out-of-order append")
        need = self._n + len(t)
        if need > len(self._t) or self._stale is None or not self._t.flags.writeable:
            cap = max(need, 2 * len(self._t), 64)
            nt = np.empty(cap, np.int64)
            nv = np.empty(cap, np.float64)
            ns = np.zeros(cap, bool)
            nt[: self._n], nv[: self._n] = self.t, self.v
            if self._stale is not None:
                ns[: self._n] = self.stale
            self._t, self._v, self._stale = nt, nv, ns
        self._t[self._n: need] = t
        self._v[self._n: need] = v
        self._stale[self._n: need] = stale
        self._n = need
        self._clean = None
        self._keys = {}


class Store:
    """All series by label set, with an index by metric name."""

    def __init__(self) -> None:
        self._series: Dict[Labels, Series] = {}
        self._by_name: Dict[str, List[Labels]] = {}
        self._interned: Dict[Tuple[int, int, int, bytes], np.ndarray] = {}

    def __len__(self) -> int:
        return len(self._series)

    def __iter__(self):
        return iter(self._series.values())

    def get(self, labels: Labels) -> Optional[Series]:
        return self._series.get(labels)

    def names(self) -> List[str]:
        return sorted(self._by_name)

    def time_range(self) -> Tuple[Optional[int], Optional[int]]:
        """First and last sample time (ms) over every series, or ``(None, None)``."""
        lo = hi = None
        for s in self._series.values():
            if len(s):
                a, b = int(s.t[0]), int(s.t[-1])
                lo = a if lo is None else min(lo, a)
                hi = b if hi is None else max(hi, b)
        return lo, hi

    def intern(self, t: np.ndarray) -> np.ndarray:
        """One shared array per distinct timestamp sequence."""
        if not len(t):
            return t
        key = (len(t), int(t[0]), int(t[-1]), hashlib.blake2b(t.tobytes(), digest_size=16).digest())
        got = self._interned.get(key)
        if got is None:
            t = np.ascontiguousarray(t, dtype=np.int64)
            t.setflags(write=False)
            self._interned[key] = t
            return t
        return got

    def add(self, labels: Labels, t: Sequence[int], v: Sequence[float], stale: Optional[Sequence[bool]] = None) -> None:
        """Add raw samples of one series (any order; a second add of the same series merges, the
        first sample at a timestamp winning)."""
        ta = np.asarray(t, dtype=np.int64)
        va = np.asarray(v, dtype=np.float64)
        sa = None if stale is None else np.asarray(stale, dtype=bool)
        if len(ta) != len(va) or (sa is not None and len(sa) != len(ta)):
            raise SeriesError(f"{labels}: timestamps and values differ in length")
        old = self._series.get(labels)
        if old is not None:
            ost = old.stale if old.stale is not None else np.zeros(len(old), bool)
            ta = np.concatenate([old.t, ta])
            va = np.concatenate([old.v, va])
            sa = np.concatenate([ost, sa if sa is not None else np.zeros(len(t), bool)])
        if len(ta) > 1 and not (np.diff(ta) > 0).all():
            order = np.argsort(ta, kind="stable")
            ta, va = ta[order], va[order]
            sa = None if sa is None else sa[order]
            first = np.concatenate([[True], np.diff(ta) > 0])
            ta, va = ta[first], va[first]
            sa = None if sa is None else sa[first]
        if sa is not None and not sa.any():
            sa = None
        s = Series(labels, self.intern(ta), va, sa)
        if old is None:
            self._by_name.setdefault(get(labels, NAME), []).append(labels)
        self._series[labels] = s

    def append(self, labels: Labels, t: np.ndarray, v: np.ndarray, stale: np.ndarray) -> None:
        """Append samples written by a rule (after everything the series already holds)."""
        s = self._series.get(labels)
        if s is None:
            s = Series(labels, np.empty(0, np.int64), np.empty(0, np.float64), None, 0)
            self._series[labels] = s
            self._by_name.setdefault(get(labels, NAME), []).append(labels)
        s.append(t, v, stale)

    def write(self, labels: Labels, t: np.ndarray, v: np.ndarray, stale: np.ndarray) -> None:
        """Samples (or stale markers) a rule wrote; where the series already has a sample at a
        timestamp (another rule wrote it first), the earlier one stays."""
        s = self._series.get(labels)
        if s is None or not len(s) or t[0] > s.t[-1]:
            self.append(labels, t, v, stale)
            return
        new = ~np.isin(t, s.t)
        old_stale = s.stale if s.stale is not None else np.zeros(len(s), bool)
        ta = np.concatenate([s.t, t[new]])
        va = np.concatenate([s.v, v[new]])
        sa = np.concatenate([old_stale, stale[new]])
        order = np.argsort(ta, kind="stable")
        fresh = Series(labels, np.empty(0, np.int64), np.empty(0), None, 0)
        fresh.append(ta[order], va[order], sa[order])
        self._series[labels] = fresh

    def select(self, matchers: MatcherSet) -> List[Series]:
        """Series matching every matcher, in Prometheus' order (sorted by label set)."""
        name = matchers.name_equal()
        if name is not None:
            cands: Iterable[Labels] = self._by_name.get(name, ())
        else:
            cands = [ls for n, lss in self._by_name.items() if matchers.matches_name(n) for ls in lss]
        out = [self._series[ls] for ls in cands if matchers.matches(ls)]
        out.sort(key=lambda s: s.labels)
        return out
