"""Every alert links to a runbook that exists, and every query in the runbooks is valid PromQL."""

import re
import subprocess

import pytest
import yaml

from conftest import ROOT
from promseries import rules_by_alert

BOOKS = ROOT / "docs" / "runbooks"


def test_every_alert_has_its_runbook():
    for name, rules in rules_by_alert().items():
        for r in rules:
            url = r["annotations"]["runbook_url"]
            # no runbook URL configured: the runbook's path here, and its steps in the alert itself
            assert url == f"docs/runbooks/{name}.md", url
            assert r["annotations"]["runbook"].startswith("- "), r["annotations"]
        text = (BOOKS / f"{name}.md").read_text()
        assert text.startswith(f"# {name}\n")
        for section in ("## What it means", "## Confirm", "## Act"):
            assert section in text, (name, section)
    assert {p.stem for p in BOOKS.glob("*.md")} == set(rules_by_alert())


@pytest.mark.prometheus
def test_runbook_queries_are_valid_promql(tmp_path):
    queries = []
    for p in sorted(BOOKS.glob("*.md")):
        for block in re.findall(r"```promql\n(.*?)```", p.read_text(), re.S):
            for line in block.strip().splitlines():
                queries.append((p.stem, line.replace("$POD", "vllm-0").replace("$MODEL", "llama-70b")))
    assert len(queries) > 40
    rules = [{"record": f"runbook:check{i}", "expr": q} for i, (_, q) in enumerate(queries)]
    f = tmp_path / "runbook-queries.yml"
    f.write_text(yaml.safe_dump({"groups": [{"name": "runbooks", "rules": rules}]}))
    r = subprocess.run(["promtool", "check", "rules", str(f)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
