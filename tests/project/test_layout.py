"""The package's shape: imports flow one way between the wings.

runtime (the sidecar) imports neither the pack nor the harness nor the view; the pack imports
neither the runtime nor the harness; the view (``top`` and the demo's screen) reads the runtime
only; nothing imports the command line back. No module imports itself round a circle. Checked on the source, with
every import (module level or inside a function) resolved to its absolute module name.
"""

import ast

from conftest import ROOT

PKG = ROOT / "exporter"

# wing -> wings (and foundation modules) it may import
# (the foundation modules: slo, errors, promql_strings, which both slo and the PromQL lexer read)
FOUNDATION = {"slo", "errors", "promql_strings", ""}
ALLOWED = {
    "runtime": {"runtime"} | FOUNDATION,
    "pack": {"pack"} | FOUNDATION,
    "harness": {"harness", "runtime", "pack", "analysis", "view"} | FOUNDATION,
    "view": {"view", "runtime"} | FOUNDATION,  # the top/demo view of the sidecar's state
    "analysis": {"analysis", "pack", "runtime"} | FOUNDATION,
    "slo": {"errors", "promql_strings", ""},
    "promql_strings": set(),
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


def _module_name(path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _graph():
    """module -> the modules of this package it imports, anywhere in its source (a function's body
    too): ``from a.b import c`` is an edge to ``a.b.c`` when c is a module, else to ``a.b``."""
    modules = {_module_name(p): p for p in PKG.rglob("*.py")}
    graph = {}
    for mod, path in modules.items():
        edges = set()
        for _, target, names in _imports(path):
            subs = [f"{target}.{n}" for n in names if f"{target}.{n}" in modules]
            edges.update(subs)
            if len(subs) < len(names) or not names:
                edges.add(target)
        graph[mod] = {e for e in edges if e in modules and e != mod}
    return graph


def _circles(graph):
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles():
    """No two modules import each other, directly or round a longer circle, even where the import
    is hidden in a function (which only moves the circle to run time)."""
    circles = _circles(_graph())
    assert not circles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)


def test_the_circle_finder_finds_a_hidden_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert _circles(graph) == [["a", "b", "c"]]


# Module names found in more than one wing, each naming the same subject there. Any other name
# means one thing: a second wing that wants it picks another (runtime/exposition.py parses the
# text format, analysis/promql/parser.py PromQL; runtime/rolling.py keeps the sidecar's rolling
# totals, analysis/promql/windows.py is PromQL's range functions; analysis/rulemanager.py runs rule
# groups, pack/rules.py renders the rule files).
SAME_SUBJECT = {
    # a command (cli) is named for the work it runs
    "backtest": "the backtest: the command and the engine",
    "gate": "the regression gate: the command and the verdict",
    "demo": "the demo: the command and the stack it starts",
    "postmortem": "the postmortem: the command and the report it writes",
    # one concern: its signal in the sidecar, its alerts and panels in the pack, its analysis
    "capacity": "KV cache and load headroom: the sidecar's signal, the pack's alerts and panel, the model, the command",
    "gpu": "the GPUs: the sidecar's readings and collector, the pack's alerts and panel",
    "health": "the targets' health: the sidecar's self-health collector, the pack's target alerts",
    "latency": "TTFT and inter-token latency: the sidecar's signal, the pack's alerts",
    "series": "time series: the rules' store (analysis), a scenario's book of them (harness)",
    "alerts": "Prometheus alerts: the pack's alerting rules, the analysis of their pending/firing states",
}


def _names_by_wing():
    """leaf module or package name -> the wings it stands in (the foundation modules, slo and
    errors, are no wing)."""
    out = {}
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG)
        if len(rel.parts) < 2:
            continue
        wing = rel.parts[0]
        names = list(rel.parts[1:-1]) + ([] if path.stem == "__init__" else [path.stem])
        for name in names:
            out.setdefault(name, set()).add(wing)
    return out


def test_a_module_name_means_one_thing_across_the_wings():
    shared = {n: sorted(w) for n, w in _names_by_wing().items() if len(w) > 1}
    unexplained = {n: w for n, w in shared.items() if n not in SAME_SUBJECT}
    assert not unexplained, ("module names in two wings (rename one, or add the name to SAME_SUBJECT if it "
                             f"names the same subject in each): {unexplained}")
    stale = sorted(set(SAME_SUBJECT) - set(shared))
    assert not stale, f"SAME_SUBJECT lists names no longer shared: {stale}"
    for name in ("parser", "windows", "rules"):
        assert name not in shared, name


def test_every_module_says_what_it_owns():
    missing = [str(p.relative_to(ROOT)) for p in PKG.rglob("*.py")
               if p.name != "__main__.py" and not ast.get_docstring(ast.parse(p.read_text()))]
    assert not missing, f"modules without a docstring: {missing}"
