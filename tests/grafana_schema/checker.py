"""Type-check Grafana dashboard JSON against Grafana's own schema, the way Grafana ships it:
the TypeScript types of npm's ``@grafana/schema``, one pinned release per Grafana major.

For each major and dashboard a ``.ts`` file is written::

    import type { Dashboard } from 'schema12';
    export const dashboard: Plain<Dashboard> & Exported = <the JSON>;
    export const panel_7_options: Plain<timeseries.Options> = <panel 7's options>;
    export const panel_7_custom: Plain<timeseries.FieldConfig> = <its fieldConfig.defaults.custom>;

and ``tsc --strict --noEmit`` runs over them, one compiler run per major (side by side). An object
literal assigned to a typed constant gets TypeScript's excess-property check, so an unknown or
misspelt field is an error, and so is a wrong type or a missing required field. TypeScript reports
at most one excess property per object, and none for an object with an error further inside it:
fix what it reports and run again. ``Exported`` types ``__inputs``/``__requires`` as Grafana's
exporter writes them (they are not part of the dashboard model).

``Dashboard`` types a panel's ``options`` and ``fieldConfig.defaults.custom`` as
``Record<string, unknown>``: the panel plugins own those shapes. Where the package ships a
plugin's own types (``raw/composable/<plugin>/panelcfg``: time series, stat, heatmap, table,
state timeline) those parts are checked against them too, and so are the queries against the
Prometheus query model where the package has it (Grafana 10's). ``Plain<T>`` turns the plugins' string
enums into the union of their values (JSON holds ``"scheme"``, not ``HeatmapColorMode.Scheme``),
and changes nothing else.

The npm packages are installed once per ``package.json``/``package-lock.json`` content into
``~/.cache/vllm-sidecar-exporter/grafana-schema/<hash>`` (``$VLLM_SIDECAR_SCHEMA_CACHE``
overrides the parent), under a file lock, so parallel runs share one install.

``check_operator`` does the same for grafana-operator ``GrafanaDashboard`` objects with the CRD's
model from npm's ``@kubernetes-models/grafana-operator`` (its TypeScript type, and its JSON-schema
validation run under node).

Nothing here is generated into the repository: the ``.ts`` files and ``tsconfig.json`` live in a
temporary directory.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

HERE = Path(__file__).resolve().parent

# Grafana major -> the npm alias in package.json
MAJORS: Dict[str, str] = {"10": "schema10", "11": "schema11", "12": "schema12", "13": "schema13"}

# panel type -> the directory of its plugin types under dist/esm/raw/composable/
PLUGIN_DIRS: Dict[str, str] = {"timeseries": "timeseries", "stat": "stat", "heatmap": "heatmap",
                               "table": "table", "state-timeline": "statetimeline"}

PLAIN = """\
// What Grafana's "Export for sharing externally" adds around the dashboard model for the import
// dialog (DashboardExporter.ts: Input, Requires); the dashboard schema itself has no such fields.
interface ExportInput { name: string; label: string; description: string; type: 'datasource' | 'constant';
  pluginId?: string; pluginName?: string; value?: string; }
interface ExportRequire { type: 'grafana' | 'datasource' | 'panel'; id: string; name: string; version: string; }
type Exported = { __inputs?: ExportInput[]; __elements?: Record<string, unknown>; __requires?: ExportRequire[] };
// The Prometheus data source's own annotation fields (public/app/plugins/datasource/prometheus:
// PromAnnotation's legacy fields, which its prepareAnnotation reads into the query). The dashboard
// schema has no model of a data source's annotation fields; write_ts checks them against this.
interface PromAnnotationFields { expr: string; step?: string; titleFormat?: string; textFormat?: string;
  tagKeys?: string; useValueForTime?: boolean; }
// String enums become the union of their values, so JSON strings match; nothing else changes.
type Plain<T> = T extends string ? `${T}` : T extends number | boolean | null | undefined ? T
  : T extends ReadonlyArray<infer U> ? Array<Plain<U>> : T extends object ? { [K in keyof T]: Plain<T[K]> } : T;
"""


@dataclass(frozen=True)
class TscError:
    major: str  # the Grafana major, or what else was checked
    file: str  # the dashboard's file name, e.g. vllm-overview.json
    where: str  # the constant the error is in: dashboard, panel_7_options, panel_7_custom, panel_7_targets
    line: int
    code: str  # TS2353
    message: str
    source: str  # the .ts line the error points at

    def __str__(self) -> str:
        what = f"Grafana {self.major}" if self.major.isdigit() else self.major
        return (f"{what} {self.file} {self.where} (line {self.line}): {self.code} "
                f"{self.message}\n    {self.source.strip()}")


@dataclass(frozen=True)
class Allowed:
    """An error that is a documented default, not a problem of the dashboards."""

    code: str
    message: str  # regular expression, searched in the message
    where: str  # regular expression, matched against TscError.where
    reason: str
    majors: Tuple[str, ...] = tuple(MAJORS)

    def matches(self, e: TscError) -> bool:
        return (e.major in self.majors and e.code == self.code and re.search(self.message, e.message) is not None
                and re.fullmatch(self.where, e.where) is not None)


class NpmMissing(RuntimeError):
    pass


# -- installing -----------------------------------------------------------------------------------

def _package_hash() -> str:
    h = hashlib.sha256()
    for name in ("package.json", "package-lock.json"):
        h.update(name.encode() + b"\0" + (HERE / name).read_bytes() + b"\0")
    return h.hexdigest()[:16]


def cache_root() -> Path:
    base = os.environ.get("VLLM_SIDECAR_SCHEMA_CACHE")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(xdg) / "vllm-sidecar-exporter" / "grafana-schema"


def install() -> Path:
    """The directory holding node_modules for the pinned packages, installed on first use."""
    npm = shutil.which("npm")
    if not npm:
        raise NpmMissing("npm is not installed (Node.js 18 or newer with npm is needed for the schema check)")
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    target = root / _package_hash()
    marker = target / ".installed"
    if marker.exists():
        return target
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.exists():  # another process installed it while we waited
            return target
        if target.exists():
            shutil.rmtree(target)  # a half-finished install
        work = Path(tempfile.mkdtemp(prefix="install-", dir=root))
        try:
            shutil.copy(HERE / "package.json", work / "package.json")
            shutil.copy(HERE / "package-lock.json", work / "package-lock.json")
            r = subprocess.run([npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund", "--loglevel=error"],
                               cwd=work, capture_output=True, text=True, timeout=600)
            if r.returncode != 0:
                raise RuntimeError(f"npm ci failed in {work}:\n{r.stdout}\n{r.stderr}")
            (work / ".installed").write_text("ok\n")
            os.rename(work, target)
        finally:
            if work.exists():
                shutil.rmtree(work, ignore_errors=True)
    return target


# -- writing the TypeScript -----------------------------------------------------------------------

def _literal(value, indent: int = 0) -> str:
    text = json.dumps(value, indent=2, ensure_ascii=False)
    return text.replace("\n", "\n" + " " * indent)


def _plugin_module(pkg: Path, plugin_dir: str, kind: str = "panelcfg") -> Optional[Path]:
    found = sorted((pkg / "dist" / "esm" / "raw" / "composable" / plugin_dir / kind / "x").glob("*.d.ts"))
    return found[0] if found else None


def _panels(dashboard: Mapping) -> Iterable[Mapping]:
    for p in dashboard.get("panels", []):
        yield p
        yield from p.get("panels", []) if p.get("type") == "row" else ()


PROM_ANNOTATION_FIELDS = ("expr", "step", "titleFormat", "textFormat", "tagKeys", "useValueForTime")


def _split_annotations(dashboard: Mapping):
    """The dashboard without the Prometheus data source's own fields of its annotations, and those
    fields per annotation (index, fields), to be checked against ``PromAnnotationFields`` (the
    value types). Only those names are taken out: any other field stays in the dashboard, where
    the schema rejects what it does not know."""
    import copy

    d = copy.deepcopy(dict(dashboard))
    out = []
    for i, a in enumerate(d.get("annotations", {}).get("list", [])):
        if (a.get("datasource") or {}).get("type") != "prometheus":
            continue
        fields = {k: a.pop(k) for k in list(a) if k in PROM_ANNOTATION_FIELDS}
        if fields:
            out.append((i, fields))
    return d, out


def write_ts(dashboard: Mapping, alias: str, pkg: Path) -> str:
    """One .ts file: the dashboard typed as ``Dashboard``, each panel's options and custom field
    config typed as its plugin's ``Options`` and ``FieldConfig`` where the package has them."""
    imports = [f"import type {{ Dashboard }} from '{alias}';"]
    dashboard, prom_annotations = _split_annotations(dashboard)
    consts = [f"export const dashboard: Plain<Dashboard> & Exported = {_literal(dashboard)};"]
    consts += [f"export const annotation_{i}_prometheus: PromAnnotationFields = {_literal(a)};"
               for i, a in prom_annotations]
    used: Dict[str, str] = {}
    # the Prometheus query model, where the package ships it (Grafana 10's; later ones moved it out)
    prom = _plugin_module(pkg, "prometheus", "dataquery")
    if prom is not None:
        imports.append(f"import type * as prometheus from '{str(prom)[: -len('.d.ts')]}';")
    for p in _panels(dashboard):
        if prom is not None and p.get("targets"):
            consts.append(f"export const panel_{p.get('id')}_targets: Array<Plain<prometheus.PrometheusDataQuery>> = "
                          f"{_literal(p['targets'])};")
        plugin_dir = PLUGIN_DIRS.get(p.get("type", ""))
        mod = _plugin_module(pkg, plugin_dir) if plugin_dir else None
        if mod is None:
            continue
        ns = "plugin_" + plugin_dir
        if ns not in used:
            used[ns] = str(mod)[: -len(".d.ts")]
            imports.append(f"import type * as {ns} from '{used[ns]}';")
        pid = p.get("id")
        if "options" in p:
            consts.append(f"export const panel_{pid}_options: Plain<{ns}.Options> = {_literal(p['options'])};")
        custom = p.get("fieldConfig", {}).get("defaults", {}).get("custom")
        if custom is not None and "export interface FieldConfig " in Path(mod).read_text():
            consts.append(f"export const panel_{pid}_custom: Plain<{ns}.FieldConfig> = {_literal(custom)};")
    return "\n".join(imports) + "\n\n" + PLAIN + "\n" + "\n\n".join(consts) + "\n"


# -- running tsc ----------------------------------------------------------------------------------

_ERR = re.compile(r"^(?P<file>[^()\s]+\.ts)\((?P<line>\d+),(?P<col>\d+)\): error (?P<code>TS\d+): (?P<msg>.*)$")


def _where(lines: Sequence[str], lineno: int) -> str:
    for i in range(lineno - 1, -1, -1):
        m = re.match(r"export const (\w+):", lines[i])
        if m:
            return m.group(1)
    return "imports"


def _tsconfig(files: Iterable[str], paths: Mapping[str, List[str]]) -> str:
    return json.dumps({
        "compilerOptions": {
            "strict": True, "noEmit": True, "target": "es2020", "module": "commonjs",
            "moduleResolution": "node10", "skipLibCheck": True, "types": [],
            "noErrorTruncation": True, "pretty": False, "paths": dict(paths),
        },
        "files": sorted(files),
    }, indent=2)


def _tools(base: Path) -> Tuple[str, Path]:
    node = shutil.which("node")
    if not node:
        raise NpmMissing("node is not installed")
    return node, base / "node_modules" / "typescript" / "bin" / "tsc"


def _start_tsc(node: str, tsc: Path, d: Path) -> subprocess.Popen:
    return subprocess.Popen([node, str(tsc), "-p", "tsconfig.json", "--strict", "--noEmit"], cwd=d,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _errors(label: str, d: Path, proc: subprocess.Popen, files: Mapping[str, str]) -> List[TscError]:
    out, _ = proc.communicate(timeout=600)
    parsed: List[dict] = []
    for raw in out.splitlines():
        m = _ERR.match(raw)
        if m:
            parsed.append(m.groupdict())
        elif raw.startswith(" ") and parsed:  # tsc's explanation of the error, indented
            parsed[-1]["msg"] += "\n" + raw
        elif raw.startswith("error TS"):  # a problem of the set-up, not of a file
            raise RuntimeError(f"tsc ({label}) failed:\n{out}")
    if proc.returncode != 0 and not parsed:
        raise RuntimeError(f"tsc ({label}) failed without a parsable error:\n{out}")
    errors: List[TscError] = []
    cache: Dict[str, List[str]] = {}
    for m in parsed:
        ts = m["file"]
        lines = cache.setdefault(ts, (d / ts).read_text().splitlines())
        n = int(m["line"])
        errors.append(TscError(label, files.get(ts, ts), _where(lines, n), n, m["code"], m["msg"],
                               lines[n - 1] if n <= len(lines) else ""))
    return errors


def _ts_name(name: str) -> str:
    return re.sub(r"\W", "_", name[: -len(".json")] if name.endswith(".json") else name) + ".ts"


def check(dashboards: Mapping[str, Mapping], majors: Optional[Iterable[str]] = None) -> List[TscError]:
    """Every tsc error for every dashboard (file name -> parsed JSON) and Grafana major. The
    compilers of the majors run side by side."""
    base = install()
    node, tsc = _tools(base)
    errors: List[TscError] = []
    with tempfile.TemporaryDirectory(prefix="grafana-schema-") as tmp:
        runs = []
        for major in majors or MAJORS:
            alias = MAJORS[major]
            pkg = base / "node_modules" / alias
            d = Path(tmp) / f"grafana{major}"
            d.mkdir()
            os.symlink(base / "node_modules", d / "node_modules")
            files: Dict[str, str] = {}
            for name, dash in dashboards.items():
                (d / _ts_name(name)).write_text(write_ts(dash, alias, pkg))
                files[_ts_name(name)] = name
            # the plugin types import '@grafana/schema': the same major's package
            (d / "tsconfig.json").write_text(_tsconfig(files, {"@grafana/schema": [str(pkg)]}))
            runs.append((major, d, _start_tsc(node, tsc, d), files))
        for major, d, proc, files in runs:
            errors += _errors(major, d, proc, files)
    return errors


# -- grafana-operator's GrafanaDashboard ----------------------------------------------------------

OPERATOR_TYPES = "@kubernetes-models/grafana-operator/grafana.integreatly.org/v1beta1/GrafanaDashboard"

VALIDATE_JS = """\
// The model's own validation: the JSON schema of grafana-operator's CRD (types, enums, required).
import { readFileSync } from "node:fs";
import { GrafanaDashboard } from "%s";
let failed = 0;
for (const [i, doc] of JSON.parse(readFileSync(process.argv[2], "utf8")).entries()) {
  try { new GrafanaDashboard(doc).validate(); }
  catch (e) { failed++; console.log(`document ${i} (${doc?.metadata?.name}): ${e.message}`); }
}
process.exit(failed ? 1 : 0);
"""


def check_operator(docs: Sequence[Mapping]) -> List[str]:
    """Problems of grafana-operator GrafanaDashboard objects: typed as ``IGrafanaDashboard`` (the
    CRD's model, excess-property checked) and validated by the model's JSON schema."""
    base = install()
    node, tsc = _tools(base)
    problems: List[str] = []
    with tempfile.TemporaryDirectory(prefix="grafana-operator-") as tmp:
        d = Path(tmp)
        os.symlink(base / "node_modules", d / "node_modules")
        body = [f"import type {{ IGrafanaDashboard }} from '{OPERATOR_TYPES}';"]
        body += [f"export const doc_{i}: IGrafanaDashboard = {_literal(doc)};" for i, doc in enumerate(docs)]
        (d / "operator.ts").write_text("\n\n".join(body) + "\n")
        (d / "tsconfig.json").write_text(_tsconfig(["operator.ts"], {}))
        proc = _start_tsc(node, tsc, d)
        (d / "docs.json").write_text(json.dumps(list(docs)))
        (d / "validate.mjs").write_text(VALIDATE_JS % OPERATOR_TYPES)
        r = subprocess.run([node, "validate.mjs", "docs.json"], cwd=d, capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            problems += (r.stdout + r.stderr).strip().splitlines() or [f"validation exited {r.returncode}"]
        problems += [str(e) for e in _errors("grafana-operator", d, proc, {"operator.ts": "operator"})]
    return problems


def split(errors: Iterable[TscError], allowed: Sequence[Allowed]) -> Tuple[List[TscError], Dict[Allowed, int]]:
    """(errors no allow-list entry covers, how many errors each entry covered)."""
    bad: List[TscError] = []
    used: Dict[Allowed, int] = {a: 0 for a in allowed}
    for e in errors:
        hit = next((a for a in allowed if a.matches(e)), None)
        if hit is None:
            bad.append(e)
        else:
            used[hit] += 1
    return bad, used
