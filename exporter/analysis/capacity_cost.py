"""What the fleet costs, from the SLO file's ``cost`` section and the capacity model's figures.

Pure arithmetic, each figure from a few numbers (tests work every one by hand):

- a replica-hour costs ``price x GPUs per replica`` (``cost.unit: gpu_hour``; GPUs per replica
  from the sidecar's own count of the pod's GPUs where Prometheus has it, else
  ``cost.gpus_per_replica``) or ``price`` (``replica_hour``), at the price of how the fleet is
  bought (``cost.fleet``: reserved, on_demand or spot);
- a month: replicas x replica-hour x ``cost.hours_per_month`` + ``cost.monthly_fixed``, for the
  replicas serving now and for the replicas the target needs, the latter against
  ``cost.monthly_budget``;
- per million output tokens and per thousand requests at the observed load (what the range cost,
  replica-hours it ran times the price, over what it served) and at the sustainable load (one
  replica-hour over what one replica sustains in an hour at the range's mix);
- spot: ``cost.spot_share`` of the replicas on spot prices; the saving, and the risk: spot
  capacity can be reclaimed at short notice, and with the spot replicas gone at once what the
  others sustain against the target.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Optional


@dataclass(frozen=True)
class Prices:
    currency: str
    fleet: str                   # how the replicas serving now are bought
    replica_hour: float          # at the fleet's price
    spot_replica_hour: float
    gpus_per_replica: Optional[float]   # None with replica_hour prices
    gpus_source: str             # "sidecar": counted from vllm_sidecar_gpu_info; "slo": cost.gpus_per_replica; ""
    unit_prices: Mapping[str, float]
    unit: str
    hours_per_month: float
    monthly_fixed: float
    monthly_budget: float
    spot_share: float


@dataclass(frozen=True)
class Spot:
    share: float
    replicas: int                # replicas moved to spot (the share of those the target needs, rounded up)
    monthly: float               # the needed fleet's month with them on spot
    saving: float                # against all of them at the fleet's price
    saving_share: float
    capacity_left_qps: Optional[float]   # what the other replicas sustain with every spot replica reclaimed
    enough_without_spot: Optional[bool]  # ... against the target
    risk: str


@dataclass(frozen=True)
class ModelCost:
    prices: Prices
    replicas_now: int
    monthly_now: float
    replicas_needed: Optional[int]
    monthly_needed: Optional[float]
    within_budget: Optional[bool]        # the needed fleet's month against the budget
    budget_margin: Optional[float]       # budget / monthly_needed - 1
    observed_hours: float                # replica-hours in the range
    observed_cost: float                 # what they cost (without the fixed monthly part)
    per_million_output_observed: Optional[float]
    per_thousand_requests_observed: Optional[float]
    per_million_output_sustainable: Optional[float]
    per_thousand_requests_sustainable: Optional[float]
    spot: Optional[Spot]


def prices(slo: Mapping[str, Any], gpus_seen: Optional[float] = None) -> Prices:
    """The SLO's prices per replica-hour; ``gpus_seen``: GPUs per replica the sidecars report."""
    c = slo["cost"]
    unit_prices = dict(c["prices"])
    if c["unit"] == "gpu_hour":
        gpus, src = (float(gpus_seen), "sidecar") if gpus_seen else (float(c["gpus_per_replica"]), "slo")
    else:
        gpus, src = None, ""
    per = gpus if gpus is not None else 1.0
    return Prices(c["currency"], c["fleet"], unit_prices[c["fleet"]] * per, unit_prices["spot"] * per, gpus, src,
                  unit_prices, c["unit"], float(c["hours_per_month"]), float(c["monthly_fixed"]),
                  float(c["monthly_budget"]), float(c["spot_share"]))


def monthly(p: Prices, replicas: float, replica_hour: Optional[float] = None) -> float:
    return replicas * (p.replica_hour if replica_hour is None else replica_hour) * p.hours_per_month + p.monthly_fixed


def spot(p: Prices, replicas_needed: int, per_replica_qps: Optional[float], target_qps: Optional[float]) -> Spot:
    """``p.spot_share`` of the needed replicas (rounded up) on spot prices."""
    k = min(replicas_needed, math.ceil(p.spot_share * replicas_needed - 1e-9)) if p.spot_share > 0 else 0
    full = monthly(p, replicas_needed)
    with_spot = (replicas_needed - k) * p.replica_hour * p.hours_per_month + \
        k * p.spot_replica_hour * p.hours_per_month + p.monthly_fixed
    saving = full - with_spot
    left = (replicas_needed - k) * per_replica_qps if per_replica_qps is not None else None
    enough = None if left is None or target_qps is None else left >= target_qps
    if k == 0:
        risk = "no replica on spot: no saving, no reclaim risk"
    else:
        rest = "" if left is None else \
            f"; with the {k} spot replica{'' if k == 1 else 's'} reclaimed at once the other " \
            f"{replicas_needed - k} sustain {left:.3g} req/s" + \
            ("" if target_qps is None else f" against the target {target_qps:.3g} req/s: " +
             ("still enough" if enough else "NOT enough until replacements have loaded the model"))
        risk = (f"spot capacity can be reclaimed at short notice (latency rises while replacements start and load "
                f"the model){rest}")
    return Spot(p.spot_share, k, with_spot, saving, saving / full if full > 0 else 0.0, left, enough, risk)


def model_cost(p: Prices, replicas_now: int, replicas_needed: Optional[int], observed_replica_hours: float,
               observed_output_tokens: Optional[float], observed_requests: Optional[float],
               per_replica_qps: Optional[float], mean_output: Optional[float],
               target_qps: Optional[float]) -> ModelCost:
    """Every cost figure of one model. ``per_replica_qps``: what one replica sustains at the range's
    mix (req/s); ``observed_*``: over the range."""
    now = monthly(p, replicas_now)
    need = monthly(p, replicas_needed) if replicas_needed is not None else None
    within = None if need is None else need <= p.monthly_budget
    margin = None if need is None or need <= 0 else p.monthly_budget / need - 1
    cost = observed_replica_hours * p.replica_hour

    def per(n: Optional[float], scale: float) -> Optional[float]:
        return cost / n * scale if n and n > 0 else None

    sus_tok = per_replica_qps * mean_output * 3600 if per_replica_qps and mean_output else None
    sus_req = per_replica_qps * 3600 if per_replica_qps else None
    return ModelCost(
        p, replicas_now, now, replicas_needed, need, within, margin, observed_replica_hours, cost,
        per(observed_output_tokens, 1e6), per(observed_requests, 1e3),
        p.replica_hour / sus_tok * 1e6 if sus_tok else None, p.replica_hour / sus_req * 1e3 if sus_req else None,
        spot(p, replicas_needed, per_replica_qps, target_qps) if replicas_needed else None)
