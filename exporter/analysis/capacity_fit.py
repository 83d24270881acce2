"""What one replica sustains, and the trend of the peaks: the capacity model's pure pieces, each
tested on its own against a hand-worked answer (tests/analysis/test_capacity.py).

- ``peak``, ``period_peaks`` and ``trend``: the highest rate, the peak of each period, a
  least-squares line through them with its slope's interval and, with Fieller's interval, when it
  reaches the capacity;
- ``curve``: the load-latency curve, binned; ``sustainable``: the best level held within every
  objective (the pack's ``sustained`` rule's answer, read over every replica and step);
- ``fit_prefill_weight``, ``sustained_level``, ``mix_band``, ``load_mixes`` and
  ``weighted_capacity``: the capacity in weighted tokens/s (output + w x prompt) and per load mix;
- ``target``: replicas needed for a rate and the verdict for the replicas serving now.

``capacity.compute`` puts them together over history.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .promql.durations import format_duration
from .promql.labels import drop_name
from .promql.vector import Vec
from .stats import crossing, linear_fit

DAY_MS = 86_400_000
CURVE_BINS = 12
LIMIT_NEAR = 0.9       # an objective missed at >= 90% of the sustainable load: the limit was reached
MIN_COVERAGE = 0.9     # a trend period counts when samples cover at least 90% of its steps
MIN_PERIODS = 3        # a fit with an uncertainty needs three periods
MIN_FIT_STEPS = 6      # the prefill weight is fitted from at least this many saturated steps ...
MIN_FIT_SPREAD = 1.5   # ... whose prompt tokens/s differ by at least this factor (two mixes, not one)
MIX_BAND = 2.0         # load mixes: prompt tokens per output token in bands of this factor


@dataclass(frozen=True)
class Objectives:
    ttft_p95_seconds: float
    ttft_mean_seconds: float
    itl_mean_seconds: float

    @classmethod
    def from_slo(cls, slo) -> "Objectives":
        o = slo["objectives"]
        # the rules write the ITL objective with 6 significant digits; so does this
        return cls(float(o["ttft_p95_seconds"]), float(o["ttft_mean_seconds"]),
                   float(f"{1.0 / o['output_tokens_per_second']:.6g}"))

    def met(self, ttft_p95: np.ndarray, ttft_mean: np.ndarray, itl_mean: np.ndarray) -> np.ndarray:
        """True where every objective holds (NaN or absent: not met), as the rules say."""
        with np.errstate(invalid="ignore"):
            return (ttft_p95 <= self.ttft_p95_seconds) & (ttft_mean <= self.ttft_mean_seconds) & \
                (itl_mean <= self.itl_mean_seconds)



@dataclass(frozen=True)
class Peak:
    value: float
    at_ms: int


@dataclass(frozen=True)
class CurveBin:
    lo: float                  # tokens/s per replica, (lo, hi]
    hi: float
    points: int
    tokens_per_second: float   # medians of the points in the bin
    ttft_p95: Optional[float]
    ttft_mean: Optional[float]
    itl_mean: Optional[float]
    within_share: float        # share of the points where every objective held


@dataclass(frozen=True)
class Points:
    """Every replica at every step with traffic: the load-latency scatter."""

    tokens_per_second: np.ndarray
    ttft_p95: np.ndarray
    ttft_mean: np.ndarray
    itl_mean: np.ndarray
    within: np.ndarray


@dataclass(frozen=True)
class Sustainable:
    tokens_per_second: Optional[float]     # held for capacity.sustain within every objective; None: never
    at_ms: Optional[int]
    replica: Dict[str, str]
    instantaneous_max: Optional[float]     # the best single step within every objective
    bound: str                             # "observed": objectives were missed just above it; "lower": never
                                           # pushed that far, the real limit is higher; "none": never met
    missed_near_limit: int                 # steps with an objective missed at >= LIMIT_NEAR x the figure


@dataclass(frozen=True)
class PeriodPeak:
    start_ms: int
    value: float
    at_ms: int


@dataclass(frozen=True)
class Trend:
    status: str                     # "too-few" | "no-trend" | "rising" | "falling"
    period_ms: int
    confidence: float
    peaks: List[PeriodPeak]
    slope_per_day: Optional[float] = None
    slope_low: Optional[float] = None
    slope_high: Optional[float] = None
    level_now: Optional[float] = None       # the line at the last period
    crosses_at_ms: Optional[int] = None     # when the line reaches the capacity
    crosses_earliest_ms: Optional[int] = None
    crosses_latest_ms: Optional[int] = None
    note: str = ""


@dataclass(frozen=True)
class Target:
    qps: float
    source: str                       # "given" or "peak + headroom"
    replicas_now: int
    replicas_needed: Optional[int]
    capacity_qps: Optional[float]
    margin: Optional[float]           # capacity / target - 1
    enough: Optional[bool]            # None: unknown (no sustainable figure)


@dataclass(frozen=True)
class PrefillWeight:
    """What one prompt token costs in output tokens, and where that number comes from."""

    weight: float
    source: str                        # "fitted": from saturated steps; "slo": capacity.prefill_weight
    saturated_steps: int               # replica-steps at saturation in the range
    level: Optional[float] = None      # fitted: the weighted tokens/s a replica makes at saturation
    low: Optional[float] = None        # fitted: the weight's confidence interval
    high: Optional[float] = None
    note: str = ""


@dataclass(frozen=True)
class Mix:
    """One load mix seen in the range: steps whose prompt tokens per output token fall in
    [lo, hi), what a replica held there, and what it sustains at that mix."""

    lo: float
    hi: float
    steps: int                         # replica-steps with traffic
    first_ms: int
    last_ms: int
    prompt_tokens: float               # mean per request in the mix
    output_tokens: float
    held_qps: float                    # the highest a replica held there (rate window)
    held_tokens_per_second: float      # output tokens/s, the highest a replica held there
    saturated_share: float             # share of its steps saturated (requests waited in most of the rate window)
    within_share: float                # share of its steps within every objective
    capacity_qps: Optional[float]      # what one replica sustains at this mix within every objective
    capacity_tokens_per_second: Optional[float]
    replicas_needed: Optional[int]     # for the target, were all of it this mix


@dataclass(frozen=True)
class Weighted:
    """The capacity in weighted tokens/s (output + weight x prompt)."""

    weight: PrefillWeight
    tokens_per_second: Optional[float]  # sustainable per replica; None: never within the objectives
    at_ms: Optional[int]
    replica: Dict[str, str]
    bound: str                           # as Sustainable.bound
    missed_near_limit: int
    request_cost: Optional[float]        # weight x mean prompt + mean output of the range's mix
    mixes: List[Mix]



def peak(times: np.ndarray, values: np.ndarray, present: np.ndarray) -> Optional[Peak]:
    """The highest value and its (first) time."""
    ok = present & np.isfinite(values)
    if not ok.any():
        return None
    v = np.where(ok, values, -np.inf)
    i = int(np.argmax(v))
    return Peak(float(v[i]), int(times[i]))


def period_peaks(times: np.ndarray, values: np.ndarray, present: np.ndarray, period_ms: int, step_ms: int,
                 min_coverage: float = MIN_COVERAGE) -> List[PeriodPeak]:
    """The peak of each period (aligned to unix time 0: UTC days for 1d) whose samples cover at
    least ``min_coverage`` of its steps."""
    ok = present & np.isfinite(values)
    out: List[PeriodPeak] = []
    if not ok.any():
        return out
    per = times // period_ms
    expected = max(period_ms // step_ms, 1)
    for p in np.unique(per[ok]):
        sel = ok & (per == p)
        if sel.sum() < min_coverage * expected:
            continue
        idx = np.nonzero(sel)[0]
        j = idx[int(np.argmax(values[idx]))]
        out.append(PeriodPeak(int(p * period_ms), float(values[j]), int(times[j])))
    return out


def trend(peaks: Sequence[PeriodPeak], period_ms: int, capacity: Optional[float], confidence: float) -> Trend:
    """A least-squares line through the periodic peaks (x in days); when it reaches ``capacity``."""
    if len(peaks) < MIN_PERIODS:
        return Trend("too-few", period_ms, confidence, list(peaks),
                     note=f"{len(peaks)} full period(s) of {format_duration(period_ms)}; a trend needs {MIN_PERIODS}")
    x = [p.start_ms / DAY_MS for p in peaks]
    y = [p.value for p in peaks]
    fit = linear_fit(x, y)
    lo, hi = fit.slope_interval(confidence)
    last_x = x[-1]
    common = dict(period_ms=period_ms, confidence=confidence, peaks=list(peaks), slope_per_day=fit.slope,
                  slope_low=lo, slope_high=hi, level_now=fit.at(last_x))
    if not fit.significant(confidence):
        return Trend("no-trend", note="the slope's confidence interval contains zero", **common)
    status = "rising" if fit.slope > 0 else "falling"
    if capacity is None:
        return Trend(status, note="no capacity figure to reach", **common)
    cr = crossing(fit, capacity, confidence)

    def ms(d: Optional[float]) -> Optional[int]:
        return None if d is None or not math.isfinite(d) else int(round(d * DAY_MS))

    if status == "falling" and fit.at(last_x) < capacity:
        return Trend(status, note="falling and below the capacity: no crossing ahead", **common)
    note = "the line is already above the capacity" if fit.at(last_x) >= capacity else ""
    return Trend(status, crosses_at_ms=ms(cr.estimate), crosses_earliest_ms=ms(cr.earliest),
                 crosses_latest_ms=ms(cr.latest), note=note, **common)


def curve(points: Points, objectives: Objectives, bins: int = CURVE_BINS) -> List[CurveBin]:
    """The load-latency curve: points binned by tokens/s per replica (equal widths from 0 to the
    highest load), the medians of each bin."""
    x = points.tokens_per_second
    if not len(x) or not np.nanmax(x) > 0:
        return []
    top = float(np.nanmax(x))
    width = top / bins
    idx = np.clip(np.ceil(x / width).astype(np.int64) - 1, 0, bins - 1)
    out = []

    def med(a: np.ndarray) -> Optional[float]:
        a = a[np.isfinite(a)]
        return float(np.median(a)) if len(a) else None

    for b in range(bins):
        sel = idx == b
        if not sel.any():
            continue
        out.append(CurveBin(b * width, (b + 1) * width, int(sel.sum()), float(np.median(x[sel])),
                            med(points.ttft_p95[sel]), med(points.ttft_mean[sel]), med(points.itl_mean[sel]),
                            float(points.within[sel].mean())))
    return out


def sustainable(sustained: Vec, within: Vec, times: np.ndarray, points: Points) -> Sustainable:
    """The best sustained within-objective level over every replica and step, where it was, and
    whether the objectives were missed near it (the limit was reached) or never (a lower bound)."""
    best, at, who = None, None, {}
    if sustained.n:
        v = np.where(sustained.P, sustained.V, -np.inf)
        i, j = np.unravel_index(int(np.argmax(v)), v.shape)
        if np.isfinite(v[i, j]):
            best, at, who = float(v[i, j]), int(times[j]), dict(drop_name(sustained.labels[i]))
    inst = None
    if within.n:
        w = np.where(within.P, within.V, -np.inf)
        if np.isfinite(w.max()):
            inst = float(w.max())
    if best is None or best <= 0:
        return Sustainable(None, None, {}, inst if inst and inst > 0 else None, "none", 0)
    missed = int(((~points.within) & (points.tokens_per_second >= LIMIT_NEAR * best)).sum())
    return Sustainable(best, at, who, inst, "observed" if missed else "lower", missed)


def target(target_qps: Optional[float], peak_qps: Optional[Peak], headroom: float, replicas_now: int,
           per_replica: Optional[float], mean_output: Optional[float]) -> Optional[Target]:
    """Replicas needed for the target rate and the verdict for the replicas serving now.
    ``per_replica`` is what one replica sustains and ``mean_output`` what one request costs, in the
    same unit (weighted tokens: ``w x mean prompt + mean output``; output tokens: the mean output)."""
    if target_qps is not None:
        qps, source = target_qps, "given"
    elif peak_qps is not None:
        qps, source = peak_qps.value * (1 + headroom), "peak + headroom"
    else:
        return None
    if not per_replica or not mean_output:
        return Target(qps, source, replicas_now, None, None, None, None)
    needed = max(1, math.ceil(qps * mean_output / per_replica - 1e-9))
    cap_qps = replicas_now * per_replica / mean_output
    margin = cap_qps / qps - 1 if qps > 0 else None
    return Target(qps, source, replicas_now, needed, cap_qps, margin, replicas_now >= needed)


def fit_prefill_weight(prompt: np.ndarray, output: np.ndarray, saturated: np.ndarray, fallback: float,
                       confidence: float = 0.95) -> PrefillWeight:
    """The prefill weight from saturated steps: at its limit a replica makes ``C = output + w x prompt``
    weighted tokens/s whatever the mix, so at saturation output tokens/s against prompt tokens/s lie
    on a line of slope ``-w``. Whatever else happens on the machine (a noisy neighbour, a slow
    scrape) only lowers a step below that line, so the line is drawn through the best saturated
    step of each load mix (the highest output tokens/s in each band of ``mix_band``): through two
    mixes exactly, through three or more by least squares (with the weight's confidence interval).
    Needs ``MIN_FIT_STEPS`` saturated steps, two mixes whose prompt tokens/s are ``MIN_FIT_SPREAD``
    apart, and a falling line; otherwise ``fallback`` (the SLO's ``capacity.prefill_weight``), with
    the reason."""
    ok = saturated & np.isfinite(prompt) & np.isfinite(output) & (output > 0) & (prompt >= 0)
    n = int(ok.sum())

    def slo(why: str) -> PrefillWeight:
        return PrefillWeight(float(fallback), "slo", n, note=why)

    if n < MIN_FIT_STEPS:
        return slo(f"{n} saturated step(s) (requests waiting in capacity.saturated_share of the rate window); "
                   f"a fit needs {MIN_FIT_STEPS}")
    idx = np.nonzero(ok)[0]
    bands = mix_band(prompt[idx], output[idx])
    best = [idx[bands == b][int(np.argmax(output[idx[bands == b]]))] for b in np.unique(bands)]
    x, y = prompt[best], output[best]
    if len(best) < 2 or x.min() * MIN_FIT_SPREAD > x.max():
        return slo(f"the saturated steps are one mix (prompt tokens/s {prompt[idx].min():.0f} to "
                   f"{prompt[idx].max():.0f}); a fit needs two, {MIN_FIT_SPREAD:g}x apart")
    order = np.argsort(x)
    x, y = x[order], y[order]
    lo = hi = None
    if len(best) == 2:
        slope = float((y[1] - y[0]) / (x[1] - x[0]))
        level = float(y[0] - slope * x[0])
    else:
        fit = linear_fit(x.tolist(), y.tolist())
        slope, level = fit.slope, fit.intercept
        lo, hi = fit.slope_interval(confidence)
    pts = ", ".join(f"{a:.0f} prompt → {b:.0f} output tokens/s" for a, b in zip(x, y))
    if not slope < 0:
        return slo(f"the best saturated steps of {len(best)} mixes ({pts}) do not fall: slope {slope:+.3g}")
    return PrefillWeight(-slope, "fitted", n, level=level, low=None if hi is None else -hi,
                         high=None if lo is None else -lo,
                         note=f"through the best saturated step of each of {len(best)} mixes ({pts}), "
                              f"{n} saturated steps")


def sustained_level(u: np.ndarray, within: np.ndarray, window_steps: int) -> np.ndarray:
    """Per step, the lowest of ``u`` over the last ``window_steps`` steps when every objective held
    at each (0 where one did not), where the replica was there for the whole window and one step
    before it (NaN otherwise): the ``sustained`` recording rule, on the evaluation grid."""
    n = len(u)
    out = np.full(n, np.nan)
    k = max(int(window_steps), 1)
    present = np.isfinite(u)
    level = np.where(within & present, u, 0.0)
    for j in range(k, n):
        if present[j - k:j + 1].all():
            out[j] = level[j - k + 1:j + 1].min()
    return out


def mix_band(prompt: np.ndarray, output: np.ndarray) -> np.ndarray:
    """The load mix of each step: the band of prompt tokens per output token (``MIX_BAND`` apart,
    anchored at 1: ... [0.5, 1) [1, 2) [2, 4) ...), as an integer; a large negative number for
    steps without prompt tokens."""
    with np.errstate(divide="ignore", invalid="ignore"):
        r = prompt / output
        b = np.floor(np.log(r) / math.log(MIX_BAND))
    return np.where(np.isfinite(b), b, -10_000).astype(np.int64)


def load_mixes(times: np.ndarray, prompt: np.ndarray, output: np.ndarray, qps: np.ndarray, saturated: np.ndarray,
               within: np.ndarray, min_steps: int) -> List[Tuple[int, np.ndarray]]:
    """(band, mask) of each load mix with at least ``min_steps`` steps, in order of first time."""
    has = np.isfinite(prompt) & np.isfinite(output) & (output > 0) & np.isfinite(qps) & (qps > 0)
    bands = mix_band(prompt, output)
    found = []
    for b in np.unique(bands[has]):
        sel = has & (bands == b)
        if sel.sum() >= min_steps:
            found.append((int(times[sel].min()), int(b), sel))
    return [(b, sel) for _, b, sel in sorted(found)]


def weighted_capacity(replicas: Sequence[Dict[str, np.ndarray]], times: np.ndarray, weight: PrefillWeight,
                      window_steps: int, mean_prompt: Optional[float], mean_output: Optional[float],
                      target_qps: Optional[float], mix_steps: int = 1) -> Weighted:
    """The weighted capacity of a model from its replicas' series (each a dict of aligned arrays:
    ``labels``, ``output``, ``prompt``, ``qps``, ``saturated``, ``within``)."""
    w = weight.weight
    best, at, who = None, None, {}
    us = []
    for r in replicas:
        u = r["output"] + w * np.where(np.isfinite(r["prompt"]), r["prompt"], 0.0)
        us.append(u)
        lvl = sustained_level(u, r["within"], window_steps)
        if np.isfinite(lvl).any():
            j = int(np.nanargmax(lvl))
            if lvl[j] > 0 and (best is None or lvl[j] > best):
                best, at, who = float(lvl[j]), int(times[j]), dict(r["labels"])
    missed = 0
    if best is not None:
        for r, u in zip(replicas, us):
            missed += int((np.isfinite(u) & ~r["within"] & (u >= LIMIT_NEAR * best)).sum())
    bound = "none" if best is None else ("observed" if missed else "lower")
    cost = w * mean_prompt + mean_output if mean_prompt is not None and mean_output else None

    def cat(key: str) -> np.ndarray:
        return np.concatenate([r[key] for r in replicas]) if replicas else np.empty(0)

    t_all = np.concatenate([times for _ in replicas]) if replicas else np.empty(0, dtype=np.int64)
    p_all, g_all, q_all = cat("prompt"), cat("output"), cat("qps")
    sat_all = cat("saturated").astype(bool) if replicas else np.empty(0, bool)
    win_all = cat("within").astype(bool) if replicas else np.empty(0, bool)
    mixes = []
    for b, sel in load_mixes(t_all, p_all, g_all, q_all, sat_all, win_all, mix_steps):
        q_sum = float(q_all[sel].sum())
        mp, mo = float(p_all[sel].sum()) / q_sum, float(g_all[sel].sum()) / q_sum
        per_req = w * mp + mo
        cq = best / per_req if best and per_req > 0 else None
        lo = 0.0 if b <= -10_000 else MIX_BAND ** b
        mixes.append(Mix(lo, MIX_BAND ** (b + 1) if b > -10_000 else 0.0, int(sel.sum()), int(t_all[sel].min()),
                         int(t_all[sel].max()), mp, mo, float(q_all[sel].max()), float(g_all[sel].max()),
                         float(sat_all[sel].mean()), float(win_all[sel].mean()), cq, cq * mo if cq else None,
                         max(1, math.ceil(target_qps / cq - 1e-9)) if cq and target_qps else None))
    return Weighted(weight, best, at, who, bound, missed, cost, mixes)

