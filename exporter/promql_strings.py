"""PromQL's string literals: their value, quotes and escapes as Prometheus' ``strutil.Unquote``
reads them (Go's escapes in double and single quotes, none in back quotes). The one
implementation, shared by the PromQL lexer (``analysis/promql/lexer.py``) and the SLO loader's
check of the selectors it will write into rules (``slo.py``); a foundation module like
``errors``, so both can read it."""

from __future__ import annotations

from typing import List

_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\"}


def unquote(text: str) -> str:
    """The value of a PromQL string literal, quotes included (Prometheus' ``strutil.Unquote``:
    double, single or back quotes, the last raw). ValueError if bad."""
    q = text[0]
    body = text[1:-1]
    if q == "`":
        return body
    out: List[str] = []
    i = 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        i += 1
        if i >= len(body):
            raise ValueError("escape sequence not terminated")
        e = body[i]
        if e in _ESCAPES:
            out.append(_ESCAPES[e])
            i += 1
        elif e == q:
            out.append(q)
            i += 1
        elif e in "01234567":
            digits = body[i:i + 3]
            if len(digits) < 3 or any(d not in "01234567" for d in digits) or int(digits, 8) > 255:
                raise ValueError(f"bad octal escape in {text}")
            out.append(chr(int(digits, 8)))
            i += 3
        elif e in "xuU":
            n = {"x": 2, "u": 4, "U": 8}[e]
            digits = body[i + 1:i + 1 + n]
            try:
                if len(digits) < n:
                    raise ValueError
                code = int(digits, 16)
            except ValueError:
                raise ValueError(f"bad escape \\{e} in {text}") from None
            if code > 0x10FFFF or 0xD800 <= code < 0xE000:
                raise ValueError("escape sequence is an invalid Unicode code point")
            out.append(chr(code))
            i += 1 + n
        else:
            raise ValueError(f"unknown escape sequence \\{e}")
    return "".join(out)
