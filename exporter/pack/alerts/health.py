"""Health of what watches the replica: vLLM or the sidecar unreachable, and a vLLM input the
sidecar needs gone missing (a vLLM upgrade renamed it)."""

from __future__ import annotations

from typing import List

from .. import conditions, recording_pd
from ..context import Ctx
from .alert import Alert


def alerts(c: Ctx) -> List[Alert]:
    r, s, who = c.per_pod, c.selector, c.who
    n = conditions.names(c)
    # their names, asked as the annotations are (while it is pending or firing), never by the expression
    missing = c.show_each("vllm_sidecar_input_missing{P} == 1", "metric", otherwise="inputs")
    return [
        Alert("VLLMTargetDown",
              f"(\n{n['expected_down']}\nor\n{n['targets_down']}\n)\n"
              f"unless on ({r}) {recording_pd.names(c)['asleep']}",  # asleep: not down
              "critical",
              f"{{{{ $labels.target }}}} unreachable on {who}",
              "target=vllm: the sidecar (or Prometheus) cannot read vLLM's /metrics: the server is down, "
              "restarting or wedged. target=sidecar: the sidecar itself is gone, so the pod is not watched. "
              f"Up is 1, and {{{{ $value }}}} now. Inputs: {c.inputs('up', 'vllm_sidecar_target_up')}"),
        Alert("VLLMSidecarInputMissing",
              f"max by ({r}) (vllm_sidecar_inputs_missing{s()}) > 0",
              "warning",
              f"{{{{ $value }}}} vLLM input(s) missing on {who}",
              f"The sidecar needs {missing}and vLLM serves them under no known name: a vLLM upgrade "
              "renamed or removed them. The signals that depend on them are left out until the alias table knows "
              "the new names. Inputs: " + c.inputs("vllm_sidecar_input_missing")),
    ]
