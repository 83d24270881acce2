"""Prometheus durations (``5m``, ``1h30m``, ``1d``, ``250ms``) to and from milliseconds.

The syntax is ``model.ParseDuration`` of prometheus/common 0.39 (what Prometheus 2.42 uses):
units ``y`` (365 days), ``w``, ``d``, ``h``, ``m``, ``s``, ``ms``, each at most once and in that
order, integers only.
"""

from __future__ import annotations

import re

_UNITS = (("y", 365 * 86_400_000), ("w", 7 * 86_400_000), ("d", 86_400_000), ("h", 3_600_000),
          ("m", 60_000), ("s", 1000), ("ms", 1))
_RE = re.compile(r"(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?")


class DurationError(ValueError):
    """Text that is not a Prometheus duration."""


def parse_duration(text: str) -> int:
    """Milliseconds of a Prometheus duration; ``"0"`` is 0. Raises ``DurationError``."""
    if text == "0":
        return 0
    m = _RE.fullmatch(text)
    if not text or m is None:
        raise DurationError(f"not a valid duration string: {text!r}")
    total = 0
    for (_, ms), part in zip(_UNITS, m.groups()):
        if part is not None:
            total += int(part) * ms
    return total


def format_duration(ms: int) -> str:
    """The shortest Prometheus spelling of ``ms`` (``90000`` -> ``1m30s``), as ``model.Duration``
    prints it."""
    if ms == 0:
        return "0s"
    out, rest = [], ms
    if rest < 0:
        return "-" + format_duration(-ms)
    for unit, size in _UNITS:
        if rest >= size:
            n, rest = divmod(rest, size)
            out.append(f"{n}{unit}")
    return "".join(out)
