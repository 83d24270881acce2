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
import json
import math
import re
from functools import lru_cache
from importlib import resources
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import yaml

from .errors import ConfigError
from .promql_strings import unquote

DEFAULTS_FILE = "slo.yaml"
SEVERITIES = ("critical", "warning", "info")

_LABEL_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")

# -- durations -------------------------------------------------------------------------------
# The one parser of Prometheus durations in the project (the SLO file, the PromQL engine, the
# backtest's sources and rule files all call it; the web config's Go durations are another
# syntax). It is ``model.ParseDuration`` of prometheus/common 0.39 (Prometheus 2.42): ``0``, or
# ASCII digits with the units y (365 days) w d h m s ms, each at most once, in that order, not
# empty, at most 2^63-1 nanoseconds in all.

_DURATION_RE = re.compile(r"(?:([0-9]+)y)?(?:([0-9]+)w)?(?:([0-9]+)d)?(?:([0-9]+)h)?"
                          r"(?:([0-9]+)m)?(?:([0-9]+)s)?(?:([0-9]+)ms)?")
_UNIT_MS = (365 * 86_400_000, 7 * 86_400_000, 86_400_000, 3_600_000, 60_000, 1000, 1)
_MAX_NS = 2 ** 63 - 1


class DurationError(ValueError):
    """Text that is not a Prometheus duration."""


def parse_duration(text: str) -> int:
    """Milliseconds of a Prometheus duration (``"0"`` is 0), exactly as Prometheus reads it;
    anything else raises ``DurationError`` with Prometheus' own message."""
    if not isinstance(text, str):
        raise DurationError(f"not a valid duration string: {text!r}")
    if text == "0":
        return 0
    if text == "":
        raise DurationError("empty duration string")
    m = _DURATION_RE.fullmatch(text)
    if m is None:
        raise DurationError(f"not a valid duration string: {text!r}")
    total_ns = 0
    for part, ms in zip(m.groups(), _UNIT_MS):
        if part is None:
            continue
        n = int(part)
        if n > _MAX_NS // ms // 1_000_000:
            raise DurationError("duration out of range")
        total_ns += n * ms * 1_000_000
        if total_ns > _MAX_NS:
            raise DurationError("duration out of range")
    return total_ns // 1_000_000


def seconds(duration: str) -> float:
    """A Prometheus duration (``1h30m``, ``90s``) in seconds; ``DurationError`` (a ValueError)
    when it is not one."""
    return parse_duration(duration) / 1000


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


def _int(lo: int) -> Check:
    def check(v: Any, where: str) -> int:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ConfigError(f"{where}: expected a whole number, got {v!r}")
        if v < lo:
            raise ConfigError(f"{where}: {v!r} is out of range")
        return v
    return check


def _quoted(v: Any) -> str:
    return json.dumps(v) if isinstance(v, str) else repr(v)


def _duration_or_zero(v: Any, where: str) -> str:
    """A Prometheus duration, ``0`` included (``for``, ``keep_firing_for``), kept as written."""
    if not isinstance(v, str):
        raise ConfigError(f"{where}: {_quoted(v)} is not a Prometheus duration (write it as text, like \"5m\")")
    try:
        parse_duration(v)
    except DurationError:
        raise ConfigError(f"{where}: {_quoted(v)} is not a Prometheus duration "
                          "(like 90s or 1h30m: units y w d h m s ms, each once, in that order)") from None
    return v


def _duration(v: Any, where: str) -> str:
    """A window: a Prometheus duration longer than 0 (PromQL refuses ``[0s]``)."""
    if parse_duration(_duration_or_zero(v, where)) == 0:
        raise ConfigError(f"{where}: {_quoted(v)} must be longer than 0")
    return v


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


# -- PromQL and template text the pack writes into rules -----------------------------------
# What the pack writes verbatim into a rule file must be what Prometheus accepts: label matchers
# (``selector``), a regular expression inside a double-quoted PromQL string (``http_handlers``),
# Go templates in alert labels and annotations. The checks below are Prometheus' own rules where
# they are small (the lexer's strings and escapes, label names) and a strict subset where they
# are not (templates), so that whatever passes renders a file ``promtool check rules`` accepts.

_MATCHER_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
def _promql_string(text: str, i: int) -> Tuple[str, int]:
    """The PromQL string literal starting at ``text[i]``: its value and the index after it."""
    q = text[i]
    j = i + 1
    while True:
        if j >= len(text) or (q != "`" and text[j] == "\n"):
            raise ValueError("unterminated quoted string")
        if text[j] == "\\" and q != "`":
            j += 2
            continue
        if text[j] == q:
            return unquote(text[i:j + 1]), j + 1
        j += 1


def _go_regex_error(pattern: str) -> Optional[str]:
    """Why Go's ``regexp`` (RE2) refuses ``pattern``, or None. Uses RE2 itself when installed
    (the analysis and test extras bring google-re2); else Python's ``re``, which is close."""
    try:
        import re2  # type: ignore[import-not-found]
    except ImportError:  # pragma: no cover - the sidecar's image without the analysis extra
        try:
            re.compile(pattern)
        except re.error as exc:
            return str(exc)
        return None
    opts = re2.Options()
    opts.log_errors = False
    try:
        re2.compile(pattern, opts)
    except re2.error as exc:
        why = exc.args[0] if exc.args else exc
        return why.decode("utf-8", "replace") if isinstance(why, bytes) else str(why)
    return None


def _selector(v: Any, where: str) -> str:
    """Label matchers without braces (``namespace="llm", pod=~"vllm-.*"``), as Prometheus' parser
    reads the inside of ``{…}``; no ``__name__`` (every rule names its metric)."""
    hint = 'expected label matchers without braces, like namespace="llm"'
    if not isinstance(v, str):
        raise ConfigError(f"{where}: {hint}")
    text, i, n = v, 0, len(v)

    def skip(i: int) -> int:
        while i < n and text[i] in " \t\r\n":
            i += 1
        return i

    i = skip(i)
    while i < n:
        m = _MATCHER_NAME.match(text, i)
        if not m:
            raise ConfigError(f"{where}: {_quoted(v)}: a label name expected at character {i + 1}; {hint}")
        name = m.group(0)
        if name == "__name__":
            raise ConfigError(f"{where}: __name__ cannot be matched here (each rule names its own metric)")
        i = skip(m.end())
        op = next((o for o in ("=~", "!~", "!=", "=") if text.startswith(o, i)), None)
        if op is None:
            raise ConfigError(f"{where}: {_quoted(v)}: =, !=, =~ or !~ expected at character {i + 1}")
        i = skip(i + len(op))
        if i >= n or text[i] not in "\"'`":
            raise ConfigError(f"{where}: {_quoted(v)}: a quoted value expected at character {i + 1}")
        try:
            value, i = _promql_string(text, i)
        except ValueError as exc:
            raise ConfigError(f"{where}: {_quoted(v)}: {exc} at character {i + 1}") from None
        if op in ("=~", "!~"):
            why = _go_regex_error("^(?:" + value + ")$")
            if why:
                raise ConfigError(f"{where}: {_quoted(value)} is not a regular expression Prometheus takes ({why})")
        i = skip(i)
        if i < n:
            if text[i] != ",":
                raise ConfigError(f"{where}: {_quoted(v)}: \",\" expected at character {i + 1}")
            i = skip(i + 1)
    return v


def _regex_in_string(v: Any, where: str) -> str:
    """A regular expression the pack writes between double quotes (``handler=~"…"``): RE2 syntax,
    and nothing the PromQL string would read differently (no backslash, quote or line break)."""
    if not isinstance(v, str):
        raise ConfigError(f"{where}: expected a regular expression as text, got {_quoted(v)}")
    bad = next((c for c in v if c in '\\"\n\r'), None)
    if bad is not None:
        raise ConfigError(f"{where}: {_quoted(v)}: {_quoted(bad)} cannot be written inside the rules' "
                          "PromQL string (use a character class like [.] instead of a backslash)")
    why = _go_regex_error("^(?:" + v + ")$")
    if why:
        raise ConfigError(f"{where}: {_quoted(v)} is not a regular expression Prometheus takes ({why})")
    return v


# Go templates in alert labels and annotations: Prometheus parses each (promtool check rules
# does). Accepted here: text with actions that print a variable or one of its fields, optionally
# piped through functions of Prometheus' template library that take no argument. That is what
# alert texts use; anything richer is refused rather than guessed at.
_TEMPLATE_VALUE = r"(?:\$labels\.[a-zA-Z_][a-zA-Z0-9_]*|\$externalLabels\.[a-zA-Z_][a-zA-Z0-9_]*|\$value|\$externalURL" \
                  r"|\.Labels\.[a-zA-Z_][a-zA-Z0-9_]*|\.Value|\.ExternalURL)"
_TEMPLATE_FUNCS = r"(?:humanize|humanize1024|humanizeDuration|humanizePercentage|humanizeTimestamp|toUpper|toLower|title)"
_TEMPLATE_ACTION = re.compile(rf"\{{\{{-?[ \t]*(?:{_TEMPLATE_FUNCS}[ \t]+)?{_TEMPLATE_VALUE}"
                              rf"(?:[ \t]*\|[ \t]*{_TEMPLATE_FUNCS})*[ \t]*-?\}}\}}")


def _template_error(text: str) -> Optional[str]:
    rest = _TEMPLATE_ACTION.sub("", text)
    if "{{" in rest:
        return ("a template action other than {{ $labels.NAME }}, {{ $value }} or {{ $value | humanize }} "
                "(the forms this file accepts)")
    return None


def _label_value(x: Any, where: str, template: bool) -> str:
    if not isinstance(x, (str, int, float)) or isinstance(x, bool):
        raise ConfigError(f"{where}: expected a text value, got {_quoted(x)}")
    x = str(x)
    if any(0xD800 <= ord(c) <= 0xDFFF for c in x):
        raise ConfigError(f"{where}: not valid UTF-8")
    if template:
        why = _template_error(x)
        if why:
            raise ConfigError(f"{where}: {_quoted(x)}: {why}")
    return x


def _labels(template: bool, what: str = "label") -> Check:
    def check(v: Any, where: str) -> Dict[str, str]:
        if not isinstance(v, dict):
            raise ConfigError(f"{where}: expected a mapping of {what} names to values")
        out = {}
        for k, x in v.items():
            if not isinstance(k, str) or not _LABEL_RE.fullmatch(k):
                raise ConfigError(f"{where}.{k}: not a valid {what} name")
            if k == "__name__" and what == "label":
                raise ConfigError(f"{where}.{k}: a rule cannot set __name__")
            out[k] = _label_value(x, f"{where}.{k}", template)
        return out
    return check


_label_map = _labels(template=True)  # the SLO's labels go on alerting rules too (templated there)


def _label_names(v: Any, where: str) -> List[str]:
    if not isinstance(v, list) or not v or not all(isinstance(x, str) and _LABEL_RE.fullmatch(x) for x in v):
        raise ConfigError(f"{where}: expected a list of label names")
    if "model_name" in v:
        raise ConfigError(f"{where}: model_name is added by the pack itself")
    reserved = [x for x in v if x in ("le", "__name__") or x.startswith("__")]
    if reserved:
        raise ConfigError(f"{where}: {reserved[0]} cannot identify a replica")
    if len(set(v)) != len(v):
        raise ConfigError(f"{where}: a label is listed twice")
    return v


def _label_name_or_empty(v: Any, where: str) -> str:
    """One label name, or "" (none)."""
    if v is None or v == "":
        return ""
    if not isinstance(v, str) or not _LABEL_RE.fullmatch(v) or v.startswith("__") or v in ("le", "model_name"):
        raise ConfigError(f"{where}: expected a label name (or \"\" for none), got {v!r}")
    return v


def _url(v: Any, where: str) -> str:
    """Text written into each alert's ``runbook_url`` annotation (a Go template there)."""
    if not isinstance(v, str):
        raise ConfigError(f"{where}: expected text, got {_quoted(v)}")
    why = _template_error(v)
    if why:
        raise ConfigError(f"{where}: {_quoted(v)}: {why}")
    return _label_value(v, where, template=True)


def _outer_labels(v: Any, where: str) -> List[str]:
    if not isinstance(v, list) or not all(isinstance(x, str) and _LABEL_RE.fullmatch(x) for x in v):
        raise ConfigError(f"{where}: expected a list of label names, like [cluster] (or [] for none)")
    if "model_name" in v:
        raise ConfigError(f"{where}: model_name is added by the pack itself")
    return v


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
    "for": _duration_or_zero,
    "keep_firing_for": _duration_or_zero,
    "enabled": _bool,
    "severity": _choice(*SEVERITIES),
    "labels": _labels(template=True),
    "annotations": _labels(template=True, what="annotation"),
}

# Every leaf of the SLO file and its check. A mapping not listed here is a section whose keys
# are listed one by one; ``alerts`` is checked by ALERT_KEYS.
SCHEMA: Dict[str, Check] = {
    "selector": _selector,
    "replica_labels": _label_names,
    "outer_labels": _outer_labels,
    "sidecar_target_label": _label_name_or_empty,
    "evaluation_interval": _duration,
    "views_interval": _duration_or_zero,
    "steady_interval": _duration_or_zero,
    "steady_for": _duration,
    "slow_interval": _duration_or_zero,
    "slow_for": _duration,
    "runbook_base_url": _url,
    "labels": _label_map,
    "windows.rate": _duration,
    "windows.sustain": _duration,
    "windows.sidecar": _duration,
    "windows.queue_growth": _duration,
    "windows.hardware_errors": _duration,
    "windows.target_seen": _duration,
    "windows.startup": _duration,
    "windows.held_back": _duration,
    "windows.held_back_sparse": _duration,
    "windows.episode": _duration,
    "windows.episode_recent": _duration,
    "windows.batch_peak": _duration,
    "windows.baseline": _duration,
    "windows.baseline_offset": _duration,
    "windows.baseline_edge": _duration,
    "windows.history_from": _duration,
    "windows.history_step": _duration_or_zero,
    "windows.quantile_step": _duration_or_zero,
    "objectives.ttft_mean_seconds": _number(0, open_lo=True),
    "objectives.ttft_p95_seconds": _number(0, open_lo=True),
    "objectives.output_tokens_per_second": _number(0, open_lo=True),
    "objectives.availability": _number(0, 1, open_lo=True, below=1),
    "availability_sli": _choice("combined", "http", "engine"),
    "http_handlers": _regex_in_string,
    "burn_rates.page": _burn_pairs,
    "burn_rates.ticket": _burn_pairs,
    "kv_cache.warn": _number(0, 1, open_lo=True),
    "kv_cache.critical": _number(0, 1, open_lo=True),
    "kv_cache.held_back_share": _number(0, 1, open_lo=True),
    "kv_cache.held_back_scrapes": _number(1),
    "kv_cache.batch_room": _number(0, 1, open_lo=True),
    "long_prompt.tokens": _number(1),
    "long_prompt.surge_factor": _number(1),
    "long_prompt.min_per_second": _number(0),
    "long_prompt.min_count": _number(0),
    "long_prompt.baseline_quantile": _number(0, 1, open_lo=True),
    "queue.min_waiting": _number(0),
    "prefix_cache.min_hit_ratio": _number(0, 1),
    "prefix_cache.fleet_factor": _number(0, 1, open_lo=True),
    "prefix_cache.warmup": _duration,
    "error_ratio.max": _number(0, 1, open_lo=True),
    "error_ratio.page": _number(0, 1, open_lo=True),
    "error_ratio.page_min_per_second": _number(0),
    "outlier.throughput_factor": _number(0, 1, open_lo=True),
    "outlier.ttft_factor": _number(1),
    "outlier.min_replicas": _number(2),
    "gpu_busy_low.busy_utilization": _number(0, 1, open_lo=True),
    "gpu_busy_low.low_throughput_fraction": _number(0, 1, open_lo=True),
    "gpu_busy_low.throughput_floor": _number(0),
    "gpu_busy_low.baseline_horizon": _duration,
    "gpu_busy_low.baseline_quantile": _number(0, 1, open_lo=True),
    "gpu_busy_low.baseline_min_busy": _duration,
    "gpu_busy_low.planned_tokens_per_second": _number(0),
    "gpu_busy_low.planned_prefill_tokens_per_second": _number(0),
    "stall.after": _duration,
    "gpu.fatal_xids": _int_list,
    "dashboards.cluster_label": _label_or_empty,
    "capacity.sustain": _duration,
    "capacity.history": _duration,
    "capacity.peak_window": _duration,
    "capacity.headroom": _number(0),
    "capacity.prefill_weight": _number(0),
    "capacity.saturated_share": _number(0, 1, open_lo=True),
    "capacity.prefill_tokens_per_second": _number(0),
    "capacity.decode_tokens_per_second": _number(0),
    "capacity.prefix_hit_ratio": _number(0, 1, below=1),
    "capacity.prefill_gpus_per_instance": _int(1),
    "capacity.decode_gpus_per_instance": _int(1),
    "capacity.gpus": _int(0),
    "disaggregation.transfer_failure_ratio": _number(0, 1, open_lo=True),
    "disaggregation.min_failures_per_second": _number(0),
    "disaggregation.recompute_share": _number(0, 1, open_lo=True),
    "disaggregation.transfer_ttft_share": _number(0, 1, open_lo=True),
    "disaggregation.expired_share": _number(0, 1, open_lo=True),
    "disaggregation.expired_per_second": _number(0),
    "disaggregation.saturated_waiting": _number(0, open_lo=True),
    "disaggregation.room_waiting": _number(0, open_lo=True),
    "disaggregation.room_load": _number(0, 1, open_lo=True),
    "speculative.planned_speedup": _number(0),
    "speculative.low_factor": _number(0, 1, open_lo=True),
    "cost.currency": _text,
    "cost.unit": _choice("gpu_hour", "replica_hour"),
    "cost.prices.reserved": _number(0),
    "cost.prices.on_demand": _number(0),
    "cost.prices.spot": _number(0),
    "cost.fleet": _choice("reserved", "on_demand", "spot"),
    "cost.gpus_per_replica": _number(1),
    "cost.spot_share": _number(0, 1),
    "cost.monthly_fixed": _number(0),
    "cost.monthly_budget": _number(0),
    "cost.hours_per_month": _number(0, open_lo=True),
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


LOOKBACK_S = 300.0  # Prometheus' lookback: an instant read finds a sample at most this old


def _check_cadence(slo: Dict[str, Any]) -> None:
    """The groups' intervals: each under Prometheus' lookback (a later group, or a dashboard,
    reading a record written less often would find none between two evaluations), and the steady
    alerts' wait shorter than the slow ones' (else the steady group would never hold an alert)."""
    for key in ("steady_interval", "slow_interval", "views_interval"):
        if seconds(slo[key]) >= LOOKBACK_S:
            raise ConfigError(f"{key}: {slo[key]} must be under 5m (Prometheus' lookback: what this group "
                              "records would be missing between two of its evaluations)")
    if seconds(slo["steady_interval"]) > 0 and seconds(slo["slow_interval"]) > 0 \
            and seconds(slo["steady_for"]) >= seconds(slo["slow_for"]):
        raise ConfigError(f"steady_for: {slo['steady_for']} must be shorter than slow_for ({slo['slow_for']})")


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
    _check_cadence(slo)
    taken = set(slo["replica_labels"]) | set(slo["outer_labels"]) | {"job", "instance", "engine"}
    if slo["sidecar_target_label"] in taken:
        # the raw path reads only series where this label is empty: one every series has empties nothing
        raise ConfigError(f"sidecar_target_label: {slo['sidecar_target_label']} already names targets or replicas; "
                          "give a label of its own (e.g. vllm_sidecar)")
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
    of each alert rule; ``windows.target_seen_step`` (retired) is dropped."""
    data = dict(data)
    # windows.target_seen_step: the step at which earlier releases looked for a target in its raw
    # series; the targets that answer are now recorded at every evaluation, and the key means nothing
    if isinstance(data.get("windows"), dict) and "target_seen_step" in data["windows"]:
        data["windows"] = {k: v for k, v in data["windows"].items() if k != "target_seen_step"}
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
    return SCHEMA.get(path) in (_duration, _duration_or_zero)


def durations(slo: Mapping[str, Any]) -> List[Tuple[str, str]]:
    """(path, duration) of every duration in the SLO, for tests that look for stale text."""
    out = [(p, _get(slo, p)) for p, c in SCHEMA.items() if c is _duration]
    for name, settings in slo["alerts"].items():
        for key in ("for", "keep_firing_for"):
            if key in settings:
                out.append((f"alerts.{name}.{key}", settings[key]))
    return out
