"""The postmortem timeline as a PNG: chosen signals over time (one panel per expression, one
line per series), every firing alert shaded behind them, and a lane per alert series below
(firing solid, pending hatched), with the onset marked.

Needs matplotlib (the ``analysis`` extra); drawn with the Agg backend, no display needed.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy as np

from .alerts import runs
from .promql.labels import Labels
from .report import _RELATIVE_BEFORE_MS


@dataclass
class Panel:
    title: str
    labels: List[Labels]
    values: np.ndarray   # (series, steps), NaN where absent


@dataclass
class Lane:
    name: str            # alertname and identifying labels
    alertname: str
    firing: np.ndarray
    pending: np.ndarray


def _series_name(ls: Labels, keep: int = 3) -> str:
    parts = [f"{k}={v}" for k, v in ls if k not in ("__name__", "namespace", "model_name", "job", "instance")]
    return ", ".join(parts[:keep]) or "{}"


def render(path: str, times: np.ndarray, panels: Sequence[Panel], lanes: Sequence[Lane],
           onset_ms: Optional[int] = None, title: str = "backtest") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    relative = len(times) and abs(int(times[-1])) < _RELATIVE_BEFORE_MS
    if relative:
        x = times / 3_600_000.0
        to_x = lambda ms: ms / 3_600_000.0  # noqa: E731
        xlabel = "hours since t=0"
    else:
        x = np.array([_dt.datetime.fromtimestamp(t / 1000, tz=_dt.timezone.utc) for t in times])
        to_x = lambda ms: _dt.datetime.fromtimestamp(ms / 1000, tz=_dt.timezone.utc)  # noqa: E731
        xlabel = "time (UTC)"
    step = int(times[1] - times[0]) if len(times) > 1 else 60_000
    names = sorted({ln.alertname for ln in lanes})
    cmap = plt.get_cmap("tab10" if len(names) <= 10 else "tab20")
    colour = {n: cmap(i % cmap.N) for i, n in enumerate(names)}

    def spans(mask: np.ndarray) -> List[Tuple]:
        return [(to_x(int(times[s])), to_x(int(times[e]) + step)) for s, e in runs(mask)]

    lane_h = 0.28
    heights = [3.0] * len(panels) + [max(1.2, lane_h * len(lanes) + 0.6)]
    fig, axes = plt.subplots(len(heights), 1, sharex=True, figsize=(13, sum(heights) + 1.2),
                             gridspec_kw={"height_ratios": heights}, squeeze=False)
    axes = axes[:, 0]
    any_firing = {n: np.zeros(len(times), bool) for n in names}
    for ln in lanes:
        any_firing[ln.alertname] |= ln.firing
    for ax, panel in zip(axes, panels):
        for ls, vals in zip(panel.labels, panel.values):
            ax.plot(x, vals, linewidth=1.0, label=_series_name(ls))
        for n in names:
            for a, b in spans(any_firing[n]):
                ax.axvspan(a, b, color=colour[n], alpha=0.08, linewidth=0)
        ax.set_title(panel.title, fontsize=9, loc="left")
        if not panel.labels:
            ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center", va="center", color="grey")
        elif len(panel.labels) <= 12:
            ax.legend(fontsize=7, loc="upper left", ncol=min(4, len(panel.labels)))
        ax.grid(alpha=0.3)
    lane_ax = axes[-1]
    for i, ln in enumerate(lanes):
        y = len(lanes) - 1 - i
        for a, b in spans(ln.pending):
            lane_ax.fill_between([a, b], y - 0.35, y + 0.35, color=colour[ln.alertname], alpha=0.25, hatch="//",
                                 linewidth=0)
        for a, b in spans(ln.firing):
            lane_ax.fill_between([a, b], y - 0.35, y + 0.35, color=colour[ln.alertname], alpha=0.9, linewidth=0)
    lane_ax.set_yticks(range(len(lanes)))
    lane_ax.set_yticklabels([ln.name for ln in reversed(lanes)], fontsize=7)
    lane_ax.set_ylim(-0.7, max(len(lanes), 1) - 0.3)
    lane_ax.set_title("alerts (solid: firing, hatched: pending)", fontsize=9, loc="left")
    if not lanes:
        lane_ax.text(0.5, 0.5, "no alert fired or went pending", transform=lane_ax.transAxes, ha="center",
                     va="center", color="grey")
    if len(times):
        lane_ax.set_xlim(x[0], to_x(int(times[-1]) + step))
    if onset_ms is not None:
        for ax in axes:
            ax.axvline(to_x(onset_ms), color="black", linestyle="--", linewidth=1)
        axes[0].annotate("onset", (to_x(onset_ms), 1.0), xycoords=("data", "axes fraction"), fontsize=8,
                         xytext=(3, -10), textcoords="offset points")
    lane_ax.set_xlabel(xlabel)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
