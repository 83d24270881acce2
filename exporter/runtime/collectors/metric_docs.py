"""The derived series' rows of the README's metric tables and of docs/interface.md, rendered from
``DERIVED``, ``POD_DERIVED`` and ``RESOLUTION``: the name, the labels and the help text served on
/metrics. Each table sits in a marked region of the Markdown::

    <!-- BEGIN generated: lora (make docs) -->
    | metric | labels | meaning |
    ...
    <!-- END generated: lora -->

and only the region is rewritten, so the prose around it stays written by hand. ``make docs``
rewrites every region (``python -m exporter.runtime.collectors.metric_docs README.md
docs/interface.md``; ``--check`` only says which differ); tests/project/test_metric_docs.py fails
while one differs. Which README table a series is a row of is its ``section``.
"""

from __future__ import annotations

import re
import sys
from typing import Callable, Dict, Iterator, List, Tuple

from .base import PREFIX
from .vllm import DERIVED, POD_DERIVED, RESOLUTION

# section -> the README table (its heading) its rows are in
SECTIONS = {
    "vllm": "Derived from vLLM, per `model_name`, over the window",
    "kv_transfer": "Prefill/decode disaggregation (KV transfer)",
    "lora": "LoRA adapters (whole pod)",
}

BEGIN = re.compile(r"^<!-- BEGIN generated: (?P<name>[a-z_-]+) \(make docs\) -->\n", re.M)


def _end(name: str) -> str:
    return f"<!-- END generated: {name} -->\n"


def _rows(section: str) -> Iterator[Tuple[str, Tuple[str, ...], bool, str]]:
    """(name, labels, per model, help) of every derived series of ``section``, the table's order:
    the per-model series, the quantiles' resolution flag after the last distribution, the pod's."""
    rows = [(name, ("model_name", *(("quantile",) if s.summary else s.extra)), True, s.help)
            for name, s in DERIVED.items() if s.section == section]
    summaries = [i for i, (name, *_rest) in enumerate(rows) if DERIVED[name].summary]
    if section == "vllm":
        rows.insert(summaries[-1] + 1 if summaries else len(rows),
                    (RESOLUTION[0], ("model_name", "metric", "for_quantile"), True, RESOLUTION[1]))
    rows += [(name, p.labels or ((p.label,) if p.label else ()), False, p.help)
             for name, p in POD_DERIVED.items() if p.section == section]
    yield from rows


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def readme_table(section: str) -> str:
    out = ["| metric | labels | meaning |", "| --- | --- | --- |"]
    for name, labels, _model, help_ in _rows(section):
        out.append(f"| `{PREFIX}{name}` | {', '.join(labels)} | {_cell(help_)} |")
    return "\n".join(out) + "\n"


def interface_table(per_model: bool) -> str:
    """Every derived series, per model (``model_name`` left out of the braces) or the pod's."""
    out = ["| name | meaning |", "| --- | --- |"]
    for section in SECTIONS:
        for name, labels, model, help_ in _rows(section):
            if model != per_model:
                continue
            extra = [label for label in labels if label != "model_name"]
            braces = "{" + ",".join(extra) + "}" if extra else ""
            out.append(f"| `{PREFIX}{name}{braces}` | {_cell(help_)} |")
    return "\n".join(out) + "\n"


REGIONS: Dict[str, Callable[[], str]] = {
    "derived": lambda: readme_table("vllm"),
    "kv-transfer": lambda: readme_table("kv_transfer"),
    "lora": lambda: readme_table("lora"),
    "interface-derived-model": lambda: interface_table(True),
    "interface-derived-pod": lambda: interface_table(False),
}


def regions(text: str) -> List[Tuple[str, int, int]]:
    """(name, start, end) of the body of every generated region in ``text``."""
    out = []
    for m in BEGIN.finditer(text):
        name = m.group("name")
        if name not in REGIONS:
            raise ValueError(f"unknown generated region {name!r} (known: {', '.join(REGIONS)})")
        end = text.find(_end(name), m.end())
        if end < 0:
            raise ValueError(f"generated region {name!r} has no end line {_end(name).strip()!r}")
        out.append((name, m.end(), end))
    return out


def rewrite(text: str) -> str:
    """``text`` with the body of every generated region rendered anew."""
    for name, start, end in reversed(regions(text)):
        text = text[:start] + REGIONS[name]() + text[end:]
    return text


def main(argv: List[str]) -> int:
    check = "--check" in argv
    paths = [a for a in argv if a != "--check"]
    if not paths:
        print("usage: python -m exporter.runtime.collectors.metric_docs [--check] FILE.md ...", file=sys.stderr)
        return 2
    stale = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        new = rewrite(text)
        if new != text:
            stale.append(path)
            if not check:
                with open(path, "w", encoding="utf-8") as f:
                    f.write(new)
    if check and stale:
        print("generated metric tables out of date (run `make docs`): " + ", ".join(stale), file=sys.stderr)
        return 1
    for path in stale:
        print(f"rewrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
