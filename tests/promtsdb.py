"""A real Prometheus serving recorded history: OpenMetrics text turned into TSDB blocks by
``promtool tsdb create-blocks-from openmetrics``, then ``prometheus`` started over them with no
scrape targets. For the tests that read history over the HTTP API (backtest, capacity, gate) and
must give the same answer as from the file. The server runs in its own process group and is
stopped by it, whatever the test does."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Iterator, Sequence

import requests

from exporter.harness.localstack import free_port


def create_blocks(openmetrics_file: Path, data: Path, timeout: float = 300, nice: int = 0) -> None:
    """``promtool tsdb create-blocks-from openmetrics`` of one file into ``data`` (which may already
    hold blocks: the new ones are added beside them)."""
    assert shutil.which("promtool"), "promtool not installed (make test installs it)"
    argv = ["promtool", "tsdb", "create-blocks-from", "openmetrics", "-q", str(openmetrics_file), str(data)]
    if nice:
        argv = ["nice", "-n", str(nice)] + argv
    r = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-2000:]


@contextlib.contextmanager
def prometheus_over(openmetrics_file: Path, workdir: Path, ready_seconds: float = 60) -> Iterator[str]:
    """Yield the base URL of a Prometheus holding ``openmetrics_file``'s samples."""
    data = workdir / "tsdb"
    create_blocks(openmetrics_file, data)
    with prometheus_serving(data, workdir, ready_seconds) as url:
        yield url


@contextlib.contextmanager
def prometheus_serving(data: Path, workdir: Path, ready_seconds: float = 60, flags: Sequence[str] = ()) -> Iterator[str]:
    """Yield the base URL of a Prometheus started over the TSDB directory ``data`` (no targets)."""
    assert shutil.which("prometheus"), "prometheus not installed (make test installs it)"
    cfg = workdir / "prometheus.yml"
    cfg.write_text("global: {}\nscrape_configs: []\n")
    port = free_port()
    with (workdir / "prometheus.log").open("w") as log:
        proc = subprocess.Popen(["prometheus", f"--config.file={cfg}", f"--storage.tsdb.path={data}",
                                 f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=100y",
                                 *flags],
                                stdout=subprocess.DEVNULL, stderr=log, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + ready_seconds
        while True:
            try:
                if requests.get(url + "/-/ready", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "prometheus did not become ready"
            time.sleep(0.2)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
