"""No process started by the tests outlives them.

Every process the tests start inherits ``SIDECAR_EXPORTER_TEST_RUN=<this run's mark>`` (set here at
import, so in ``os.environ`` before any test starts anything), and so does every process those
start: vLLM's EngineCore and workers too, even once their API server is gone and they are orphaned.
At the end of the session ``pytest_sessionfinish`` looks for processes that are still alive and
either descend from the pytest process, carry this run's mark in their environment, or run a
known program (vLLM, Prometheus, Alertmanager, the sidecar) from a directory under this run's
temporary directory. It waits a few seconds for processes on their way out, then kills what is
left (its process group when that is not pytest's own), lists them, and fails the run.

conftest.py imports the hook; ``pytest -p leakcheck`` loads it on its own (tests/project/test_leakcheck.py).
"""

from __future__ import annotations

import os
import re
import signal
import time
import uuid
from pathlib import Path
from typing import Dict, List, Optional

import pytest

MARK_VAR = "SIDECAR_EXPORTER_TEST_RUN"  # not VLLM_*: vLLM warns about unknown VLLM_ variables
MARK = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
os.environ[MARK_VAR] = MARK
KNOWN = re.compile(r"vllm|prometheus|alertmanager|vllm-sidecar-exporter|exporter\.cli|-m exporter")
GRACE_S = 5.0


def _read(path: str) -> Optional[bytes]:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def _stat(pid: int):
    """(state, ppid) from /proc/PID/stat, or None when the process is gone."""
    raw = _read(f"/proc/{pid}/stat")
    if raw is None:
        return None
    rest = raw[raw.rfind(b")") + 2:].split()
    return rest[0].decode(), int(rest[1])


def cmdline(pid: int) -> str:
    raw = _read(f"/proc/{pid}/cmdline") or b""
    comm = (_read(f"/proc/{pid}/comm") or b"?").decode().strip()
    return raw.replace(b"\0", b" ").decode(errors="replace").strip() or f"[{comm}]"


def _pids() -> List[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def leftovers(mark: str = MARK, root: int = None, tmp_root: Optional[Path] = None) -> Dict[int, str]:
    """{pid: command line} of the live (non-zombie) processes this run started."""
    root = os.getpid() if root is None else root
    me = os.getpid()
    parents: Dict[int, int] = {}
    live = set()
    for pid in _pids():
        st = _stat(pid)
        if st is None or st[0] in ("Z", "X"):
            continue
        parents[pid] = st[1]
        live.add(pid)
    found: Dict[int, str] = {}
    needle = f"{MARK_VAR}={mark}".encode()
    tmp = str(tmp_root) if tmp_root else None
    for pid in live:
        if pid == me:
            continue
        p, hops = parents.get(pid), 0
        descends = False
        while p and hops < 64:
            if p == root:
                descends = True
                break
            p, hops = parents.get(p), hops + 1
        env = _read(f"/proc/{pid}/environ") or b""
        marked = needle in env.split(b"\0")
        from_tmp = False
        if tmp and not (descends or marked):
            try:
                cwd = os.readlink(f"/proc/{pid}/cwd")
            except OSError:
                cwd = ""
            from_tmp = cwd.startswith(tmp) and bool(KNOWN.search(cmdline(pid)))
        if descends or marked or from_tmp:
            found[pid] = cmdline(pid)
    return found


def kill(pids) -> None:
    """SIGKILL each process, and its process group when that is not ours."""
    own = os.getpgrp()
    for pid in pids:
        try:
            pgid = os.getpgid(pid)
            if pgid != own and pgid > 1:
                os.killpg(pgid, signal.SIGKILL)
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def check(mark: str = MARK, tmp_root: Optional[Path] = None, grace: float = GRACE_S) -> Dict[int, str]:
    """What is still alive after ``grace`` seconds; killed before returning."""
    end = time.monotonic() + grace
    left = leftovers(mark, tmp_root=tmp_root)
    while left and time.monotonic() < end:
        time.sleep(0.25)
        left = leftovers(mark, tmp_root=tmp_root)
    if left:
        kill(left)
        end = time.monotonic() + 5
        while time.monotonic() < end and any(_stat(p) and _stat(p)[0] not in ("Z", "X") for p in left):
            time.sleep(0.1)
    return left


def pytest_sessionfinish(session, exitstatus):
    factory = getattr(session.config, "_tmp_path_factory", None)
    tmp_root = None
    if factory is not None:
        try:
            tmp_root = factory.getbasetemp()
        except Exception:  # noqa: BLE001 - no temporary directory made in this run
            tmp_root = None
    left = check(tmp_root=tmp_root)
    if not left:
        return
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    lines = [f"{len(left)} process(es) started by the tests were still running at the end (killed now):"]
    lines += [f"  pid {pid}: {cmd[:300]}" for pid, cmd in sorted(left.items())]
    for line in lines:
        if tr is not None:
            tr.write_line(line, red=True, bold=True)
        else:
            print(line)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
