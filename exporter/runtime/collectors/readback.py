"""A sidecar's ``/metrics`` page read back into the ``Published`` state it was rendered from:
the inverse of the collectors, field by field, through the same tables (``DERIVED``, the GPU
series). ``top --sidecar-url`` shows a running sidecar through it (``view/console.py``), and a
flight record is replayed through it (``analysis/replay.py``)."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple

from ..exposition import parse
from ..gpu import THROTTLE_REASONS, GpuReading, GpuState
from ..signals import (
    Availability,
    BusyLow,
    Caches,
    Distribution,
    KvQueue,
    KvTransfer,
    Latency,
    Lora,
    LoraAdapter,
    ModelSignals,
    Prompts,
    Signals,
    Throughput,
)
from ..state import Published
from .base import PREFIX
from .gpu import GPU_COUNTERS, GPU_GAUGES
from .vllm import DERIVED

# derived series (name without the prefix) -> (ModelSignals part, field), from the collectors' table
SCALARS: Dict[str, Tuple[str, str]] = {n: s.at for n, s in DERIVED.items() if s.at and not s.summary and not s.extra}
DISTRIBUTIONS: Dict[str, Tuple[str, str]] = {n: s.at for n, s in DERIVED.items() if s.at and s.summary}
# read apart: requests_finished_per_second (by finished_reason), engine_stalled, and the three
# series of "GPU busy, tokens low" (baseline, threshold, verdict)
FINISHED = "requests_finished_per_second"
# series with a field path and one extra label: {label value: value} in that field
MAPPINGS: Dict[str, Tuple[str, str]] = {n: s.at for n, s in DERIVED.items() if s.at and s.extra}
# the two series whose label is the value: the capacity waiters' cause, the batch ceiling's source
CAUSE, CEILING = "capacity_wait_cause", "batch_ceiling_requests"
OTHER = tuple(n for n in DERIVED if n not in SCALARS and n not in DISTRIBUTIONS and n not in MAPPINGS
              and n not in (CAUSE, CEILING))
_PARTS = {"throughput": Throughput, "kv": KvQueue, "latency": Latency, "prompts": Prompts, "caches": Caches,
          "kv_transfer": KvTransfer, "availability": Availability}


def _lora_from(each) -> Optional[Lora]:
    """The LoRA state a page's ``lora_*`` series were rendered from (None without them)."""
    def one(name: str) -> Optional[float]:
        vals = [v for _, v in each(name)]
        return vals[0] if vals else None

    known = one("lora_adapters_known")
    if known is None:
        return None
    flags: Dict[str, Dict[str, bool]] = {}
    for key in ("active", "running", "waiting"):
        for lab, v in each(f"lora_adapter_{key}"):
            flags.setdefault(lab["adapter"], {})[key] = v == 1.0
    adapters = tuple(LoraAdapter(name, f.get("active", False), f.get("running"), f.get("waiting"))
                     for name, f in sorted(flags.items()))
    running, waiting, max_adapters = one("lora_adapters_running"), one("lora_adapters_waiting"), one("lora_max_adapters")
    return Lora(max_adapters=None if max_adapters is None else int(max_adapters), adapters=adapters, known=int(known),
                active=int(one("lora_adapters_active") or 0),
                running=None if running is None else int(running), waiting=None if waiting is None else int(waiting),
                distinguished=running is not None)


def published_from_exposition(text: str, t: float) -> Published:
    """The ``Published`` state a sidecar's ``/metrics`` page (text format) was rendered from, as
    far as the page says it: every derived signal, the self-health the view and the collectors
    show, and the GPUs. (Not on the page, so not here: the GPU read errors' messages.)"""
    page = parse(text)
    by_name: Dict[str, List[Tuple[Dict[str, str], float]]] = {}
    for smp in page.samples:
        if smp.name.startswith(PREFIX):
            by_name.setdefault(smp.name[len(PREFIX):], []).append((dict(smp.labels), smp.value))

    def each(name: str):
        return by_name.get(name, [])

    models: Dict[str, Dict[str, Dict[str, Any]]] = {}

    def part(model: str, name: str) -> Dict[str, Any]:
        return models.setdefault(model, {k: {} for k in (*_PARTS, "other")})[name]

    for name, (where, fld) in SCALARS.items():
        for labels, v in each(name):
            part(labels["model_name"], where)[fld] = int(v) if fld == "pressure_level" else v
    for name, (where, fld) in DISTRIBUTIONS.items():
        qs: Dict[str, List[Tuple[float, float]]] = {}
        for labels, v in each(name):
            qs.setdefault(labels["model_name"], []).append((float(labels["quantile"]), v))
        sums = {lab["model_name"]: v for lab, v in each(name + "_sum")}
        counts = {lab["model_name"]: v for lab, v in each(name + "_count")}
        for model in set(qs) | set(counts):
            part(model, where)[fld] = Distribution(tuple(sorted(qs.get(model, []))), count=counts.get(model, 0.0),
                                                   sum=sums.get(model, 0.0))
    for name, (where, fld) in MAPPINGS.items():
        label = DERIVED[name].extra[0]
        for labels, v in each(name):
            part(labels["model_name"], where).setdefault(fld, {})[labels[label]] = v
    for labels, v in each(CAUSE):
        if v == 1.0:
            part(labels["model_name"], "kv")["wait_cause"] = labels["cause"]
    for labels, v in each(CEILING):
        part(labels["model_name"], "kv").update(batch_ceiling=v, ceiling_source=labels["source"])
    for key in OTHER:
        for labels, v in each(key):
            part(labels["model_name"], "other")[key] = v
    out_models = []
    for model in sorted(models):
        parts = models[model]
        other = parts["other"]
        busy = None
        if "gpu_busy_low_throughput" in other:
            busy = BusyLow(baseline=other.get("throughput_baseline_tokens_per_second"),
                           threshold=other.get("throughput_low_threshold_tokens_per_second", 0.0),
                           flagged=other["gpu_busy_low_throughput"] == 1.0)
        stalled = other.get("engine_stalled")
        sleep = other.get("engine_sleep_level")
        out_models.append(ModelSignals(
            model=model, **{k: cls(**parts[k]) for k, cls in _PARTS.items()},
            stalled=None if stalled is None else stalled == 1.0, busy_low=busy,
            sleep_level=None if sleep is None else int(sleep)))
    util = [v for _, v in each("gpu_mean_utilization_ratio")]
    role = next((lab["role"] for lab, _ in each("role_info")), None)
    signals = Signals(gpu_mean_utilization=util[0] if util else None, models=tuple(out_models),
                      lora=_lora_from(each), role=role,
                      role_conflicts=tuple(sorted(lab["reason"] for lab, v in each("role_conflict") if v == 1.0)))

    up = tuple(sorted((lab["target"], v == 1.0) for lab, v in each("target_up")))
    gpu_source = next((lab["collector"] for lab, _ in each("collector_success") if lab["collector"] != "vllm"), "")
    gpu = None
    if PREFIX + "gpu_info" in page.types:
        readings: Dict[Tuple[str, str], GpuReading] = {}
        driver = ""
        for lab, _ in each("gpu_info"):
            readings[(lab["gpu"], lab["uuid"])] = GpuReading(index=int(lab["gpu"]), uuid=lab["uuid"], name=lab["name"])
            driver = lab["driver_version"]

        def reading(lab: Mapping[str, str]) -> GpuReading:
            key = (lab["gpu"], lab["uuid"])
            if key not in readings:
                readings[key] = GpuReading(index=int(lab["gpu"]), uuid=lab["uuid"], name="")
            return readings[key]

        for attr, name, _ in GPU_GAUGES:
            for lab, v in each(name):
                setattr(reading(lab), attr, v)
        for attr, name, _ in GPU_COUNTERS:
            for lab, v in each(name + "_total"):
                setattr(reading(lab), attr, v)
        for lab, v in each("gpu_ecc_errors_total"):
            setattr(reading(lab), f"ecc_{lab['type']}_total", v)
        bits = dict((reason, bit) for bit, reason in THROTTLE_REASONS)
        for lab, v in each("gpu_clock_throttle_active"):
            g = reading(lab)
            g.throttle_reasons = (g.throttle_reasons or 0) | (bits.get(lab["reason"], 0) if v == 1.0 else 0)
        xids = {(int(lab["gpu"]), lab["uuid"], int(lab["xid"])): int(v) for lab, v in each("gpu_xid_errors_total")}
        gpu = GpuState(ok=dict(up).get("gpu", False), gpus=sorted(readings.values(), key=lambda g: g.index),
                       driver_version=driver, xid_totals=xids)
    return Published(
        t=t,
        signals=signals,
        up=up,
        last_success=tuple(sorted((lab["target"], v) for lab, v in each("last_success_timestamp_seconds"))),
        errors_total=tuple(sorted(((lab["target"], lab["reason"]), int(v)) for lab, v in each("poll_errors_total"))),
        input_missing=tuple(sorted((lab["metric"], v == 1.0) for lab, v in each("input_missing"))),
        input_resolved=tuple(sorted((lab["input"], lab["metric"]) for lab, _ in each("input_resolved"))),
        gpu=gpu,
        malformed_lines_total=int(sum(v for _, v in each("parse_malformed_lines_total"))),
        malformed_by_reason=tuple(sorted((lab["reason"], int(v)) for lab, v in each("parse_malformed_lines_total"))),
        vllm_restarts_total=int(sum(v for _, v in each("vllm_restarts_total"))),
        poll_seconds=tuple(sorted((lab["target"], v) for lab, v in each("poll_duration_seconds"))),
        page_bytes=int(sum(v for _, v in each("vllm_page_bytes"))),
        version=next((lab["version"] for lab, _ in each("build_info")), ""),
        gpu_source=gpu_source,
    )
