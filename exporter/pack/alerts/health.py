"""Health of what watches the replica: vLLM or the sidecar unreachable, and a vLLM input the
sidecar needs gone missing (a vLLM upgrade renamed it)."""

from __future__ import annotations

from typing import List

from ..context import TVLLM, Ctx
from .alert import Alert


def alerts(c: Ctx) -> List[Alert]:
    r, s, who = c.r, c.s, c.who
    seen = c.windows["target_seen"]
    startup = c.seconds(c.windows["startup"])
    # vLLM down as the sidecar sees it, once vLLM has answered this sidecar before, or after the
    # startup grace: a new pod loading its model (minutes for a 70B) is not down
    read_before = f"max by ({r}) (vllm_sidecar_last_success_timestamp_seconds{s(TVLLM)})"
    sidecar_age = f"time() - max by ({r}) (vllm_sidecar_process_start_time_seconds{s()})"
    return [
        Alert("VLLMTargetDown",
              f"(\n(\n  max by ({r}, target) (vllm_sidecar_target_up{s(TVLLM)}) == 0\n"
              f"  and on ({r})\n  ({read_before} or ({sidecar_age}) > {startup:g})\n)\nor\n"
              f"label_replace(\n  max by ({r}) (up{s()} and on ({c.target})"
              f" max_over_time(vllm:num_requests_running{s()}[{seen}])) == 0,\n"
              f"  \"target\", \"vllm\", \"\", \"\"\n)\nor\n"
              f"label_replace(\n  max by ({r}) (up{s()} and on ({c.target})"
              f" max_over_time(vllm_sidecar_build_info{s()}[{seen}])) == 0,\n"
              f"  \"target\", \"sidecar\", \"\", \"\"\n)\n)\n"
              f"unless on ({r}) {c.rec('vllm_engine_asleep', 'max_over_time' + c.W)}",  # asleep: not down (recording_pd)
              "critical",
              f"{{{{ $labels.target }}}} unreachable on {who}",
              "target=vllm: the sidecar (or Prometheus) cannot read vLLM's /metrics: the server is down, "
              "restarting or wedged. target=sidecar: the sidecar itself is gone, so the pod is not watched."),
        Alert("VLLMSidecarInputMissing",
              f"max by ({r}, metric) (vllm_sidecar_input_missing{s()}) == 1",
              "warning",
              f"vLLM metric {{{{ $labels.metric }}}} missing on {who}",
              "The sidecar needs {{ $labels.metric }} and vLLM serves it under no known name: a vLLM upgrade "
              "renamed or removed it. The signals that depend on it are left out until the alias table knows "
              "the new name."),
    ]
