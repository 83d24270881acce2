"""Prefill/decode disaggregation: KV transfers failing (explicitly, or silently: a decode
instance computing its prompts again), transfers eating the TTFT budget, KV leases expiring, and
one side saturated while the other has room. Each reads the recording rules of
``recording_pd``; none judges an engine that slept within the rate window."""

from __future__ import annotations

from typing import List

from ..context import Ctx
from ..recording_pd import names
from .alert import Alert


def alerts(c: Ctx) -> List[Alert]:
    by, svc, who = c.per_replica, c.per_model, c.who
    n = names(c)
    d = c.slo["disaggregation"]
    awake = f"unless on ({by}) {n['asleep']}"
    slow_at = d["transfer_ttft_share"] * c.slo["objectives"]["ttft_p95_seconds"]

    def side(saturated: str, room: str) -> str:
        return (f"label_replace(max by ({svc}) ({n['side_saturated']}{{role=\"{saturated}\"}})\n"
                f"  and on ({svc}) {n['side_room']}{{role=\"{room}\"}}, \"scale_side\", \"{saturated}\", \"\", \"\")")
    return [
        # explicit failures: vLLM counted them
        Alert("VLLMKVTransferFailing",
              f"{n['failure_ratio']} > {d['transfer_failure_ratio']:g}\n"
              f"and on ({by}) {n['failures']} >= {d['min_failures_per_second']:g}\n{awake}",
              "critical",
              f"KV transfers failing on {who} ({c.model})",
              f"{{{{ $value | humanizePercentage }}}} of KV transfers failed over {c.human(c.rate_window)} (normally 0; pages "
              f"above {d['transfer_failure_ratio']:.0%}). The decode side cannot load the prefill side's KV: "
              f"requests fail or are computed again.",
              labels={"signal": "failed"}),
        # silent failure: a decode instance computes the prompts its KV should have brought
        Alert("VLLMKVTransferFailing",
              f"{n['recomputed']} > {d['recompute_share']:g}\n{awake}",
              "critical",
              f"KV transfers failing silently on {who} ({c.model})",
              f"This decode instance computed {{{{ $value | humanizePercentage }}}} of the prompt tokens its prefix "
              f"cache did not hold (normally about 0%: they arrive by KV transfer from prefill; pages above "
              f"{d['recompute_share']:.0%}). Its transfers fail silently: every request pays a full prefill.",
              rule_id="VLLMKVTransferFailingSilent", labels={"signal": "recomputed"}),
        Alert("VLLMKVTransferSlow",
              f"{n['xfer_p95']} > {slow_at:g}\nand on ({by}) {n['transfers']} > 0\n{awake}",
              "warning",
              f"KV transfers slow on {who} ({c.model})",
              f"KV transfer p95 {{{{ $value | humanizeDuration }}}}, over {slow_at:g}s ({d['transfer_ttft_share']:.0%} "
              f"of the {c.slo['objectives']['ttft_p95_seconds']:g}s TTFT p95 objective; normally a small part of "
              f"it). A decode instance's TTFT includes its KV fetch: the transfer eats the first-token budget."),
        Alert("VLLMKVLeasesExpiring",
              f"{n['expired_share']} > {d['expired_share']:g}\n"
              f"and on ({by}) {n['expired']} >= {d['expired_per_second']:g}\n{awake}",
              "warning",
              f"KV leases expiring on {who} ({c.model})",
              f"The KV of {{{{ $value | humanizePercentage }}}} of this replica's requests expired before the decode "
              f"side read it (normally a few %: clients gone; warns above {d['expired_share']:.0%}). Decode reads "
              f"the prefill side's KV too late: those prefills are wasted and the requests computed again."),
        Alert("VLLMDisaggregationImbalance",
              f"{side('prefill', 'decode')}\nor\n{side('decode', 'prefill')}",
              "warning",
              f"Scale the {{{{ $labels.scale_side }}}} side of {c.model}",
              f"{{{{ $value | humanize }}}} requests wait per {{{{ $labels.scale_side }}}} instance (saturated at "
              f"{d['saturated_waiting']:g}, normally under {d['room_waiting']:g}) while the other side has room: "
              f"none waiting, KV cache below {c.slo['kv_cache']['warn']:.0%}, under {d['room_load']:.0%} of its "
              f"tokens/s. Add {{{{ $labels.scale_side }}}} instances or move one over."),
    ]
