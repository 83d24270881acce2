"""What every subcommand's front shares: the program name and an argparse parser whose usage
errors are one line on stderr and exit status 2."""

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
