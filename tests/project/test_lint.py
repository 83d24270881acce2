"""The code passes ruff's lint as configured in pyproject.toml ([tool.ruff]: pycodestyle, pyflakes,
isort and bugbear; lines up to 130). A test rather than a separate CI step, so that ``make test``
and .ci/run report a lint failure beside the others with the lines at fault."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT


def test_ruff_finds_nothing():
    ruff = Path(sys.executable).parent / "ruff"
    ruff = str(ruff) if ruff.exists() else shutil.which("ruff")
    if ruff is None:
        pytest.fail("ruff is not installed: pip install -e '.[test]' (make test does)")
    r = subprocess.run([ruff, "check", "--no-cache", "--output-format", "concise", "."], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
