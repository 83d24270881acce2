"""Grafana's own schema: every dashboard, committed and rendered from another SLO, type-checks
against npm's @grafana/schema for Grafana 10, 11, 12 and 13 (``tsc --strict``: unknown fields,
wrong types and missing required fields are errors), its panel options against each panel
plugin's own types; a deliberately broken dashboard fails the same check; the grafana-operator
GrafanaDashboards pass the CRD's model. See tests/grafana_schema/checker.py for how.

Needs Node.js and npm (CI has them); the npm packages are installed once into a cache directory.
"""

import copy
import json
import shutil

import pytest
import yaml

from conftest import ROOT
from exporter.pack import dashboards as dash_mod
from exporter.slo import load_slo
from grafana_schema.checker import MAJORS, Allowed, check, check_operator, split

DASH_DIR = ROOT / "dashboards"

# Errors that are documented defaults, not problems of the dashboards. Each says why.
ALLOWED = (
    Allowed("TS2741", r"Property 'percentChangeColorMode' is missing", r"panel_\d+_options",
            "stat panel: Grafana 11 added percentChangeColorMode (schema default \"standard\") and Grafana 10's "
            "schema rejects it as unknown, so no value passes every major; it only colours the percent change, "
            "which these panels turn off (showPercentChange: false)", majors=("11", "12", "13")),
)

pytestmark = pytest.mark.skipif(not (shutil.which("npm") and shutil.which("node")),
                                reason="npm/node are not installed: Grafana's schema (@grafana/schema) cannot "
                                       "be checked; install Node.js 18+ with npm (CI has them)")


def committed():
    return {p.name: json.loads(p.read_text()) for p in sorted(DASH_DIR.glob("*.json"))}


OTHER_SLO = """
replica_labels: [cluster, namespace, pod]
windows: {rate: 3m, sustain: 90s}
objectives: {ttft_p95_seconds: 2.75, availability: 0.9975}
dashboards: {cluster_label: ""}
"""


def broken(dashes):
    """The capacity dashboard, plus a stat and a heatmap panel, with the mistakes the check must
    catch, each in its own object (TypeScript reports one excess property per object literal)."""
    d = copy.deepcopy(dashes["vllm-capacity.json"])
    stat = copy.deepcopy(next(p for p in dashes["vllm-overview.json"]["panels"] if p["type"] == "stat"))
    heat = copy.deepcopy(next(p for p in dashes["vllm-prompts-cache.json"]["panels"] if p["type"] == "heatmap"))
    stat["id"], heat["id"] = 900, 901
    d["panels"] += [stat, heat]
    d["templating"]["list"][1]["definition"] = "label_values(up, job)"  # not in the v1 schema
    panels = {p["type"]: p for p in d["panels"]}
    panels["row"]["gridPos"]["w"] = "24"  # wrong type
    panels["timeseries"]["options"]["tooltip"]["show"] = True  # unknown option field
    panels["timeseries"]["fieldConfig"]["defaults"]["custom"]["lineWidht"] = 2  # custom field config typo
    panels["table"]["options"]["footer"] = {"show": False, "reducer": ["sum"]}  # gone in Grafana 12
    stat["options"]["colorMode"] = "rainbow"  # not one of the enum's values
    heat["options"]["tooltip"] = {"show": True, "yHistogram": True}  # the old shape the builder wrote
    panels["table"]["targets"][0]["fmt"] = "table"  # not a field of the Prometheus query (Grafana 10's model)
    ann = next(a for a in d["annotations"]["list"] if a.get("expr"))
    ann["useValueForTime"] = "no"  # the Prometheus annotation's own field, wrong type
    return d


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """One compiler run per major over the committed dashboards, the same dashboards rendered from
    another SLO, and the broken one."""
    dashes = committed()
    f = tmp_path_factory.mktemp("slo") / "slo.yaml"
    f.write_text(OTHER_SLO)
    other = {f"other-{n}": json.loads(t) for n, t in dash_mod.render_all(load_slo(str(f))).items()}
    # TypeScript reports an excess property of an object only when nothing inside it is wrong:
    # the unknown top-level field goes into a dashboard of its own
    top = copy.deepcopy(dashes["vllm-gpu.json"]) | {"refreshIntervall": "1m"}
    return check({**dashes, **other, "broken.json": broken(dashes), "broken-top.json": top})


def test_every_dashboard_passes_grafana_schema_for_each_major(results):
    real = [e for e in results if not e.file.startswith("broken")]
    bad, _ = split(real, ALLOWED)
    assert not bad, f"{len(bad)} schema error(s):\n" + "\n\n".join(str(e) for e in bad)
    checked = {e.major for e in results}
    assert checked == set(MAJORS), checked  # every major ran (the broken dashboard fails on each)


def test_the_check_catches_a_broken_dashboard(results):
    errs = [e for e in results if e.file.startswith("broken")]
    for major in MAJORS:
        mine = [e for e in errs if e.major == major]

        def caught(where, code, text, mine=mine):
            return any(e.where.startswith(where) and e.code == code and text in e.message for e in mine)

        top = [e for e in mine if e.file == "broken-top.json"]
        assert len(top) == 1 and top[0].code == "TS2353" and "'\"refreshIntervall\"' does not exist" in top[0].message
        assert caught("dashboard", "TS2353", "'\"definition\"' does not exist"), major
        assert caught("dashboard", "TS2322", "Type 'string' is not assignable to type 'number'"), major
        assert caught("panel_", "TS2353", "'\"show\"' does not exist"), major  # timeseries and heatmap tooltip
        assert sum(1 for e in mine if e.code == "TS2353" and "'\"show\"'" in e.message) >= 2, major
        assert caught("panel_", "TS2353", "'\"lineWidht\"' does not exist"), major
        assert caught("panel_900_options", "TS2322", '"rainbow"'), major
        assert caught("annotation_", "TS2322", "is not assignable to type 'boolean"), major
        assert caught("panel_", "TS2353", "'\"footer\"' does not exist") == (major in ("12", "13")), major
        assert caught("panel_", "TS2353", "'\"fmt\"' does not exist") == (major == "10"), major
    # none of it hides behind the allow-list
    bad, _ = split(errs, ALLOWED)
    assert len(bad) == len([e for e in errs if not any(a.matches(e) for a in ALLOWED)])
    assert len(bad) >= 7 * len(MAJORS) + 3  # footer on 12 and 13, fmt on 10


def test_every_allow_list_entry_is_needed_and_explained(results):
    _, used = split(results, ALLOWED)
    for entry, n in used.items():
        assert len(entry.reason) > 40, entry
        assert n, f"allow-list entry no longer needed: {entry}"


def test_grafana_operator_dashboards_pass_the_crd_model():
    path = ROOT / dash_mod.OPERATOR_PATH
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert len(docs) == len(committed())

    def wrong(name, **spec):
        d = copy.deepcopy(docs[0])
        d["metadata"]["name"] = name
        d["spec"].update(spec)
        return d

    unknown = wrong("unknown-field", folderName="vLLM")  # not a field of the CRD
    missing = wrong("no-selector")
    del missing["spec"]["instanceSelector"]  # required
    typed = wrong("wrong-type", resyncPeriod=600)  # a duration string
    problems = check_operator(docs + [unknown, missing, typed])
    n = len(docs)
    # TypeScript names the constant (doc_<index>), the CRD's JSON schema the document
    by_doc = {i: [p for p in problems if f"doc_{i} " in p or f"document {i} " in p] for i in range(n + 3)}
    assert sum(map(len, by_doc.values())) == len(problems), problems
    assert not any(by_doc[i] for i in range(n)), problems
    assert any("'\"folderName\"' does not exist" in p for p in by_doc[n]), by_doc[n]
    assert any("instanceSelector" in p for p in by_doc[n + 1]), by_doc[n + 1]
    assert any("resyncPeriod must be string" in p for p in by_doc[n + 2]), by_doc[n + 2]
    assert any("TS2322" in p for p in by_doc[n + 2]), by_doc[n + 2]
