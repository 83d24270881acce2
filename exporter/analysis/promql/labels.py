"""Label sets and what PromQL does with them: matching selectors, grouping keys, join
signatures, dropping the metric name, and Go's regexp ``Expand`` for ``label_replace``.

A label set is a tuple of ``(name, value)`` pairs sorted by name, with no empty values (an empty
value is the same as no label, as in Prometheus). Python compares such tuples the way
``labels.Compare`` does, so ``sorted()`` gives Prometheus' series order.
"""

from __future__ import annotations

import re
from typing import Dict, Iterable, Mapping, Optional, Sequence, Tuple

from .ast import Matcher
from .parser import GoRegex, compile_regex

Labels = Tuple[Tuple[str, str], ...]
NAME = "__name__"


def make(d: Mapping[str, str]) -> Labels:
    return tuple(sorted((k, v) for k, v in d.items() if v != ""))


def get(ls: Labels, name: str) -> str:
    for k, v in ls:
        if k == name:
            return v
    return ""


def drop_name(ls: Labels) -> Labels:
    if ls and ls[0][0] == NAME:
        return ls[1:]
    return tuple(p for p in ls if p[0] != NAME)


def keep(ls: Labels, names: Iterable[str]) -> Labels:
    want = set(names)
    return tuple(p for p in ls if p[0] in want)


def without(ls: Labels, names: Iterable[str]) -> Labels:
    drop = set(names)
    return tuple(p for p in ls if p[0] not in drop)


def setl(ls: Labels, name: str, value: str) -> Labels:
    d = dict(ls)
    if value == "":
        d.pop(name, None)
    else:
        d[name] = value
    return make(d)


def fmt(ls: Labels) -> str:
    """``name{a="b", ...}`` as Prometheus prints a label set (name outside the braces)."""
    name = get(ls, NAME)
    inner = ", ".join(f'{k}="{_esc(v)}"' for k, v in ls if k != NAME)
    return f"{name}{{{inner}}}"


def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class MatcherSet:
    """A selector's matchers, compiled once."""

    def __init__(self, matchers: Sequence[Matcher]) -> None:
        self.matchers = tuple(matchers)
        self._rx: Dict[int, GoRegex] = {
            i: compile_regex(m.value) for i, m in enumerate(self.matchers) if m.op in ("=~", "!~")}

    def name_equal(self) -> Optional[str]:
        for m in self.matchers:
            if m.name == NAME and m.op == "=":
                return m.value
        return None

    def match_one(self, i: int, value: str) -> bool:
        m = self.matchers[i]
        if m.op == "=":
            return value == m.value
        if m.op == "!=":
            return value != m.value
        hit = self._rx[i].fullmatch(value) is not None
        return hit if m.op == "=~" else not hit

    def matches(self, ls: Labels) -> bool:
        d = dict(ls)
        return all(self.match_one(i, d.get(m.name, "")) for i, m in enumerate(self.matchers))

    def matches_name(self, name: str) -> bool:
        """Whether a series named ``name`` can match (only the ``__name__`` matchers checked)."""
        return all(self.match_one(i, name) for i, m in enumerate(self.matchers) if m.name == NAME)


def grouping_key(ls: Labels, grouping: Sequence[str], without_: bool) -> Labels:
    """What ``generateGroupingKey`` hashes: the ``by`` labels, or all but the ``without`` labels
    and the metric name."""
    if without_:
        drop = set(grouping) | {NAME}
        return tuple(p for p in ls if p[0] not in drop)
    want = set(grouping)
    return tuple(p for p in ls if p[0] in want)


def signature(ls: Labels, names: Sequence[str], on: bool) -> Labels:
    """The join signature of ``signatureFunc``: ``on`` labels, or all but ``ignoring`` labels and
    the metric name."""
    if on:
        want = set(names)
        return tuple(p for p in ls if p[0] in want)
    drop = set(names) | {NAME}
    return tuple(p for p in ls if p[0] not in drop)


_EXPAND = re.compile(r"\$(\$|\{([^}]*)\}|([a-zA-Z0-9_]+))")


def expand(template: str, match: "re.Match[str]") -> str:
    """Go's ``regexp.Expand``: ``$1``, ``${1}``, ``$name``, ``${name}``, ``$$``; a name is taken as
    long as possible (``$1x`` is ``${1x}``); unknown groups expand to nothing."""

    def group(name: str) -> str:
        try:
            if name.isdigit():
                g = match.group(int(name))
            else:
                g = match.group(name)
        except IndexError:  # no such group
            return ""
        return g or ""

    out = []
    pos = 0
    for m in _EXPAND.finditer(template):
        out.append(template[pos:m.start()])
        if m.group(1) == "$":
            out.append("$")
        else:
            name = m.group(2) if m.group(2) is not None else m.group(3)
            if m.group(2) is not None and not re.fullmatch(r"[a-zA-Z0-9_]+", name or ""):
                out.append(m.group(0))  # Go leaves a malformed ${...} as written
            else:
                out.append(group(name))
        pos = m.end()
    out.append(template[pos:])
    return "".join(out)

