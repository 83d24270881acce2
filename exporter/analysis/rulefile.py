"""Reading rule groups: a Prometheus rule file (``groups:``), a PrometheusRule manifest
(``spec.groups``, several YAML documents allowed), or the groups the pack renders.

Each rule's expression is parsed here, so a bad rule fails before any history is read, with the
file, line, group and rule in the message. Alert labels may use ``{{ $labels.x }}`` (filled from
the alert's own labels); other templates in labels are refused (annotations are not evaluated:
the backtest reports alerts, not notifications).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import yaml

from .promql.ast import SCALAR, VECTOR, Expr
from .promql.durations import DurationError, parse_duration
from .promql.lexer import PromQLSyntaxError
from .promql.parser import parse


class RuleFileError(ValueError):
    """A rule file that cannot be used; ``str()`` is one line naming file, line and rule."""


@dataclass(frozen=True)
class Rule:
    kind: str                       # "record" or "alert"
    name: str
    expr: Expr
    expr_text: str
    labels: Tuple[Tuple[str, str], ...] = ()
    for_ms: int = 0
    keep_firing_for_ms: int = 0
    where: str = ""                 # "file:line" for messages


@dataclass
class Group:
    name: str
    rules: List[Rule]
    interval_ms: Optional[int] = None


def evaluation_step(groups: List[Group], default_ms: int) -> int:
    """How often a file's rules are evaluated: its most frequent group, a group without an interval
    of its own at ``default_ms`` (the file's or the SLO's); the pack's alerting group, beside its
    slow alerts' and views' groups every 2 minutes, sets the step (``rulemanager`` runs those at
    the first step of each of their intervals)."""
    return min((g.interval_ms or default_ms for g in groups), default=default_ms)


_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL_TEMPLATE = re.compile(r"\{\{\s*(?:\$labels|\.Labels)\.([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}")
_RULE_KEYS = {"record", "alert", "expr", "for", "keep_firing_for", "labels", "annotations"}


def _dur(v: Any, where: str, key: str) -> int:
    try:
        return parse_duration(str(v))
    except DurationError as exc:
        raise RuleFileError(f"{where}: {key}: {exc}") from None


def check_label_template(value: str, where: str) -> None:
    rest = _LABEL_TEMPLATE.sub("", value)
    if "{{" in rest:
        raise RuleFileError(f"{where}: label templates other than {{{{ $labels.name }}}} are not supported: {value!r}")


def fill_label_template(value: str, labels: Dict[str, str]) -> str:
    return _LABEL_TEMPLATE.sub(lambda m: labels.get(m.group(1), ""), value)


def groups_from_data(groups: Any, path: str, lines: Optional[Dict[Tuple[int, int], int]] = None,
                     group_lines: Optional[Dict[int, int]] = None) -> List[Group]:
    """Groups from the parsed ``groups:`` list (of a file, a manifest or the rendered pack)."""
    if not isinstance(groups, list):
        raise RuleFileError(f"{path}: 'groups' must be a list")
    out: List[Group] = []
    seen = set()
    for gi, g in enumerate(groups):
        gwhere = f"{path}:{(group_lines or {}).get(gi, 0)}" if group_lines else path
        if not isinstance(g, dict) or not g.get("name"):
            raise RuleFileError(f"{gwhere}: group {gi + 1} has no name")
        gname = str(g["name"])
        if gname in seen:
            raise RuleFileError(f"{gwhere}: group {gname!r} defined twice")
        seen.add(gname)
        interval = _dur(g["interval"], f"{gwhere}: group {gname!r}", "interval") if g.get("interval") else None
        rules: List[Rule] = []
        for ri, r in enumerate(g.get("rules") or []):
            line = (lines or {}).get((gi, ri))
            where = f"{path}:{line}" if line else f"{path}: group {gname!r} rule {ri + 1}"
            rules.append(_rule(r, where, gname))
        out.append(Group(gname, rules, interval))
    return out


def _rule(r: Any, where: str, gname: str) -> Rule:
    if not isinstance(r, dict):
        raise RuleFileError(f"{where}: a rule must be a mapping")
    unknown = set(r) - _RULE_KEYS
    if unknown:
        raise RuleFileError(f"{where}: unknown key {sorted(unknown)[0]!r} in rule")
    if ("record" in r) == ("alert" in r):
        raise RuleFileError(f"{where}: a rule needs exactly one of 'record' and 'alert'")
    kind = "record" if "record" in r else "alert"
    name = str(r[kind])
    what = f"{where} ({kind} {name!r} in group {gname!r})"
    if kind == "record" and not _METRIC_NAME.match(name):
        raise RuleFileError(f"{what}: invalid recording rule name")
    if kind == "record" and ("for" in r or "keep_firing_for" in r or "annotations" in r):
        raise RuleFileError(f"{what}: 'for', 'keep_firing_for' and 'annotations' are for alerting rules")
    if r.get("expr") is None or str(r["expr"]).strip() == "":
        raise RuleFileError(f"{what}: no expr")
    text = str(r["expr"])
    try:
        expr = parse(text)
    except PromQLSyntaxError as exc:
        raise RuleFileError(f"{what}: bad expr: {exc}") from None
    if expr.type not in (VECTOR, SCALAR):
        raise RuleFileError(f"{what}: expr is a {expr.type}; a rule needs an instant vector or a scalar")
    labels = r.get("labels") or {}
    if not isinstance(labels, dict):
        raise RuleFileError(f"{what}: labels must be a mapping")
    for k, v in labels.items():
        if not _LABEL_NAME.match(str(k)) or str(k) == "__name__":
            raise RuleFileError(f"{what}: invalid label name {k!r}")
        if kind == "alert":
            check_label_template(str(v), what)
        elif "{{" in str(v):
            raise RuleFileError(f"{what}: recording rule labels cannot be templates")
    return Rule(kind, name, expr, text, tuple(sorted((str(k), str(v)) for k, v in labels.items())),
                _dur(r["for"], what, "for") if r.get("for") is not None else 0,
                _dur(r["keep_firing_for"], what, "keep_firing_for") if r.get("keep_firing_for") is not None else 0,
                where)


def _positions(node) -> Tuple[Optional[Any], Dict[Tuple[int, int], int], Dict[int, int]]:
    """The ``groups`` node of a document and the line of each group and rule."""
    if not isinstance(node, yaml.MappingNode):
        return None, {}, {}
    m = {k.value: v for k, v in node.value}
    gnode = m.get("groups")
    if gnode is None and "spec" in m and isinstance(m["spec"], yaml.MappingNode):
        gnode = {k.value: v for k, v in m["spec"].value}.get("groups")
    lines: Dict[Tuple[int, int], int] = {}
    glines: Dict[int, int] = {}
    if isinstance(gnode, yaml.SequenceNode):
        for gi, g in enumerate(gnode.value):
            glines[gi] = g.start_mark.line + 1
            if isinstance(g, yaml.MappingNode):
                rn = {k.value: v for k, v in g.value}.get("rules")
                if isinstance(rn, yaml.SequenceNode):
                    for ri, r in enumerate(rn.value):
                        lines[(gi, ri)] = r.start_mark.line + 1
    return gnode, lines, glines


def load_rule_file(path: str) -> List[Group]:
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise RuleFileError(f"{path}: {exc.strerror}") from None
    try:
        docs = list(yaml.safe_load_all(text))
        nodes = list(yaml.compose_all(text))
    except yaml.YAMLError as exc:
        raise RuleFileError(f"{path}: not YAML: {str(exc).splitlines()[0]}") from None
    out: List[Group] = []
    for doc, node in zip(docs, nodes):
        if doc is None:
            continue
        if not isinstance(doc, dict):
            raise RuleFileError(f"{path}: expected a rule file (groups:) or a PrometheusRule")
        if "groups" in doc:
            groups = doc["groups"]
        elif doc.get("kind") == "PrometheusRule":
            groups = (doc.get("spec") or {}).get("groups")
        else:
            raise RuleFileError(f"{path}: neither a rule file ('groups:') nor a PrometheusRule manifest")
        _, lines, glines = _positions(node)
        out.extend(groups_from_data(groups, path, lines, glines))
    if not out:
        raise RuleFileError(f"{path}: no rule groups")
    names = [g.name for g in out]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise RuleFileError(f"{path}: group {sorted(dup)[0]!r} defined twice")
    return out
