"""The plain rule file as Grafana Mimir's (and Cortex's) ruler takes it.

`mimirtool rules check` cannot run here: no package provides mimirtool or cortextool (Debian 12,
PyPI and npm have none; its release binaries and the Go module proxy its source needs are out of
reach of these machines). What `rules check` does, read from mimir's pkg/mimirtool/rules
(rules.go: Validate, CheckRecordingRules; the command runs both), is re-implemented here over the
rendered file: each file is one namespace whose groups have non-empty, unique names; every rule
passes Prometheus' rulefmt validation (promtool check rules, in test_rules_promtool.py, runs the
same validation); and with --strict every recording rule name has the level:metric:operation
form (at least two colons). The group keys Mimir adds to Prometheus' format (source_tenants,
evaluation_delay, ...) are not used, so Prometheus, Mimir and Cortex read the same file.

Thanos Ruler reads Prometheus' format plus one group key, ``partial_response_strategy`` (warn or
abort; `thanos tools rules-check` validates the rest with Prometheus' rulefmt). Both rendered
files pass: the plain one and the vmalert target (plain Prometheus format too, with its group
``interval`` and no keep_firing_for: for a ruler whose rule engine predates keep_firing_for)."""

import yaml

from conftest import ROOT

FILES = [ROOT / "rules" / "vllm.rules.yml", ROOT / "rules" / "vllm.vmalert.rules.yml"]


def mimir_check(doc: dict, strict: bool = True) -> list:
    problems = []
    seen = set()
    for g in doc.get("groups") or []:
        name = g.get("name") or ""
        if not name:
            problems.append("group name should not be empty")
        if name in seen:
            problems.append(f"group name: {name!r} is repeated in the same namespace")
        seen.add(name)
        for r in g.get("rules") or []:
            rec = r.get("record")
            if rec and len(rec.split(":")) < (3 if strict else 2):
                problems.append(f"{name}: recording rule name {rec!r} does not match level:metric:operation")
    return problems


def test_rule_file_passes_mimirtool_rules_check_strict():
    for f in FILES:
        doc = yaml.safe_load(f.read_text())
        assert mimir_check(doc) == [], f
        keys = {k for g in doc["groups"] for k in g}
        assert keys <= {"name", "interval", "limit", "rules", "query_offset"}, keys


def test_the_check_finds_what_mimirtool_finds():
    bad = {"groups": [{"name": "a", "rules": [{"record": "vllm_rate5m", "expr": "1"}, {"record": "x:y", "expr": "1"}]},
                      {"name": "a", "rules": []}, {"name": "", "rules": []}]}
    got = mimir_check(bad)
    assert len(got) == 4 and any("repeated" in p for p in got) and any("empty" in p for p in got)
    assert len(mimir_check(bad, strict=False)) == 3  # x:y has the one colon the non-strict check asks for


THANOS_GROUP_KEYS = {"name", "interval", "rules", "limit", "query_offset", "partial_response_strategy"}


def thanos_check(doc: dict) -> list:
    problems = []
    for g in doc.get("groups") or []:
        extra = set(g) - THANOS_GROUP_KEYS
        if extra:
            problems.append(f"{g.get('name')}: unknown group keys {sorted(extra)}")
        prs = g.get("partial_response_strategy")
        if prs is not None and str(prs).lower() not in ("warn", "abort"):
            problems.append(f"{g.get('name')}: partial_response_strategy {prs!r} is neither warn nor abort")
    return problems


def test_rule_files_pass_thanos_rules_check_group_schema():
    for f in FILES:
        assert thanos_check(yaml.safe_load(f.read_text())) == [], f
    assert len(thanos_check({"groups": [{"name": "a", "rules": [], "partial_response_strategy": "maybe",
                                         "source_tenants": ["x"]}]})) == 2
