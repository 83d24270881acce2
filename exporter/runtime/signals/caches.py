"""Caches: the prefix-cache hit ratio and speculative decoding's acceptance ratio over the
window (from counters; on releases that only had a lifetime ratio gauge, that gauge)."""

from __future__ import annotations

from typing import Optional

from ..rolling import Window
from .results import Caches


def counter_ratio(view: Window, model: str, num: str, den: str, legacy_gauge: str) -> Optional[float]:
    """Increase of ``num`` over increase of ``den`` in the window; on releases that only had a
    lifetime ratio gauge, that gauge; None when neither is there or nothing was counted."""
    latest = view.latest
    if latest.present(num) and latest.present(den):
        d = view.increase(den, model) or 0.0
        return (view.increase(num, model) or 0.0) / d if d > 0 else None
    if latest.present(legacy_gauge):
        vals = latest.gauge(legacy_gauge, model)
        return max(vals) if vals else None
    return None


def caches(view: Window, model: str) -> Caches:
    return Caches(
        prefix_cache_hit_ratio=counter_ratio(view, model, "prefix_cache_hits", "prefix_cache_queries",
                                             "prefix_cache_hit_rate_legacy"),
        spec_decode_acceptance_ratio=counter_ratio(view, model, "spec_accepted_tokens", "spec_draft_tokens",
                                                   "spec_acceptance_legacy"),
    )
