"""Prometheus durations (``5m``, ``1h30m``, ``1d``, ``250ms``) to and from milliseconds.

Parsing is the project's one parser, ``exporter.slo.parse_duration`` (``model.ParseDuration`` of
prometheus/common 0.39, what Prometheus 2.42 uses), re-exported here for the engine; this module
adds only the printing side.
"""

from __future__ import annotations

from ...slo import _UNIT_MS, DurationError, parse_duration

__all__ = ["DurationError", "parse_duration", "format_duration"]

_UNITS = tuple(zip(("y", "w", "d", "h", "m", "s", "ms"), _UNIT_MS))


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
