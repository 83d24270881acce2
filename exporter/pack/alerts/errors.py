"""Errors: corrupted (NaN) outputs, a replica's error ratio (a warning, and a page when a large
share fails), and the availability SLO's
multi-window, multi-burn-rate alerts (the SRE workbook's page and ticket pairs)."""

from __future__ import annotations

from typing import List

from ..context import Ctx
from .alert import Alert


def _burn_expr(c: Ctx, pairs, budget: float) -> str:
    ratio = lambda w: c.mrec("vllm_availability_errors", "ratio_rate", w)  # noqa: E731
    terms = []
    for p in pairs:
        limit = f"{p['factor'] * budget:.6g}"
        terms.append((ratio(p["long"]), ratio(p["short"]), limit))
    if len(terms) == 1:
        lng, sht, limit = terms[0]
        return f"{lng} > {limit}\nand on ({c.per_model})\n{sht} > {limit}"
    return "\nor\n".join(f"{lng} > {limit} and on ({c.per_model}) {sht} > {limit}" for lng, sht, limit in terms)


def _pairs_text(pairs) -> str:
    return " or ".join(f"{p['long']}/{p['short']} over {p['factor']:g}x" for p in pairs)


def alerts(c: Ctx) -> List[Alert]:
    by, s, who, W = c.per_replica, c.selector, c.who, c.rate_window
    o = c.slo["objectives"]
    budget = 1 - o["availability"]
    burn = c.slo["burn_rates"]
    er = c.slo["error_ratio"]
    return [
        Alert("VLLMCorruptedRequests",
              f"sum by ({by}) (increase(vllm:corrupted_requests_total{s()}[{W}])) > 0",
              "critical",
              f"vLLM produced corrupted (NaN) outputs on {who} ({c.model})",
              f"{{{{ $value | humanize }}}} requests had NaN logits in the last {c.human(W)} (normally none): "
              "answers are garbage. "
              "Suspect the GPU (check XID and ECC), the weights or a bad kernel; take the replica out."),
        Alert("VLLMErrorBudgetBurn", _burn_expr(c, burn["page"], budget),
              "critical",
              f"{c.model} burning its {o['availability'] * 100:g}% availability budget fast",
              f"Errors are {{{{ $value | humanizePercentage }}}} of requests: at this pace the 30-day error budget "
              f"({budget * 100:.3g}%) is gone in days ({_pairs_text(burn['page'])} the budget rate).",
              rule_id="VLLMErrorBudgetBurnPage", labels={"window": "fast"}),
        Alert("VLLMErrorBudgetBurn", _burn_expr(c, burn["ticket"], budget),
              "warning",
              f"{c.model} spending its availability budget faster than it earns it",
              f"Errors are {{{{ $value | humanizePercentage }}}} of requests over {c.human(burn['ticket'][0]['long'])}, "
              f"above {burn['ticket'][0]['factor']:g}x the {budget * 100:.3g}% budget rate: the SLO will be missed this "
              f"month if nothing changes.",
              rule_id="VLLMErrorBudgetBurnTicket", labels={"window": "slow"}),
        Alert("VLLMErrorRatioHigh",
              f"{c.rec('vllm_availability_errors', 'ratio_rate')} > {er['max']}",
              "warning",
              f"vLLM requests failing on {who} ({c.model})",
              "{{ $value | humanizePercentage }} of this replica's requests failed (the availability SLI's "
              f"count: server errors and errors inside streams, each once; client aborts not counted), where it "
              f"warns above {er['max']:.1%}."),
        # the page tier: one replica failing a large share of its requests pages whatever the fleet's
        # size (in a fleet of many, its errors are diluted in the availability budget, whose burn
        # pages only once the 1 h window fills); a floor on the errors' rate keeps a replica with
        # hardly any traffic from paging on two failures
        Alert("VLLMErrorRatioHigh",
              f"{c.rec('vllm_availability_errors', 'ratio_rate')} > {er['page']}\n"
              f"and on ({by})\n{c.rec('vllm_availability_errors', 'rate')} >= {er['page_min_per_second']}",
              "critical",
              f"vLLM replica {who} failing many of its requests ({c.model})",
              "{{ $value | humanizePercentage }} of this replica's requests failed (the availability SLI's "
              f"count; it pages above {er['page']:.0%}): its clients see the failures now, whatever the fleet's "
              "error budget says.",
              rule_id="VLLMErrorRatioHighPage"),
    ]
