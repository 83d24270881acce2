"""The SLO file: objectives, thresholds and windows, read by the sidecar and the pack alike.

The defaults are a YAML file shipped inside the package (``exporter/slo.yaml``, linked from
``rules/slo.yaml``): the one place where a threshold or a window is written. ``load_slo(path)``
merges a user's file over them (a user's file needs only the keys it changes) and validates the
result against ``SCHEMA``; a wrong value raises ``ConfigError`` with one line naming the key.

The result is a plain nested dict (what the pack's renderers index); ``seconds(...)`` turns a
Prometheus duration into seconds for the sidecar.
"""

from __future__ import annotations

import copy
import math
import re
from functools import lru_cache
from importlib import resources
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import yaml

from .errors import ConfigError

DEFAULTS_FILE = "slo.yaml"
SEVERITIES = ("critical", "warning", "info")

_DURATION_RE = re.compile(r"(\d+(?:ms|s|m|h|d|w|y))+")
_UNIT_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}
_LABEL_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def seconds(duration: str) -> float:
    """A Prometheus duration (``1h30m``, ``90s``) in seconds."""
    s = str(duration).strip()
    if not _DURATION_RE.fullmatch(s):
        raise ValueError(f"{duration!r} is not a Prometheus duration like 5m")
    return sum(int(n) * _UNIT_SECONDS[u] for n, u in re.findall(r"(\d+)(ms|s|m|h|d|w|y)", s))


@lru_cache(maxsize=1)
def _defaults_text() -> str:
    return resources.files("exporter").joinpath(DEFAULTS_FILE).read_text(encoding="utf-8")


def defaults() -> Dict[str, Any]:
    """The built-in SLO (a fresh copy)."""
    return validate_slo(yaml.safe_load(_defaults_text()))


# -- validation ------------------------------------------------------------------------------

Check = Callable[[Any, str], Any]


def _number(lo: float = -math.inf, hi: float = math.inf, open_lo: bool = False, below: Optional[float] = None) -> Check:
    def check(v: Any, where: str) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ConfigError(f"{where}: expected a number, got {v!r}")
        if v < lo or (open_lo and v == lo) or v > hi or (below is not None and v >= below):
            raise ConfigError(f"{where}: {v!r} is out of range")
        return v
    return check


def _duration(v: Any, where: str) -> str:
    s = str(v).strip()
    if isinstance(v, bool) or not _DURATION_RE.fullmatch(s):
        raise ConfigError(f"{where}: {v!r} is not a Prometheus duration like 5m")
    return s


def _text(v: Any, where: str) -> str:
    if not isinstance(v, str):
        raise ConfigError(f"{where}: expected text, got {v!r}")
    return v


def _choice(*choices: str) -> Check:
    def check(v: Any, where: str) -> str:
        if v not in choices:
            raise ConfigError(f"{where}: must be {' or '.join(choices)}, got {v!r}")
        return v
    return check


def _bool(v: Any, where: str) -> bool:
    if not isinstance(v, bool):
        raise ConfigError(f"{where}: expected true or false, got {v!r}")
    return v


def _selector(v: Any, where: str) -> str:
    if not isinstance(v, str) or "{" in v or "}" in v:
        raise ConfigError(f"{where}: expected label matchers without braces, like namespace=\"llm\"")
    return v


def _label_names(v: Any, where: str) -> List[str]:
    if not isinstance(v, list) or not v or not all(isinstance(x, str) and _LABEL_RE.fullmatch(x) for x in v):
        raise ConfigError(f"{where}: expected a list of label names")
    if "model_name" in v:
        raise ConfigError(f"{where}: model_name is added by the pack itself")
    return v


def _outer_labels(v: Any, where: str) -> List[str]:
    if not isinstance(v, list) or not all(isinstance(x, str) and _LABEL_RE.fullmatch(x) for x in v):
        raise ConfigError(f"{where}: expected a list of label names, like [cluster] (or [] for none)")
    if "model_name" in v:
        raise ConfigError(f"{where}: model_name is added by the pack itself")
    return v


def _label_map(v: Any, where: str) -> Dict[str, str]:
    if not isinstance(v, dict):
        raise ConfigError(f"{where}: expected a mapping of label names to values")
    for k, x in v.items():
        if not isinstance(k, str) or not _LABEL_RE.fullmatch(k):
            raise ConfigError(f"{where}.{k}: not a valid label name")
        if not isinstance(x, (str, int, float)) or isinstance(x, bool):
            raise ConfigError(f"{where}.{k}: expected a text value, got {x!r}")
    return {k: str(x) for k, x in v.items()}


def _label_or_empty(v: Any, where: str) -> str:
    if not isinstance(v, str) or (v and not _LABEL_RE.fullmatch(v)):
        raise ConfigError(f"{where}: expected a label name, or \"\" for no cluster variable")
    return v


def _int_list(v: Any, where: str) -> List[int]:
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in v):
        raise ConfigError(f"{where}: expected a list of positive whole numbers")
    return v


def _burn_pairs(v: Any, where: str) -> List[Dict[str, Any]]:
    if not isinstance(v, list) or not v:
        raise ConfigError(f"{where}: expected a list of {{long, short, factor}}")
    out = []
    for i, pair in enumerate(v):
        at = f"{where}[{i}]"
        if not isinstance(pair, dict) or set(pair) != {"long", "short", "factor"}:
            raise ConfigError(f"{at}: expected exactly long, short and factor")
        out.append({"long": _duration(pair["long"], at + ".long"), "short": _duration(pair["short"], at + ".short"),
                    "factor": _number(0, open_lo=True)(pair["factor"], at + ".factor")})
        if seconds(out[-1]["short"]) >= seconds(out[-1]["long"]):
            raise ConfigError(f"{at}: the short window must be shorter than the long one")
    return out


ALERT_KEYS: Dict[str, Check] = {
    "for": _duration,
    "keep_firing_for": _duration,
    "enabled": _bool,
    "severity": _choice(*SEVERITIES),
    "labels": _label_map,
    "annotations": _label_map,
}

# Every leaf of the SLO file and its check. A mapping not listed here is a section whose keys
# are listed one by one; ``alerts`` is checked by ALERT_KEYS.
SCHEMA: Dict[str, Check] = {
    "selector": _selector,
    "replica_labels": _label_names,
    "outer_labels": _outer_labels,
    "runbook_base_url": _text,
    "labels": _label_map,
    "windows.rate": _duration,
    "windows.sustain": _duration,
    "windows.sidecar": _duration,
    "windows.queue_growth": _duration,
    "windows.hardware_errors": _duration,
    "windows.target_seen": _duration,
    "windows.startup": _duration,
    "windows.held_back": _duration,
    "windows.batch_peak": _duration,
    "windows.baseline": _duration,
    "windows.baseline_offset": _duration,
    "windows.baseline_edge": _duration,
    "objectives.ttft_mean_seconds": _number(0, open_lo=True),
    "objectives.ttft_p95_seconds": _number(0, open_lo=True),
    "objectives.output_tokens_per_second": _number(0, open_lo=True),
    "objectives.availability": _number(0, 1, open_lo=True, below=1),
    "availability_sli": _choice("combined", "http", "engine"),
    "http_handlers": _text,
    "burn_rates.page": _burn_pairs,
    "burn_rates.ticket": _burn_pairs,
    "kv_cache.warn": _number(0, 1, open_lo=True),
    "kv_cache.critical": _number(0, 1, open_lo=True),
    "kv_cache.held_back_share": _number(0, 1, open_lo=True),
    "kv_cache.batch_room": _number(0, 1, open_lo=True),
    "long_prompt.tokens": _number(1),
    "long_prompt.surge_factor": _number(1),
    "long_prompt.min_per_second": _number(0),
    "long_prompt.baseline_quantile": _number(0, 1, open_lo=True),
    "queue.min_waiting": _number(0),
    "prefix_cache.min_hit_ratio": _number(0, 1),
    "prefix_cache.fleet_factor": _number(0, 1, open_lo=True),
    "prefix_cache.warmup": _duration,
    "error_ratio.max": _number(0, 1, open_lo=True),
    "outlier.throughput_factor": _number(0, 1, open_lo=True),
    "outlier.ttft_factor": _number(1),
    "outlier.min_replicas": _number(2),
    "gpu_busy_low.busy_utilization": _number(0, 1, open_lo=True),
    "gpu_busy_low.low_throughput_fraction": _number(0, 1, open_lo=True),
    "gpu_busy_low.throughput_floor": _number(0),
    "gpu_busy_low.baseline_horizon": _duration,
    "gpu_busy_low.baseline_quantile": _number(0, 1, open_lo=True),
    "gpu_busy_low.baseline_min_busy": _duration,
    "stall.after": _duration,
    "gpu.fatal_xids": _int_list,
    "dashboards.cluster_label": _label_or_empty,
    "capacity.sustain": _duration,
    "capacity.history": _duration,
    "capacity.peak_window": _duration,
    "capacity.headroom": _number(0),
    "gate.max_regression": _number(0, open_lo=True),
    "gate.min_effect_ms": _number(0),
}
SECTIONS = sorted({k.split(".")[0] for k in SCHEMA if "." in k})


def _get(slo: Mapping[str, Any], path: str) -> Any:
    cur: Any = slo
    for part in path.split("."):
        cur = cur[part]
    return cur


def _set(slo: Dict[str, Any], path: str, value: Any) -> None:
    parts = path.split(".")
    cur = slo
    for part in parts[:-1]:
        cur = cur[part]
    cur[parts[-1]] = value


def validate_slo(slo: Dict[str, Any]) -> Dict[str, Any]:
    """Check every key of a complete SLO (defaults already merged in); returns it normalised."""
    for path, check in SCHEMA.items():
        try:
            value = _get(slo, path)
        except (KeyError, TypeError):
            raise ConfigError(f"{path}: missing") from None
        _set(slo, path, check(value, path))
    if slo["kv_cache"]["critical"] < slo["kv_cache"]["warn"]:
        raise ConfigError("kv_cache.critical: must not be below kv_cache.warn")
    alerts = slo.get("alerts")
    if not isinstance(alerts, dict):
        raise ConfigError("alerts: expected a mapping of alert rules to their settings")
    for name, settings in alerts.items():
        if not isinstance(settings, dict):
            raise ConfigError(f"alerts.{name}: expected a mapping like {{for: 5m}}")
        for key, value in settings.items():
            check = ALERT_KEYS.get(key)
            if check is None:
                raise ConfigError(f"alerts.{name}.{key}: unknown setting (known: {', '.join(ALERT_KEYS)})")
            settings[key] = check(value, f"alerts.{name}.{key}")
    return slo


# -- merging a user's file over the defaults -------------------------------------------------

def _merge(base: Dict[str, Any], over: Mapping[str, Any], path: str = "") -> Dict[str, Any]:
    out = copy.deepcopy(base)
    for k, v in over.items():
        where = f"{path}{k}"
        if k not in base:
            if path == "alerts.":
                raise ConfigError(f"{where}: no such alert rule")
            raise ConfigError(f"{where}: unknown key in the SLO file")
        if isinstance(base[k], dict) and path != "alerts." and k != "labels":
            if not isinstance(v, dict):
                raise ConfigError(f"{where}: expected a mapping")
            out[k] = _merge(base[k], v, where + ".")
        elif path == "alerts.":
            if not isinstance(v, dict):
                raise ConfigError(f"{where}: expected a mapping like {{for: 5m}}")
            out[k] = {**base[k], **v}
        else:
            out[k] = v
    return out


def _legacy(data: Dict[str, Any], path: str) -> Dict[str, Any]:
    """Files written for earlier releases: a top-level ``for: {Alert: 5m}`` map is the ``for``
    of each alert rule."""
    data = dict(data)
    legacy_for = data.pop("for", None)
    if legacy_for is not None:
        if not isinstance(legacy_for, dict):
            raise ConfigError("for: expected a mapping of alert rules to durations")
        alerts = dict(data.get("alerts") or {})
        for name, d in legacy_for.items():
            alerts[name] = {**(alerts.get(name) or {}), "for": d}
        for name in legacy_for:
            if name not in yaml.safe_load(_defaults_text())["alerts"]:
                raise ConfigError(f"for.{name}: no such alert rule")
        data["alerts"] = alerts
    return data


def read_yaml_mapping(path: str, what: str, must: str = "a mapping") -> Dict[str, Any]:
    """A YAML file that holds one mapping (empty: ``{}``); any other content is a ConfigError
    that starts with ``what`` and names the file (and the line, for bad YAML)."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except OSError as exc:
        raise ConfigError(f"{what}: cannot read {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{what}: {path} is not valid YAML{at}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{what}: {path} must hold {must}")
    return data


def read_slo_file(path: str) -> Dict[str, Any]:
    return read_yaml_mapping(path, "slo")


def load_slo(path: Optional[str]) -> Dict[str, Any]:
    """The SLO in ``path`` merged over the defaults (the defaults alone when ``path`` is None)."""
    base = yaml.safe_load(_defaults_text())
    if not path:
        return validate_slo(base)
    return validate_slo(_merge(base, _legacy(read_slo_file(path), path)))


def is_duration(path: str) -> bool:
    """Whether the SLO key at ``path`` holds a duration."""
    return SCHEMA.get(path) is _duration


def alert_settings(slo: Mapping[str, Any], rule_id: str) -> Dict[str, Any]:
    """The settings of one alerting rule (its ``for`` and any overrides)."""
    return dict(slo["alerts"][rule_id])


def durations(slo: Mapping[str, Any]) -> List[Tuple[str, str]]:
    """(path, duration) of every duration in the SLO, for tests that look for stale text."""
    out = [(p, _get(slo, p)) for p, c in SCHEMA.items() if c is _duration]
    for name, settings in slo["alerts"].items():
        for key in ("for", "keep_firing_for"):
            if key in settings:
                out.append((f"alerts.{name}.{key}", settings[key]))
    return out
