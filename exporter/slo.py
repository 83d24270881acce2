"""The SLO file: objectives, thresholds and windows, read by the sidecar and the pack alike.

``load_slo(path)`` merges a user's file over the defaults and validates it; a wrong value raises
``ConfigError`` with one line naming the key.
"""

from __future__ import annotations

import copy
import math
import re
from typing import Any, Dict, Mapping, Optional

import yaml

from .errors import ConfigError

DEFAULT_SLO: Dict[str, Any] = {
    "selector": "",
    "replica_labels": ["namespace", "pod"],
    "runbook_base_url": "https://github.com/vllm-sidecar-exporter/vllm-sidecar-exporter/blob/main/docs/runbooks",
    "objectives": {"ttft_mean_seconds": 1.5, "ttft_p95_seconds": 3.0, "output_tokens_per_second": 30.0,
                   "availability": 0.999},
    "windows": {"rate": "5m", "sustain": "2m"},
    "availability_sli": "http",
    "http_handlers": "/v1/.*",
    "kv_cache": {"warn": 0.90, "critical": 0.95},
    "long_prompt": {"tokens": 4000, "surge_factor": 3.0, "min_per_second": 0.05},
    "queue": {"min_waiting": 10},
    "prefix_cache": {"min_hit_ratio": 0.3},
    "error_ratio": {"max": 0.05},
    "outlier": {"throughput_factor": 0.5, "ttft_factor": 2.0, "min_replicas": 3},
    "for": {
        "VLLMKVCacheExhausted": "5m", "VLLMPreemptionsSustained": "5m", "VLLMTTFTHigh": "10m",
        "VLLMTTFTMeanHigh": "10m", "VLLMInterTokenLatencyHigh": "10m", "VLLMGPUBusyLowThroughput": "3m",
        "VLLMEngineStalled": "2m", "VLLMLongPromptSurge": "2m", "VLLMQueueBuildup": "5m",
        "VLLMCorruptedRequests": "0m", "VLLMErrorBudgetBurnPage": "2m", "VLLMErrorBudgetBurnTicket": "1h",
        "VLLMErrorRatioHigh": "10m", "VLLMTargetDown": "2m", "VLLMSidecarInputMissing": "10m",
        "VLLMReplicaOutlier": "15m", "VLLMPrefixCacheHitRatioLow": "30m", "GPUXidErrors": "0m",
        "GPUThermalThrottling": "10m", "GPUUncorrectableECCErrors": "0m",
    },
    "dashboards": {"cluster_label": "cluster"},
}

def _merge(base: Dict[str, Any], over: Mapping[str, Any], path: str = "") -> Dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        where = f"{path}{k}"
        if k not in base:
            raise ConfigError(f"{where}: unknown key in the SLO file")
        if isinstance(base[k], dict):
            if not isinstance(v, dict):
                raise ConfigError(f"{where}: expected a mapping")
            if k == "for":
                for alert in v:
                    if alert not in base[k]:
                        raise ConfigError(f"{where}.{alert}: no such alert")
            out[k] = _merge(base[k], v, where + ".")
        else:
            out[k] = v
    return out


def _duration(v: Any, where: str) -> str:
    s = str(v).strip()
    if not re.fullmatch(r"(\d+(ms|s|m|h|d|w|y))+", s):
        raise ConfigError(f"{where}: {v!r} is not a Prometheus duration like 5m")
    return s


def load_slo(path: Optional[str]) -> Dict[str, Any]:
    data: Mapping[str, Any] = {}
    if path:
        try:
            with open(path, encoding="utf-8") as fh:
                data = yaml.safe_load(fh) or {}
        except OSError as exc:
            raise ConfigError(f"slo: cannot read {path}: {exc.strerror or exc}") from None
        except yaml.YAMLError:
            raise ConfigError(f"slo: {path} is not valid YAML") from None
        if not isinstance(data, dict):
            raise ConfigError(f"slo: {path} must hold a mapping")
    slo = _merge(DEFAULT_SLO, data)
    return validate_slo(slo)


def validate_slo(slo: Dict[str, Any]) -> Dict[str, Any]:
    def num(path: str, lo: float, hi: float = math.inf, open_lo: bool = False) -> float:
        cur: Any = slo
        for part in path.split("."):
            cur = cur[part]
        if isinstance(cur, bool) or not isinstance(cur, (int, float)):
            raise ConfigError(f"{path}: expected a number, got {cur!r}")
        if cur < lo or (open_lo and cur == lo) or cur > hi:
            raise ConfigError(f"{path}: {cur!r} is out of range")
        return float(cur)

    num("objectives.ttft_mean_seconds", 0, open_lo=True)
    num("objectives.ttft_p95_seconds", 0, open_lo=True)
    num("objectives.output_tokens_per_second", 0, open_lo=True)
    a = num("objectives.availability", 0, 1, open_lo=True)
    if a >= 1:
        raise ConfigError("objectives.availability: must be below 1 (no error budget at 1)")
    num("kv_cache.warn", 0, 1, open_lo=True)
    num("kv_cache.critical", slo["kv_cache"]["warn"], 1)
    num("long_prompt.tokens", 1)
    num("long_prompt.surge_factor", 1)
    num("long_prompt.min_per_second", 0)
    num("queue.min_waiting", 0)
    num("prefix_cache.min_hit_ratio", 0, 1)
    num("error_ratio.max", 0, 1, open_lo=True)
    num("outlier.throughput_factor", 0, 1, open_lo=True)
    num("outlier.ttft_factor", 1)
    num("outlier.min_replicas", 2)
    if slo["availability_sli"] not in ("http", "engine"):
        raise ConfigError("availability_sli: must be http or engine")
    labels = slo["replica_labels"]
    if not isinstance(labels, list) or not labels or not all(isinstance(x, str) and x.isidentifier() for x in labels):
        raise ConfigError("replica_labels: expected a list of label names")
    if "model_name" in labels:
        raise ConfigError("replica_labels: model_name is added by the pack itself")
    cl = slo["dashboards"]["cluster_label"]
    if not isinstance(cl, str) or (cl and not cl.isidentifier()):
        raise ConfigError("dashboards.cluster_label: expected a label name, or \"\" for no cluster variable")
    sel = slo["selector"]
    if not isinstance(sel, str) or "{" in sel or "}" in sel:
        raise ConfigError("selector: expected label matchers without braces, like namespace=\"llm\"")
    for k, v in slo["for"].items():
        slo["for"][k] = _duration(v, f"for.{k}")
    for k, v in slo["windows"].items():
        slo["windows"][k] = _duration(v, f"windows.{k}")
    return slo
