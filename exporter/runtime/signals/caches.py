"""Caches: the prefix-cache hit ratio and speculative decoding's acceptance ratio over the
window (from counters; on releases that only had a lifetime ratio gauge, that gauge), and, from
``vllm:spec_decode_num_drafts``, the mean accepted length (1 + accepted tokens / drafts: the
tokens one verify step yields, what the speedup is made of) and the acceptance per draft position
(accepted at that position / drafts). None where vLLM does not count drafts or none was made in
the window."""

from __future__ import annotations

from typing import Dict, Optional

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


def spec_decode_lengths(view: Window, model: str) -> "tuple[Optional[float], Optional[Dict[str, float]]]":
    """(mean accepted length, acceptance by position) over the window."""
    latest = view.latest
    if not latest.present("spec_drafts"):
        return None, None
    drafts = view.increase("spec_drafts", model) or 0.0
    if drafts <= 0:
        return None, None
    mean = None
    if latest.present("spec_accepted_tokens"):
        mean = 1.0 + (view.increase("spec_accepted_tokens", model) or 0.0) / drafts
    by_pos = None
    if latest.present("spec_accepted_per_pos"):
        by_pos = {pos: inc / drafts for pos, inc in view.by_extra("spec_accepted_per_pos", model).items()} or None
    return mean, by_pos


def caches(view: Window, model: str) -> Caches:
    mean, by_pos = spec_decode_lengths(view, model)
    return Caches(
        spec_decode_mean_accepted_length=mean,
        spec_decode_position_acceptance=by_pos,
        prefix_cache_hit_ratio=counter_ratio(view, model, "prefix_cache_hits", "prefix_cache_queries",
                                             "prefix_cache_hit_rate_legacy"),
        spec_decode_acceptance_ratio=counter_ratio(view, model, "spec_accepted_tokens", "spec_draft_tokens",
                                                   "spec_acceptance_legacy"),
    )
