"""Configuration: command-line flags, ``VLLM_SIDECAR_*`` environment variables and a YAML file.

Precedence: flags win over the environment, the environment over the file, the file over the
defaults. ``FIELDS`` is the single table from which the flags, the environment names, the README
table and the validation are all made.

Thresholds and windows are not written here: their defaults come from the SLO file (``--slo``,
else the built-in one, ``exporter/slo.yaml``), the same file the alerting pack is rendered
from, so the sidecar and the rules agree. A field with ``slo=`` names its key there; setting the
field (flag, environment or config file) overrides the SLO for this sidecar only.

A bad value raises ``ConfigError`` whose message is one line naming the key and what is wrong;
the command line turns it into exit status 2.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields as dc_fields
from typing import Any, Dict, List, Mapping, Optional, Tuple
from urllib.parse import urlsplit, urlunsplit

import yaml

from ..errors import ConfigError
from ..slo import is_duration, load_slo, seconds

ENV_PREFIX = "VLLM_SIDECAR_"


@dataclass(frozen=True)
class Field:
    key: str
    kind: str  # float, int, str, choice, bool, list
    default: Any
    doc: str
    lo: Optional[float] = None
    hi: Optional[float] = None
    choices: Tuple[str, ...] = ()
    lo_open: bool = False  # lo excluded
    secret: bool = False
    flag: bool = True
    slo: str = ""  # the SLO key this field's default comes from ("" : the default above)


FIELDS: Tuple[Field, ...] = (
    Field("vllm_url", "str", "http://127.0.0.1:8000",
          "vLLM base URL; `/metrics` is appended when the URL has no path"),
    Field("listen", "str", "0.0.0.0:9181", "where the sidecar serves /metrics, /healthz, /readyz"),
    Field("poll_interval", "float", 2.0, "seconds between reads of vLLM and the GPUs", lo=0.05, hi=300),
    Field("window", "float", None, "sliding window of every derived rate, ratio and quantile (s)",
          lo=1, hi=3600, slo="windows.sidecar"),
    Field("gpu", "choice", "auto", "`auto`: NVML when it loads, else no GPU series; `nvml`: NVML "
          "required (failures reported); `dcgm`: this pod's GPUs from the node's dcgm-exporter; `none`: "
          "no GPU reading", choices=("auto", "nvml", "dcgm", "none")),
    Field("dcgm_url", "str", "", "dcgm-exporter's /metrics for `--gpu dcgm`, e.g. http://$(HOST_IP):9400/metrics"),
    Field("pod_name", "str", "", "this pod's name, for `--gpu dcgm` (downward API: metadata.name)"),
    Field("pod_namespace", "str", "", "this pod's namespace, for `--gpu dcgm` (downward API: metadata.namespace)"),
    Field("gpu_devices", "list", [], "GPU indices or UUIDs to read; empty: those in "
          "NVIDIA_VISIBLE_DEVICES when it lists some, else every GPU NVML shows"),
    Field("vllm_timeout", "float", 0.0, "seconds one read of vLLM may take; 0: 80% of the poll "
          "interval, at most 10 s; must be shorter than the poll interval", lo=0, hi=300),
    Field("vllm_max_page_bytes", "int", 8 * 1024 * 1024,
          "largest vLLM page accepted (bytes, after decompression)", lo=1024, hi=1 << 31),
    Field("vllm_bearer_token", "str", "", "bearer token for a protected /metrics (never logged)",
          secret=True),
    Field("vllm_bearer_token_file", "str", "", "file holding the bearer token, re-read on each "
          "poll (for mounted Kubernetes secrets)"),
    Field("log_format", "choice", "text", "log line format", choices=("text", "json")),
    Field("log_level", "choice", "info", "lowest level logged",
          choices=("debug", "info", "warning", "error")),
    Field("slo", "str", "", "the SLO file (YAML) the thresholds below default to; empty: the built-in "
          "one (exporter/slo.yaml, the same defaults the alerting pack renders)"),
    Field("kv_warn_threshold", "float", None, "KV usage at or above which pressure is `elevated` (1)",
          lo=0, hi=1, lo_open=True, slo="kv_cache.warn"),
    Field("busy_utilization", "float", None, "mean GPU utilization at or above which the pod is busy",
          lo=0, hi=1, lo_open=True, slo="gpu_busy_low.busy_utilization"),
    Field("low_throughput_fraction", "float", None, "busy pod flagged when generation tokens/s fall "
          "below this fraction of its learned baseline", lo=0, hi=1, lo_open=True,
          slo="gpu_busy_low.low_throughput_fraction"),
    Field("throughput_floor", "float", None, "tokens/s below which a busy pod is flagged while no "
          "baseline is learned yet", lo=0, slo="gpu_busy_low.throughput_floor"),
    Field("baseline_horizon", "float", None, "seconds of busy history the baseline learns from",
          lo=60, hi=7 * 86400, slo="gpu_busy_low.baseline_horizon"),
    Field("baseline_quantile", "float", None, "percentile of busy-time throughput taken as normal",
          lo=0, hi=1, lo_open=True, slo="gpu_busy_low.baseline_quantile"),
    Field("baseline_min_seconds", "float", None, "busy seconds needed before the learned baseline "
          "replaces the floor", lo=0, slo="gpu_busy_low.baseline_min_busy"),
    Field("long_prompt_tokens", "float", None, "prompt length above which a request is long",
          lo=1, slo="long_prompt.tokens"),
    Field("stall_seconds", "float", None, "requests running and no token for this long: stalled",
          lo=1, slo="stall.after"),
    Field("slo_ttft_p95_seconds", "float", None, "TTFT p95 objective (s)", lo=0, lo_open=True,
          slo="objectives.ttft_p95_seconds"),
    Field("slo_output_tokens_per_second", "float", None, "per-request generation speed objective; "
          "the inter-token latency objective is its inverse", lo=0, lo_open=True,
          slo="objectives.output_tokens_per_second"),
    Field("max_models", "int", 16, "most models (model_name) taken from one vLLM page; more are left "
          "out, counted and named in the log", lo=1, hi=1024),
    Field("max_engines", "int", 64, "most data-parallel engines (engine label) taken from one vLLM "
          "page", lo=1, hi=4096),
    Field("max_label_values", "int", 32, "most values of an extra label (finished_reason, reason) "
          "taken per input and model", lo=1, hi=1024),
)
# Keys of earlier releases that now live only in the SLO file: a clear error, not "unknown key".
MOVED: Dict[str, str] = {
    "kv_critical_threshold": "kv_cache.critical",
    "slo_ttft_mean_seconds": "objectives.ttft_mean_seconds",
}
FIELD_BY_KEY: Dict[str, Field] = {f.key: f for f in FIELDS}


@dataclass(frozen=True)
class Config:
    vllm_url: str
    listen: str
    poll_interval: float
    window: float
    gpu: str
    dcgm_url: str
    pod_name: str
    pod_namespace: str
    gpu_devices: Tuple[str, ...]
    vllm_timeout: float
    vllm_max_page_bytes: int
    vllm_bearer_token: str
    vllm_bearer_token_file: str
    log_format: str
    log_level: str
    slo: str
    kv_warn_threshold: float
    busy_utilization: float
    low_throughput_fraction: float
    throughput_floor: float
    baseline_horizon: float
    baseline_quantile: float
    baseline_min_seconds: float
    long_prompt_tokens: float
    stall_seconds: float
    slo_ttft_p95_seconds: float
    slo_output_tokens_per_second: float
    max_models: int = 16
    max_engines: int = 64
    max_label_values: int = 32

    @property
    def metrics_url(self) -> str:
        return metrics_url(self.vllm_url)

    @property
    def listen_host_port(self) -> Tuple[str, int]:
        return split_listen(self.listen)

    @property
    def slo_itl_seconds(self) -> float:
        return 1.0 / self.slo_output_tokens_per_second

    def redacted(self) -> Dict[str, Any]:
        out = {}
        for f in dc_fields(self):
            v = getattr(self, f.name)
            spec = FIELD_BY_KEY.get(f.name)
            if spec is not None and spec.secret and v:
                v = "<redacted>"
            if f.name == "vllm_url":
                v = redact_url(v)
            out[f.name] = v
        return out


def env_name(key: str) -> str:
    return ENV_PREFIX + key.upper()


def flag_name(key: str) -> str:
    return "--" + key.replace("_", "-")


def metrics_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.path in ("", "/"):
        parts = parts._replace(path="/metrics")
    return urlunsplit(parts)


def redact_url(url: str) -> str:
    parts = urlsplit(url)
    if parts.password or parts.username:
        host = parts.hostname or ""
        if parts.port:
            host += f":{parts.port}"
        parts = parts._replace(netloc="<redacted>@" + host)
    return urlunsplit(parts)


def split_listen(value: str) -> Tuple[str, int]:
    m = re.fullmatch(r"\[?([^\]]*?)\]?:(\d+)", value.strip())
    if not m:
        raise ConfigError(f"listen: {value!r} is not HOST:PORT")
    port = int(m.group(2))
    if not 0 <= port <= 65535:
        raise ConfigError(f"listen: port {port} out of range 0-65535")
    return (m.group(1) or "0.0.0.0"), port


def _convert(spec: Field, raw: Any, origin: str) -> Any:
    where = f"{spec.key} (from {origin})"
    if spec.kind in ("float", "int"):
        if isinstance(raw, bool):
            raise ConfigError(f"{where}: expected a number, got {raw!r}")
        try:
            v = float(raw) if spec.kind == "float" else int(str(raw).strip(), 0) if isinstance(raw, str) else int(raw)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: expected a number, got {raw!r}") from None
        if spec.kind == "int" and isinstance(raw, float) and raw != int(raw):
            raise ConfigError(f"{where}: expected a whole number, got {raw!r}")
        if isinstance(v, float) and not math.isfinite(v):
            raise ConfigError(f"{where}: must be finite, got {raw!r}")
        if spec.lo is not None and (v < spec.lo or (spec.lo_open and v == spec.lo)):
            op = ">" if spec.lo_open else ">="
            raise ConfigError(f"{where}: must be {op} {spec.lo:g}, got {raw!r}")
        if spec.hi is not None and v > spec.hi:
            raise ConfigError(f"{where}: must be <= {spec.hi:g}, got {raw!r}")
        return v
    if spec.kind == "choice":
        v = str(raw).strip().lower()
        if v not in spec.choices:
            raise ConfigError(f"{where}: must be one of {', '.join(spec.choices)}, got {raw!r}")
        return v
    if spec.kind == "list":
        if isinstance(raw, str):
            items = [p.strip() for p in raw.split(",") if p.strip()]
        elif isinstance(raw, (list, tuple)):
            items = [str(p).strip() for p in raw]
        else:
            raise ConfigError(f"{where}: expected a list, got {raw!r}")
        return tuple(items)
    if not isinstance(raw, (str, int, float)) or isinstance(raw, bool):
        raise ConfigError(f"{where}: expected text, got {raw!r}")
    return str(raw)


def load_file(path: str) -> Dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except OSError as exc:
        raise ConfigError(f"config: cannot read {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"config: {path} is not valid YAML{at}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config: {path} must hold a mapping of keys to values")
    out = {}
    for k, v in data.items():
        key = str(k).replace("-", "_")
        if key in MOVED:
            raise ConfigError(f"{k}: moved to the SLO file as {MOVED[key]} (give the file with --slo)")
        if key not in FIELD_BY_KEY:
            raise ConfigError(f"{k}: unknown key in {path}")
        out[key] = v
    return out


def build(flags: Mapping[str, Any], env: Mapping[str, str], config_file: Optional[str] = None) -> Config:
    """Merge defaults, file, environment and flags (None means "not given") into a Config."""
    raw: Dict[str, Tuple[Any, str]] = {f.key: (f.default, "default") for f in FIELDS}
    if config_file is None:
        config_file = flags.get("config") or env.get(env_name("config")) or None
    if config_file:
        for k, v in load_file(config_file).items():
            raw[k] = (v, f"file {config_file}")
    for f in FIELDS:
        if env_name(f.key) in env:
            raw[f.key] = (env[env_name(f.key)], f"env {env_name(f.key)}")
    for f in FIELDS:
        v = flags.get(f.key)
        if v is not None:
            raw[f.key] = (v, f"flag {flag_name(f.key)}")
    for key, path in MOVED.items():
        if flags.get(key) is not None or env_name(key) in env:
            raise ConfigError(f"{key}: moved to the SLO file as {path} (give the file with --slo)")
    slo_path = raw["slo"][0] if raw["slo"][1] != "default" else ""
    slo = load_slo(str(slo_path) if slo_path else None)
    values = {}
    for f in FIELDS:
        v, origin = raw[f.key]
        if origin == "default" and f.slo:
            v, origin = slo_default(f, slo), f"SLO {f.slo}"
            values[f.key] = _convert(f, v, origin)
            continue
        values[f.key] = _convert(f, v, origin) if origin != "default" else (
            tuple(v) if f.kind == "list" else v)
    cfg = Config(**values)
    return _cross_checks(cfg, raw)


def _cross_checks(cfg: Config, raw: Mapping[str, Tuple[Any, str]]) -> Config:
    split_listen(cfg.listen)
    parts = urlsplit(cfg.vllm_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"vllm_url: {redact_url(cfg.vllm_url)!r} is not an http(s) URL with a host")
    if cfg.window < 2 * cfg.poll_interval:
        raise ConfigError(
            f"window: {cfg.window:g} s must be at least two poll intervals ({2 * cfg.poll_interval:g} s)")
    timeout = cfg.vllm_timeout
    if timeout == 0:
        timeout = min(0.8 * cfg.poll_interval, 10.0)
    elif timeout >= cfg.poll_interval:
        raise ConfigError(
            f"vllm_timeout: {timeout:g} s must be shorter than poll_interval ({cfg.poll_interval:g} s)")
    if cfg.gpu == "dcgm":
        for key in ("dcgm_url", "pod_name", "pod_namespace"):
            if not getattr(cfg, key):
                raise ConfigError(f"{key}: needed with gpu dcgm (set {env_name(key)}, see deploy/)")
        dparts = urlsplit(cfg.dcgm_url)
        if dparts.scheme not in ("http", "https") or not dparts.hostname:
            raise ConfigError(f"dcgm_url: {cfg.dcgm_url!r} is not an http(s) URL with a host")
    if cfg.vllm_bearer_token and cfg.vllm_bearer_token_file:
        raise ConfigError("vllm_bearer_token_file: give either a token or a token file, not both")
    return Config(**{**{f.name: getattr(cfg, f.name) for f in dc_fields(cfg)}, "vllm_timeout": timeout})


def defaults() -> Config:
    return build({}, {})


def slo_default(f: Field, slo: Dict[str, Any]) -> Any:
    """A field's value as the SLO states it (durations in seconds)."""
    cur: Any = slo
    for part in f.slo.split("."):
        cur = cur[part]
    return seconds(cur) if is_duration(f.slo) else cur


def default_text(f: Field) -> str:
    """How a field's default reads in ``--help`` and the README."""
    d = f.default
    if f.slo:
        return f"SLO `{f.slo}`"
    if f.kind == "list":
        return ",".join(d) if d else "(empty)"
    if f.secret or d == "":
        return "(none)"
    return str(d)


def doc_table() -> List[Tuple[str, str, str, str]]:
    """(flag, env, default, meaning) for every key, for the README and ``--help``."""
    return [(flag_name(f.key), env_name(f.key), default_text(f), f.doc) for f in FIELDS]
