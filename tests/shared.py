"""What several test modules need alike, written once (project/test_layout.py keeps a test module
from writing its own again):

- ``run_main(capsys, *argv)``, ``main_for(*command)``: the command line in this process, its exit
  code and what it printed;
- ``run_cli(*args)``: the command line as a process of its own (``python -m exporter``);
- ``poll_until(cond, what)``: ``cond()``'s first true answer, asked until a deadline, a failed
  test naming ``what`` when none comes;
- ``PressureScript``: the page a vLLM stand-in (``PageServer``) serves, a real one under pressure
  whose counters advance at every read and whose gauges the test sets.
"""

import os
import subprocess
import sys

from conftest import ROOT, page
from exporter.cli import main
from exporter.harness import pagetransform as pt
from exporter.harness.localstack import StackError, wait_until


def run_main(capsys, *argv):
    """``exporter.cli.main(argv)`` in this process: (exit code, stdout, stderr)."""
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def main_for(*command):
    """``run_main`` of one subcommand: ``main_for("gate")(capsys, "--baseline", ...)``."""
    def run(capsys, *argv):
        return run_main(capsys, *command, *argv)
    return run


def run_cli(*args, env=None, timeout=20):
    """``python -m exporter ARGS`` from the checkout, as a process: its ``CompletedProcess``."""
    e = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run([sys.executable, "-m", "exporter", *args], capture_output=True, text=True,
                          timeout=timeout, env=e, cwd=ROOT)


def poll_until(cond, what="condition", timeout=60.0, every=0.05, diag=None, stop_if=None):
    """``cond()``'s first true answer, asked every ``every`` seconds (an exception counts as "not
    yet"); an ``AssertionError`` naming ``what`` (and ``diag()``) when ``timeout`` runs out, or at
    once when ``stop_if()`` gives a reason to stop. ``localstack.wait_until`` as a test's check."""
    try:
        return wait_until(cond, timeout, every, what, diag=diag, stop_if=stop_if)
    except StackError as exc:
        raise AssertionError(str(exc)) from None


class PressureScript:
    """A vLLM stand-in's page: the real after_pressure page, its counters ``growth`` further at
    every read (those named ``only_prefix``...), the gauges set by ``gauges``: by default the KV
    cache at ``kv``, 12 running and ``capacity`` waiting for it, as the test sets them."""

    growth = 0.02
    only_prefix = "vllm:"

    def __init__(self):
        self.base = page("after_pressure.txt")
        self.n = 0
        self.kv = 0.5
        self.capacity = 0

    def __call__(self):
        self.n += 1
        return self.gauges(pt.scale_counters(self.base, 1 + self.n * self.growth, only_prefix=self.only_prefix))

    def gauges(self, text):
        text = pt.set_values(text, {"vllm:kv_cache_usage_perc": self.kv, "vllm:num_requests_running": 12,
                                    "vllm:num_requests_waiting": self.capacity})
        return pt.set_values(text, {"vllm:num_requests_waiting_by_reason": self.capacity}, 'reason="capacity"')
