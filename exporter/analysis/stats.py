"""Small statistics for the capacity model and the regression gate, without scipy: Student's t
distribution, an ordinary least-squares line with its standard errors, and where that line
(with its confidence band) crosses a level (Fieller's interval, the classic inverse-regression
answer to "when does the trend reach X, and how sure are we").

Every function is pure and takes plain numbers or sequences.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Sequence


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the regularized incomplete beta function (modified Lentz)."""
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        step = d * c
        h *= step
        if abs(step - 1.0) < 1e-15:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    ln = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    front = math.exp(ln)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    if df <= 0:
        raise ValueError("degrees of freedom must be positive")
    if math.isinf(t):
        return 1.0 if t > 0 else 0.0
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_ppf(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t (bisection on the CDF, to 1e-12)."""
    if not 0.0 < p < 1.0:
        raise ValueError("p must be between 0 and 1")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_ppf(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
        if hi > 1e12:
            return math.inf
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2.0


@dataclass(frozen=True)
class LinearFit:
    """``y = intercept + slope * x`` by ordinary least squares."""

    n: int
    slope: float
    intercept: float
    slope_se: float        # standard error of the slope
    residual_sd: float     # s: the residuals' standard deviation (n - 2 degrees of freedom)
    x_mean: float
    y_mean: float
    sxx: float             # sum of (x - x_mean)^2

    @property
    def df(self) -> int:
        return self.n - 2

    def at(self, x: float) -> float:
        return self.intercept + self.slope * x

    def t_crit(self, confidence: float) -> float:
        return t_ppf(0.5 + confidence / 2.0, self.df)

    def slope_interval(self, confidence: float):
        h = self.t_crit(confidence) * self.slope_se
        return self.slope - h, self.slope + h

    def significant(self, confidence: float) -> bool:
        """Whether the slope's two-sided confidence interval excludes zero."""
        lo, hi = self.slope_interval(confidence)
        return lo > 0 or hi < 0

    def band(self, x: float, confidence: float) -> float:
        """Half-width of the confidence band of the fitted line (the mean response) at ``x``."""
        return self.t_crit(confidence) * self.residual_sd * math.sqrt(1.0 / self.n + (x - self.x_mean) ** 2 / self.sxx)


def linear_fit(x: Sequence[float], y: Sequence[float]) -> LinearFit:
    """Least squares through at least three points with at least two distinct ``x``."""
    n = len(x)
    if n != len(y):
        raise ValueError("x and y differ in length")
    if n < 3:
        raise ValueError("a fit with an uncertainty needs at least 3 points")
    xm = sum(x) / n
    ym = sum(y) / n
    sxx = sum((a - xm) ** 2 for a in x)
    if sxx == 0:
        raise ValueError("every x is the same")
    sxy = sum((a - xm) * (b - ym) for a, b in zip(x, y))
    slope = sxy / sxx
    intercept = ym - slope * xm
    sse = sum((b - intercept - slope * a) ** 2 for a, b in zip(x, y))
    s = math.sqrt(max(sse, 0.0) / (n - 2))
    return LinearFit(n, slope, intercept, s / math.sqrt(sxx), s, xm, ym, sxx)


@dataclass(frozen=True)
class Crossing:
    """Where the fitted line reaches ``level``: the estimate, and the x range in which the level
    lies inside the line's confidence band (``None`` for an open end)."""

    estimate: float
    earliest: Optional[float]
    latest: Optional[float]


def crossing(fit: LinearFit, level: float, confidence: float) -> Optional[Crossing]:
    """Fieller's interval for the x at which the line reaches ``level``: the x where ``level`` is
    inside the confidence band. With ``d = x - x_mean`` and ``m = level - y_mean`` the band's
    edges meet the level where ``(m - slope d)^2 = t^2 (s^2 / n + se^2 d^2)``, a quadratic in d.
    ``None`` when the slope is zero (the line never reaches it)."""
    if fit.slope == 0:
        return None
    est = (level - fit.intercept) / fit.slope
    t = fit.t_crit(confidence)
    m = level - fit.y_mean
    a = fit.slope ** 2 - (t * fit.slope_se) ** 2
    b = -2.0 * m * fit.slope
    c = m * m - (t * fit.residual_sd) ** 2 / fit.n
    if a <= 0:
        # the slope is not significant: the band contains the level out to one side or both
        return Crossing(est, None, None)
    disc = max(b * b - 4 * a * c, 0.0)
    r = math.sqrt(disc)
    d1, d2 = (-b - r) / (2 * a), (-b + r) / (2 * a)
    return Crossing(est, fit.x_mean + min(d1, d2), fit.x_mean + max(d1, d2))
