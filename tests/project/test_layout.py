"""The package's shape: imports flow one way between the wings.

runtime (the sidecar) imports neither the pack nor the harness nor the view; the pack imports
neither the runtime nor the harness; the view (``top`` and the demo's screen) reads the runtime
only; nothing imports the command line back. No module imports itself round a circle. Checked on the source, with
every import (module level or inside a function) resolved to its absolute module name.

And the tests' own shape: a folder per wing, each test module in the one of the code it checks,
what they share in the support modules of tests/ (docs/architecture.md, "The tests").
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


# -- the tests' own layout --------------------------------------------------------------------------
# tests/<wing>/ holds the tests of one wing of the package (tests/runtime the runtime's, ...);
# tests/project the checks of the repository as a whole (lint, layout, packaging, deploy, docs);
# tests/e2e the tests on the real CPU vLLM. tests/ itself holds conftest.py and the support modules
# every folder imports by name (conftest puts tests/ on sys.path): no test module.
TESTS = ROOT / "tests"
OTHER_TEST_FOLDERS = {"project", "e2e"}
DATA_FOLDERS = {"fixtures", "grafana_schema"}  # recorded pages and files; grafana's schema checker


def _wings():
    return {p.parent.name for p in PKG.glob("*/__init__.py")}


def _test_modules():
    return sorted(TESTS.rglob("test_*.py"))


def test_every_test_module_lives_in_its_wings_folder():
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == _wings() | OTHER_TEST_FOLDERS | DATA_FOLDERS, (
        "tests/ has a folder for each wing of exporter/ (and project, e2e, fixtures, grafana_schema): "
        f"{sorted(folders ^ (_wings() | OTHER_TEST_FOLDERS | DATA_FOLDERS))}")
    misplaced = [str(p.relative_to(TESTS)) for p in _test_modules()
                 if p.relative_to(TESTS).parts[0] in DATA_FOLDERS or len(p.relative_to(TESTS).parts) != 2]
    assert not misplaced, f"test modules outside tests/<wing>/: {misplaced}"
    names = [p.name for p in _test_modules()]
    twice = sorted({n for n in names if names.count(n) > 1})
    assert not twice, f"test module names in two folders (pytest imports them by name): {twice}"


def test_a_test_module_imports_no_test_module_of_another_folder():
    """What two wings' tests share is a support module in tests/; a test module may read another
    of its own folder only (pytest puts a test's own folder on the path, not the others')."""
    own = {p.stem: p.parent for p in _test_modules()}
    bad = []
    for path in _test_modules():
        for node in ast.walk(ast.parse(path.read_text())):
            mods = ([node.module] if isinstance(node, ast.ImportFrom) and node.module else
                    [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            bad += [f"{path.relative_to(TESTS)}:{node.lineno} imports {m}" for m in mods
                    if m in own and own[m] != path.parent]
    assert not bad, "\n".join(bad)


def _calls(node):
    """The called names in ``node``: ``f`` for ``f(...)``, ``a.f`` for ``a.f(...)``."""
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            f = n.func
            if isinstance(f, ast.Name):
                yield f.id
            elif isinstance(f, ast.Attribute):
                yield f"{f.value.id}.{f.attr}" if isinstance(f.value, ast.Name) else f.attr


def copied_helpers(source: str):
    """(line, what) of each helper in ``source`` that writes again what tests/shared.py has: a
    function (not a test) that runs the command line in this process and reads capsys, starts
    ``python -m exporter`` itself, or waits (in a loop of sleeps, or only wraps ``wait_until``); a
    class serving the pressure page
    that is not a ``PressureScript``."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and not node.name.startswith("test"):
            calls = set(_calls(node))
            strings = {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
            if "main" in calls and "capsys.readouterr" in calls:
                yield node.lineno, f"{node.name}: the command line in this process (shared.run_main, main_for)"
            if calls & {"subprocess.run", "subprocess.Popen"} and {"-m", "exporter"} <= strings and len(node.body) <= 3:
                yield node.lineno, f"{node.name}: python -m exporter as a process (shared.run_cli)"
            wraps_wait = "wait_until" in calls and len(node.body) == 1  # a fixture may wait among other things
            if wraps_wait or ("time.sleep" in calls and any(isinstance(n, ast.While) for n in ast.walk(node))):
                yield node.lineno, f"{node.name}: a wait in a loop of sleeps (shared.poll_until)"
        if isinstance(node, ast.ClassDef) and "after_pressure.txt" in ast.unparse(node) \
                and "PressureScript" not in {ast.unparse(b) for b in node.bases}:
            yield node.lineno, f"{node.name}: the stand-in's pressure page (shared.PressureScript)"


def test_no_test_module_writes_a_shared_helper_again():
    found = [f"{p.relative_to(TESTS)}:{line} {what}" for p in _test_modules()
             for line, what in copied_helpers(p.read_text())]
    assert not found, "use tests/shared.py:\n" + "\n".join(found)


def test_the_copy_finder_finds_each_kind():
    source = '''
def _cli(capsys, *argv):
    rc = main(["gate", *argv])
    return rc, *capsys.readouterr()

def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "exporter", *args])

def _wait(fn):
    while time.monotonic() < end:
        time.sleep(0.05)

def wait_for(cond, what):
    wait_until(cond, 60, 0.01, what)

class Script:
    def __init__(self):
        self.base = page("after_pressure.txt")

class Filling(PressureScript):
    base = page("after_pressure.txt")

def test_inline(capsys):
    main(["x"]); capsys.readouterr()
'''
    assert [line for line, _ in copied_helpers(source)] == [2, 6, 9, 13, 16]
