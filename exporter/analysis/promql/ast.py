"""The PromQL syntax tree (immutable dataclasses) and its printed form.

Each node knows its value type (``scalar``, ``vector``, ``matrix``, ``string``) as Prometheus
2.42's ``parser.Expr.Type()`` defines it. ``str(node)`` prints the expression back in one
canonical spelling (used as a cache key by the engine and in error messages); it parses to the
same tree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Tuple

from .durations import format_duration

SCALAR, VECTOR, MATRIX, STRING = "scalar", "vector", "matrix", "string"

COMPARISONS = ("==", "!=", ">", "<", ">=", "<=")
SET_OPS = ("and", "or", "unless")
ARITHMETIC = ("+", "-", "*", "/", "%", "^", "atan2")


def _quote(s: str) -> str:
    out = s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{out}"'


def format_number(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


@dataclass(frozen=True)
class Matcher:
    """One label matcher: ``name op "value"`` with op ``=``, ``!=``, ``=~``, ``!~``."""

    name: str
    op: str
    value: str

    def __str__(self) -> str:
        return f"{self.name}{self.op}{_quote(self.value)}"


@dataclass(frozen=True)
class At:
    """An ``@`` modifier: a fixed time (ms), or ``start()`` / ``end()`` of the query."""

    ms: Optional[int] = None
    preprocessor: Optional[str] = None

    def __str__(self) -> str:
        if self.preprocessor:
            return f" @ {self.preprocessor}()"
        return f" @ {self.ms / 1000:.3f}"


@dataclass(frozen=True)
class Expr:
    @property
    def type(self) -> str:  # pragma: no cover - every node overrides
        raise NotImplementedError


@dataclass(frozen=True)
class NumberLiteral(Expr):
    val: float

    @property
    def type(self) -> str:
        return SCALAR

    def __str__(self) -> str:
        return format_number(self.val)


@dataclass(frozen=True)
class StringLiteral(Expr):
    val: str

    @property
    def type(self) -> str:
        return STRING

    def __str__(self) -> str:
        return _quote(self.val)


@dataclass(frozen=True)
class VectorSelector(Expr):
    name: Optional[str]
    matchers: Tuple[Matcher, ...]  # including the name matcher when a name is given
    offset_ms: int = 0
    at: Optional[At] = None

    @property
    def type(self) -> str:
        return VECTOR

    def selector_text(self) -> str:
        """The selector without offset or ``@`` (what a Prometheus server is asked for)."""
        others = [m for m in self.matchers if not (self.name and m.name == "__name__" and m.op == "="
                                                   and m.value == self.name)]
        inner = ", ".join(str(m) for m in others)
        if self.name:
            return f"{self.name}{{{inner}}}" if inner else self.name
        return f"{{{inner}}}"

    def modifiers(self) -> str:
        out = ""
        if self.offset_ms:
            out += f" offset {format_duration(self.offset_ms)}" if self.offset_ms > 0 \
                else f" offset -{format_duration(-self.offset_ms)}"
        if self.at:
            out += str(self.at)
        return out

    def __str__(self) -> str:
        return self.selector_text() + self.modifiers()


@dataclass(frozen=True)
class MatrixSelector(Expr):
    selector: VectorSelector
    range_ms: int

    @property
    def type(self) -> str:
        return MATRIX

    def __str__(self) -> str:
        return f"{self.selector.selector_text()}[{format_duration(self.range_ms)}]{self.selector.modifiers()}"


@dataclass(frozen=True)
class SubqueryExpr(Expr):
    expr: Expr
    range_ms: int
    step_ms: int = 0  # 0: the default step (the evaluation interval)
    offset_ms: int = 0
    at: Optional[At] = None

    @property
    def type(self) -> str:
        return MATRIX

    def __str__(self) -> str:
        step = format_duration(self.step_ms) if self.step_ms else ""
        out = f"{self.expr}[{format_duration(self.range_ms)}:{step}]"
        if self.offset_ms:
            out += f" offset {format_duration(self.offset_ms)}" if self.offset_ms > 0 \
                else f" offset -{format_duration(-self.offset_ms)}"
        if self.at:
            out += str(self.at)
        return out


@dataclass(frozen=True)
class Call(Expr):
    func: str
    args: Tuple[Expr, ...]
    return_type: str = field(default=VECTOR, compare=False)

    @property
    def type(self) -> str:
        return self.return_type

    def __str__(self) -> str:
        return f"{self.func}({', '.join(str(a) for a in self.args)})"


@dataclass(frozen=True)
class AggregateExpr(Expr):
    op: str
    expr: Expr
    param: Optional[Expr] = None
    grouping: Tuple[str, ...] = ()
    without: bool = False
    has_grouping: bool = False  # "by ()" given explicitly (same meaning as none)

    @property
    def type(self) -> str:
        return VECTOR

    def __str__(self) -> str:
        mod = ""
        if self.without:
            mod = f" without ({', '.join(self.grouping)})"
        elif self.grouping or self.has_grouping:
            mod = f" by ({', '.join(self.grouping)})"
        args = f"{self.param}, {self.expr}" if self.param is not None else str(self.expr)
        return f"{self.op}{mod} ({args})"


@dataclass(frozen=True)
class VectorMatching:
    card: str  # one-to-one, many-to-one, one-to-many, many-to-many
    labels: Tuple[str, ...] = ()
    on: bool = False
    include: Tuple[str, ...] = ()

    def __str__(self) -> str:
        out = ""
        if self.on or self.labels:
            out += f" {'on' if self.on else 'ignoring'} ({', '.join(self.labels)})"
        if self.card == "many-to-one":
            out += f" group_left ({', '.join(self.include)})"
        elif self.card == "one-to-many":
            out += f" group_right ({', '.join(self.include)})"
        return out


@dataclass(frozen=True)
class BinaryExpr(Expr):
    op: str
    lhs: Expr
    rhs: Expr
    matching: Optional[VectorMatching] = None  # None unless both sides are vectors
    return_bool: bool = False

    @property
    def type(self) -> str:
        if self.lhs.type == SCALAR and self.rhs.type == SCALAR:
            return SCALAR
        return VECTOR

    def __str__(self) -> str:
        mod = " bool" if self.return_bool else ""
        if self.matching is not None:
            mod += str(self.matching)
        return f"{self.lhs} {self.op}{mod} {self.rhs}"


@dataclass(frozen=True)
class UnaryExpr(Expr):
    op: str
    expr: Expr

    @property
    def type(self) -> str:
        return self.expr.type

    def __str__(self) -> str:
        return f"{self.op}{self.expr}"


@dataclass(frozen=True)
class ParenExpr(Expr):
    expr: Expr

    @property
    def type(self) -> str:
        return self.expr.type

    def __str__(self) -> str:
        return f"({self.expr})"


def unwrap_parens(e: Expr) -> Expr:
    while isinstance(e, ParenExpr):
        e = e.expr
    return e


def walk(e: Expr):
    """Every node of the tree, parents first."""
    yield e
    if isinstance(e, MatrixSelector):
        yield from walk(e.selector)
    elif isinstance(e, SubqueryExpr):
        yield from walk(e.expr)
    elif isinstance(e, Call):
        for a in e.args:
            yield from walk(a)
    elif isinstance(e, AggregateExpr):
        if e.param is not None:
            yield from walk(e.param)
        yield from walk(e.expr)
    elif isinstance(e, BinaryExpr):
        yield from walk(e.lhs)
        yield from walk(e.rhs)
    elif isinstance(e, (UnaryExpr, ParenExpr)):
        yield from walk(e.expr)
