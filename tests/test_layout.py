"""The package's shape: imports flow one way between the wings.

runtime (the sidecar) imports neither the pack nor the harness; the pack imports neither the
runtime nor the harness; nothing imports the command line back. Checked on the source, with
every import (module level or inside a function) resolved to its absolute module name.
"""

import ast

from conftest import ROOT

PKG = ROOT / "exporter"

# wing -> wings (and foundation modules) it may import
ALLOWED = {
    "runtime": {"runtime", "slo", "errors", ""},
    "pack": {"pack", "slo", "errors", ""},
    "harness": {"harness", "runtime", "pack", "analysis", "slo", "errors", ""},
    "analysis": {"analysis", "pack", "runtime", "slo", "errors", ""},
    "slo": {"errors", ""},
    "errors": set(),
}


def _imports(path):
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    pkg = parts if path.name == "__init__.py" else parts[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg[: len(pkg) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.startswith("exporter"):
                yield node.lineno, mod, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("exporter"):
                    yield node.lineno, a.name, []


def _wing(mod: str, names) -> str:
    bits = mod.split(".")
    if len(bits) == 1:  # "from exporter import x": x is the wing (or __version__)
        return names[0] if names and names[0] != "__version__" else ""
    return bits[1]


def test_imports_flow_one_way():
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG)
        own = rel.parts[0].removesuffix(".py")
        if own in ("cli", "__main__", "__init__"):
            continue
        allowed = ALLOWED.get(own)
        assert allowed is not None, f"{rel}: a wing the layout test does not know; add it to ALLOWED"
        for line, mod, names in _imports(path):
            wing = _wing(mod, names)
            if wing not in allowed:
                bad.append(f"{rel}:{line} imports {mod} ({wing})")
    assert not bad, "imports against the flow:\n" + "\n".join(bad)


def test_nothing_imports_the_command_line():
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG)
        if rel.parts[0] in ("cli", "__main__.py"):
            continue
        for line, mod, names in _imports(path):
            if mod.startswith("exporter.cli") or (mod == "exporter" and "cli" in names):
                bad.append(f"{rel}:{line} imports {mod}")
    assert not bad, "\n".join(bad)


def test_every_module_says_what_it_owns():
    missing = [str(p.relative_to(ROOT)) for p in PKG.rglob("*.py")
               if p.name != "__main__.py" and not ast.get_docstring(ast.parse(p.read_text()))]
    assert not missing, f"modules without a docstring: {missing}"
