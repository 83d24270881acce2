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

import ipaddress
import math
import os
import re
from dataclasses import dataclass, make_dataclass
from dataclasses import fields as dc_fields
from typing import Any, Dict, Mapping, Optional, Tuple
from urllib.parse import urlsplit, urlunsplit

from ..errors import ConfigError
from ..slo import is_duration, load_slo, read_yaml_mapping, seconds

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
    spelling: str = ""  # the flag's spelling when it is not --key-with-dashes (exporter-toolkit's --web.*)
    blank_default: bool = False  # an empty value means the default (an env var from an absent pod label)


FIELDS: Tuple[Field, ...] = (
    Field("vllm_url", "str", "http://127.0.0.1:8000",
          "vLLM base URL; `/metrics` is appended when the URL has no path, and an OpenAI base URL "
          "ending in `/v1` is read at `/metrics` instead (vLLM serves its metrics at the root); "
          "query values and passwords in it are never logged"),
    Field("listen", "str", "0.0.0.0:9181", "where the sidecar serves /metrics, /healthz, /readyz; "
          "IPv6 in brackets: `[::]:9181` (dual-stack where the OS allows), `[::1]:9181`"),
    Field("web_config_file", "str", "", "exporter-toolkit web configuration: TLS (certificate, key, "
          "client CA), bcrypt basic-auth users, response headers; re-read when it or a file it names "
          "changes (see Securing the listener)", spelling="--web.config.file"),
    Field("web_max_requests", "int", 40, "most /metrics scrapes in progress at once (one answered "
          "from a body already built takes none); beyond it 503 with Retry-After (0: no limit)",
          lo=0, hi=100_000, spelling="--web.max-requests"),
    Field("web_max_connections", "int", 1000, "most open connections; when full, a new one pushes out "
          "the oldest that has not sent a request yet, then the oldest idle one", lo=8, hi=1_000_000,
          spelling="--web.max-connections"),
    Field("web_header_timeout", "float", 10.0, "seconds a connection has to finish its TLS handshake and "
          "send a complete request line and headers", lo=0, hi=600, lo_open=True,
          spelling="--web.header-timeout"),
    Field("web_idle_timeout", "float", 120.0, "seconds an idle keep-alive connection stays open (longer "
          "than the scrape interval, so Prometheus keeps its connection)", lo=0, hi=3600, lo_open=True,
          spelling="--web.idle-timeout"),
    Field("role", "choice", "both", "this replica's part in prefill/decode disaggregation: `prefill`, `decode` "
          "or `both` (a replica that does both, as without disaggregation); served as "
          "vllm_sidecar_role_info; set it from a pod label through the downward API (empty, as from a pod "
          "without the label: `both`)", choices=("prefill", "decode", "both"), blank_default=True),
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
    Field("vllm_bearer_token", "str", "", "bearer token for a protected /metrics (never logged). "
          "A flag's value is visible to every process on the host (/proc/PID/cmdline, ps): prefer "
          "the environment variable or `--vllm-bearer-token-file`", secret=True),
    Field("vllm_bearer_token_file", "str", "", "file holding the bearer token: one line of printable "
          "ASCII, at most 8 KiB (a UTF-8 BOM and surrounding whitespace are stripped); re-read when it "
          "changes (a rotated Kubernetes secret) and on SIGHUP"),
    Field("vllm_ca_file", "str", "", "PEM file of the CA certificates that verify an https vLLM URL; "
          "empty: the system's"),
    Field("log_format", "choice", "text", "log line format", choices=("text", "json")),
    Field("log_level", "choice", "info", "lowest level logged",
          choices=("debug", "info", "warning", "error")),
    Field("slo", "str", "", "the SLO file (YAML) the thresholds below default to; empty: the built-in "
          "one (exporter/slo.yaml, the same defaults the alerting pack renders)"),
    Field("kv_warn_threshold", "float", None, "KV usage at or above which pressure is `elevated` (1)",
          lo=0, hi=1, lo_open=True, slo="kv_cache.warn"),
    Field("max_num_seqs", "int", None, "vLLM's --max-num-seqs (the batch ceiling); 0: unknown, learned from "
          "the highest batch run while nothing waited for capacity. Requests waiting for capacity while the "
          "batch runs below batch room of it are held back by the KV cache, whatever its usage reads",
          lo=0, hi=1_000_000, slo="kv_cache.max_num_seqs"),
    Field("batch_room", "float", None, "the batch has room below this share of its ceiling",
          lo=0, hi=1, lo_open=True, slo="kv_cache.batch_room"),
    Field("held_back_window", "float", None, "seconds over which the held-back signal (requests held back "
          "by the KV cache, preempting or rejecting) is averaged, as the KV alert reads it",
          lo=0, lo_open=True, slo="windows.held_back"),
    Field("held_back_recent_window", "float", None, "seconds over which the held-back signal is averaged for "
          "a chronic overload", lo=0, lo_open=True, slo="windows.episode_recent"),
    Field("held_back_share", "float", None, "share of the held-back window with requests held back at which "
          "preempting counts as held back too", lo=0, hi=1, lo_open=True, slo="kv_cache.held_back_share"),
    Field("preempting_window", "float", None, "seconds after a preemption the replica counts as preempting",
          lo=0, lo_open=True, slo="windows.sustain"),
    Field("rejecting_window", "float", None, "seconds after an admission rejection the replica counts as "
          "rejecting", lo=0, lo_open=True, slo="windows.rate"),
    Field("busy_utilization", "float", None, "mean GPU utilization at or above which the pod is busy",
          lo=0, hi=1, lo_open=True, slo="gpu_busy_low.busy_utilization"),
    Field("low_throughput_fraction", "float", None, "busy pod flagged when generation tokens/s fall "
          "below this fraction of its learned baseline", lo=0, hi=1, lo_open=True,
          slo="gpu_busy_low.low_throughput_fraction"),
    Field("throughput_floor", "float", None, "tokens/s below which a busy pod is flagged while no "
          "baseline is learned yet", lo=0, slo="gpu_busy_low.throughput_floor"),
    Field("planned_tokens_per_second", "float", None, "what one replica should make while busy (tokens/s, "
          "your capacity plan); while no baseline is learned a busy pod is flagged below the low fraction of "
          "it (0: no plan, only the floor)", lo=0, slo="gpu_busy_low.planned_tokens_per_second"),
    Field("planned_prefill_tokens_per_second", "float", None, "the same for a prefill instance (`--role "
          "prefill`), in prompt tokens/s (0: no plan, only the floor)", lo=0,
          slo="gpu_busy_low.planned_prefill_tokens_per_second"),
    Field("baseline_horizon", "float", None, "seconds of busy history the baseline learns from",
          lo=60, hi=7 * 86400, slo="gpu_busy_low.baseline_horizon"),
    Field("baseline_quantile", "float", None, "percentile of busy-time throughput taken as normal",
          lo=0, hi=1, lo_open=True, slo="gpu_busy_low.baseline_quantile"),
    Field("baseline_min_seconds", "float", None, "busy seconds needed before the learned baseline "
          "replaces the floor", lo=0, slo="gpu_busy_low.baseline_min_busy"),
    Field("long_prompt_tokens", "float", None, "prompt length above which a request is long",
          lo=1, slo="long_prompt.tokens"),
    Field("long_prompt_surge_per_second", "float", None, "long prompts per second above which the sidecar "
          "counts a surge (a degraded time its throughput baseline never learns from)", lo=0,
          slo="long_prompt.min_per_second"),
    Field("stall_seconds", "float", None, "requests running (or waiting with none running and no engine "
          "iteration) and no token for this long: stalled",
          lo=1, slo="stall.after"),
    Field("slo_ttft_p95_seconds", "float", None, "TTFT p95 objective (s)", lo=0, lo_open=True,
          slo="objectives.ttft_p95_seconds"),
    Field("slo_output_tokens_per_second", "float", None, "per-request generation speed objective; "
          "the inter-token latency objective is its inverse", lo=0, lo_open=True,
          slo="objectives.output_tokens_per_second"),
    Field("availability_sli", "choice", None, "what the availability SLI counts, as the pack does: `http` (the "
          "counted handlers' answers, 5xx failed), `engine` (vLLM's finished requests, reason error failed) "
          "or `combined` (HTTP answers, the larger of the two failure counts); served as "
          "vllm_sidecar_availability_requests_total and vllm_sidecar_availability_errors_total",
          choices=("engine", "http", "combined"), slo="availability_sli"),
    Field("http_handlers", "str", None, "the HTTP handlers the availability SLI counts (a regular expression, "
          "matched whole as PromQL's =~)", slo="http_handlers"),
    Field("flight_minutes", "float", 30.0, "minutes of polls the flight recorder keeps in memory for "
          "/debug/flight (0: no recorder)", lo=0, hi=24 * 60),
    Field("flight_max_bytes", "int", 16 * 1024 * 1024, "hard cap on the flight recorder's memory, pinned "
          "events included (bytes); over it the oldest polls go first", lo=64 * 1024, hi=1 << 34),
    Field("flight_event_before", "float", 600.0, "seconds before an event (KV thrashing, a stall, vLLM "
          "unreachable or restarted, a GPU XID) the recorder keeps beyond its ring", lo=0, hi=86400),
    Field("flight_event_after", "float", 600.0, "seconds after an event the recorder keeps", lo=0, hi=86400),
    Field("flight_max_events", "int", 16, "most events kept pinned (the oldest forgotten first)", lo=0, hi=1000),
    Field("flight_labels", "str", "", "labels added to every series of /debug/flight so records of "
          "several pods merge, e.g. `namespace=prod,pod=vllm-0`; empty: namespace and pod from "
          "`--pod-namespace`/`--pod-name` when set (downward API)"),
    Field("max_models", "int", 16, "most models (model_name) taken from one vLLM page; more are left "
          "out, counted and named in the log", lo=1, hi=1024),
    Field("max_engines", "int", 64, "most data-parallel engines (engine label) taken from one vLLM "
          "page", lo=1, hi=4096),
    Field("max_label_values", "int", 32, "most values of an extra label (finished_reason, reason) "
          "taken per input and model, and most LoRA adapter names", lo=1, hi=1024),
)
# Keys of earlier releases that now live only in the SLO file: a clear error, not "unknown key".
MOVED: Dict[str, str] = {
    "kv_critical_threshold": "kv_cache.critical",
    "slo_ttft_mean_seconds": "objectives.ttft_mean_seconds",
}
FIELD_BY_KEY: Dict[str, Field] = {f.key: f for f in FIELDS}


class _Settings:
    """What a ``Config`` offers besides its fields."""

    @property
    def metrics_url(self) -> str:
        return metrics_url(self.vllm_url)

    @property
    def metrics_url_note(self) -> str:
        """One line to log when the URL given is not the URL read (an OpenAI ``/v1`` base)."""
        return metrics_url_note(self.vllm_url)

    @property
    def listen_host_port(self) -> Tuple[str, int]:
        return split_listen(self.listen)

    @property
    def slo_itl_seconds(self) -> float:
        return 1.0 / self.slo_output_tokens_per_second

# The configuration a sidecar runs with: one frozen field per entry of FIELDS, in its order, so
# the table above is the only list of the keys.
_TYPES = {"float": float, "int": int, "str": str, "choice": str, "bool": bool, "list": Tuple[str, ...]}
Config = make_dataclass("Config", [(f.key, _TYPES[f.kind]) for f in FIELDS], bases=(_Settings,), frozen=True,
                        namespace={"__module__": __name__,
                                   "__doc__": "The merged configuration: one field per entry of ``FIELDS``."})


def env_name(key: str) -> str:
    return ENV_PREFIX + key.upper()


def flag_name(key: str) -> str:
    spec = FIELD_BY_KEY.get(key)
    if spec is not None and spec.spelling:
        return spec.spelling
    return "--" + key.replace("_", "-")


def flag_aliases(key: str) -> Tuple[str, ...]:
    """Other spellings the command line takes for a key: ``--web-config-file`` beside
    exporter-toolkit's ``--web.config.file``."""
    plain = "--" + key.replace("_", "-")
    return (plain,) if flag_name(key) != plain else ()


def metrics_url(url: str) -> str:
    """The URL read: ``/metrics`` when the URL has no path; a path ending in ``/v1`` (the OpenAI
    base URL users copy from their clients) has that segment replaced by ``/metrics``, because
    vLLM serves its metrics at the root, never under ``/v1``."""
    parts = urlsplit(url)
    path = parts.path
    if path in ("", "/"):
        parts = parts._replace(path="/metrics")
    elif path.rstrip("/").endswith("/v1"):
        parts = parts._replace(path=path.rstrip("/")[:-3] + "/metrics")
    return urlunsplit(parts)


def metrics_url_note(url: str) -> str:
    parts = urlsplit(url)
    if parts.path not in ("", "/") and parts.path.rstrip("/").endswith("/v1"):
        return (f"vllm_url {redact_url(url)} is an OpenAI API base URL; vLLM serves its metrics at "
                f"the root, so {redact_url(metrics_url(url))} is read")
    return ""


def redact_url(url: str) -> str:
    """The URL without secrets: user and password replaced, every query value replaced (a query
    in a metrics URL is how proxies take tokens: ``?token=``, ``?api_key=``, signatures), and the
    fragment dropped."""
    try:
        parts = urlsplit(url)
        hostname, port = parts.hostname, parts.port
    except ValueError:  # not a URL we can take apart: nothing of it is safe to show
        return "<unparsable URL>"
    if parts.password or parts.username or "@" in parts.netloc:
        host = hostname or ""
        if ":" in host:
            host = f"[{host}]"
        if port:
            host += f":{port}"
        parts = parts._replace(netloc="<redacted>@" + host)
    if parts.query:
        parts = parts._replace(query=_redact_query(parts.query))
    return urlunsplit(parts._replace(fragment=""))


def _redact_query(query: str) -> str:
    out = []
    for item in re.split(r"([&;])", query):
        if item in ("&", ";", ""):
            out.append(item)
        elif "=" in item:
            out.append(item.split("=", 1)[0] + "=<redacted>")
        else:  # a bare value (?SECRET): it may be the secret itself
            out.append("<redacted>")
    return "".join(out)


# -- bearer tokens -----------------------------------------------------------------------------
TOKEN_MAX_BYTES = 8192
_BOM = b"\xef\xbb\xbf"


def parse_token(raw: bytes) -> str:
    """A bearer token from the bytes of a file or a setting: a UTF-8 BOM and surrounding
    whitespace stripped; then one line of printable ASCII without spaces, at most
    ``TOKEN_MAX_BYTES``. Raises ``ValueError`` whose text never contains any of the token."""
    if raw.startswith(_BOM):
        raw = raw[len(_BOM):]
    raw = raw.strip(b" \t\r\n\f\v")
    if not raw:
        raise ValueError("is empty")
    if len(raw) > TOKEN_MAX_BYTES:
        raise ValueError(f"is longer than {TOKEN_MAX_BYTES} bytes")
    lines = len(raw.replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n"))
    if lines > 1:
        raise ValueError(f"holds {lines} lines; it must hold the token alone, on one line")
    for i, b in enumerate(raw):
        if not 0x21 <= b <= 0x7E:
            what = "a space or tab" if b in (0x20, 0x09) else "a byte that is not printable ASCII"
            raise ValueError(f"holds {what} at byte {i + 1}")
    return raw.decode("ascii")


def split_listen(value: str) -> Tuple[str, int]:
    """``HOST:PORT``, ``:PORT`` (every IPv4 address) or ``[IPV6]:PORT`` -> (host, port); the host
    comes back without brackets (``::`` listens on every address, IPv4 too where the OS allows)."""
    v = value.strip()
    m = re.fullmatch(r"\[([^\[\]]*)\]:(\d+)", v)
    if m:
        host = m.group(1)
        try:
            ipaddress.IPv6Address(host.split("%", 1)[0])
        except ValueError:
            raise ConfigError(f"listen: {host!r} in brackets is not an IPv6 address") from None
    else:
        m = re.fullmatch(r"([^\[\]:]*):(\d+)", v)
        if not m:
            if v.count(":") > 1 and "[" not in v:
                raise ConfigError(f"listen: {value!r}: an IPv6 address needs brackets, e.g. [::1]:9181")
            raise ConfigError(f"listen: {value!r} is not HOST:PORT or [IPV6]:PORT")
        host = m.group(1) or "0.0.0.0"
    port = int(m.group(2))
    if not 0 <= port <= 65535:
        raise ConfigError(f"listen: port {port} out of range 0-65535")
    return host, port


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
        if not v and spec.blank_default:
            return spec.default
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
    data = read_yaml_mapping(path, "config", must="a mapping of keys to values")
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
    url = cfg.vllm_url
    if any(ord(c) <= 0x20 or ord(c) >= 0x7F for c in url):
        raise ConfigError("vllm_url: holds a space, a control character or a non-ASCII character "
                          "(percent-encode it)")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise ConfigError(f"vllm_url: {redact_url(url)!r} is not an http(s) URL with a host") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"vllm_url: {redact_url(url)!r} is not an http(s) URL with a host")
    if cfg.window < 2 * cfg.poll_interval:
        raise ConfigError(
            f"window: {cfg.window:g} s must be at least two poll intervals ({2 * cfg.poll_interval:g} s)")
    try:
        re.compile(cfg.http_handlers)
    except re.error as exc:
        raise ConfigError(f"http_handlers: {cfg.http_handlers!r} is not a regular expression ({exc})") from None
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
    token = cfg.vllm_bearer_token
    if token:
        try:
            token = parse_token(token.encode("utf-8", "surrogateescape"))
        except ValueError as exc:
            raise ConfigError(f"vllm_bearer_token (from {raw['vllm_bearer_token'][1]}): {exc}") from None
    if cfg.flight_labels:
        try:
            parse_labels(cfg.flight_labels)
        except ValueError as exc:
            raise ConfigError(f"flight_labels: {exc} (expected NAME=VALUE,...)") from None
    if cfg.vllm_ca_file and not os.path.isfile(cfg.vllm_ca_file):
        raise ConfigError(f"vllm_ca_file: {cfg.vllm_ca_file} is not a readable file")
    return Config(**{**{f.name: getattr(cfg, f.name) for f in dc_fields(cfg)}, "vllm_timeout": timeout,
                     "vllm_bearer_token": token})


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


def parse_labels(text: str) -> Tuple[Tuple[str, str], ...]:
    """``namespace=ns,pod=p`` -> labels; ValueError names what is wrong."""
    out: Dict[str, str] = {}
    for item in (text or "").split(","):
        item = item.strip()
        if not item:
            continue
        k, sep, v = item.partition("=")
        k = k.strip()
        if not sep or not k or not (k[0].isalpha() or k[0] == "_") or not all(c.isalnum() or c == "_" for c in k):
            raise ValueError(f"{item!r} is not NAME=VALUE")
        if k == "__name__":
            raise ValueError("__name__ is not a label")
        out[k] = v.strip()
    return tuple(sorted(out.items()))
