"""HTTP/1.1 framing pieces of the listener, around h11 (which reads and writes the bytes): the
request as routing sees it, ``Accept-Encoding``'s gzip verdict, the ``Date`` header, and the
answer heads, made once per second and reused (h11's events are immutable)."""

from __future__ import annotations

import time
from email.utils import formatdate
from http import HTTPStatus
from typing import Dict, Optional, Tuple
from urllib.parse import urlsplit

import h11

MAX_HEAD = 16 * 1024  # bytes of a request head; beyond, 431
TEXT = "text/plain; charset=utf-8"
PHRASES = {s.value: s.phrase for s in HTTPStatus}


class Request:
    """What routing needs of one request h11 has read: the method, the target and its path, the
    version and the headers (names lower-cased, repeated ones joined with ", ")."""

    __slots__ = ("method", "target", "path", "version", "headers", "has_body")

    def __init__(self, method: str, target: str, path: str, version: str, headers: Dict[str, str]) -> None:
        self.method, self.target, self.path, self.version, self.headers = method, target, path, version, headers
        cl = headers.get("content-length")
        self.has_body = "transfer-encoding" in headers or (cl is not None and cl != "0")

    @classmethod
    def from_h11(cls, ev: h11.Request) -> "Request":
        headers: Dict[str, str] = {}
        for name, value in ev.headers:
            k, v = name.decode("latin-1"), value.decode("latin-1")
            headers[k] = f"{headers[k]}, {v}" if k in headers else v
        target = ev.target.decode("latin-1")
        return cls(ev.method.decode("latin-1"), target, path_of(target),
                   "HTTP/" + ev.http_version.decode("latin-1"), headers)


def path_of(target: str) -> str:
    """The path of a request target (origin or absolute form); "" for any other form."""
    if target.startswith("/"):
        return target.split("?", 1)[0]
    if target.startswith(("http://", "https://")):
        return urlsplit(target).path or "/"
    return ""


def accepts_gzip(value: str) -> bool:
    """Whether an Accept-Encoding value allows gzip, q-values honoured: ``gzip;q=0`` means no
    gzip; ``*`` counts when gzip is not named; an unreadable q counts as 0."""
    gzip_q: Optional[float] = None
    star_q: Optional[float] = None
    for item in value.split(","):
        coding, *params = item.split(";")
        coding = coding.strip().lower()
        if not coding:
            continue
        q = 1.0
        for p in params:
            k, _, v = p.partition("=")
            if k.strip().lower() == "q":
                try:
                    q = float(v.strip())
                except ValueError:
                    q = 0.0
                if not 0.0 <= q <= 1.0:  # also NaN
                    q = 0.0
        if coding in ("gzip", "x-gzip"):
            gzip_q = q if gzip_q is None else max(gzip_q, q)
        elif coding == "*":
            star_q = q
    if gzip_q is not None:
        return gzip_q > 0
    return star_q is not None and star_q > 0


_date_cache: Tuple[int, str] = (0, "")


def http_date() -> str:
    global _date_cache
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache = (now, formatdate(now, usegmt=True))
    return _date_cache[1]


class ResponseHeads:
    """Answer heads by what is in them (status, type, length, date, headers, keep-alive), made
    once and reused for the rest of the second; at most 64 kept."""

    def __init__(self) -> None:
        self._heads: Dict[tuple, h11.Response] = {}

    def get(self, code: int, ctype: str, length: int, headers: Tuple[Tuple[str, str], ...],
            extra: Tuple[Tuple[str, str], ...], keep: bool) -> h11.Response:
        date = http_date()
        key = (code, ctype, length, date, headers, extra, keep)
        resp = self._heads.get(key)
        if resp is None:
            hs = [("Server", "vllm-sidecar-exporter"), ("Date", date), ("Content-Type", ctype),
                  ("Content-Length", str(length)), *headers, *extra]
            if not keep:
                hs.append(("Connection", "close"))
            resp = h11.Response(status_code=code, headers=hs, reason=PHRASES.get(code, ""))
            if len(self._heads) >= 64:
                self._heads.clear()
            self._heads[key] = resp
        return resp
