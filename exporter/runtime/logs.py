"""Logging: text or JSON lines, and one line per change of state, never one per poll.

``StateLog`` remembers what it last said about each subject (a target's reachability, the error
reason, the missing inputs, the models, each GPU) and logs only when that changes. Secrets never
reach it: messages are built from redacted URLs, and ``Redactor`` masks any bearer token that
might still slip into a message.
"""

from __future__ import annotations

import json
import logging
import re
import sys
import time
from typing import Any, Dict, Hashable, Optional

_BEARER_RE = re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]+")
_USERINFO_RE = re.compile(r"(://)[^/@\s]+@")


def redact(text: str) -> str:
    text = _BEARER_RE.sub(r"\1<redacted>", text)
    return _USERINFO_RE.sub(r"\1<redacted>@", text)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: Dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": redact(record.getMessage()),
        }
        fields = getattr(record, "fields", None)
        if fields:
            out.update({k: (redact(v) if isinstance(v, str) else v) for k, v in fields.items()})
        if record.exc_info:
            out["exc"] = redact(self.formatException(record.exc_info))
        return json.dumps(out, sort_keys=False)


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = redact(super().format(record))
        fields = getattr(record, "fields", None)
        if fields:
            line += " " + " ".join(f"{k}={redact(str(v))!s}" for k, v in fields.items())
        return line


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


_UNSET = object()
