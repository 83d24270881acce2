"""The end-of-run process check (tests/leakcheck.py) finds what the tests leave running, orphans
included, kills it and fails the run; a clean run passes."""

import os
import subprocess
import sys
import time
from pathlib import Path

import leakcheck

TESTS = Path(leakcheck.__file__).resolve().parent  # the support modules' folder: -p leakcheck


def alive(pid: int) -> bool:
    st = leakcheck._stat(pid)
    return st is not None and st[0] not in ("Z", "X")


def test_an_orphan_of_this_run_is_found_and_killed():
    # a shell that starts a process in its own session and exits: the process is re-parented
    # (like vLLM's EngineCore when only its API server is killed), found by this run's mark
    out = subprocess.run(["sh", "-c", "setsid sleep 300.25 >/dev/null 2>&1 & echo $!"], capture_output=True,
                         text=True, check=True).stdout
    pid = int(out.strip())
    try:
        time.sleep(0.2)
        assert alive(pid)
        parent = leakcheck._stat(pid)[1]
        assert parent != os.getpid()  # not our child: found by the mark alone
        assert pid in leakcheck.leftovers()
        assert "sleep 300.25" in leakcheck.leftovers()[pid]
        leakcheck.kill([pid])
        end = time.monotonic() + 5
        while alive(pid) and time.monotonic() < end:
            time.sleep(0.05)
        assert not alive(pid)
    finally:
        leakcheck.kill([pid])


def run_pytest(tmp_path, body: str):
    test = tmp_path / "test_inner.py"
    test.write_text(body)
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "leakcheck", "-p", "no:cacheprovider",
                           "-p", "no:cloudcoil",
                           "--rootdir", str(tmp_path), str(test)], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120)


def test_a_run_that_leaves_processes_fails_and_lists_them(tmp_path):
    r = run_pytest(tmp_path, (
        "import subprocess\n"
        "def test_leaks():\n"
        "    subprocess.Popen(['sleep', '300.5'], start_new_session=True)\n"
        "    subprocess.run(['sh', '-c', 'setsid sleep 300.75 >/dev/null 2>&1 &'], check=True)\n"))
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "1 passed" in out and "still running at the end (killed now)" in out, out
    assert "sleep 300.5" in out and "sleep 300.75" in out, out
    def left():  # killed by the inner run; gone once the kernel has reaped them
        return [pid for pid in leakcheck._pids() if alive(pid) and leakcheck.cmdline(pid) in ("sleep 300.5", "sleep 300.75")]

    end = time.monotonic() + 30
    while left() and time.monotonic() < end:
        time.sleep(0.1)
    assert left() == []


def test_a_clean_run_passes(tmp_path):
    r = run_pytest(tmp_path, (
        "import subprocess\n"
        "def test_clean():\n"
        "    p = subprocess.Popen(['sleep', '30'], start_new_session=True)\n"
        "    p.kill(); p.wait()\n"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "still running" not in r.stdout
