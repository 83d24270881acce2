"""Health of what watches the replica: vLLM or the sidecar unreachable, and a vLLM input the
sidecar needs gone missing (a vLLM upgrade renamed it)."""

from __future__ import annotations

from typing import List

from .. import conditions, recording_pd
from ..context import TVLLM, Ctx
from .alert import Alert


def alerts(c: Ctx) -> List[Alert]:
    r, s, who = c.per_pod, c.selector, c.who
    n = conditions.names(c)
    return [
        Alert("VLLMTargetDown",
              f"(\nmax by ({r}, target) (vllm_sidecar_target_up{s(TVLLM)}) == 0\n"
              f"and on ({r})\n{n['expected_up']}\nor\n{n['targets_up']} == 0\n)\n"
              f"unless on ({r}) {recording_pd.names(c)['asleep']}",  # asleep: not down
              "critical",
              f"{{{{ $labels.target }}}} unreachable on {who}",
              "target=vllm: the sidecar (or Prometheus) cannot read vLLM's /metrics: the server is down, "
              "restarting or wedged. target=sidecar: the sidecar itself is gone, so the pod is not watched. "
              f"Up is 1, and {{{{ $value }}}} now. Inputs: {c.inputs('up', 'vllm_sidecar_target_up')}"),
        Alert("VLLMSidecarInputMissing",
              f"max by ({r}, metric) (vllm_sidecar_input_missing{s()}) == 1",
              "warning",
              f"vLLM metric {{{{ $labels.metric }}}} missing on {who}",
              "The sidecar needs {{ $labels.metric }} and vLLM serves it under no known name: a vLLM upgrade "
              "renamed or removed it. The signals that depend on it are left out until the alias table knows "
              "the new name. Inputs: " + c.inputs("vllm_sidecar_input_missing")),
    ]
