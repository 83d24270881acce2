"""The derived series' rows of the README's metric tables and of docs/interface.md are generated
from the sidecar's own tables (``make docs``): each region is what the renderer writes now, and
every derived series the sidecar serves has exactly one generated row in each document."""

import difflib
import re

import pytest

from conftest import ROOT
from exporter.runtime.collectors import DERIVED, POD_DERIVED, RESOLUTION
from exporter.runtime.collectors import metric_docs as md

DOCS = {
    "README.md": ("derived", "kv-transfer", "lora"),
    "docs/interface.md": ("interface-derived-model", "interface-derived-pod"),
}
SERVED = sorted(["vllm_sidecar_" + n for n in list(DERIVED) + list(POD_DERIVED)] + ["vllm_sidecar_" + RESOLUTION[0]])
ROW = re.compile(r"^\| `(vllm_sidecar_[a-z0-9_]+)(\{[a-z_,]*\})?` \|", re.M)


def _generated_names(text):
    names = []
    for _name, start, end in md.regions(text):
        names += [m.group(1) for m in ROW.finditer(text[start:end])]
    return names


@pytest.mark.parametrize("doc", sorted(DOCS))
def test_generated_regions_match_the_tables(doc):
    text = (ROOT / doc).read_text()
    assert [name for name, _s, _e in md.regions(text)] == list(DOCS[doc]), f"{doc}: its generated regions"
    new = md.rewrite(text)
    diff = "".join(difflib.unified_diff(text.splitlines(True), new.splitlines(True), doc, "rendered", n=0))
    assert new == text, f"{doc} differs from the sidecar's tables: run `make docs`\n{diff[:3000]}"


@pytest.mark.parametrize("doc", sorted(DOCS))
def test_every_served_derived_series_has_exactly_one_generated_row(doc):
    names = _generated_names((ROOT / doc).read_text())
    counts = {n: names.count(n) for n in SERVED}
    assert not [n for n, c in counts.items() if c != 1], {n: c for n, c in counts.items() if c != 1}
    assert sorted(names) == SERVED, sorted(set(names) - set(SERVED))


def test_every_readme_section_is_a_table_with_its_heading():
    text = (ROOT / "README.md").read_text()
    for name, (section, heading) in zip(DOCS["README.md"], md.SECTIONS.items()):
        assert md.REGIONS[name]() == md.readme_table(section)
        assert text.index(f"### {heading}\n") < text.index(f"<!-- BEGIN generated: {name} (make docs) -->"), heading
    assert {s.section for s in DERIVED.values()} | {p.section for p in POD_DERIVED.values()} <= set(md.SECTIONS)


def test_rewrite_keeps_the_prose_and_fails_on_a_broken_region():
    text = "before\n<!-- BEGIN generated: lora (make docs) -->\nstale\n<!-- END generated: lora -->\nafter\n"
    out = md.rewrite(text)
    assert out.startswith("before\n<!-- BEGIN generated: lora (make docs) -->\n| metric |")
    assert out.endswith("<!-- END generated: lora -->\nafter\n") and "stale" not in out
    assert md.rewrite(out) == out
    with pytest.raises(ValueError, match="no end line"):
        md.rewrite("<!-- BEGIN generated: lora (make docs) -->\n")
    with pytest.raises(ValueError, match="unknown generated region"):
        md.rewrite("<!-- BEGIN generated: nope (make docs) -->\n<!-- END generated: nope -->\n")
