"""Real Prometheus, Alertmanager and the sidecar on free loopback ports: for the demo's
``--with-prometheus`` and for the tests.

Every process started here is stopped by ``Stack.close()`` (use it as a context manager), also
when the caller fails; ``diag()`` gives the tail of each process's log for error messages.
"""

import calendar
import json
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Dict, List, Optional

import yaml


def free_port() -> int:
    """A loopback port free now (the kernel's choice): the one way the harness, tests and
    benchmarks pick a port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 30.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read().decode())


class StackError(RuntimeError):
    """A process of the stack did not start, answer or behave as expected; one message."""


class WaitTimeout(StackError, TimeoutError):
    """A condition did not come true in time; the message says which, with the last value seen."""


def wait_until(fn, timeout: float, every: float = 0.25, what: str = "condition", diag=None, stop_if=None):
    """``fn()``'s first true answer, asked every ``every`` seconds for up to ``timeout``; an
    exception from ``fn`` counts as "not yet". ``WaitTimeout`` (saying ``what``, the last answer
    and ``diag()``) when time runs out; ``StackError`` at once when ``stop_if()`` gives a reason
    to stop waiting (a process that exited). The one wait of the harness, the tests and scripts."""
    end = time.monotonic() + timeout
    last = None
    while time.monotonic() < end:
        why = stop_if() if stop_if else ""
        if why:
            raise StackError(f"{why} while waiting for {what}\n{diag() if diag else ''}")
        try:
            last = fn()
            if last:
                return last
        except Exception as exc:  # noqa: BLE001 - not up yet
            last = exc
        time.sleep(every)
    extra = diag() if diag else ""
    raise WaitTimeout(f"timed out after {timeout}s waiting for {what} (last: {last!r})\n{extra}")


class Webhook:
    """An Alertmanager webhook receiver: keeps every notification it gets."""

    def __init__(self) -> None:
        self.received: List[dict] = []
        self.lock = threading.Lock()
        hook = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                return

            def do_POST(self):  # noqa: N802
                n = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(n).decode())
                body["_path"] = self.path
                with hook.lock:
                    hook.received.append(body)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def alerts(self, path: Optional[str] = None) -> List[dict]:
        with self.lock:
            return [dict(a, _path=n["_path"], _receiver=n["receiver"]) for n in self.received
                    if path is None or n["_path"] == path for a in n["alerts"]]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class Process:
    def __init__(self, name: str, args: List[str], workdir: Path, env: Optional[Dict[str, str]] = None):
        self.name = name
        self.log_path = workdir / f"{name}.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, cwd=workdir,
                                     env={**os.environ, **(env or {})}, start_new_session=True)

    def tail(self, n: int = 30) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return f"--- {self.name} log (last {n} lines) ---\n" + "\n".join(lines[-n:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self.log.close()


def alertmanager_binary() -> str:
    return shutil.which("prometheus-alertmanager") or shutil.which("alertmanager") or "alertmanager"


class Stack:
    """Prometheus (+ optionally Alertmanager) scraping the given targets with the given rules."""

    def __init__(self, workdir: Path) -> None:
        self.dir = workdir
        self.procs: List[Process] = []
        self.webhook: Optional[Webhook] = None
        self.prom_url = ""
        self.am_url = ""

    def __enter__(self) -> "Stack":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def diag(self) -> str:
        return "\n".join(p.tail() for p in self.procs)

    def start_alertmanager(self, config_path: Path, group_wait: str = "1s") -> None:
        self.webhook = Webhook()
        cfg = yaml.safe_load(config_path.read_text())
        # the example config, with its receivers pointed at the test's webhook and quick timers
        for r in cfg["receivers"]:
            for w in r.get("webhook_configs", []):
                w["url"] = f"http://127.0.0.1:{self.webhook.port}/{r['name']}"
        route = cfg["route"]
        for node in [route] + route.get("routes", []):
            if "group_wait" in node:
                node["group_wait"] = group_wait
            node["group_interval"] = "1s"
            node["repeat_interval"] = "1m"
        path = self.dir / "alertmanager.yml"
        path.write_text(yaml.safe_dump(cfg))
        port = free_port()
        self.am_url = f"http://127.0.0.1:{port}"
        (self.dir / "am-data").mkdir(exist_ok=True)
        p = Process("alertmanager", [alertmanager_binary(), f"--config.file={path}",
                                     f"--storage.path={self.dir / 'am-data'}",
                                     f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
                    self.dir)
        self.procs.append(p)
        wait_until(lambda: urllib.request.urlopen(self.am_url + "/-/ready", timeout=1).status == 200, 30,
                   what="alertmanager ready", diag=self.diag)

    def start_prometheus(self, targets: List[dict], rule_files: List[Path], interval: str = "1s",
                         extra_flags: Optional[List[str]] = None) -> None:
        """``targets``: [{"job": ..., "address": "127.0.0.1:port", "labels": {...}}]"""
        scrape = []
        for t in targets:
            scrape.append({"job_name": t["job"], "scrape_interval": interval, "scrape_timeout": interval,
                           "metrics_path": t.get("path", "/metrics"),
                           "static_configs": [{"targets": [t["address"]], "labels": t.get("labels", {})}]})
        cfg = {"global": {"scrape_interval": interval, "evaluation_interval": interval},
               "rule_files": [str(p) for p in rule_files], "scrape_configs": scrape}
        if self.am_url:
            cfg["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [self.am_url.split("//")[1]]}]}]}
        path = self.dir / "prometheus.yml"
        path.write_text(yaml.safe_dump(cfg))
        self.scrape_seconds = _seconds(interval)
        self.targets = len(targets)
        port = free_port()
        self.prom_url = f"http://127.0.0.1:{port}"
        p = Process("prometheus", ["prometheus", f"--config.file={path}", f"--storage.tsdb.path={self.dir / 'prom-data'}",
                                   f"--web.listen-address=127.0.0.1:{port}", "--web.enable-lifecycle",
                                   *(extra_flags or [])], self.dir)
        self.procs.append(p)
        wait_until(lambda: urllib.request.urlopen(self.prom_url + "/-/ready", timeout=1).status == 200, 30,
                   what="prometheus ready", diag=self.diag)

    def query(self, promql: str, at: Optional[float] = None) -> List[dict]:
        q = {"query": promql}
        if at is not None:
            q["time"] = str(at)
        data = http_get(self.prom_url + "/api/v1/query?" + urllib.parse.urlencode(q))
        if data.get("status") != "success":
            raise StackError(f"Prometheus query {promql!r} failed: {data}")
        return data["data"]["result"]

    def alerts(self) -> List[dict]:
        return http_get(self.prom_url + "/api/v1/alerts")["data"]["alerts"]

    def alert_state(self, name: str) -> Optional[str]:
        states = {a["state"] for a in self.alerts() if a["labels"]["alertname"] == name}
        return "firing" if "firing" in states else ("pending" if "pending" in states else None)

    def settled_at(self, after: float = 0.0, scrapes: int = 4, timeout: float = 180.0, lag: float = 3.0,
                   diag=None) -> float:
        """A moment (Unix seconds) at which every target's last ``scrapes`` scrapes had all
        succeeded, and since which every rule group of the fastest interval has evaluated (the
        alerting group; the pack's slow alerts and views run every few minutes): ask a query
        ``at`` it to read a settled state. On a busy machine a scrape that times out writes ``up`` 0 and marks every
        series of its target stale until the next one, and a rule evaluated in that gap records
        nothing; a query at "now" can fall in such a gap, a query at this moment cannot. The
        moment is ``lag`` seconds in the past, so that a scrape still in flight (its samples are
        stamped with its start) cannot land before it unseen; and later than ``after`` (what the
        caller has seen by then is in it). Waits up to ``timeout``."""
        span = f"{int((scrapes + 0.5) * self.scrape_seconds * 1000)}ms"
        healthy = f"min_over_time(up[{span}]) == 1 and count_over_time(up[{span}]) >= {scrapes}"

        def moment():
            at = time.time() - lag
            if at <= after or len(self.query(healthy, at=at)) < self.targets:
                return None
            groups = http_get(self.prom_url + "/api/v1/rules")["data"]["groups"]
            fastest = min((g["interval"] for g in groups), default=0)
            return at if all(unix_time(g["lastEvaluation"]) > at for g in groups if g["interval"] == fastest) else None

        return wait_until(moment, timeout, every=0.5, what=f"{scrapes} good scrapes of every target in a row",
                          diag=diag or self.diag)

    def targets_up(self) -> bool:
        data = http_get(self.prom_url + "/api/v1/targets")["data"]["activeTargets"]
        return bool(data) and all(t["health"] == "up" for t in data)

    def close(self) -> None:
        for p in reversed(self.procs):
            p.stop()
        if self.webhook:
            self.webhook.close()


def _seconds(duration: str) -> float:
    """A Prometheus duration of one unit ("1s", "500ms", "2m") in seconds."""
    for unit, scale in (("ms", 0.001), ("s", 1.0), ("m", 60.0)):
        if duration.endswith(unit) and duration[:-len(unit)].replace(".", "", 1).isdigit():
            return float(duration[:-len(unit)]) * scale
    raise ValueError(f"scrape interval {duration!r}: a number of ms, s or m")


def unix_time(rfc3339: str) -> float:
    """Prometheus' RFC 3339 time (nanoseconds; ``Z`` or an offset) in Unix seconds; 0 for Go's
    zero time (a rule group not evaluated yet)."""
    stamp, offset = rfc3339[:19], rfc3339[19:]
    if stamp.startswith("0001-"):
        return 0.0
    frac, zone = "0", "Z"
    if offset.startswith("."):
        cut = next((i for i, c in enumerate(offset[1:]) if not c.isdigit()), len(offset) - 1)
        frac, zone = offset[1:1 + cut] or "0", offset[1 + cut:] or "Z"
    shift = 0
    if zone not in ("Z", ""):
        sign = -1 if zone[0] == "-" else 1
        hours, _, minutes = zone[1:].partition(":")
        shift = sign * (int(hours) * 3600 + int(minutes or 0) * 60)
    return calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%S")) + float("0." + frac) - shift


class SidecarThread:
    """The real sidecar (``run_sidecar``) in a thread, on a free port."""

    def __init__(self, cfg_overrides: dict, nvml=None) -> None:
        from ..runtime import config
        from ..runtime.app import run_sidecar

        cfg = config.build({"listen": "127.0.0.1:0", **cfg_overrides}, {})
        self.stop_event = threading.Event()
        self.ready: dict = {}
        self.thread = threading.Thread(
            target=run_sidecar, args=(cfg, {}),
            kwargs={"stop": self.stop_event, "nvml": nvml,
                    "on_ready": lambda srv, sc: self.ready.update(server=srv, sidecar=sc)},
            daemon=True)
        self.thread.start()
        wait_until(lambda: "server" in self.ready, 10, what="sidecar serving")
        self.port = self.ready["server"].address[1]
        self.address = f"127.0.0.1:{self.port}"

    @property
    def sidecar(self):
        return self.ready["sidecar"]

    def close(self) -> None:
        self.stop_event.set()
        self.thread.join(3)
