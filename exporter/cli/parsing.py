"""What every subcommand's front shares: the program name, an argparse parser whose usage
errors are one line on stderr and exit status 2, and the reading of times and durations given
on the command line."""

from __future__ import annotations

import argparse
import sys

PROG = "vllm-sidecar-exporter"


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line on stderr and exit status 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        sys.exit(2)


def fail(sub: str, message: str) -> int:
    """Write the one-line error of subcommand ``sub`` and return exit status 2."""
    prog = f"{PROG} {sub}" if sub else PROG
    sys.stderr.write(f"{prog}: error: {message}\n")
    return 2


def parse_time(text: str, what: str) -> int:
    """RFC 3339 (``2026-01-02T03:04:05Z``, offsets and fractions allowed) or unix seconds, to ms
    (the sidecar's own reading of ``/debug/flight?start=&end=``)."""
    from ..runtime.flight import parse_when

    return int(round(parse_when(text, what) * 1000))


def duration_ms(text: str, what: str) -> int:
    """A positive Prometheus duration (``30s``, ``1h30m``) in ms; ValueError naming ``what``."""
    from ..analysis.promql.durations import DurationError, parse_duration

    try:
        ms = parse_duration(text)
    except DurationError:
        raise ValueError(f"{what}: {text!r} is not a duration (like 30s, 5m, 1h30m)") from None
    if ms <= 0:
        raise ValueError(f"{what}: must be positive")
    return ms
