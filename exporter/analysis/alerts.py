"""The alert state machine of Prometheus 2.42's ``AlertingRule.Eval``, over a whole timeline.

Given at which evaluations an alert's expression returned its label set, it says at which ones
the alert was pending and at which it was firing:

- the first evaluation that returns it makes it pending (``ActiveAt``); it fires at the first
  evaluation at least ``for`` after ``ActiveAt`` (at once when ``for`` is 0);
- an evaluation that does not return it deletes a pending alert; a firing one resolves, unless
  ``keep_firing_for`` keeps it firing: from the first evaluation without it (``KeepFiringSince``)
  it stays firing while ``t - KeepFiringSince < keep_firing_for``; returning in that time
  continues the same firing alert;
- after resolving, the next return starts over as a new pending alert.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

import numpy as np


@dataclass(frozen=True)
class States:
    pending: np.ndarray  # bool per evaluation
    firing: np.ndarray   # bool per evaluation


def runs(mask: np.ndarray) -> List[Tuple[int, int]]:
    """Maximal runs of True as ``(first, last)`` indices (inclusive)."""
    if not len(mask):
        return []
    m = np.concatenate([[False], mask.astype(bool), [False]])
    d = np.diff(m.astype(np.int8))
    starts = np.nonzero(d == 1)[0]
    ends = np.nonzero(d == -1)[0] - 1
    return list(zip(starts.tolist(), ends.tolist()))


def evaluate(times: np.ndarray, active: np.ndarray, for_ms: int, keep_firing_for_ms: int = 0) -> States:
    """Pending and firing at each evaluation time, from whether the expression returned the
    alert's label set then."""
    n = len(times)
    pending = np.zeros(n, bool)
    firing = np.zeros(n, bool)
    kff = keep_firing_for_ms
    is_firing = False
    prev_end = -1
    for s, e in runs(active):
        if is_firing:
            k0 = prev_end + 1
            if kff > 0 and times[s - 1] - times[k0] < kff:
                firing[k0:e + 1] = True  # kept firing through the gap, and firing again
                prev_end = e
                continue
            if kff > 0:
                gap = np.arange(k0, s)
                firing[gap[times[gap] - times[k0] < kff]] = True
            is_firing = False
        active_at = times[s]
        ready = np.nonzero(times[s:e + 1] - active_at >= for_ms)[0]
        if len(ready):
            f = s + int(ready[0])
            pending[s:f] = True
            firing[f:e + 1] = True
            is_firing = True
        else:
            pending[s:e + 1] = True
        prev_end = e
    if is_firing and kff > 0 and prev_end + 1 < n:
        k0 = prev_end + 1
        tail = np.arange(k0, n)
        firing[tail[times[tail] - times[k0] < kff]] = True
    return States(pending, firing)
