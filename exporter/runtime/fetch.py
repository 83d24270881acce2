"""Fetching a metrics page over HTTP: vLLM's ``/metrics``, and dcgm-exporter's for the dcgm source.

One ``requests.Session`` (so one kept-alive connection) per sidecar; a total deadline per read
that is shorter than the poll interval; a cap on the page size enforced while the body is read
(after gzip decompression, so a compressed bomb is stopped too); an optional bearer token, read
from a file on every poll when given as a file so a rotated Kubernetes secret is picked up.

Every failure becomes ``FetchError`` with a short ``reason`` (the label value of
``vllm_sidecar_poll_errors_total``) and a one-line message without secrets.
"""

from __future__ import annotations

import time
from typing import Callable

import requests
from requests.adapters import HTTPAdapter

from .config import redact_url

CHUNK = 64 * 1024

# Every reason a fetch can fail with (``vllm_sidecar_poll_errors_total{reason}``); the sidecar
# starts each at 0 so that ``increase()`` sees the first failure. A test checks that every
# ``FetchError`` raised in this module uses one of these.
REASONS = ("refused", "timeout", "connection", "http_5xx", "http_4xx", "http_other", "unauthorized",
           "parse", "too_large", "token")


class FetchError(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class PageFetcher:
    def __init__(
        self,
        url: str,
        timeout: float,
        max_bytes: int,
        token: str = "",
        token_file: str = "",
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self.safe_url = redact_url(url)
        self.timeout = timeout
        self.max_bytes = max_bytes
        self._token = token
        self._token_file = token_file
        self._monotonic = monotonic
        self.session = requests.Session()
        self.session.trust_env = False  # a sidecar talks to localhost: no proxy from the env
        self.session.mount("http://", HTTPAdapter(pool_connections=1, pool_maxsize=1, max_retries=0))
        self.session.mount("https://", HTTPAdapter(pool_connections=1, pool_maxsize=1, max_retries=0))
        self.last_bytes = 0

    def _headers(self) -> dict:
        h = {
            # vLLM serves text either way; asking for text keeps other servers honest too
            "Accept": "text/plain;version=0.0.4;q=1,*/*;q=0.1",
            "Accept-Encoding": "gzip",
            "User-Agent": "vllm-sidecar-exporter",
        }
        token = self._token
        if self._token_file:
            try:
                with open(self._token_file, encoding="utf-8") as fh:
                    token = fh.read().strip()
            except OSError as exc:
                raise FetchError("token", f"cannot read the bearer token file: {exc.strerror}") from None
        if token:
            h["Authorization"] = "Bearer " + token
        return h

    def fetch(self) -> str:
        """Return the page text, or raise FetchError."""
        start = self._monotonic()
        deadline = start + self.timeout
        try:
            resp = self.session.get(
                self.url, headers=self._headers(), timeout=(self.timeout, self.timeout), stream=True
            )
        except requests.exceptions.Timeout:
            raise FetchError("timeout", f"{self.safe_url}: no answer within {self.timeout:g} s") from None
        except requests.exceptions.ConnectionError as exc:
            text = str(exc)
            if "refused" in text.lower():
                raise FetchError("refused", f"{self.safe_url}: connection refused") from None
            raise FetchError("connection", f"{self.safe_url}: connection failed ({_short(exc)})") from None
        except requests.exceptions.RequestException as exc:
            raise FetchError("connection", f"{self.safe_url}: {_short(exc)}") from None
        try:
            if resp.status_code >= 500:
                raise FetchError("http_5xx", f"{self.safe_url}: HTTP {resp.status_code}")
            if resp.status_code in (401, 403):
                raise FetchError("unauthorized", f"{self.safe_url}: HTTP {resp.status_code}, check the bearer token")
            if resp.status_code >= 400:
                raise FetchError("http_4xx", f"{self.safe_url}: HTTP {resp.status_code}")
            if resp.status_code != 200:
                raise FetchError("http_other", f"{self.safe_url}: HTTP {resp.status_code}")
            declared = resp.headers.get("Content-Length")
            if declared and declared.isdigit() and "gzip" not in resp.headers.get("Content-Encoding", "") \
                    and int(declared) > self.max_bytes:
                raise FetchError("too_large", f"{self.safe_url}: page of {int(declared)} bytes is over the "
                                 f"{self.max_bytes}-byte cap")
            chunks = []
            size = 0
            try:
                for chunk in _chunks(resp.raw):
                    size += len(chunk)
                    if size > self.max_bytes:
                        raise FetchError("too_large", f"{self.safe_url}: page over the {self.max_bytes}-byte cap")
                    chunks.append(chunk)
                    if self._monotonic() > deadline:
                        raise FetchError("timeout", f"{self.safe_url}: page not read within {self.timeout:g} s")
            except FetchError:
                raise
            except requests.exceptions.Timeout:
                raise FetchError("timeout", f"{self.safe_url}: page not read within {self.timeout:g} s") from None
            except Exception as exc:  # urllib3 read errors: timeouts, broken gzip, resets
                name = type(exc).__name__
                if "Timeout" in name or "timed out" in str(exc):
                    raise FetchError("timeout", f"{self.safe_url}: page not read within {self.timeout:g} s") from None
                if "Decode" in name:
                    raise FetchError("parse", f"{self.safe_url}: body could not be decompressed") from None
                raise FetchError("connection", f"{self.safe_url}: read failed ({name})") from None
            if self._monotonic() > deadline:
                raise FetchError("timeout", f"{self.safe_url}: page not read within {self.timeout:g} s")
            body = b"".join(chunks)
            self.last_bytes = size
        except BaseException:
            resp.close()  # drop a connection left mid-body
            raise
        resp.raw.release_conn()  # whole body read: the connection goes back for the next poll
        ctype = resp.headers.get("Content-Type", "")
        if "html" in ctype.lower() or body[:200].lstrip().lower().startswith((b"<!doctype", b"<html")):
            raise FetchError("parse", f"{self.safe_url}: got an HTML page, not metrics")
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError:
            raise FetchError("parse", f"{self.safe_url}: page is not UTF-8 text") from None

    def close(self) -> None:
        self.session.close()


def _chunks(raw):
    """The body as it arrives: ``read1`` returns what one socket read brings, so the deadline
    is checked between small reads even when a server dribbles bytes."""
    read1 = getattr(raw, "read1", None)
    if read1 is None:  # older urllib3
        yield from raw.stream(CHUNK, decode_content=True)
        return
    while True:
        chunk = read1(CHUNK, decode_content=True)
        if not chunk:
            return
        yield chunk


def _short(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:160]
