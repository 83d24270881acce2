"""What every test folder has: the real vLLM pages as fixtures (``idle``, ``after_load``,
``after_pressure``), a fake ``clock``, ``ROOT``, ``FIXTURES`` and ``page()``; tests/ on the path, so
that the support modules beside this file (``shared``, ``helpers``, ``promseries``...) import by
name from tests/<wing>/; the virtualenv first on PATH; and the leak check at the end of the run.
The layout of the tests: docs/architecture.md, "The tests"."""

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
FIXTURES = ROOT / "tests" / "fixtures"
VLLM_PAGES = FIXTURES / "vllm"


def page(name: str) -> str:
    return (VLLM_PAGES / name).read_text()


@pytest.fixture
def idle():
    return page("idle.txt")


@pytest.fixture
def after_load():
    return page("after_load.txt")


@pytest.fixture
def after_pressure():
    return page("after_pressure.txt")


class FakeClock:
    def __init__(self, t: float = 1_800_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> None:
        self.t += s


@pytest.fixture
def clock():
    return FakeClock()


# -- the run's environment ------------------------------------------------------------------------

# the virtualenv's programs first on PATH (its kubectl, its console script), however pytest started
_VENV_BIN = str(Path(sys.executable).parent)
if os.environ.get("PATH", "").split(os.pathsep)[0] != _VENV_BIN:
    os.environ["PATH"] = _VENV_BIN + os.pathsep + os.environ.get("PATH", "")

# no process started by the tests outlives them: checked (and the run failed) at the end
sys.path.insert(0, str(Path(__file__).resolve().parent))
from leakcheck import pytest_sessionfinish  # noqa: E402,F401


@pytest.fixture(scope="module")
def naive():
    """The user's naive rules, beside which every detection-matrix cell is judged."""
    from exporter.harness.detection import naive_rules_file

    return naive_rules_file()
