"""Logging: one record a line, text (``key=value``, quoted and escaped) or JSON, and one line per
change of state, never one per poll.

``StateLog`` remembers what it last said about each subject (a target's reachability and error
reason, the missing inputs, the models, each GPU) and logs only when that changes.

Nothing a line carries can break it or leak a secret:

- text lines are ``ts=… level=… logger=… msg="…" key=value…``; a value with a space, a quote,
  ``=`` or any control character is quoted and escaped (``\\n``, ``\\"``, ``\\u2028``…), so a
  model name holding a newline cannot forge a log line, and a traceback stays on its line;
- every message and field is redacted: URLs lose their user, password and query values,
  ``Bearer``/``Basic`` credentials and ``token=``/``api_key=``-style pairs are masked, and every
  secret the sidecar knows (``add_secret``: the bearer token as read) is replaced wherever it
  appears, whatever the code path that built the text;
- values are capped (``MAX_VALUE`` characters) and long lists are summarised (``summarize``).
"""

from __future__ import annotations

import json
import logging
import re
import sys
import threading
import time
from typing import Any, Dict, Hashable, Iterable, Optional

MAX_VALUE = 2000  # characters of one message or field value; the rest is cut, with a count

# credentials after an auth scheme ("Bearer x", "basic x"), not the prose "bearer token"
_BEARER_RE = re.compile(r"(?i)\b(bearer|basic)(\s+)(?!(?:token|tokens|auth|credentials)\b)[^\s\"',;]+")
_PAIR_RE = re.compile(
    r"(?i)\b([a-z0-9_.-]*(?:token|api[_-]?key|apikey|secret|passw(?:or)?d|pwd|credential|signature"
    r"|access[_-]?key)[a-z0-9_.-]*)(\s*=\s*[\"']?|[\"']\s*:\s*[\"'])(?!<redacted>)[^\s\"'&,;]+")
_URL_RE = re.compile(r"(?i)\b[a-z][a-z0-9+.-]*://[^\s\"'<>]+")

_secrets_lock = threading.Lock()
_secrets: tuple = ()


def add_secret(value: str) -> None:
    """Mask ``value`` wherever it appears in any later log line (values under 6 characters are
    not tracked: masking them would garble ordinary words)."""
    global _secrets
    if not value or len(value) < 6:
        return
    with _secrets_lock:
        if value not in _secrets:
            _secrets = tuple(sorted(set(_secrets) | {value}, key=len, reverse=True))[:16]


def redact(text: str) -> str:
    for s in _secrets:
        if s in text:
            text = text.replace(s, "<redacted>")
    if "://" in text:
        from .config import redact_url

        text = _URL_RE.sub(lambda m: redact_url(m.group(0)), text)
    text = _BEARER_RE.sub(r"\1\2<redacted>", text)
    return _PAIR_RE.sub(r"\1\2<redacted>", text)


def summarize(items: Iterable[Any], first: int = 5) -> str:
    """``"3: a, b, c"``, or for a long list ``"10000: m0, m1, m2, m3, m4 and 9995 more"``."""
    items = list(items)
    shown = ", ".join(str(i) for i in items[:first])
    more = f" and {len(items) - first} more" if len(items) > first else ""
    return f"{len(items)}: {shown}{more}"


def _cap(text: str) -> str:
    if len(text) <= MAX_VALUE:
        return text
    return text[:MAX_VALUE] + f"…(+{len(text) - MAX_VALUE} chars)"


# control characters (C0, DEL, C1) and the Unicode line and paragraph separators
_ESCAPES = {c: f"\\u{c:04x}" for c in [*range(0x20), *range(0x7F, 0xA0), 0x2028, 0x2029]}
_ESCAPES.update({ord("\n"): "\\n", ord("\r"): "\\r", ord("\t"): "\\t", ord('"'): '\\"', ord("\\"): "\\\\"})
_SAFE_RE = re.compile(r"[A-Za-z0-9_.:/@+%<>,()\[\]*#!?~^-]+")


def quote(value: Any) -> str:
    """A logfmt value: bare when it is plainly safe, else double-quoted with escapes."""
    text = value if isinstance(value, str) else str(value)
    if text and _SAFE_RE.fullmatch(text):
        return text
    return '"' + text.translate(_ESCAPES) + '"'


def _ts(record: logging.LogRecord) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"


def _clean(value: Any) -> Any:
    if isinstance(value, str):
        return _cap(redact(value))
    if isinstance(value, (int, float, bool)) or value is None:
        return value
    return _cap(redact(str(value)))


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: Dict[str, Any] = {
            "ts": _ts(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": _clean(record.getMessage()),
        }
        fields = getattr(record, "fields", None)
        if fields:
            for k, v in fields.items():
                if k not in out:
                    out[k] = _clean(v)
        if record.exc_info:
            out["exc"] = _clean(self.formatException(record.exc_info))
        return json.dumps(out, sort_keys=False)


class TextFormatter(logging.Formatter):
    """``ts=… level=… logger=… msg="…" key=value…`` on one line, whatever the values hold."""

    def format(self, record: logging.LogRecord) -> str:
        parts = [f"ts={_ts(record)}", f"level={record.levelname.lower()}", f"logger={quote(record.name)}",
                 f"msg={quote(_clean(record.getMessage()))}"]
        fields = getattr(record, "fields", None)
        if fields:
            for k, v in fields.items():
                key = re.sub(r"[^A-Za-z0-9_.-]", "_", str(k)) or "_"
                parts.append(f"{key}={quote(_clean(v))}")
        if record.exc_info:
            parts.append(f"exc={quote(_clean(self.formatException(record.exc_info)))}")
        return " ".join(parts)


def setup(fmt: str = "text", level: str = "info", stream=None) -> logging.Logger:
    root = logging.getLogger("vllm_sidecar")
    for h in list(root.handlers):
        root.removeHandler(h)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))
    root.propagate = False
    return root


class StateLog:
    """Logs a subject's state only when it differs from what was last logged."""

    def __init__(self, logger: logging.Logger) -> None:
        self.log = logger
        self._said: Dict[Hashable, Any] = {}

    def change(self, subject: Hashable, state: Any, level: int, msg: str, **fields: Any) -> bool:
        if self._said.get(subject, _UNSET) == state:
            return False
        first = subject not in self._said
        self._said[subject] = state
        if first and level < logging.WARNING and fields.pop("quiet_first", False):
            return False
        fields.pop("quiet_first", None)
        self.log.log(level, msg, extra={"fields": fields} if fields else None)
        return True

    def said(self, subject: Hashable) -> Optional[Any]:
        return self._said.get(subject)

    def note(self, subject: Hashable, state: Any) -> bool:
        """Record ``state`` as said without logging it (the caller logs its own line, e.g. with a
        traceback); True when it differs from what was last said."""
        if self._said.get(subject, _UNSET) == state:
            return False
        self._said[subject] = state
        return True


_UNSET = object()
