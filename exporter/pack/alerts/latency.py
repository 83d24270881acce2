"""Latency: time to first token (p95 and mean) and inter-token latency against the SLO's
objectives, per replica over the rate window."""

from __future__ import annotations

from typing import List

from ..context import Ctx
from .alert import Alert


def alerts(c: Ctx) -> List[Alert]:
    who, W = c.who, c.rate_window
    o = c.slo["objectives"]
    itl = 1.0 / o["output_tokens_per_second"]
    return [
        Alert("VLLMTTFTHigh",
              f"{c.rec('vllm_time_to_first_token_seconds', 'histogram_quantile')}{{quantile=\"0.95\"}} > {o['ttft_p95_seconds']}",
              "warning",
              f"TTFT p95 above {o['ttft_p95_seconds']:g}s on {who} ({c.model})",
              f"Time to first token p95 is {{{{ $value | humanizeDuration }}}} (the sidecar's, over "
              f"{c.windows['sidecar']}; from vLLM's buckets over {W} on a pod without one), above the "
              f"{o['ttft_p95_seconds']:g}s objective."),
        Alert("VLLMTTFTMeanHigh",
              f"{c.rec('vllm_time_to_first_token_seconds', 'mean')} > {o['ttft_mean_seconds']}",
              "warning",
              f"TTFT mean above {o['ttft_mean_seconds']:g}s on {who} ({c.model})",
              f"Mean time to first token over {W} is {{{{ $value | humanizeDuration }}}}, above the "
              f"{o['ttft_mean_seconds']:g}s objective."),
        Alert("VLLMInterTokenLatencyHigh",
              f"{c.rec('vllm_inter_token_latency_seconds', 'mean')} > {itl:.6g}",
              "warning",
              f"Generation slower than {o['output_tokens_per_second']:g} tokens/s per request on {who}",
              f"Mean inter-token latency over {W} is {{{{ $value | humanizeDuration }}}} (objective "
              f"{itl * 1000:.1f}ms, i.e. {o['output_tokens_per_second']:g} tokens/s per request). The batch is too "
              f"large for the GPUs or decoding is starved by prefills."),
    ]
