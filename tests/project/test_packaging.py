"""The package builds without deprecation warnings about its metadata: the license is an SPDX
expression (``project.license = "Apache-2.0"``, setuptools 77+), the LICENSE file ships, and
the container build copies every file the build reads."""

import re
import subprocess
import sys
import zipfile

import pytest

from conftest import ROOT


def test_wheel_builds_without_license_warnings(tmp_path):
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-v",
                        "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True, timeout=600)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert "project.license` as a TOML table is deprecated" not in out
    assert not re.search(r"license.*deprecat|deprecat.*license", out, re.I), out[-3000:]
    [whl] = tmp_path.glob("vllm_sidecar_exporter-*.whl")
    with zipfile.ZipFile(whl) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
        assert any(n.endswith(".dist-info/licenses/LICENSE") for n in z.namelist())
    assert "License-Expression: Apache-2.0" in meta.splitlines()


def test_dockerfile_copies_what_the_build_reads():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"
    needed = {"pyproject.toml", project["readme"], *project["license-files"]}
    copied = set()
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            copied.update(line.split()[1:-1])
    assert needed <= copied, needed - copied
    assert "Apache License" in (ROOT / "LICENSE").read_text()[:200]


def test_the_repository_documents_its_own_interface():
    """The interface page is the project's own (docs/interface.md, linked from the README), and no
    tracked file points a reader outside the repository for it."""
    import subprocess as sp

    page = (ROOT / "docs" / "interface.md").read_text()
    for must in ("## Command line", "## Metric names", "## Alert names", "`top`", "`--sidecar-url URL`"):
        assert must in page, must
    assert "](docs/interface.md)" in (ROOT / "README.md").read_text()
    files = sp.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    if not files:  # not a git checkout (an unpacked archive): every file then
        files = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file() and ".venv" not in p.parts]
    pointing = [f for f in files if (ROOT / f).is_file() and f != "tests/project/test_packaging.py"
                and "shared/CONTRACT" in (ROOT / f).read_text(errors="replace")]
    assert pointing == []
