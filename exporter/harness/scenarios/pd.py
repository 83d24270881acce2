"""Prefill/decode disaggregation, speculative decoding and sleep mode in the fleet scenarios: the
vLLM 0.33 series a pod with a ``role`` writes besides those of ``fleet``, and the sidecar's series
of issue 28 for it.

A pod's role (``Pod.role``): ``prefill`` (a KV producer: the GPU busy on prompts, one output
token per request, its KV read by the decode side), ``decode`` (a KV consumer: its prompts arrive
by transfer, ``prompt_tokens_by_source{source="external_kv_transfer"}``, while it generates;
requests waiting on a KV fetch sit in vLLM's waiting queue and count as ``reason="capacity"``
waiters, as vLLM 0.33's scheduler counts them), or ``both`` (a plain replica on a 0.33 page).
Pods of the older scenarios have no role and write none of this.

vLLM's series (names, labels and histogram bounds from the 0.33 wheel: ``v1/metrics/loggers.py``,
``kv_connector/v1/nixl/stats.py``, ``v1/spec_decode/metrics.py``):
- ``vllm:engine_sleep_state{sleep_state=awake|weights_offloaded|discard_all}``,
  ``vllm:prompt_tokens_by_source_total{source}``, ``vllm:external_prefix_cache_{queries,hits}_total``,
  ``vllm:iteration_tokens_total`` (histogram: one observation per engine step) on every role pod;
- the NIXL family on prefill and decode pods: ``vllm:nixl_xfer_time_seconds``,
  ``vllm:nixl_post_time_seconds``, ``vllm:nixl_bytes_transferred``, ``vllm:nixl_num_descriptors``
  (histograms, observed where the transfer is read: the decode side), ``vllm:nixl_num_failed_transfers_total``,
  ``vllm:nixl_num_failed_notifications_total`` (decode side), ``vllm:nixl_num_kv_expired_reqs_total``,
  ``vllm:nixl_num_notifications_after_expiry_total`` (prefill side);
- ``vllm:num_requests_kv_fetch_by_stage{stage}`` on decode pods (KV consumers only);
- ``vllm:spec_decode_num_{drafts,draft_tokens,accepted_tokens}_total`` and
  ``vllm:spec_decode_num_accepted_tokens_per_pos_total{position}`` on pods with ``spec_tokens``.

The sidecar's series (``sidecar_series``) are those SPEC.md names, derived over the sidecar's
window from the same rates (a rolling mean over the scrape grid): used where the runtime's own
derivations (``sidecar_sim``) do not serve the name, so a runtime that reads these inputs itself
takes over without a change here.
"""

from __future__ import annotations

import math
from typing import Dict, List, Tuple

import numpy as np

from .shapes import lognormal_cdf

ROLES = ("prefill", "decode", "both")
KV_FETCH_STAGES = ("waiting_to_start", "in_progress", "completed_waiting")
SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")
SLEEP_STATES = ("awake", "weights_offloaded", "discard_all")
QUANTILES = (0.5, 0.95, 0.99)
_XFER = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
# the histograms of vLLM's NixlPromMetrics, their bounds as prometheus_client writes them
NIXL_HISTOGRAMS: Dict[str, Tuple[float, ...]] = {
    "vllm:nixl_xfer_time_seconds": _XFER[1:],
    "vllm:nixl_post_time_seconds": _XFER,
    "vllm:nixl_bytes_transferred": tuple(float(2 ** (10 + i)) for i in range(1, 25, 2)),
    "vllm:nixl_num_descriptors": (10.0, 20.0, 30.0, 50.0, 75.0, 100.0, 200.0, 400.0, 1000.0, 2000.0, 4000.0,
                                  10000.0, 20000.0, 50000.0),
}
ITERATION_BOUNDS = (1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0)
Rows = Dict[Tuple[str, Tuple[Tuple[str, str], ...]], np.ndarray]


def le_text(x: float) -> str:
    return "+Inf" if math.isinf(x) else repr(float(x))


def has_connector(pod) -> bool:
    return pod.role in ("prefill", "decode")


def prompt_rate(S: Dict[str, np.ndarray]) -> np.ndarray:
    """Prompt tokens per second, as ``fleet`` counts them."""
    share, ptok, ltok = S["long_share"], S["prompt_tokens"], S["long_tokens"]
    return S["requests"] * ((1 - share) * ptok * math.exp(0.18) + share * ltok)


def by_source(S: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Prompt tokens per second by source: the local prefix cache's hits first, then what the
    connector found (external), the rest computed here."""
    p = prompt_rate(S)
    local = p * S["prefix_hit"]
    ext = (p - local) * S["external_hit"]
    return {"local_cache_hit": local, "external_kv_transfer": ext, "local_compute": np.maximum(p - local - ext, 0.0)}


def spec_rates(pod, S: Dict[str, np.ndarray]) -> Dict[str, object]:
    """drafts, draft tokens, accepted tokens per second and the accepted per position (list)."""
    k = pod.spec_tokens
    pos = [S["spec_accept"] * S["spec_decay"] ** p for p in range(k)]
    accepted_per_draft = sum(pos) if pos else np.zeros_like(S["spec_accept"])
    drafts = S["requests"] * S["output_tokens"] / (1.0 + accepted_per_draft)
    return {"drafts": drafts, "draft_tokens": drafts * k, "accepted": drafts * accepted_per_draft,
            "per_pos": [drafts * a for a in pos]}


def iterations(S: Dict[str, np.ndarray]) -> Tuple[np.ndarray, np.ndarray]:
    """Engine steps per second (one per ``itl`` while anything runs; none asleep or wedged) and
    the mean tokens scheduled per step."""
    steps = np.where((S["running"] > 0) & (S["sleep_level"] == 0), 1.0 / np.maximum(S["itl"], 0.005), 0.0)
    tokens = S["requests"] * S["output_tokens"] + by_source(S)["local_compute"]
    mean = np.where(steps > 0, tokens / np.where(steps > 0, steps, 1.0), 0.0)
    return steps, mean


def series(pod, S: Dict[str, np.ndarray]) -> List[Tuple[str, Dict[str, str], str, np.ndarray]]:
    """Every counter and gauge of the pod beside ``fleet``'s: (vLLM name, extra labels, "c" or
    "g", rate or value per step)."""
    out: List[Tuple[str, Dict[str, str], str, np.ndarray]] = []
    lvl = S["sleep_level"]
    for k, state in enumerate(SLEEP_STATES):
        out.append(("vllm:engine_sleep_state", {"sleep_state": state}, "g", (lvl == k).astype(float)))
    src = by_source(S)
    for s in SOURCES:
        out.append(("vllm:prompt_tokens_by_source_total", {"source": s}, "c", src[s]))
    p = prompt_rate(S)
    queried = p - src["local_cache_hit"] if pod.role == "decode" else 0.0 * p
    out.append(("vllm:external_prefix_cache_queries_total", {}, "c", queried))
    out.append(("vllm:external_prefix_cache_hits_total", {}, "c", queried * S["external_hit"]))
    if has_connector(pod):
        out += [("vllm:nixl_num_failed_transfers_total", {}, "c", S["kv_transfer_failures"]),
                ("vllm:nixl_num_failed_notifications_total", {}, "c", S["kv_notification_failures"]),
                ("vllm:nixl_num_kv_expired_reqs_total", {}, "c", S["kv_expired"]),
                ("vllm:nixl_num_notifications_after_expiry_total", {}, "c", S["kv_notifications_after_expiry"])]
    if pod.role == "decode":
        for stage, col in zip(KV_FETCH_STAGES, ("kv_fetch_waiting", "kv_fetch_in_progress", "kv_fetch_completed")):
            out.append(("vllm:num_requests_kv_fetch_by_stage", {"stage": stage}, "g", S[col]))
    if pod.spec_tokens:
        sp = spec_rates(pod, S)
        out += [("vllm:spec_decode_num_drafts_total", {}, "c", sp["drafts"]),
                ("vllm:spec_decode_num_draft_tokens_total", {}, "c", sp["draft_tokens"]),
                ("vllm:spec_decode_num_accepted_tokens_total", {}, "c", sp["accepted"])]
        for k, r in enumerate(sp["per_pos"]):
            out.append(("vllm:spec_decode_num_accepted_tokens_per_pos_total", {"position": str(k)}, "c", r))
    return out


def histograms(pod, S: Dict[str, np.ndarray]):
    """(vLLM name, bounds, observations per second, cdf(bounds array) -> per step x bound, mean)."""
    steps, mean = iterations(S)
    out = [("vllm:iteration_tokens_total", ITERATION_BOUNDS, steps,
            lambda x: lognormal_cdf(x[None, :], np.maximum(mean, 1.0)[:, None], 0.8), mean)]
    if has_connector(pod):
        n = S["kv_transfers"]
        for name, col, sigma in (("vllm:nixl_xfer_time_seconds", "kv_xfer_time", 0.5),
                                 ("vllm:nixl_post_time_seconds", "kv_post_time", 0.5),
                                 ("vllm:nixl_bytes_transferred", "kv_bytes", 0.4),
                                 ("vllm:nixl_num_descriptors", "kv_descriptors", 0.4)):
            med = S[col]
            out.append((name, NIXL_HISTOGRAMS[name], n,
                        lambda x, med=med, sigma=sigma: lognormal_cdf(x[None, :], med[:, None], sigma),
                        med * math.exp(sigma * sigma / 2)))
    return out


def write_vllm(fleet, pod, S: Dict[str, np.ndarray], up: np.ndarray, lab: Dict[str, str]) -> None:
    """The pod's role series into the fleet's book (``lab``: the scrape's and vLLM's labels)."""
    for name, extra, kind, v in series(pod, S):
        if kind == "c":
            fleet._counter(name, {**lab, **extra}, v, up)
        else:
            fleet.book.put(name, {**lab, **extra}, up, v)
    for name, bounds, rate, cdf, mean in histograms(pod, S):
        xs = np.array([*bounds, math.inf])
        fr = cdf(xs)
        for j, x in enumerate(xs):
            fleet._counter(name + "_bucket", {**lab, "le": le_text(x)}, rate * fr[:, j], up)
        fleet._counter(name + "_sum", lab, rate * mean, up)
        fleet._counter(name + "_count", lab, rate, up)


def _rolling(x: np.ndarray, w: int) -> np.ndarray:
    """Mean of the last ``w`` steps (fewer at the start)."""
    c = np.cumsum(np.concatenate([[0.0], x]))
    i = np.arange(1, len(x) + 1)
    lo = np.maximum(i - w, 0)
    return (c[i] - c[lo]) / (i - lo)


def sidecar_series(pod, S: Dict[str, np.ndarray], step: float, window: float) -> Rows:
    """The sidecar's issue-28 series of a role pod per scrape step (NaN: absent), over ``window``."""
    n = len(S["requests"])
    w = max(1, int(round(window / step)))
    model = {"model_name": pod.model}
    out: Rows = {}

    def put(name: str, labels: Dict[str, str], v, where=None) -> None:
        v = np.broadcast_to(np.asarray(v, dtype=float), (n,)).copy()
        if where is not None:
            v[~where] = np.nan
        out[(name, tuple(sorted(labels.items())))] = v

    R = {k: _rolling(v, w) for k, v in S.items() if k in (
        "kv_transfers", "kv_transfer_failures", "kv_notification_failures", "kv_expired",
        "kv_notifications_after_expiry")}
    put("role_info", {"role": pod.role}, 1.0)
    put("engine_sleep_level", model, S["sleep_level"])
    src = {k: _rolling(v, w) for k, v in by_source(S).items()}
    total = sum(src.values())
    put("prompt_tokens_transferred_ratio", model, src["external_kv_transfer"] / np.where(total > 0, total, 1.0),
        total > 0)
    if pod.role == "decode":
        queried = _rolling(prompt_rate(S) * (1 - S["prefix_hit"]), w)
        hits = _rolling(prompt_rate(S) * (1 - S["prefix_hit"]) * S["external_hit"], w)
        put("external_prefix_cache_hit_ratio", model, hits / np.where(queried > 0, queried, 1.0), queried > 0)
        for stage, col in zip(KV_FETCH_STAGES, ("kv_fetch_waiting", "kv_fetch_in_progress", "kv_fetch_completed")):
            put("requests_waiting_kv_fetch", {**model, "stage": stage}, S[col])
    if has_connector(pod):
        done, failed = R["kv_transfers"], R["kv_transfer_failures"]
        tried = done + failed
        put("kv_transfer_failure_ratio", model, failed / np.where(tried > 0, tried, 1.0), tried > 0)
        put("kv_transfer_failures_per_second", {**model, "kind": "transfer"}, failed)
        put("kv_transfer_failures_per_second", {**model, "kind": "notification"}, R["kv_notification_failures"])
        put("kv_transfers_per_second", model, done)
        put("kv_transfer_bytes_per_second", model, _rolling(S["kv_transfers"] * S["kv_bytes"], w))
        put("kv_expired_requests_per_second", model, R["kv_expired"])
        put("kv_notifications_after_expiry_per_second", model, R["kv_notifications_after_expiry"])
        for name, col in (("kv_transfer_seconds", "kv_xfer_time"), ("kv_transfer_post_seconds", "kv_post_time")):
            # the transfers' median over the window (weighted by count), then the lognormal's quantiles
            med = _rolling(S["kv_transfers"] * S[col], w) / np.where(done > 0, done, 1.0)
            for q in QUANTILES:
                z = {0.5: 0.0, 0.95: 1.6449, 0.99: 2.3263}[q]
                put(name, {**model, "quantile": repr(q)}, med * math.exp(0.5 * z), done > 0)
    if pod.spec_tokens:
        sp = {k: (_rolling(v, w) if not isinstance(v, list) else [_rolling(x, w) for x in v])
              for k, v in spec_rates(pod, S).items()}
        drafts = sp["drafts"]
        some = drafts > 0
        d = np.where(some, drafts, 1.0)
        put("spec_decode_acceptance_ratio", model, sp["accepted"] / np.where(some, sp["draft_tokens"], 1.0), some)
        put("spec_decode_mean_accepted_length", model, 1.0 + sp["accepted"] / d, some)
        for k, r in enumerate(sp["per_pos"]):
            put("spec_decode_position_acceptance_ratio", {**model, "position": str(k)}, r / d, some)
    return out
