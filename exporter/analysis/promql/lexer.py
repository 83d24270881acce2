"""PromQL text to tokens, following Prometheus 2.42's ``promql/parser/lex.go``.

Keywords are case-insensitive (``SUM``, ``By``); ``Inf`` and ``NaN`` are numbers; a name with a
colon is a metric name; inside ``{...}`` every word is a label name; inside ``[...]`` a
duration and, for subqueries, a colon; ``#`` starts a comment to the end of the line. Strings
take Go's escapes (``"..."``, ``'...'``) or none (backticks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

from ...promql_strings import unquote as unquote_string


class PromQLSyntaxError(ValueError):
    """Text that is not PromQL. ``pos`` is the character offset of the problem."""

    def __init__(self, message: str, pos: int) -> None:
        super().__init__(message)
        self.message = message
        self.pos = pos

    def __str__(self) -> str:
        return f"{self.message} (at character {self.pos + 1})"


KEYWORDS = {
    "and", "or", "unless", "atan2",
    "sum", "avg", "count", "min", "max", "group", "stddev", "stdvar", "topk", "bottomk",
    "count_values", "quantile",
    "offset", "by", "without", "on", "ignoring", "group_left", "group_right", "bool",
    "start", "end",
}
AGGREGATORS = ("sum", "avg", "count", "min", "max", "group", "stddev", "stdvar", "topk", "bottomk",
               "count_values", "quantile")


@dataclass(frozen=True)
class Token:
    kind: str  # NUMBER STRING DURATION IDENT METRIC KEYWORD OP ( ) { } [ ] , : @ EOF
    text: str
    pos: int


def _is_alpha(c: str) -> bool:
    return c == "_" or ("a" <= c <= "z") or ("A" <= c <= "Z")


def _is_digit(c: str) -> bool:
    return "0" <= c <= "9"


def _is_alnum(c: str) -> bool:
    return _is_alpha(c) or _is_digit(c)


def unquote(text: str, pos: int = 0) -> str:
    """A lexed string token's value (Prometheus' ``strutil.Unquote``): the project's one
    ``exporter.promql_strings.unquote`` (the SLO loader checks its selector with it too)."""
    try:
        return unquote_string(text)
    except ValueError as exc:
        raise PromQLSyntaxError(str(exc), pos) from None


def tokenize(src: str, prometheus3: bool = False) -> List[Token]:
    """All tokens of ``src``, ending with an ``EOF`` token. Raises ``PromQLSyntaxError``.
    ``prometheus3``: a plain number inside brackets is a ``NUMBER`` (Prometheus 3 reads it as
    seconds), not a syntax error."""
    return _Lexer(src, prometheus3).run()


def _scan_string(src: str, start: int) -> int:
    """End of the quoted string starting at ``start``."""
    n = len(src)
    q = src[start]
    j = start + 1
    while True:
        if j >= n or (q != "`" and src[j] == "\n"):
            raise PromQLSyntaxError("unterminated quoted string" if q != "`" else "unterminated raw string", start)
        c = src[j]
        if c == "\\" and q != "`":
            j += 2
            continue
        if c == q:
            return j + 1
        j += 1


def _scan_number(src: str, j: int) -> int:
    """End of a number starting at j, or -1 when what follows makes it no number."""
    n = len(src)
    digits = "0123456789"
    if src.startswith(("0x", "0X"), j):
        digits = "0123456789abcdefABCDEF"
        j += 2
    while j < n and src[j] in digits:
        j += 1
    if j < n and src[j] == ".":
        j += 1
        while j < n and src[j] in digits:
            j += 1
    if j < n and src[j] in "eE":
        j += 1
        if j < n and src[j] in "+-":
            j += 1
        while j < n and _is_digit(src[j]):
            j += 1
    if j < n and _is_alnum(src[j]):
        return -1
    return j


def _scan_duration(src: str, j: int) -> int:
    """End of a duration starting at j (digits then units), or -1."""
    n = len(src)
    k = j
    while k < n and _is_digit(src[k]):
        k += 1
    if k == j or k >= n or src[k] not in "smhdwy":
        return -1
    k += 1
    if k < n and src[k] == "s":
        k += 1
    while k < n and _is_digit(src[k]):
        while k < n and _is_digit(src[k]):
            k += 1
        if k >= n or src[k] not in "smhdw":
            return -1
        k += 1
        if k < n and src[k] == "s":
            k += 1
    if k < n and _is_alnum(src[k]):
        return -1
    return k


class _Lexer:
    """One pass over ``src``: the state lex.go keeps (inside braces, inside brackets, a colon
    seen there, open parentheses) and one method per kind of thing that can start at a point.
    Each method takes the position of the character it reads and returns the next one."""

    def __init__(self, src: str, prometheus3: bool) -> None:
        self.src, self.n, self.prometheus3 = src, len(src), prometheus3
        self.toks: List[Token] = []
        self.brace = self.bracket = self.got_colon = False
        self.paren = 0

    def emit(self, kind: str, start: int, end: int) -> int:
        self.toks.append(Token(kind, self.src[start:end], start))
        return end

    def run(self) -> List[Token]:
        src, n = self.src, self.n
        i = 0
        while i < n:
            c = src[i]
            if c in " \t\n\r":
                i += 1
            elif c == "#":
                while i < n and src[i] not in "\r\n":
                    i += 1
            elif self.brace:
                i = self.in_braces(i, c)
            elif self.bracket and (_is_digit(c) or (self.prometheus3 and c == "." and i + 1 < n
                                                    and _is_digit(src[i + 1]))):
                i = self.range_duration(i)
            else:
                i = self.operator(i, c) or self.operand(i, c) or self.grouping(i, c)
        if self.brace:
            raise PromQLSyntaxError("unexpected end of input inside braces", n)
        if self.paren:
            raise PromQLSyntaxError("unclosed left parenthesis", n)
        if self.bracket:
            raise PromQLSyntaxError("unclosed left bracket", n)
        self.toks.append(Token("EOF", "", n))
        return self.toks

    def in_braces(self, i: int, c: str) -> int:
        """Inside ``{...}``: label names, matchers, strings, commas, the closing brace."""
        src, n = self.src, self.n
        if _is_alpha(c):
            j = i
            while j < n and _is_alnum(src[j]):
                j += 1
            return self.emit("IDENT", i, j)
        if c == ",":
            return self.emit(",", i, i + 1)
        if c in "\"'`":
            return self.emit("STRING", i, _scan_string(src, i))
        if c == "=":
            return self.emit("OP", i, i + 2 if src.startswith("=~", i) else i + 1)
        if c == "!":
            if src.startswith("!~", i) or src.startswith("!=", i):
                return self.emit("OP", i, i + 2)
            raise PromQLSyntaxError(f"unexpected character after '!' inside braces: {src[i + 1:i + 2]!r}", i)
        if c == "}":
            self.brace = False
            return self.emit("}", i, i + 1)
        raise PromQLSyntaxError(f"unexpected character inside braces: {c!r}", i)

    def range_duration(self, i: int) -> int:
        """A duration inside ``[...]`` (or, for Prometheus 3, a number of seconds)."""
        j = _scan_duration(self.src, i)
        if j < 0 and self.prometheus3:
            j = _scan_number(self.src, i)
            if j >= 0:
                return self.emit("NUMBER", i, j)
        if j < 0:
            raise PromQLSyntaxError(f"bad duration syntax: {self.src[i:i + 10]!r}", i)
        return self.emit("DURATION", i, j)

    def operator(self, i: int, c: str) -> int:
        """A comma or an operator starting at i; 0 when there is none there."""
        src = self.src
        if c == ",":
            return self.emit(",", i, i + 1)
        if c in "*/%+-^":
            return self.emit("OP", i, i + 1)
        if c == "=":
            if src.startswith("==", i):
                return self.emit("OP", i, i + 2)
            if src.startswith("=~", i):
                raise PromQLSyntaxError("unexpected character after '=': '~'", i)
            return self.emit("OP", i, i + 1)
        if c == "!":
            if src.startswith("!=", i):
                return self.emit("OP", i, i + 2)
            raise PromQLSyntaxError(f"unexpected character after '!': {src[i + 1:i + 2]!r}", i)
        if c in "<>":
            return self.emit("OP", i, i + 2 if src.startswith("=", i + 1) else i + 1)
        return 0

    def operand(self, i: int, c: str) -> int:
        """A number, duration, string or word starting at i; 0 when there is none there."""
        src, n = self.src, self.n
        if _is_digit(c) or (c == "." and i + 1 < n and _is_digit(src[i + 1])):
            j = _scan_number(src, i)
            if j >= 0:
                return self.emit("NUMBER", i, j)
            j = _scan_duration(src, i)
            if j < 0:
                raise PromQLSyntaxError(f"bad number or duration syntax: {src[i:i + 10]!r}", i)
            return self.emit("DURATION", i, j)
        if c in "\"'`":
            return self.emit("STRING", i, _scan_string(src, i))
        if _is_alpha(c) or c == ":":
            return self.word(i, c)
        return 0

    def word(self, i: int, c: str) -> int:
        """A keyword, name, ``Inf``/``NaN``; inside brackets only a subquery's colon."""
        src, n = self.src, self.n
        if self.bracket:
            if self.got_colon:
                raise PromQLSyntaxError(f"unexpected colon {c!r}", i)
            if c != ":":
                raise PromQLSyntaxError(f"unexpected character in brackets: {c!r}", i)
            self.got_colon = True
            return self.emit(":", i, i + 1)
        j = i
        while j < n and (_is_alnum(src[j]) or src[j] == ":"):
            j += 1
        low = src[i:j].lower()
        if low in ("inf", "nan"):
            return self.emit("NUMBER", i, j)
        if low in KEYWORDS:
            return self.emit("KEYWORD", i, j)  # compared lower-cased; labels keep the spelling
        return self.emit("METRIC" if ":" in low else "IDENT", i, j)

    def grouping(self, i: int, c: str) -> int:
        """Parentheses, braces, brackets and ``@``: the state they open and close."""
        if c == "(":
            self.paren += 1
        elif c == ")":
            self.paren -= 1
            if self.paren < 0:
                raise PromQLSyntaxError("unexpected right parenthesis ')'", i)
        elif c == "{":
            self.brace = True
        elif c == "[":
            if self.bracket:
                raise PromQLSyntaxError("unexpected left bracket '['", i)
            self.bracket, self.got_colon = True, False
        elif c == "]":
            if not self.bracket:
                raise PromQLSyntaxError("unexpected right bracket ']'", i)
            self.bracket = False
        elif c != "@":
            raise PromQLSyntaxError(f"unexpected character: {c!r}", i)
        return self.emit(c, i, i + 1)
