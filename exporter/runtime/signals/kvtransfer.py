"""KV transfer between prefill and decode instances (disaggregation), and whether vLLM's page
agrees with the role the replica was given.

``kv_transfer``: from the KV connector's series (NIXL's, Mooncake's where they match; see
``inputs``), over the window: the failure ratio (failed over failed plus completed transfers, the
completed ones being the transfer-time histogram's count), failures per second by kind
(``transfer``: every failure NIXL counts, handshakes and notifications included; ``notification``:
NIXL's failed notifications, a part of the former), transfer and post time quantiles, bytes and
transfers per second, expired KV leases and notifications after expiry per second, the requests
waiting on an async KV fetch by stage (a gauge, engines summed), the share of prompt tokens that
arrived by KV transfer (``vllm:prompt_tokens_by_source``, which every connector fills: a decode
instance whose share falls to 0 recomputes its prompts, a transfer that failed silently; served
only where the page shows a connector, since every V1 page carries that counter) and the
external prefix-cache hit ratio. A field whose series are absent is None, never 0; a ratio whose
denominator did not move in the window is None.

``role_conflicts``: the page alone cannot tell a replica's role (a ``kv_both`` instance shows the
same connector series as a consumer's), but it can contradict it:

- ``no_kv_consumer``: role ``decode``, yet no ``vllm:num_requests_kv_fetch_by_stage`` series, which
  vLLM serves on every KV consumer (and ``kv_both``) instance: this vLLM receives no KV;
- ``receives_kv``: role ``prefill``, yet prompt tokens arrived by KV transfer in the window
  (``source="external_kv_transfer"`` grew): this instance loads KV computed elsewhere.

A ``kv_both`` page under role ``prefill`` or ``decode`` is never a conflict by itself, nor is any
page under role ``both``.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

from ..rolling import Window, model_hist
from .latency import distribution
from .results import KvTransfer

EXTERNAL_SOURCE = "external_kv_transfer"
# Inputs only a KV connector serves: without any of them the page has no connector, and the share
# of prompt tokens by transfer (whose counter every V1 page carries) is left out, not served as 0
CONNECTOR_INPUTS = ("kv_fetch_by_stage", "kv_xfer_time", "kv_failed_transfers", "kv_expired")


def _rate(view: Window, key: str, model: str) -> Optional[float]:
    if not view.latest.present(key):
        return None
    inc = view.increase(key, model)
    span = view.span_of(key, model)
    if inc is None or span <= 0:
        return None
    return inc / span


def _ratio(num: Optional[float], den: Optional[float]) -> Optional[float]:
    return num / den if num is not None and den else None


def _by_stage(view: Window, model: str) -> Optional[Dict[str, float]]:
    latest = view.latest
    if not latest.present("kv_fetch_by_stage"):
        return None
    out: Dict[str, float] = {}
    for _e, stage, v in latest.by_model.get(("kv_fetch_by_stage", model), ()):
        out[stage] = out.get(stage, 0.0) + v
    return out or None


def transferred_ratio(view: Window, model: str) -> Optional[float]:
    """Prompt tokens that came by KV transfer over prompt tokens from every source, in the window."""
    if not view.latest.present("prompt_tokens_by_source"):
        return None
    by = view.by_extra("prompt_tokens_by_source", model)
    return _ratio(by.get(EXTERNAL_SOURCE, 0.0), sum(by.values()))


def kv_transfer(view: Window, model: str) -> KvTransfer:
    latest = view.latest
    xfer = view.hist("kv_xfer_time", model) if latest.present("kv_xfer_time") else None
    span = view.span
    failed = view.increase("kv_failed_transfers", model) if latest.present("kv_failed_transfers") else None
    ratio = None
    if failed is not None and xfer is not None:
        ratio = _ratio(failed, failed + xfer.count)
    kinds = {kind: r for kind, r in (("transfer", _rate(view, "kv_failed_transfers", model)),
                                     ("notification", _rate(view, "kv_failed_notifications", model)))
             if r is not None}
    sizes = view.hist("kv_bytes", model) if latest.present("kv_bytes") else None
    ext = None
    if latest.present("external_prefix_cache_hits") and latest.present("external_prefix_cache_queries"):
        ext = _ratio(view.increase("external_prefix_cache_hits", model),
                     view.increase("external_prefix_cache_queries", model))
    return KvTransfer(
        failure_ratio=ratio,
        failures_per_second=kinds or None,
        transfer_seconds=distribution(xfer, model_hist(latest, "kv_xfer_time", model)) if xfer else None,
        post_seconds=(distribution(view.hist("kv_post_time", model), model_hist(latest, "kv_post_time", model))
                      if latest.present("kv_post_time") else None),
        bytes_per_second=sizes.sum / span if sizes is not None and span > 0 else None,
        transfers_per_second=xfer.count / span if xfer is not None and span > 0 else None,
        expired_per_second=_rate(view, "kv_expired", model),
        notifications_after_expiry_per_second=_rate(view, "kv_notifications_after_expiry", model),
        waiting_fetch=_by_stage(view, model),
        prompt_tokens_transferred_ratio=(transferred_ratio(view, model)
                                         if any(latest.present(k) for k in CONNECTOR_INPUTS) else None),
        external_prefix_cache_hit_ratio=ext,
    )


def role_conflicts(view: Window, role: str) -> Tuple[str, ...]:
    """Why the page contradicts ``role`` (see the module docstring); () when it does not. Needs a
    window (two reads) for ``receives_kv``; ``no_kv_consumer`` is known from one page."""
    latest = view.latest
    if latest is None or not latest.models:
        return ()
    out = []
    if role == "decode" and not latest.present("kv_fetch_by_stage"):
        out.append("no_kv_consumer")
    if role == "prefill" and view.polls >= 2 and latest.present("prompt_tokens_by_source"):
        if any(view.by_extra("prompt_tokens_by_source", m).get(EXTERNAL_SOURCE, 0.0) > 0 for m in latest.models):
            out.append("receives_kv")
    return tuple(sorted(out))
