"""Synthetic vLLM history with known answers, for the capacity model's tests.

A replica runs through phases of constant load; in each phase every request has the same prompt
and output length and lands in one known bucket of each histogram, so every figure the capacity
model computes can be worked out by hand: rates are exact (counters grow linearly, so ``rate()``
extrapolates to the phase's rate), a histogram quantile inside one bucket is the bucket's lower
bound plus the quantile times its width, a mean is the observed value.

``history(...)`` returns OpenMetrics text with a timestamp on every sample (what ``--file``
takes); ``input_series(...)`` the same samples as promtool's ``input_series`` from time 0.
"""

from dataclasses import dataclass
from typing import Dict, List, Sequence

TTFT_BUCKETS = (0.25, 0.5, 1.0, 2.5, 5.0)
TOKEN_BUCKETS = (50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0)


@dataclass
class Phase:
    seconds: int
    requests_per_second: float
    ttft: float                 # every request's time to first token (s)
    itl: float = 0.02           # every inter-token latency (s)
    prompt_tokens: float = 400  # every request's prompt length
    output_tokens: float = 100  # every request's output length
    prefix_hit_ratio: float = 0.5
    spec_accepted_ratio: float = 0.0  # 0: no speculative decoding series at all
    waiting: float = 0.0        # requests waiting (vllm:num_requests_waiting; only when a phase has some)
    gpu_utilization: float = 0.0  # the sidecar's GPU series (one GPU), only when a phase has a utilization:
    power_watts: float = 0.0      # vllm_sidecar_gpu_utilization_ratio and the energy counter (joules)
    role: str = ""                # the sidecar's vllm_sidecar_role_info{role} (pod-level), only when given
    spec_draft_tokens: int = 0    # draft tokens per draft: vllm:spec_decode_num_drafts_total, only when given

    @property
    def tokens_per_second(self) -> float:
        return self.requests_per_second * self.output_tokens


def _fmt_le(b: float) -> str:
    return repr(float(b))


class _Counters:
    def __init__(self) -> None:
        self.c: Dict[str, float] = {}

    def add(self, key: str, v: float) -> None:
        self.c[key] = self.c.get(key, 0.0) + v


def _hist(cnt: _Counters, name: str, buckets: Sequence[float], value: float, n: float) -> None:
    for b in buckets:
        cnt.add(f'{name}_bucket|le="{_fmt_le(b)}"', n if value <= b else 0.0)
    cnt.add(f'{name}_bucket|le="+Inf"', n)
    cnt.add(f"{name}_sum|", value * n)
    cnt.add(f"{name}_count|", n)


def samples(phases: Sequence[Phase], labels: Dict[str, str], start: float, scrape: float = 15.0):
    """(name, labels text, value, timestamp) for every scrape of one replica: the first scrape at
    ``start`` with every counter at 0, then one every ``scrape`` seconds, each adding what the
    phase in force since the previous scrape did."""
    lab = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    cnt = _Counters()
    spec = any(p.spec_accepted_ratio for p in phases)
    steps = [ph for ph in phases for _ in range(int(ph.seconds // scrape))]
    for k in range(len(steps) + 1):
        if k:
            ph = steps[k - 1]
            n = ph.requests_per_second * scrape
            toks = n * ph.output_tokens
            cnt.add("vllm:request_success_total|", n)
            cnt.add("vllm:generation_tokens_total|", toks)
            cnt.add("vllm:prompt_tokens_total|", n * ph.prompt_tokens)
            _hist(cnt, "vllm:time_to_first_token_seconds", TTFT_BUCKETS, ph.ttft, n)
            _hist(cnt, "vllm:inter_token_latency_seconds", TTFT_BUCKETS, ph.itl, toks)
            _hist(cnt, "vllm:request_prompt_tokens", TOKEN_BUCKETS, ph.prompt_tokens, n)
            _hist(cnt, "vllm:request_generation_tokens", TOKEN_BUCKETS, ph.output_tokens, n)
            cnt.add("vllm:prefix_cache_queries_total|", n * ph.prompt_tokens)
            cnt.add("vllm:prefix_cache_hits_total|", n * ph.prompt_tokens * ph.prefix_hit_ratio)
            if spec:
                cnt.add("vllm:spec_decode_num_draft_tokens_total|", toks)
                cnt.add("vllm:spec_decode_num_accepted_tokens_total|", toks * ph.spec_accepted_ratio)
            if ph.spec_draft_tokens:
                cnt.add("vllm:spec_decode_num_drafts_total|", toks / ph.spec_draft_tokens)
        elif not cnt.c:
            ph = steps[0]
            _hist(cnt, "vllm:time_to_first_token_seconds", TTFT_BUCKETS, ph.ttft, 0)
            _hist(cnt, "vllm:inter_token_latency_seconds", TTFT_BUCKETS, ph.itl, 0)
            _hist(cnt, "vllm:request_prompt_tokens", TOKEN_BUCKETS, ph.prompt_tokens, 0)
            _hist(cnt, "vllm:request_generation_tokens", TOKEN_BUCKETS, ph.output_tokens, 0)
            for key in ("vllm:request_success_total|", "vllm:generation_tokens_total|", "vllm:prompt_tokens_total|",
                        "vllm:prefix_cache_queries_total|", "vllm:prefix_cache_hits_total|") + \
                    (("vllm:spec_decode_num_draft_tokens_total|", "vllm:spec_decode_num_accepted_tokens_total|")
                     if spec else ()) + \
                    (("vllm:spec_decode_num_drafts_total|",) if any(p.spec_draft_tokens for p in phases) else ()):
                cnt.add(key, 0.0)
        t = start + k * scrape
        yield ("vllm:num_requests_running", lab, 1.0, t)
        if phases[0].role:
            pod = ",".join(f'{x}="{v}"' for x, v in sorted(labels.items()) if x != "model_name")
            yield ("vllm_sidecar_role_info", pod + f',role="{phases[0].role}"', 1.0, t)
        if any(p.waiting for p in phases):
            yield ("vllm:num_requests_waiting", lab, float(steps[max(k - 1, 0)].waiting), t)
        if any(p.gpu_utilization for p in phases):
            if k:
                cnt.add("energy|", steps[k - 1].power_watts * scrape)
            gpu = ",".join(f'{x}="{v}"' for x, v in sorted(labels.items()) if x != "model_name") + ',gpu="0",uuid="GPU-0"'
            yield ("vllm_sidecar_gpu_info", gpu + ',name="H100",driver_version="550"', 1.0, t)
            yield ("vllm_sidecar_gpu_utilization_ratio", gpu, float(steps[max(k - 1, 0)].gpu_utilization), t)
            yield ("vllm_sidecar_gpu_energy_joules_total", gpu, cnt.c.get("energy|", 0.0), t)
        for key, v in cnt.c.items():
            if key == "energy|":
                continue
            name, extra = key.split("|")
            yield (name, ",".join(x for x in (lab, extra) if x), v, t)


def _all(replicas: Dict[str, Sequence[Phase]], start: float, scrape: float, namespace: str, model: str):
    by: Dict[str, List] = {}
    for pod, phases in replicas.items():
        labels = {"namespace": namespace, "pod": pod, "model_name": model}
        for name, lab, v, t in samples(phases, labels, start, scrape):
            by.setdefault(f"{name}{{{lab}}}", []).append((v, t))
    return by


def history(replicas: Dict[str, Sequence[Phase]], start: float = 1_767_225_600.0, scrape: float = 15.0,
            namespace: str = "llm", model: str = "m") -> str:
    """OpenMetrics text of every replica (pod name -> phases)."""
    lines: List[str] = []
    for series, vts in sorted(_all(replicas, start, scrape, namespace, model).items()):
        lines += [f"{series} {v!r} {t:.3f}" for v, t in vts]
    return "\n".join(lines) + "\n# EOF\n"


def input_series(replicas: Dict[str, Sequence[Phase]], scrape: float = 15.0, namespace: str = "llm",
                 model: str = "m") -> List[dict]:
    """The same history as promtool ``input_series`` (sample k at k x scrape from time 0)."""
    return [{"series": series, "values": " ".join(repr(v) for v, _ in vts)}
            for series, vts in sorted(_all(replicas, 0.0, scrape, namespace, model).items())]
