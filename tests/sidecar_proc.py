"""The real sidecar as a process (``python -m exporter``), for the fault suite.

Started in a new session and stopped by its process group, so nothing it starts outlives a
test. Its JSON log lines are collected as they come; its port is read from its "serving on"
line (``--listen 127.0.0.1:0``), so no port is guessed. Waits are on state, never on time:
``wait_for`` polls a condition with a generous limit and says what it last saw when it fails.
"""

from __future__ import annotations

import calendar
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Callable, Dict, List, Optional

from conftest import ROOT, page
from exporter.harness import pagetransform as pt
from exporter.runtime.exposition import parse
from shared import poll_until


class Advancing:
    """A real vLLM page whose counters advance on every read, like a server under load."""

    def __init__(self, name: str = "after_load.txt"):
        self.base = page(name)
        self.n = 0

    def __call__(self) -> str:
        self.n += 1
        return pt.scale_counters(self.base, 1 + self.n * 0.01)


def http_get(url: str, timeout: float = 5.0):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def scrape(url: str) -> Dict[tuple, float]:
    """A sidecar's /metrics (``url`` its base) as {(name, sorted labels): value}."""
    status, text = http_get(url + "/metrics")
    assert status == 200, status
    return {(s.name, tuple(sorted(s.labels))): s.value for s in parse(text).samples}


def value(m: Dict[tuple, float], name: str, **labels) -> Optional[float]:
    return m.get((name, tuple(sorted(labels.items()))))


class SidecarProcess:
    def __init__(self, *args: str, env: Optional[Dict[str, str]] = None, log_format: str = "json") -> None:
        e = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_SIDECAR_")}
        e.update({"PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", **(env or {})})
        self.log_format = log_format
        self.args = ["--listen", "127.0.0.1:0", "--gpu", "none", "--log-format", log_format, *args]
        self.proc = subprocess.Popen([sys.executable, "-m", "exporter", *self.args], cwd=ROOT, env=e,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     errors="replace", start_new_session=True)
        self.lines: List[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        try:
            line = self.wait_for(lambda: next((x for x in self.lines if "serving on http://" in x), None),
                                 what="the serving line")
        except BaseException:
            self.stop()
            raise
        self.port = int(re.search(r"serving on http://[^:]+:(\d+)/", line).group(1))
        self.url = f"http://127.0.0.1:{self.port}"

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))

    # -- what it says --------------------------------------------------------------------------
    @property
    def records(self) -> List[dict]:
        out = []
        for line in list(self.lines):
            try:
                out.append(json.loads(line))
            except ValueError:
                out.append({"raw": line, "msg": line, "level": "?"})
        return out

    def records_since(self, t: float) -> List[dict]:
        """Records logged at or after unix time ``t`` (by the sidecar's own timestamps)."""
        out = []
        for r in self.records:
            ts = r.get("ts")
            if ts and calendar.timegm(time.strptime(ts[:19], "%Y-%m-%dT%H:%M:%S")) + float("0" + ts[19:-1]) >= t - 0.001:
                out.append(r)
        return out

    def metrics(self) -> Dict[tuple, float]:
        return scrape(self.url)

    value = staticmethod(value)

    def errors(self, m: Dict[tuple, float], reason: str) -> float:
        return self.value(m, "vllm_sidecar_poll_errors_total", target="vllm", reason=reason) or 0.0

    def up(self, m: Dict[tuple, float]) -> Optional[float]:
        return self.value(m, "vllm_sidecar_target_up", target="vllm")

    def tokens(self, m: Dict[tuple, float]) -> Optional[float]:
        return self.value(m, "vllm_sidecar_generation_tokens_per_second", model_name="tiny-llama")

    def healthz(self) -> int:
        return http_get(self.url + "/healthz")[0]

    # -- waiting -------------------------------------------------------------------------------
    def wait_for(self, fn: Callable[[], object], timeout: float = 30.0, every: float = 0.05, what: str = ""):
        def exited() -> str:
            if self.proc.poll() is not None and not what.startswith("exit"):
                return f"the sidecar exited ({self.proc.returncode})"
            return ""
        return poll_until(fn, what, timeout, every, diag=lambda: "log tail:\n" + "\n".join(self.lines[-20:]),
                          stop_if=exited)

    def wait_metrics(self, cond: Callable[[Dict[tuple, float]], bool], what: str, timeout: float = 30.0):
        return self.wait_for(lambda: (lambda m: m if cond(m) else None)(self.metrics()), timeout, what=what)

    def healthy_again(self, timeout: float = 30.0):
        return self.wait_metrics(lambda m: self.up(m) == 1 and (self.tokens(m) or 0) > 0,
                                 "vllm up with tokens/s", timeout)

    # -- stopping ------------------------------------------------------------------------------
    def signal(self, sig: int) -> None:
        os.kill(self.proc.pid, sig)

    def stop(self) -> int:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
            except ProcessLookupError:
                pass
        self._reader.join(5)
        return self.proc.returncode
