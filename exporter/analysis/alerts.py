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

An alert of a group with an interval longer than the grid's (the pack's slow alerts) changes
state only where its group runs (``every_interval``, ``evaluate_every``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

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


def every_interval(times: np.ndarray, group_ms: Optional[int], step_ms: int) -> Optional[np.ndarray]:
    """Where a group that runs every ``group_ms`` evaluates on a grid of ``times`` (every
    ``step_ms``): the first step of each of its intervals (a mask; a grid that starts inside an
    interval waits for the next, as a Prometheus started then does), or None where it runs at every
    step. Prometheus offsets each group within its interval by a hash of its name and file; here
    every group of one interval runs at the same times, so a slow group's evaluations fall within
    one interval of Prometheus' own."""
    if not group_ms or group_ms <= step_ms:
        return None
    # t is the first step of its interval where the step before it (t - step) is in the one before
    return np.asarray(times, dtype=np.int64) % group_ms < step_ms


def evaluate_every(times: np.ndarray, active: np.ndarray, every: Optional[np.ndarray], for_ms: int,
                   keep_firing_for_ms: int = 0) -> States:
    """``evaluate`` for an alert whose group runs only where ``every`` is true
    (``every_interval``): its state changes at those evaluations and holds between them, as an
    alert of a slow group stays pending or firing in Prometheus until its group runs again."""
    if every is None:
        return evaluate(times, active, for_ms, keep_firing_for_ms)
    idx = np.nonzero(every)[0]
    st = evaluate(times[idx], active[idx], for_ms, keep_firing_for_ms)
    last = np.searchsorted(idx, np.arange(len(times)), side="right") - 1  # the group's last run so far
    seen = last >= 0
    pending = np.zeros(len(times), bool)
    firing = np.zeros(len(times), bool)
    pending[seen] = st.pending[last[seen]]
    firing[seen] = st.firing[last[seen]]
    return States(pending, firing)
