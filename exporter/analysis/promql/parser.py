"""PromQL tokens to the syntax tree, with Prometheus 2.42's grammar and type checks.

Operator precedence, lowest first: ``or``; ``and``/``unless``; comparisons; ``+ -``;
``* / % atan2``; ``^`` (right-associative). A unary sign binds like ``*`` (so ``-a^b`` is
``-(a^b)``) and folds into a number literal. ``[range]``, ``[range:step]``, ``offset`` and ``@``
bind to the selector or subquery right before them. The checks of ``checkAST`` (operand types,
``bool`` only on comparisons, set operators many-to-many, argument counts and types) raise
``PromQLSyntaxError`` with the same wording as Prometheus where it matters.
"""

from __future__ import annotations

import math
import re
from functools import lru_cache
from typing import Dict, List, Optional, Tuple

import re2

from .ast import (
    ARITHMETIC,
    COMPARISONS,
    MATRIX,
    SCALAR,
    SET_OPS,
    STRING,
    VECTOR,
    AggregateExpr,
    At,
    BinaryExpr,
    Call,
    Expr,
    Matcher,
    MatrixSelector,
    NumberLiteral,
    ParenExpr,
    StringLiteral,
    SubqueryExpr,
    UnaryExpr,
    VectorMatching,
    VectorSelector,
    unwrap_parens,
)
from .durations import DurationError, parse_duration
from .lexer import AGGREGATORS, PromQLSyntaxError, Token, tokenize, unquote

# name -> (argument types, variadic, return type); variadic: 0 none, n optional trailing args,
# -1 any number of the last type (Prometheus' parser/functions.go)
_V, _S, _M, _T = VECTOR, SCALAR, MATRIX, STRING
FUNCTIONS: Dict[str, Tuple[Tuple[str, ...], int, str]] = {
    **{f: ((_V,), 0, _V) for f in (
        "abs", "absent", "acos", "acosh", "asin", "asinh", "atan", "atanh", "ceil", "cos", "cosh", "deg", "exp",
        "floor", "histogram_count", "histogram_sum", "ln", "log10", "log2", "rad", "sgn", "sin", "sinh", "sort",
        "sort_desc", "sqrt", "tan", "tanh", "timestamp")},
    **{f: ((_M,), 0, _V) for f in (
        "absent_over_time", "avg_over_time", "changes", "count_over_time", "delta", "deriv", "idelta", "increase",
        "irate", "last_over_time", "max_over_time", "min_over_time", "present_over_time", "rate", "resets",
        "stddev_over_time", "stdvar_over_time", "sum_over_time")},
    **{f: ((_V,), 1, _V) for f in (
        "days_in_month", "day_of_month", "day_of_week", "day_of_year", "hour", "minute", "month", "year")},
    "clamp": ((_V, _S, _S), 0, _V),
    "clamp_max": ((_V, _S), 0, _V),
    "clamp_min": ((_V, _S), 0, _V),
    "histogram_fraction": ((_S, _S, _V), 0, _V),
    "histogram_quantile": ((_S, _V), 0, _V),
    "holt_winters": ((_M, _S, _S), 0, _V),
    "label_replace": ((_V, _T, _T, _T, _T), 0, _V),
    "label_join": ((_V, _T, _T, _T), -1, _V),
    "pi": ((), 0, _S),
    "predict_linear": ((_M, _S), 0, _V),
    "quantile_over_time": ((_S, _M), 0, _V),
    "round": ((_V, _S), 1, _V),
    "scalar": ((_V,), 0, _S),
    "time": ((), 0, _S),
    "vector": ((_S,), 0, _V),
}

# Prometheus 3's experimental functions (--enable-feature=promql-experimental-functions) the
# engine runs; parsed only with ``prometheus3``
EXPERIMENTAL_FUNCTIONS: Dict[str, Tuple[Tuple[str, ...], int, str]] = {
    "first_over_time": ((_M,), 0, _V),
    "mad_over_time": ((_M,), 0, _V),
}

_PREC = {"or": 1, "and": 2, "unless": 2, "==": 3, "!=": 3, "<=": 3, "<": 3, ">=": 3, ">": 3,
         "+": 4, "-": 4, "*": 5, "/": 5, "%": 5, "atan2": 5, "^": 6}
_LABEL_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
_DOC = {SCALAR: "scalar", VECTOR: "instant vector", MATRIX: "range vector", STRING: "string"}


def parse_number(text: str) -> float:
    """A NUMBER token's value, as Go's ``ParseInt(s, 0, 64)`` then ``ParseFloat`` read it."""
    low = text.lower()
    if low in ("inf", "+inf"):
        return math.inf
    if low == "nan":
        return math.nan
    try:
        if re.fullmatch(r"0[xX][0-9a-fA-F]+", text):
            return float(int(text, 16))
        if re.fullmatch(r"0[0-7]+", text):
            return float(int(text, 8))
        if re.fullmatch(r"[0-9]+", text):
            n = int(text, 10)
            if n < 2 ** 63:
                return float(n)
        return float(text)
    except ValueError:
        raise ValueError(f"error parsing number: {text!r}") from None


class RegexError(re.error):
    """A regular expression Go's ``regexp`` (RE2 syntax) refuses."""


_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False


class GoRegex:
    """A Prometheus regular expression: RE2 (Go's ``regexp`` syntax and semantics, flags inside
    groups, ``\\z``, no backreferences or lookaround) anchored as Prometheus anchors it,
    ``^(?:re)$``. ``fullmatch(text)`` gives a match (``group(i)``, ``group(name)``) or None."""

    __slots__ = ("pattern", "_rx")

    def __init__(self, pattern: str) -> None:
        self.pattern = pattern
        try:
            self._rx = re2.compile("^(?:" + pattern + ")$", _RE2_OPTIONS)
        except re2.error as exc:
            why = exc.args[0] if exc.args else exc
            raise RegexError(why.decode("utf-8", "replace") if isinstance(why, bytes) else str(why)) from None

    def fullmatch(self, text: str):
        return self._rx.search(text)


@lru_cache(maxsize=4096)
def compile_regex(pattern: str) -> GoRegex:
    """A Prometheus regular expression (``GoRegex``); ``RegexError`` when Go would refuse it."""
    return GoRegex(pattern)


class _Parser:
    def __init__(self, src: str, prometheus3: bool = False) -> None:
        self.src = src
        self.prometheus3 = prometheus3
        self.toks: List[Token] = tokenize(src, prometheus3)
        self.i = 0

    # -- token helpers ---------------------------------------------------------------------

    def peek(self, k: int = 0) -> Token:
        return self.toks[min(self.i + k, len(self.toks) - 1)]

    def next(self) -> Token:
        t = self.toks[self.i]
        self.i = min(self.i + 1, len(self.toks) - 1)
        return t

    def err(self, msg: str, tok: Optional[Token] = None) -> PromQLSyntaxError:
        return PromQLSyntaxError(msg, (tok or self.peek()).pos)

    def expect(self, kind: str, what: str) -> Token:
        t = self.peek()
        if t.kind != kind:
            shown = "end of input" if t.kind == "EOF" else repr(t.text)
            raise self.err(f"unexpected {shown}, expected {what}")
        return self.next()

    def is_kw(self, *words: str, k: int = 0) -> bool:
        t = self.peek(k)
        return t.kind == "KEYWORD" and t.text.lower() in words

    def binop(self) -> Optional[str]:
        t = self.peek()
        if t.kind == "OP" and t.text in _PREC:
            return t.text
        if t.kind == "KEYWORD" and t.text.lower() in ("and", "or", "unless", "atan2"):
            return t.text.lower()
        return None

    # -- grammar ---------------------------------------------------------------------------

    def parse(self) -> Expr:
        if self.peek().kind == "EOF":
            raise self.err("no expression found in input")
        e = self.expr(1)
        if self.peek().kind != "EOF":
            raise self.err(f"unexpected {self.peek().text!r}")
        return e

    def expr(self, min_prec: int) -> Expr:
        lhs = self.unary()
        while True:
            op = self.binop()
            if op is None or _PREC[op] < min_prec:
                return lhs
            optok = self.next()
            return_bool, matching = self.bin_modifiers()
            prec = _PREC[op]
            rhs = self.expr(prec if op == "^" else prec + 1)
            lhs = self.make_binary(op, lhs, rhs, return_bool, matching, optok)

    def bin_modifiers(self) -> Tuple[bool, Optional[VectorMatching]]:
        return_bool = False
        if self.is_kw("bool"):
            self.next()
            return_bool = True
        labels: Tuple[str, ...] = ()
        on = given = False
        card = "one-to-one"
        include: Tuple[str, ...] = ()
        if self.is_kw("on", "ignoring"):
            on = self.next().text.lower() == "on"
            labels = self.grouping_labels()
            given = True
            if self.is_kw("group_left", "group_right"):
                card = "many-to-one" if self.next().text.lower() == "group_left" else "one-to-many"
                if self.peek().kind == "(":
                    include = self.grouping_labels()
        del given
        return return_bool, VectorMatching(card, labels, on, include)

    def grouping_labels(self) -> Tuple[str, ...]:
        self.expect("(", '"("')
        out: List[str] = []
        while self.peek().kind != ")":
            t = self.next()
            if t.kind not in ("IDENT", "KEYWORD", "METRIC") or not _LABEL_RE.match(t.text):
                raise self.err(f"unexpected {t.text!r} in grouping opts, expected label", t)
            out.append(t.text)
            if self.peek().kind == ",":
                self.next()
            elif self.peek().kind != ")":
                raise self.err(f"unexpected {self.peek().text!r} in grouping opts, expected \",\" or \")\"")
        self.next()
        return tuple(out)

    def unary(self) -> Expr:
        t = self.peek()
        if t.kind == "OP" and t.text in ("+", "-"):
            self.next()
            operand = self.expr(_PREC["^"])
            if isinstance(operand, NumberLiteral):
                return NumberLiteral(-operand.val if t.text == "-" else operand.val)
            if operand.type not in (SCALAR, VECTOR):
                raise self.err(f"unary expression only allowed on expressions of type scalar or instant vector, "
                               f"got {_DOC[operand.type]!r}", t)
            return UnaryExpr(t.text, operand)
        return self.postfix(self.primary())

    def postfix(self, e: Expr) -> Expr:
        while True:
            t = self.peek()
            if t.kind == "[":
                e = self.range_or_subquery(e)
            elif self.is_kw("offset"):
                self.next()
                sign = 1
                if self.peek().kind == "OP" and self.peek().text == "-":
                    self.next()
                    sign = -1
                d = self.duration(self.duration_token(), allow_zero=self.prometheus3)
                e = self.with_offset(e, sign * d, t)
            elif t.kind == "@":
                self.next()
                e = self.with_at(e, self.at_value(), t)
            else:
                return e

    def duration_token(self) -> Token:
        """A duration, or with ``prometheus3`` also a number of seconds (``[300]``, ``offset 50``)."""
        if self.prometheus3 and self.peek().kind == "NUMBER":
            return self.next()
        return self.expect("DURATION", "duration")

    def duration(self, t: Token, allow_zero: bool = False) -> int:
        if t.kind == "NUMBER":  # Prometheus 3: seconds
            v = parse_number(t.text)
            if math.isnan(v) or math.isinf(v) or abs(v) > 9.2e12:
                raise self.err("duration out of range", t)
            ms = int(round(v * 1000))
        else:
            try:
                ms = parse_duration(t.text)
            except DurationError as exc:
                raise self.err(str(exc), t) from None
        if ms == 0 and not allow_zero:
            raise self.err("duration must be greater than 0", t)
        return ms

    def range_or_subquery(self, e: Expr) -> Expr:
        open_tok = self.next()
        rng = self.duration(self.duration_token())
        if self.peek().kind == ":":
            self.next()
            step = 0
            if self.peek().kind == "DURATION" or (self.prometheus3 and self.peek().kind == "NUMBER"):
                step = self.duration(self.next())
            self.expect("]", '"]"')
            if e.type != VECTOR:
                raise self.err(f"subquery is only allowed on instant vector, got {e.type} instead", open_tok)
            return SubqueryExpr(e, rng, step)
        self.expect("]", '":" or "]"')
        if not isinstance(e, VectorSelector):
            raise self.err("ranges only allowed for vector selectors", open_tok)
        if e.offset_ms:
            raise self.err("no offset modifiers allowed before range", open_tok)
        if e.at is not None:
            raise self.err("no @ modifiers allowed before range", open_tok)
        return MatrixSelector(e, rng)

    def with_offset(self, e: Expr, ms: int, tok: Token) -> Expr:
        if isinstance(e, VectorSelector):
            if e.offset_ms:
                raise self.err("offset may not be set multiple times", tok)
            return VectorSelector(e.name, e.matchers, ms, e.at)
        if isinstance(e, MatrixSelector):
            if e.selector.offset_ms:
                raise self.err("offset may not be set multiple times", tok)
            s = e.selector
            return MatrixSelector(VectorSelector(s.name, s.matchers, ms, s.at), e.range_ms)
        if isinstance(e, SubqueryExpr):
            if e.offset_ms:
                raise self.err("offset may not be set multiple times", tok)
            return SubqueryExpr(e.expr, e.range_ms, e.step_ms, ms, e.at)
        raise self.err("offset modifier must be preceded by an instant vector selector or range vector "
                       "selector or a subquery", tok)

    def at_value(self) -> At:
        t = self.peek()
        if self.is_kw("start", "end"):
            self.next()
            self.expect("(", '"("')
            self.expect(")", '")"')
            return At(preprocessor=t.text.lower())
        sign = 1.0
        if t.kind == "OP" and t.text in ("+", "-"):
            self.next()
            sign = -1.0 if t.text == "-" else 1.0
        if self.prometheus3 and self.peek().kind == "DURATION":  # Prometheus 3: @ 100s
            num = self.next()
            v = sign * self.duration(num, allow_zero=True) / 1000
        else:
            num = self.expect("NUMBER", "timestamp")
            v = sign * parse_number(num.text)
        if math.isinf(v) or math.isnan(v) or abs(v) >= 9.2e15:
            raise self.err(f"timestamp out of bounds for @ modifier: {v}", num)
        return At(ms=int(round(v * 1000)))

    def with_at(self, e: Expr, at: At, tok: Token) -> Expr:
        if isinstance(e, VectorSelector):
            if e.at is not None:
                raise self.err("@ <timestamp> may not be set multiple times", tok)
            return VectorSelector(e.name, e.matchers, e.offset_ms, at)
        if isinstance(e, MatrixSelector):
            s = e.selector
            if s.at is not None:
                raise self.err("@ <timestamp> may not be set multiple times", tok)
            return MatrixSelector(VectorSelector(s.name, s.matchers, s.offset_ms, at), e.range_ms)
        if isinstance(e, SubqueryExpr):
            if e.at is not None:
                raise self.err("@ <timestamp> may not be set multiple times", tok)
            return SubqueryExpr(e.expr, e.range_ms, e.step_ms, e.offset_ms, at)
        raise self.err("@ modifier must be preceded by an instant vector selector or range vector selector "
                       "or a subquery", tok)

    def primary(self) -> Expr:
        t = self.peek()
        if t.kind == "NUMBER":
            self.next()
            try:
                return NumberLiteral(parse_number(t.text))
            except ValueError as exc:
                raise self.err(str(exc), t) from None
        if t.kind == "STRING":
            self.next()
            return StringLiteral(unquote(t.text, t.pos))
        if t.kind == "(":
            self.next()
            inner = self.expr(1)
            self.expect(")", '")"')
            return ParenExpr(inner)
        if t.kind == "{":
            return self.selector(None, t)
        if t.kind == "KEYWORD" and t.text.lower() in AGGREGATORS:
            nxt = self.peek(1)
            if nxt.kind == "(" or (nxt.kind == "KEYWORD" and nxt.text.lower() in ("by", "without")):
                return self.aggregation()
            self.next()
            return self.selector(t.text, t)
        if t.kind == "IDENT":
            self.next()
            if self.peek().kind == "(":
                return self.call(t)
            return self.selector(t.text, t)
        if t.kind == "METRIC":
            self.next()
            return self.selector(t.text, t)
        if t.kind == "DURATION":
            raise self.err(f"unexpected duration {t.text!r}", t)
        shown = "end of input" if t.kind == "EOF" else repr(t.text)
        raise self.err(f"unexpected {shown}")

    def selector(self, name: Optional[str], tok: Token) -> VectorSelector:
        matchers: List[Matcher] = []
        if self.peek().kind == "{":
            self.next()
            while self.peek().kind != "}":
                lt = self.expect("IDENT", "label matching")
                op = self.expect("OP", "label matching operator")
                if op.text not in ("=", "!=", "=~", "!~"):
                    raise self.err(f"unexpected {op.text!r} in label matching", op)
                vt = self.expect("STRING", "string")
                value = unquote(vt.text, vt.pos)
                if op.text in ("=~", "!~"):
                    try:
                        compile_regex(value)
                    except re.error as exc:
                        raise self.err(f"error parsing regexp {value!r}: {exc}", vt) from None
                matchers.append(Matcher(lt.text, op.text, value))
                if self.peek().kind == ",":
                    self.next()
                elif self.peek().kind != "}":
                    raise self.err(f"unexpected {self.peek().text!r} in label matching, expected \",\" or \"}}\"")
            self.next()
        if name is not None:
            for m in matchers:
                if m.name == "__name__":
                    raise self.err(f"metric name must not be set twice: {name!r} or {m.value!r}", tok)
            matchers.append(Matcher("__name__", "=", name))
        else:
            if not any(not _matches_empty(m) for m in matchers):
                raise self.err("vector selector must contain at least one non-empty matcher", tok)
            for m in matchers:
                if m.name == "__name__" and m.op == "=":
                    name = m.value
        return VectorSelector(name, tuple(matchers))

    def call_args(self) -> List[Expr]:
        self.expect("(", '"("')
        args: List[Expr] = []
        while self.peek().kind != ")":
            args.append(self.expr(1))
            if self.peek().kind == ",":
                comma = self.next()
                if self.peek().kind == ")":
                    raise self.err("trailing commas not allowed in function call args", comma)
            elif self.peek().kind != ")":
                raise self.err(f"unexpected {self.peek().text!r} in function call, expected \",\" or \")\"")
        self.next()
        return args

    def call(self, name_tok: Token) -> Call:
        name = name_tok.text
        known = {**FUNCTIONS, **EXPERIMENTAL_FUNCTIONS} if self.prometheus3 else FUNCTIONS
        if name not in known:
            raise self.err(f"unknown function with name {name!r}", name_tok)
        types, variadic, ret = known[name]
        args = self.call_args()
        n = len(types)
        if variadic == 0:
            if len(args) != n:
                raise self.err(f"expected {n} argument(s) in call to {name!r}, got {len(args)}", name_tok)
        else:
            if len(args) < n - 1:
                raise self.err(f"expected at least {n - 1} argument(s) in call to {name!r}, got {len(args)}", name_tok)
            if variadic > 0 and len(args) > n - 1 + variadic:
                raise self.err(f"expected at most {n - 1 + variadic} argument(s) in call to {name!r}, got {len(args)}",
                               name_tok)
        for i, a in enumerate(args):
            want = types[min(i, n - 1)]
            if a.type != want:
                raise self.err(f"expected type {_DOC[want]} in call to function {name!r}, got {_DOC[a.type]}",
                               name_tok)
        return Call(name, tuple(args), ret)

    def aggregation(self) -> AggregateExpr:
        op_tok = self.next()
        op = op_tok.text.lower()
        grouping: Tuple[str, ...] = ()
        without = has = False
        if self.is_kw("by", "without"):
            without = self.next().text.lower() == "without"
            grouping = self.grouping_labels()
            has = True
            args = self.call_args()
        else:
            args = self.call_args()
            if self.is_kw("by", "without"):
                without = self.next().text.lower() == "without"
                grouping = self.grouping_labels()
                has = True
        if not args:
            raise self.err("no arguments for aggregate expression provided", op_tok)
        want = 2 if op in ("topk", "bottomk", "quantile", "count_values") else 1
        if len(args) != want:
            raise self.err(f"wrong number of arguments for aggregate expression provided, expected {want}, "
                           f"got {len(args)}", op_tok)
        param = args[0] if want == 2 else None
        expr = args[-1]
        if expr.type != VECTOR:
            raise self.err(f"expected type instant vector in aggregation expression, got {_DOC[expr.type]}", op_tok)
        if op in ("topk", "bottomk", "quantile") and param.type != SCALAR:
            raise self.err(f"expected type scalar in aggregation parameter, got {_DOC[param.type]}", op_tok)
        if op == "count_values" and param.type != STRING:
            raise self.err(f"expected type string in aggregation parameter, got {_DOC[param.type]}", op_tok)
        return AggregateExpr(op, expr, param, grouping, without, has)

    def make_binary(self, op: str, lhs: Expr, rhs: Expr, return_bool: bool,
                    matching: Optional[VectorMatching], tok: Token) -> BinaryExpr:
        lt, rt = lhs.type, rhs.type
        if return_bool and op not in COMPARISONS:
            raise self.err("bool modifier can only be used on comparison operators", tok)
        if op in COMPARISONS and not return_bool and lt == SCALAR and rt == SCALAR:
            raise self.err("comparisons between scalars must use BOOL modifier", tok)
        assert matching is not None
        if op in SET_OPS and matching.card == "one-to-one":
            matching = VectorMatching("many-to-many", matching.labels, matching.on, matching.include)
        if matching.on:
            for l1 in matching.labels:
                if l1 in matching.include:
                    raise self.err(f"label {l1!r} must not occur in ON and GROUP clause at once", tok)
        if lt not in (SCALAR, VECTOR):
            raise self.err("binary expression must contain only scalar and instant vector types", tok)
        if rt not in (SCALAR, VECTOR):
            raise self.err("binary expression must contain only scalar and instant vector types", tok)
        if lt != VECTOR or rt != VECTOR:
            if matching.labels or matching.include or matching.card in ("many-to-one", "one-to-many"):
                raise self.err("vector matching only allowed between instant vectors", tok)
            final: Optional[VectorMatching] = None
        else:
            if op in SET_OPS and matching.card in ("many-to-one", "one-to-many"):
                raise self.err(f"no grouping allowed for {op!r} operation", tok)
            final = matching
        if (lt == SCALAR or rt == SCALAR) and op in SET_OPS:
            raise self.err(f"set operator {op!r} not allowed in binary scalar expression", tok)
        assert op in COMPARISONS or op in SET_OPS or op in ARITHMETIC
        return BinaryExpr(op, lhs, rhs, final, return_bool)


def _matches_empty(m: Matcher) -> bool:
    if m.op == "=":
        return m.value == ""
    if m.op == "!=":
        return m.value != ""
    rx = compile_regex(m.value)
    hit = rx.fullmatch("") is not None
    return hit if m.op == "=~" else not hit


def parse(src: str, prometheus3: bool = False) -> Expr:
    """Parse one PromQL expression. Raises ``PromQLSyntaxError`` (with a character position).
    ``prometheus3``: also Prometheus 3's numbers as durations (``[300]``, ``offset 50``,
    ``[5m:30]``) and durations as ``@`` times (``@ 100s``)."""
    return _Parser(src, prometheus3).parse()


def selectors(e: Expr):
    """Every vector selector in ``e`` (inside matrix selectors and subqueries too)."""
    from .ast import walk

    for node in walk(e):
        if isinstance(node, VectorSelector):
            yield node


__all__ = ["parse", "parse_number", "compile_regex", "selectors", "FUNCTIONS", "PromQLSyntaxError",
           "unwrap_parens"]
