"""Prefill and decode sized apart: the capacity model of a disaggregated fleet (prefill instances
hand their KV cache to decode instances), each side in the unit its work is measured in.

- **prefill**: prompt tokens one instance *computes* per second, after prefix-cache hits
  (``prompt tokens x (1 - hit ratio)``): a cached prefix costs no compute, so the same fleet
  carries more requests as the hit ratio rises. A request needs ``prompt x (1 - hit)`` of them.
- **decode**: output tokens one instance makes per second, speculative decoding included. From
  history that is what the decode instances produced (the speedup is in it; the mean accepted
  length, ``1 + accepted / drafts``, is shown beside it). Planned, it is
  ``capacity.decode_tokens_per_second x speedup``, the speedup being the measured mean accepted
  length where vLLM counted drafts, else ``speculative.planned_speedup`` (0: none, 1.0). A request needs its
  output tokens.

Each per-instance figure comes from history where the history can tell (the best level one
instance of the side held for ``capacity.sustain`` with the side's objectives met: TTFT for
prefill, inter-token latency for decode; the replicas' roles from ``vllm_sidecar_role_info``),
else from the SLO's planned figure, and the report says which. For a target rate and a token mix:
instances per side (rounded up), GPUs (``capacity.prefill_gpus_per_instance`` and
``capacity.decode_gpus_per_instance`` each), what they cost a month, and against a GPU budget
(``--gpus`` or ``capacity.gpus``) whether it fits at all, with the most the budget carries at its
best split. Everything here is pure arithmetic on a few numbers (tests/analysis/test_capacity_sides.py
works the user's own plan by hand).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from .capacity_fit import LIMIT_NEAR, sustained_level

ROLES = ("prefill", "decode")


@dataclass(frozen=True)
class Figure:
    """A number and where it comes from: ``given`` (a flag), ``history``, ``slo`` or ``none``."""

    value: Optional[float]
    source: str
    note: str = ""


@dataclass(frozen=True)
class SideHistory:
    """What the instances of one role did over the range."""

    role: str
    instances: int
    tokens_per_second: Optional[float]   # the best level one instance held for capacity.sustain within objectives
    bound: str                           # "observed": objectives missed just above it; "lower": never; "none"
    at_ms: Optional[int]
    replica: Dict[str, str]
    held_max: Optional[float]            # the highest level any instance reached at any step
    prefix_hit_ratio: Optional[float] = None     # hits over queries of the side's instances, whole range
    mean_accepted_length: Optional[float] = None  # 1 + accepted / drafts (or the sidecar's), whole range
    mean_prompt: Optional[float] = None  # per request, the side's instances, whole range
    mean_output: Optional[float] = None
    peak_qps: Optional[float] = None     # the side's finished requests per second, highest in the range
    peak_at_ms: Optional[int] = None


@dataclass(frozen=True)
class Price:
    """What an instance-hour of each side costs, and from where."""

    currency: str
    source: str                          # "opencost" or "slo"
    per_gpu_hour: Optional[float]        # None with the SLO's replica_hour prices
    prefill_instance_hour: float
    decode_instance_hour: float
    detail: str


@dataclass(frozen=True)
class SidePlan:
    role: str
    needed_tokens_per_second: float
    per_instance: Figure                 # tokens/s one instance sustains (prefill: computed prompt tokens)
    instances: int
    gpus_per_instance: int
    gpus: int
    load: float                          # needed / (instances x per instance)
    monthly: float                       # without the SLO's monthly_fixed
    instances_now: Optional[int] = None


@dataclass(frozen=True)
class SidesPlan:
    qps: Figure
    prompt_tokens: Figure
    output_tokens: Figure
    prefix_hit_ratio: Figure
    speculative_speedup: Figure
    prefill: Optional[SidePlan]
    decode: Optional[SidePlan]
    gpus_budget: Optional[int]
    price: Price
    monthly_fixed: float
    monthly_budget: float
    missing: List[str] = field(default_factory=list)   # what is unknown, so there is no plan
    history: Dict[str, SideHistory] = field(default_factory=dict)

    @property
    def gpus_needed(self) -> Optional[int]:
        return None if self.prefill is None or self.decode is None else self.prefill.gpus + self.decode.gpus

    @property
    def fits(self) -> Optional[bool]:
        """Whether the GPU budget carries the target; None without a budget or a plan."""
        n = self.gpus_needed
        return None if n is None or self.gpus_budget is None else n <= self.gpus_budget

    @property
    def monthly(self) -> Optional[float]:
        if self.prefill is None or self.decode is None:
            return None
        return self.prefill.monthly + self.decode.monthly + self.monthly_fixed

    @property
    def within_money(self) -> Optional[bool]:
        m = self.monthly
        return None if m is None else m <= self.monthly_budget

    def best_split(self) -> Optional[Tuple[float, int, int]]:
        """The most requests/s the GPU budget carries, and its split (prefill, decode instances)."""
        if self.gpus_budget is None or self.prefill is None or self.decode is None:
            return None
        return max_qps(self.gpus_budget, self.prefill.gpus_per_instance, self.decode.gpus_per_instance,
                       self.prefill.per_instance.value, self.decode.per_instance.value,
                       self.prompt_tokens.value * (1 - self.prefix_hit_ratio.value), self.output_tokens.value)


# -- the arithmetic -------------------------------------------------------------------------------------

def instances_for(needed: float, per_instance: float) -> int:
    """Instances that carry ``needed`` tokens/s at ``per_instance`` each: at least one, rounded up
    (a whole number is not rounded up for float noise)."""
    return max(1, math.ceil(needed / per_instance - 1e-9))


def max_qps(gpus: int, gpus_prefill: int, gpus_decode: int, prefill_rate: float, decode_rate: float,
            prefill_cost: float, decode_cost: float) -> Optional[Tuple[float, int, int]]:
    """The most requests/s ``gpus`` carry with whole instances of both sides, and the split:
    ``min(P x prefill_rate / prefill_cost, D x decode_rate / decode_cost)`` over every
    ``P x gpus_prefill + D x gpus_decode <= gpus`` with at least one of each. ``*_cost``: tokens a
    request needs on that side. None when not even one of each fits."""
    best = None
    for p in range(1, gpus // gpus_prefill + 1):
        d = (gpus - p * gpus_prefill) // gpus_decode
        if d < 1:
            break
        q_p = math.inf if prefill_cost <= 0 else p * prefill_rate / prefill_cost
        q_d = math.inf if decode_cost <= 0 else d * decode_rate / decode_cost
        q = min(q_p, q_d)
        if best is None or q > best[0]:
            best = (q, p, d)
    return best


def side_plan(role: str, needed: float, per_instance: Figure, gpus_per_instance: int, instance_hour: float,
              hours_per_month: float, instances_now: Optional[int] = None) -> SidePlan:
    n = instances_for(needed, per_instance.value)
    return SidePlan(role, needed, per_instance, n, gpus_per_instance, n * gpus_per_instance,
                    needed / (n * per_instance.value), n * instance_hour * hours_per_month, instances_now)


def pick(given: Optional[float], history: Optional[float], planned: Optional[float], key: str,
         history_note: str = "") -> Figure:
    """The figure to plan with: a flag's, else history's, else the SLO's (``key``; 0 or absent: unknown)."""
    if given is not None:
        return Figure(float(given), "given")
    if history is not None and math.isfinite(history):
        return Figure(float(history), "history", history_note)
    if planned:
        return Figure(float(planned), "slo", key)
    return Figure(None, "none", key)


def price(slo: Mapping[str, Any], gpus_prefill: int, gpus_decode: int,
          opencost: Optional[Mapping[str, Optional[float]]] = None) -> Price:
    """An instance-hour of each side: from OpenCost's series where the Prometheus has them (the
    GPU nodes' ``node_total_hourly_cost`` over their ``node_gpu_count``: a GPU node is bought whole,
    its CPUs and memory with it; ``node_gpu_hourly_cost``, the GPUs' own share, is said beside it),
    else from the SLO's ``cost`` section at the fleet's price, as the rest of the capacity model."""
    c = slo["cost"]
    oc = opencost or {}
    total, gpu_only = oc.get("node_total_per_gpu_hour"), oc.get("gpu_hour")
    if total:
        detail = (f"OpenCost: the GPU nodes' node_total_hourly_cost over their node_gpu_count, "
                  f"{total:.4g} {c['currency']} per GPU-hour" +
                  (f" (node_gpu_hourly_cost, the GPUs alone: {gpu_only:.4g})" if gpu_only else ""))
        return Price(c["currency"], "opencost", total, total * gpus_prefill, total * gpus_decode, detail)
    if gpu_only:
        detail = f"OpenCost: node_gpu_hourly_cost (the GPUs alone; no node_total_hourly_cost), {gpu_only:.4g} per GPU-hour"
        return Price(c["currency"], "opencost", gpu_only, gpu_only * gpus_prefill, gpu_only * gpus_decode, detail)
    unit = float(c["prices"][c["fleet"]])
    if c["unit"] == "gpu_hour":
        return Price(c["currency"], "slo", unit, unit * gpus_prefill, unit * gpus_decode,
                     f"SLO file: cost.prices.{c['fleet']} {unit:g} {c['currency']} per GPU-hour")
    return Price(c["currency"], "slo", None, unit, unit,
                 f"SLO file: cost.prices.{c['fleet']} {unit:g} {c['currency']} per instance-hour (replica_hour)")


@dataclass(frozen=True)
class Asked:
    """What the command line asked (None: not given)."""

    target_qps: Optional[float] = None
    prompt_tokens: Optional[float] = None
    output_tokens: Optional[float] = None
    gpus: Optional[int] = None
    prefill_gpus_per_instance: Optional[int] = None
    decode_gpus_per_instance: Optional[int] = None
    headroom: Optional[float] = None


def plan(slo: Mapping[str, Any], asked: Asked, history: Optional[Mapping[str, SideHistory]] = None,
         opencost: Optional[Mapping[str, Optional[float]]] = None,
         fallback_mix: Tuple[Optional[float], Optional[float]] = (None, None)) -> SidesPlan:
    """Both sides sized for the target: each figure the flag's, else history's, else the SLO's.
    ``fallback_mix``: the model's mean prompt and output tokens (every replica) where the sides'
    own means are not known."""
    cap, cost = slo["capacity"], slo["cost"]
    hist = dict(history or {})
    pre, dec = hist.get("prefill"), hist.get("decode")
    headroom = float(cap["headroom"] if asked.headroom is None else asked.headroom)
    peak = dec.peak_qps if dec is not None else None
    qps = pick(asked.target_qps, peak * (1 + headroom) if peak else None, None, "--target-qps",
               f"the decode side's peak {peak:.4g} req/s + {headroom:.0%} headroom" if peak else "")
    prompt = pick(asked.prompt_tokens, pre.mean_prompt if pre is not None and pre.mean_prompt else fallback_mix[0],
                  None, "--prompt-tokens", "mean over the range")
    output = pick(asked.output_tokens, dec.mean_output if dec is not None and dec.mean_output else fallback_mix[1],
                  None, "--output-tokens", "mean over the range")
    hit = pick(None, pre.prefix_hit_ratio if pre is not None else None, None, "capacity.prefix_hit_ratio",
               "the prefill instances' prefix-cache hits over queries, whole range")
    if hit.value is None:
        hit = Figure(float(cap["prefix_hit_ratio"]), "slo", "capacity.prefix_hit_ratio")
    speed = pick(None, dec.mean_accepted_length if dec is not None else None, None, "speculative.planned_speedup",
                 "the decode instances' mean accepted length (1 + accepted / drafts), whole range")
    if speed.value is None:  # the same planned speedup the pack's VLLMSpecDecodeAcceptanceLow holds it to
        speed = Figure(float(slo["speculative"]["planned_speedup"]) or 1.0, "slo", "speculative.planned_speedup")
    pr = pick(None, pre.tokens_per_second if pre is not None else None, cap["prefill_tokens_per_second"],
              "capacity.prefill_tokens_per_second",
              "computed prompt tokens/s one prefill instance held within the TTFT objectives")
    planned_dec = float(cap["decode_tokens_per_second"]) * speed.value if cap["decode_tokens_per_second"] else None
    dr = pick(None, dec.tokens_per_second if dec is not None else None, planned_dec, "",
              "output tokens/s one decode instance held within the inter-token objective (speculative decoding "
              "included)")
    if dr.source == "slo":
        dr = Figure(dr.value, "slo", f"capacity.decode_tokens_per_second {float(cap['decode_tokens_per_second']):g} "
                                     f"x speedup {speed.value:.3g}")
    gp = int(asked.prefill_gpus_per_instance or cap["prefill_gpus_per_instance"])
    gd = int(asked.decode_gpus_per_instance or cap["decode_gpus_per_instance"])
    budget = asked.gpus if asked.gpus is not None else (int(cap["gpus"]) or None)
    pc = price(slo, gp, gd, opencost)
    common = dict(gpus_budget=budget, price=pc, monthly_fixed=float(cost["monthly_fixed"]),
                  monthly_budget=float(cost["monthly_budget"]), history=hist)
    missing = [f.note or name for name, f in (("target rate", qps), ("prompt tokens", prompt),
                                              ("output tokens", output), ("prefill rate", pr), ("decode rate", dr))
               if f.value is None]
    if missing:
        return SidesPlan(qps, prompt, output, hit, speed, None, None, missing=missing, **common)
    hpm = float(cost["hours_per_month"])
    p_plan = side_plan("prefill", qps.value * prompt.value * (1 - hit.value), pr, gp, pc.prefill_instance_hour, hpm,
                       pre.instances if pre is not None else None)
    d_plan = side_plan("decode", qps.value * output.value, dr, gd, pc.decode_instance_hour, hpm,
                       dec.instances if dec is not None else None)
    return SidesPlan(qps, prompt, output, hit, speed, p_plan, d_plan, **common)


def verdict(sp: SidesPlan) -> str:
    """One plain sentence, first in the report."""
    if sp.prefill is None or sp.decode is None:
        return "NO PLAN: unknown " + ", ".join(sp.missing)
    p, d = sp.prefill, sp.decode
    need = (f"{sp.qps.value:.4g} req/s of ({sp.prompt_tokens.value:.4g} in, {sp.output_tokens.value:.4g} out) needs "
            f"{sp.gpus_needed} GPUs: {p.instances} prefill instance{'s' * (p.instances != 1)} x {p.gpus_per_instance} "
            f"+ {d.instances} decode instance{'s' * (d.instances != 1)} x {d.gpus_per_instance}")
    if sp.fits is None:
        return f"{need} (no GPU budget given: --gpus or capacity.gpus)"
    best = sp.best_split()
    carry = "not even one instance of each side fits" if best is None else \
        f"{sp.gpus_budget} GPUs carry at most {best[0]:.3g} req/s ({best[1]} prefill + {best[2]} decode)"
    if sp.fits:
        return f"FITS: {need}, within the budget of {sp.gpus_budget}; {carry}"
    return f"IMPOSSIBLE: {need}; the budget is {sp.gpus_budget} GPUs, {carry}"


# -- from history ---------------------------------------------------------------------------------------

def side_history(role: str, replicas: Sequence[Dict[str, Any]], times: np.ndarray, window_steps: int,
                 hit: Optional[float] = None, accepted_length: Optional[float] = None,
                 mean_prompt: Optional[float] = None, mean_output: Optional[float] = None) -> SideHistory:
    """One role's figures from its replicas' aligned series (each ``labels``, ``level``: the side's
    tokens/s per step, ``within``: the side's objectives met per step, ``qps``)."""
    best, at, who, held = None, None, {}, None
    for r in replicas:
        u = r["level"]
        if np.isfinite(u).any():
            top = float(np.nanmax(u))
            held = top if held is None else max(held, top)
        lvl = sustained_level(u, r["within"], window_steps)
        if np.isfinite(lvl).any():
            j = int(np.nanargmax(lvl))
            if lvl[j] > 0 and (best is None or lvl[j] > best):
                best, at, who = float(lvl[j]), int(times[j]), dict(r["labels"])
    missed = 0
    if best is not None:
        for r in replicas:
            u = r["level"]
            missed += int((np.isfinite(u) & ~r["within"] & (u >= LIMIT_NEAR * best)).sum())
    bound = "none" if best is None else ("observed" if missed else "lower")
    pk = pk_at = None
    if replicas:
        q = np.nansum(np.vstack([np.where(np.isfinite(r["qps"]), r["qps"], np.nan) for r in replicas]), axis=0)
        seen = np.any(np.vstack([np.isfinite(r["qps"]) for r in replicas]), axis=0)
        if seen.any():
            j = int(np.argmax(np.where(seen, q, -np.inf)))
            pk, pk_at = float(q[j]), int(times[j])
    return SideHistory(role, len(replicas), best, bound, at, who, held, hit, accepted_length, mean_prompt,
                       mean_output, pk, pk_at)


def pooled_ratio(num: Sequence[Optional[float]], den: Sequence[Optional[float]]) -> Optional[float]:
    """``sum(num) / sum(den)`` over the pairs where both are known and ``den > 0``."""
    pairs = [(a, b) for a, b in zip(num, den) if a is not None and b is not None and b > 0]
    return sum(a for a, _ in pairs) / sum(b for _, b in pairs) if pairs else None
