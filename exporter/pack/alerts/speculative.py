"""Speculative decoding: acceptance far below what the model's replicas normally accept, or a
mean accepted length below the speedup the SLO plans (the capacity plan counts on it)."""

from __future__ import annotations

from typing import List

from ..context import Ctx
from ..recording_pd import names
from .alert import Alert


def alerts(c: Ctx) -> List[Alert]:
    by, svc, who = c.per_replica, c.per_model, c.who
    n = names(c)
    sp = c.slo["speculative"]
    awake = f"unless on ({by}) {n['asleep']}"
    out = [
        Alert("VLLMSpecDecodeAcceptanceLow",
              f"{n['acceptance']}\n< on ({svc}) group_left ()\n({sp['low_factor']:g} * {n['acceptance_normal']})\n{awake}",
              "warning",
              f"Speculative decoding accepts few drafts on {who} ({c.model})",
              f"{{{{ $value | humanizePercentage }}}} of draft tokens accepted over {c.human(c.rate_window)}, under "
              f"{sp['low_factor']:.0%} of what the model's replicas normally accept (their average over "
              f"{c.human(c.windows['baseline'])}). Decode throughput falls toward no speculation.",
              labels={"signal": "acceptance"}),
    ]
    if sp["planned_speedup"]:
        out.append(Alert(
            "VLLMSpecDecodeAcceptanceLow",
            f"{n['accepted_length']} < {sp['planned_speedup']:g}\n{awake}",
            "warning",
            f"Speculative decoding below the planned speedup on {who} ({c.model})",
            f"{{{{ $value | humanize }}}} tokens per verify step (the mean accepted length, an upper bound of the "
            f"speedup) over {c.human(c.rate_window)}, under the {sp['planned_speedup']:g}x the capacity plan counts on: the "
            f"decode side carries less than planned.",
            rule_id="VLLMSpecDecodeAcceptanceLowPlanned", labels={"signal": "accepted_length"}))
    return out
