"""PromQL text to tokens, following Prometheus 2.42's ``promql/parser/lex.go``.

Keywords are case-insensitive (``SUM``, ``By``); ``Inf`` and ``NaN`` are numbers; a name with a
colon is a metric name; inside ``{...}`` every word is a label name; inside ``[...]`` a
duration and, for subqueries, a colon; ``#`` starts a comment to the end of the line. Strings
take Go's escapes (``"..."``, ``'...'``) or none (backticks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List

from ...slo import unquote_string


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
    ``exporter.slo.unquote_string`` (the SLO loader checks its selector with it too)."""
    try:
        return unquote_string(text)
    except ValueError as exc:
        raise PromQLSyntaxError(str(exc), pos) from None


def tokenize(src: str, prometheus3: bool = False) -> List[Token]:
    """All tokens of ``src``, ending with an ``EOF`` token. Raises ``PromQLSyntaxError``.
    ``prometheus3``: a plain number inside brackets is a ``NUMBER`` (Prometheus 3 reads it as
    seconds), not a syntax error."""
    toks: List[Token] = []
    i, n = 0, len(src)
    brace = bracket = got_colon = False
    paren = 0

    def err(msg: str, at: int) -> PromQLSyntaxError:
        return PromQLSyntaxError(msg, at)

    def scan_string(start: int) -> int:
        q = src[start]
        j = start + 1
        while True:
            if j >= n or (q != "`" and src[j] == "\n"):
                raise err("unterminated quoted string" if q != "`" else "unterminated raw string", start)
            c = src[j]
            if c == "\\" and q != "`":
                j += 2
                continue
            if c == q:
                return j + 1
            j += 1

    def scan_number(j: int) -> int:
        """End of a number starting at j, or -1 when what follows makes it no number."""
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

    def scan_duration(j: int) -> int:
        """End of a duration starting at j (digits then units), or -1."""
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

    while i < n:
        c = src[i]
        if c in " \t\n\r":
            i += 1
            continue
        if c == "#":
            while i < n and src[i] not in "\r\n":
                i += 1
            continue
        if brace:
            if _is_alpha(c):
                j = i
                while j < n and _is_alnum(src[j]):
                    j += 1
                toks.append(Token("IDENT", src[i:j], i))
                i = j
            elif c == ",":
                toks.append(Token(",", c, i))
                i += 1
            elif c in "\"'`":
                j = scan_string(i)
                toks.append(Token("STRING", src[i:j], i))
                i = j
            elif c == "=":
                if src.startswith("=~", i):
                    toks.append(Token("OP", "=~", i))
                    i += 2
                else:
                    toks.append(Token("OP", "=", i))
                    i += 1
            elif c == "!":
                if src.startswith("!~", i) or src.startswith("!=", i):
                    toks.append(Token("OP", src[i:i + 2], i))
                    i += 2
                else:
                    raise err(f"unexpected character after '!' inside braces: {src[i + 1:i + 2]!r}", i)
            elif c == "}":
                toks.append(Token("}", c, i))
                brace = False
                i += 1
            else:
                raise err(f"unexpected character inside braces: {c!r}", i)
            continue
        if bracket and (_is_digit(c) or (prometheus3 and c == "." and i + 1 < n and _is_digit(src[i + 1]))):
            j = scan_duration(i)
            if j < 0 and prometheus3:
                j = scan_number(i)
                if j >= 0:
                    toks.append(Token("NUMBER", src[i:j], i))
                    i = j
                    continue
            if j < 0:
                raise err(f"bad duration syntax: {src[i:i + 10]!r}", i)
            toks.append(Token("DURATION", src[i:j], i))
            i = j
            continue
        if c == ",":
            toks.append(Token(",", c, i))
            i += 1
        elif c in "*/%+-^":
            toks.append(Token("OP", c, i))
            i += 1
        elif c == "=":
            if src.startswith("==", i):
                toks.append(Token("OP", "==", i))
                i += 2
            elif src.startswith("=~", i):
                raise err("unexpected character after '=': '~'", i)
            else:
                toks.append(Token("OP", "=", i))
                i += 1
        elif c == "!":
            if src.startswith("!=", i):
                toks.append(Token("OP", "!=", i))
                i += 2
            else:
                raise err(f"unexpected character after '!': {src[i + 1:i + 2]!r}", i)
        elif c in "<>":
            if src.startswith("=", i + 1):
                toks.append(Token("OP", c + "=", i))
                i += 2
            else:
                toks.append(Token("OP", c, i))
                i += 1
        elif _is_digit(c) or (c == "." and i + 1 < n and _is_digit(src[i + 1])):
            j = scan_number(i)
            if j >= 0:
                toks.append(Token("NUMBER", src[i:j], i))
                i = j
                continue
            j = scan_duration(i)
            if j < 0:
                raise err(f"bad number or duration syntax: {src[i:i + 10]!r}", i)
            toks.append(Token("DURATION", src[i:j], i))
            i = j
        elif c in "\"'`":
            j = scan_string(i)
            toks.append(Token("STRING", src[i:j], i))
            i = j
        elif _is_alpha(c) or c == ":":
            if bracket:
                if got_colon:
                    raise err(f"unexpected colon {c!r}", i)
                if c != ":":
                    raise err(f"unexpected character in brackets: {c!r}", i)
                toks.append(Token(":", c, i))
                got_colon = True
                i += 1
                continue
            j = i
            while j < n and (_is_alnum(src[j]) or src[j] == ":"):
                j += 1
            word = src[i:j]
            low = word.lower()
            if low in ("inf", "nan"):
                toks.append(Token("NUMBER", word, i))
            elif low in KEYWORDS:
                toks.append(Token("KEYWORD", word, i))  # compared lower-cased; labels keep the spelling
            elif ":" in word:
                toks.append(Token("METRIC", word, i))
            else:
                toks.append(Token("IDENT", word, i))
            i = j
        elif c == "(":
            toks.append(Token("(", c, i))
            paren += 1
            i += 1
        elif c == ")":
            paren -= 1
            if paren < 0:
                raise err("unexpected right parenthesis ')'", i)
            toks.append(Token(")", c, i))
            i += 1
        elif c == "{":
            toks.append(Token("{", c, i))
            brace = True
            i += 1
        elif c == "[":
            if bracket:
                raise err("unexpected left bracket '['", i)
            toks.append(Token("[", c, i))
            bracket, got_colon = True, False
            i += 1
        elif c == "]":
            if not bracket:
                raise err("unexpected right bracket ']'", i)
            toks.append(Token("]", c, i))
            bracket = False
            i += 1
        elif c == "@":
            toks.append(Token("@", c, i))
            i += 1
        else:
            raise err(f"unexpected character: {c!r}", i)
    if brace:
        raise err("unexpected end of input inside braces", n)
    if paren:
        raise err("unclosed left parenthesis", n)
    if bracket:
        raise err("unclosed left bracket", n)
    toks.append(Token("EOF", "", n))
    return toks
