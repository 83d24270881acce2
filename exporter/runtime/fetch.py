"""Fetching a metrics page over HTTP: vLLM's ``/metrics``, and dcgm-exporter's for the dcgm source.

A small HTTP/1.1 client on one socket (framed by llhttp), written for a peer that may be broken or
hostile:

- **One deadline per read, for everything.** ``fetch`` takes ``deadline = now + timeout`` and
  every blocking step gets the time left and nothing more: the name lookup (in a helper thread,
  waited for with the time left), each connect, the TLS handshake (CPython bounds a handshake
  by the socket timeout as a whole), the send, and **every** ``recv`` of the status line, the
  headers and the body (socket timeout = time left, set before each one). A server that accepts
  slowly, dribbles its headers or body a byte at a time, streams forever or never answers costs
  at most ``timeout`` seconds, and the poll fails with ``timeout``.
- **Bounded everything else.** Header block at most 64 KiB and 100 lines; at most 8 interim
  (1xx) answers, skipped; the page at most ``max_bytes`` raw *and* after gzip decompression,
  enforced while reading (a ``Content-Length`` over the cap fails before a byte of body is read;
  a gzip bomb stops at ``max_bytes + 1`` decompressed).
- **Framing by llhttp** (through httptools, the parser uvicorn uses; issue 29 for why not h11,
  which the listener keeps: docs/performance.md). The request head is written here (made once);
  the answer is fed to llhttp as it arrives (this module owns the socket, the deadline and the
  caps, llhttp the HTTP/1.1 framing: status line, header syntax, ``Content-Length``,
  ``chunked``, read-to-close, keep-alive). Whatever llhttp refuses (a malformed status line or
  header, a ``Content-Length`` that is not one number in ASCII digits or given twice, both
  framings at once, a bad chunk) is ``protocol``, and so is what this module checks on top, where
  llhttp is lenient or leaves it to its user: a version other than HTTP/1.x, a control character
  in the reason phrase, a transfer coding other than ``chunked``, bytes after the answer (a body
  longer than its ``Content-Length``), chunk-size lines and trailers past a cap, a truncated or
  corrupt gzip stream and an unknown encoding; an answer that does not begin with ``HTTP/``
  (another protocol's banner) fails at once rather than at the deadline. A body shorter than
  its ``Content-Length`` (the server closed) is ``connection``. Redirects are not followed
  (``http_other``, the redacted ``Location`` in the message): a sidecar reads one known address,
  and a redirect is usually a login page.
- **One kept-alive connection**, reused while the server keeps it and the last answer was read
  cleanly; dropped on any error. A kept-alive connection the server closed while idle is
  noticed before the request (or on an empty answer) and replaced once, within the deadline.
- **gzip**: asked for (``Accept-Encoding: gzip``) and decompressed only when the answer says
  ``Content-Encoding: gzip``; any other encoding is refused.
- **Credentials**: a bearer token (a setting, or a file re-read when it changes and on
  ``reload_token``, i.e. SIGHUP), validated by ``config.parse_token``: a bad file is the reason
  ``token`` and no request is sent; or the URL's user and password as Basic auth. Every token
  read is handed to ``logs.add_secret`` so that no log line can show it.

Every failure is ``FetchError`` with a short ``reason`` (the label value of
``vllm_sidecar_poll_errors_total``) and a one-line message built from the redacted URL, never
from a secret or from bytes the server sent (except the status code and a redacted Location).
"""

from __future__ import annotations

import base64
import ipaddress
import os
import re
import select
import socket
import ssl
import stat
import threading
import time
import zlib
from typing import Callable, List, Optional, Tuple
from urllib.parse import unquote, urlsplit

import httptools

from .. import __version__
from .config import TOKEN_MAX_BYTES, parse_token, redact_url
from .logs import add_secret

CHUNK = 64 * 1024
MAX_HEADER_BYTES = 64 * 1024
MAX_HEADER_LINES = 100
MAX_INTERIM = 8
DNS_CACHE_SECONDS = 30.0
_VISIBLE = re.compile(r"[\x21-\x7e]+")  # what a request target and a Host may hold here

# Every reason a fetch can fail with (``vllm_sidecar_poll_errors_total{reason}``); the sidecar
# starts each at 0 so that ``increase()`` sees the first failure. A test checks that every
# ``FetchError`` raised in this module uses one of these, and that the README lists them.
REASONS = ("refused", "timeout", "connection", "http_5xx", "http_4xx", "http_other", "unauthorized",
           "parse", "too_large", "token", "protocol", "tls")


class FetchError(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class _Eof(Exception):
    """The server closed the connection; ``str()`` says where."""


class _Lookup:
    """One name lookup in a daemon thread, so that a stuck resolver costs a poll its deadline,
    not the loop: the poll waits for it with the time left; a lookup still running is waited
    for again by the next poll instead of starting another."""

    def __init__(self, host: str, port: int) -> None:
        self.done = threading.Event()
        self.result: List[tuple] = []
        self.error: Optional[OSError] = None
        threading.Thread(target=self._run, args=(host, port), name="dns", daemon=True).start()

    def _run(self, host: str, port: int) -> None:
        try:
            self.result = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            self.error = exc
        finally:
            self.done.set()


class PageFetcher:
    def __init__(
        self,
        url: str,
        timeout: float,
        max_bytes: int,
        token: str = "",
        token_file: str = "",
        monotonic: Callable[[], float] = time.monotonic,
        ca_file: str = "",
    ) -> None:
        self.url = url
        self.safe_url = redact_url(url)
        self.timeout = timeout
        self.max_bytes = max_bytes
        self._monotonic = monotonic
        self.last_bytes = 0
        parts = urlsplit(url)
        self._tls = parts.scheme == "https"
        self.host = parts.hostname or ""
        self.port = parts.port or (443 if self._tls else 80)
        host_header = f"[{self.host}]" if ":" in self.host else self.host
        if parts.port:
            host_header += f":{parts.port}"
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        if not _VISIBLE.fullmatch(target) or not _VISIBLE.fullmatch(host_header):
            raise ValueError("the URL holds a space, a control character or a non-ASCII character")
        # the request head, made once (the Authorization line and the empty line end it per read)
        self._request = (f"GET {target} HTTP/1.1\r\nHost: {host_header}\r\n"
                         f"User-Agent: vllm-sidecar-exporter/{__version__}\r\n"
                         # vLLM serves text either way; asking for text keeps other servers honest too
                         "Accept: text/plain;version=0.0.4;q=1,*/*;q=0.1\r\n"
                         "Accept-Encoding: gzip\r\n").encode("ascii")
        self._basic = b""
        if parts.username is not None or parts.password is not None:
            user, pw = unquote(parts.username or ""), unquote(parts.password or "")
            add_secret(pw)
            self._basic = b"Basic " + base64.b64encode(f"{user}:{pw}".encode())
        self._token_file = token_file
        self._token_lock = threading.Lock()
        self._file_sig: Optional[tuple] = None
        self._file_error = ""
        self._auth = b""
        if token:
            self._set_token(parse_token(token.encode("utf-8", "surrogateescape")))
        try:
            ip = ipaddress.ip_address(self.host)
            family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
            self._static_addrs: Optional[List[tuple]] = [(family, socket.SOCK_STREAM, 0, "", (self.host, self.port))]
        except ValueError:
            self._static_addrs = None
        self._addrs: List[tuple] = []
        self._addrs_until = 0.0
        self._lookup: Optional[_Lookup] = None
        self._ctx: Optional[ssl.SSLContext] = None
        if self._tls:
            self._ctx = ssl.create_default_context(cafile=ca_file or None)
            self._ctx.set_alpn_protocols(["http/1.1"])
        self._sock: Optional[socket.socket] = None
        self._got = 0  # bytes of the answer under way received so far
        self._phase = ""
        self._ctype = ""
        self.connections = 0  # connections opened, for tests and the benchmark

    # -- the bearer token --------------------------------------------------------------------
    def _set_token(self, token: str) -> None:
        add_secret(token)
        self._auth = b"Bearer " + token.encode("ascii")

    def _check_token_file(self, force: bool = False) -> None:
        """Re-read the token file when it changed (inode, size, times) or when forced; a bad file
        leaves ``_file_error`` set (and no token in use) until it changes again."""
        path = self._token_file
        with self._token_lock:
            try:
                st = os.stat(path)
            except OSError as exc:
                self._file_sig = None
                self._file_error = f"cannot read the bearer token file {path}: {exc.strerror or exc}"
                return
            sig = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            if sig == self._file_sig and not force:
                return
            self._file_sig = sig
            self._file_error = ""
            if not stat.S_ISREG(st.st_mode):
                self._file_error = f"bearer token file {path} is not a regular file"
                return
            try:
                fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
                try:
                    raw = os.read(fd, 2 * TOKEN_MAX_BYTES + 64)
                finally:
                    os.close(fd)
            except OSError as exc:
                self._file_error = f"cannot read the bearer token file {path}: {exc.strerror or exc}"
                return
            try:
                self._set_token(parse_token(raw))
            except ValueError as exc:
                self._auth = b""
                self._file_error = f"bearer token file {path} {exc}"

    def reload_token(self) -> Tuple[bool, str]:
        """Re-read the token file now (SIGHUP): (usable, one line saying what happened, no secret)."""
        if not self._token_file:
            return True, "no bearer token file to re-read (the rest of the configuration is read at start only)"
        self._check_token_file(force=True)
        if self._file_error:
            return False, self._file_error
        return True, f"bearer token re-read from {self._token_file}"

    def _auth_header(self) -> bytes:
        if self._token_file:
            self._check_token_file()
            if self._file_error:
                raise FetchError("token", self._file_error)
            return self._auth
        return self._auth or self._basic

    # -- one read ----------------------------------------------------------------------------
    def fetch(self) -> str:
        """Return the page text, or raise FetchError; never takes longer than ``timeout``."""
        deadline = self._monotonic() + self.timeout
        try:
            auth = self._auth_header()
            request = self._request + b"Authorization: " + auth + b"\r\n\r\n" if auth else self._request + b"\r\n"
            body = self._exchange(request, deadline)
        except FetchError as exc:
            self._drop()
            exc.message = f"{self.safe_url}: {exc.message}"
            exc.args = (exc.message,)
            raise
        except TimeoutError:
            self._drop()
            raise FetchError("timeout", f"{self.safe_url}: no complete answer within {self.timeout:g} s "
                                        f"({self._phase})") from None
        except ssl.SSLError as exc:
            self._drop()
            raise FetchError("tls", f"{self.safe_url}: TLS failed ({_ssl_text(exc)})") from None
        except ConnectionRefusedError:
            self._drop()
            raise FetchError("refused", f"{self.safe_url}: connection refused") from None
        except _Eof as exc:
            self._drop()
            raise FetchError("connection", f"{self.safe_url}: connection closed by the server {exc}") from None
        except ConnectionResetError:
            self._drop()
            raise FetchError("connection", f"{self.safe_url}: connection reset by the server "
                                           f"({self._phase})") from None
        except OSError as exc:
            self._drop()
            what = "name lookup failed" if isinstance(exc, socket.gaierror) else "connection failed"
            raise FetchError("connection", f"{self.safe_url}: {what} ({_os_text(exc)})") from None
        ctype = self._ctype
        if "html" in ctype.lower() or body[:200].lstrip().lower().startswith((b"<!doctype", b"<html")):
            raise FetchError("parse", f"{self.safe_url}: got an HTML page, not metrics")
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise FetchError("parse", f"{self.safe_url}: page is not UTF-8 text (byte {exc.start})") from None
        self.last_bytes = len(body)
        return text

    def _exchange(self, request: bytes, deadline: float):  # -> bytes or bytearray
        reused = self._sock is not None
        if reused and not self._idle_ok():
            self._drop()
            reused = False
        if self._sock is None:
            self._connect(deadline)
        try:
            ans = self._ask(request, deadline)
        except (_Eof, ConnectionResetError, BrokenPipeError):
            if not reused or self._got:
                raise
            # the server closed the kept-alive connection as we reused it: once, on a fresh one
            self._drop()
            self._connect(deadline)
            ans = self._ask(request, deadline)
        if ans.status != 200:
            raise _status_error(ans.status, ans.headers)
        self._ctype = ans.headers.get("content-type", "")
        self._phase = "reading the body"
        if ans.body is not None:  # a plain body of known length: straight into its buffer
            self._read_exact(ans, deadline)
        while not ans.done:
            data = self._recv(deadline)
            if not data:
                if ans.length < 0 and not ans.chunked:  # framed by the close: this is its end
                    ans.done = True
                    break
                raise _Eof(ans.where())
            self._feed(ans, data)
        if ans.length >= 0 and self._got > ans.end:
            raise FetchError("protocol", "bytes after the end of the answer (a body longer than its Content-Length)")
        body = ans.body if ans.body is not None else ans.sink.finish()  # type: ignore[union-attr]
        if not ans.keep_alive():
            self._drop()  # the server closes (HTTP/1.0, Connection: close, a body framed by the close)
        else:
            extra = self._peek()
            if extra:
                raise FetchError("protocol", "bytes after the end of the answer (a body longer than its "
                                             "Content-Length)")
            if extra is None:  # the server closed after answering: fine, connect again next time
                self._drop()
        return body

    def _read_exact(self, ans: "_Answer", deadline: float) -> None:
        """The rest of a plain body of known length, received into its buffer (no copy, no parse:
        llhttp would only count the bytes); the cap was checked against the length."""
        sock = self._sock
        view = memoryview(ans.body)  # type: ignore[arg-type]
        n = ans.length
        while ans.raw < n:
            sock.settimeout(self._left(deadline))  # type: ignore[union-attr]
            got = sock.recv_into(view[ans.raw:], n - ans.raw)  # type: ignore[union-attr]
            if not got:
                raise _Eof(ans.where())
            self._got += got
            ans.raw += got
        ans.done = True

    def _ask(self, request: bytes, deadline: float) -> "_Answer":
        """Send the request; receive until the head of the answer is in (interim answers skipped).
        Body bytes that came with the head are already in the answer's sink."""
        self._got = 0
        self._phase = "sending the request"
        self._send(request, deadline)
        self._phase = "waiting for the status line and headers"
        ans = _Answer(self.max_bytes, 0)
        while not ans.head_done:
            data = self._recv(deadline)
            if not data:
                raise _Eof("in the middle of the headers" if self._got else "before answering")
            self._feed(ans, data)
            if not ans.head_done and len(ans.head) > MAX_HEADER_BYTES:
                raise FetchError("protocol", f"header block over {MAX_HEADER_BYTES // 1024} KiB")
        return ans

    def _recv(self, deadline: float) -> bytes:
        sock = self._sock
        sock.settimeout(self._left(deadline))  # type: ignore[union-attr]
        data = sock.recv(CHUNK)  # type: ignore[union-attr]
        self._got += len(data)
        return data

    def _feed(self, ans: "_Answer", data: bytes) -> None:
        """Hand what arrived to llhttp; an interim (1xx) answer's end starts a new parser on the
        bytes after it. Whatever llhttp or the checks of ``_Answer`` refuse is ``protocol``."""
        while True:
            if not ans.head_done:
                ans.head = ans.head + data if ans.head else data
                if not b"HTTP/".startswith(ans.head[:5]):
                    # another protocol on the port (an SSH banner, llhttp's RTSP/ and ICE/): say so now
                    raise FetchError("protocol", "the answer does not start with an HTTP/1.x status line")
            try:
                ans.parser.feed_data(data)
            except (httptools.HttpParserError, httptools.HttpParserUpgrade) as exc:
                error, ans.error = ans.error, None
                if error is _INTERIM:
                    # an interim answer's head ended at its first empty line (llhttp takes CRLF only)
                    end = ans.head.find(b"\r\n\r\n") + 4
                    if end > MAX_HEADER_BYTES:
                        raise FetchError("protocol", f"header block over {MAX_HEADER_BYTES // 1024} KiB") from None
                    data = ans.head[end:]
                    ans.restart(self._got - len(data))
                    if data:
                        continue
                    return
                if error is _STATUS:
                    ans.headed()
                    return
                if error is _BODY:  # llhttp stopped after the head; the body's first bytes follow it
                    head = ans.head
                    ans.take(head[ans.headed():])
                    return
                if error is not None:
                    raise error from None
                raise FetchError("protocol", f"unsound HTTP from the server ({_llhttp_text(exc)})") from None
            if ans.head_done:
                if ans.head:
                    ans.headed()
                if self._got - ans.raw > ans.start + MAX_HEADER_BYTES * 2 + 64 * ans.chunks:
                    # chunk-size lines, extensions and trailers are not body: capped, as they are not kept
                    raise FetchError("protocol", "chunk framing or trailers over their cap")
            return

    # -- connection ----------------------------------------------------------------------------
    def _left(self, deadline: float) -> float:
        left = deadline - self._monotonic()
        if left <= 0:
            raise TimeoutError
        return left

    def _resolve(self, deadline: float) -> List[tuple]:
        if self._static_addrs is not None:
            return self._static_addrs
        if self._addrs and self._monotonic() < self._addrs_until:
            return self._addrs
        self._phase = f"looking up {self.host}"
        if self._lookup is None:
            self._lookup = _Lookup(self.host, self.port)
        lookup = self._lookup
        if not lookup.done.wait(self._left(deadline)):
            raise TimeoutError
        self._lookup = None
        if lookup.error is not None:
            raise lookup.error
        self._addrs = lookup.result
        self._addrs_until = self._monotonic() + DNS_CACHE_SECONDS
        return self._addrs

    def _connect(self, deadline: float) -> None:
        addrs = self._resolve(deadline)
        self._phase = "connecting"
        error: Optional[OSError] = None
        sock = None
        for family, _, proto, _, addr in addrs:
            sock = socket.socket(family, socket.SOCK_STREAM, proto)
            try:
                sock.settimeout(self._left(deadline))
                sock.connect(addr)
                break
            except TimeoutError:
                sock.close()
                raise
            except OSError as exc:
                sock.close()
                sock, error = None, exc
        if sock is None:
            raise error or OSError("no address to connect to")
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self._ctx is not None:
                self._phase = "TLS handshake"
                sock = self._ctx.wrap_socket(sock, server_hostname=self.host, do_handshake_on_connect=False)
                sock.settimeout(self._left(deadline))
                sock.do_handshake()  # bounded as a whole by the timeout just set
        except BaseException:
            sock.close()
            raise
        self._sock = sock
        self.connections += 1

    def _idle_ok(self) -> bool:
        """A kept-alive connection is usable when nothing arrived on it while idle (neither the
        server's close nor stray bytes; TLS records without data, e.g. session tickets, are fine)."""
        return self._peek() is False

    def _peek(self) -> Optional[bool]:
        """Without blocking: None when the connection is closed or broken, True when bytes wait
        to be read, False when nothing does."""
        sock = self._sock
        try:
            if isinstance(sock, ssl.SSLSocket):
                if sock.pending():
                    return True
                if not _readable(sock):
                    return False
                sock.settimeout(0)
                try:
                    data = sock.recv(1)
                except ssl.SSLWantReadError:  # a record without data (a TLS 1.3 session ticket)
                    return False
                return True if data else None
            if not _readable(sock):
                return False
            data = sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except (BlockingIOError, ssl.SSLWantWriteError):
            return False
        except (OSError, ValueError):
            return None
        return True if data else None

    def _drop(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass

    def _send(self, data: bytes, deadline: float) -> None:
        self._sock.settimeout(self._left(deadline))  # sendall: the timeout bounds the whole send
        self._sock.sendall(data)

    def close(self) -> None:
        """Close the connection; a read in flight on another thread fails at once (connection)."""
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()


_INTERIM = object()  # the parser stopped at the end of an interim (1xx) answer
_STATUS = object()  # the parser stopped after the head of an answer other than 200
_BODY = object()  # the parser stopped after the head of a plain body of known length (read here)
_BAD_REASON = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")  # reason-phrase = *( HTAB / SP / VCHAR / obs-text )


class _Stop(Exception):
    """Raised inside an llhttp callback to stop parsing; what it stopped for is ``_Answer.error``."""


class _Answer:
    """One answer as llhttp reads it (httptools' callbacks), with the checks llhttp leaves to its
    user: the version (HTTP/1.x only), the reason phrase, the number of header lines, interim
    answers, transfer codings other than ``chunked``, the size cap before and while the body is
    read, the content coding. The body goes to a ``_Sink`` as it arrives."""

    __slots__ = ("parser", "max_bytes", "interim", "start", "head", "head_done", "done", "status",
                 "headers", "lines", "length", "chunked", "end", "raw", "chunks", "sink", "error", "keep", "body")

    def __init__(self, max_bytes: int, interim: int) -> None:
        self.max_bytes = max_bytes
        self.interim = interim
        self.restart(0)

    def restart(self, start: int) -> None:
        """A fresh parser for an answer beginning at byte ``start`` of what was received."""
        self.parser = httptools.HttpResponseParser(self)
        self.start = start
        self.head = b""  # the bytes of this answer received while its head was incomplete
        self.head_done = self.done = False
        self.status = 0
        self.headers: dict = {}
        self.lines = 0
        self.length = -1  # Content-Length, -1 if none
        self.chunked = False
        self.end = -1
        self.raw = self.chunks = 0
        self.sink: Optional[_Sink] = None
        self.error: Optional[object] = None
        self.keep = False  # llhttp's keep-alive verdict at the end of the answer
        self.body: Optional[bytearray] = None  # a plain body of known length, received into it

    def fail(self, error: FetchError) -> _Stop:
        """Keep ``error`` for the fetcher and stop llhttp (it raises its own error past a callback)."""
        self.error = error
        return _Stop()

    def keep_alive(self) -> bool:
        """Whether the connection serves the next read: an HTTP/1.1 answer framed by its length or
        by chunks, without ``Connection: close`` (HTTP/1.0 is not kept alive, as with h11)."""
        return self.keep and (self.length >= 0 or self.chunked)

    def where(self) -> str:
        if self.length >= 0:
            return f"after {self.raw} of the {self.length} bytes it announced"
        return "in the middle of the body"

    def headed(self) -> int:
        """The final head is in: its size (returned), and where a Content-Length body ends."""
        size = self.head.find(b"\r\n\r\n") + 4
        self.head = b""
        if size > MAX_HEADER_BYTES:
            raise FetchError("protocol", f"header block over {MAX_HEADER_BYTES // 1024} KiB")
        if self.length >= 0:
            self.end = self.start + size + self.length
        return size

    def take(self, data: bytes) -> None:
        """The bytes of a plain body of known length that came with its head."""
        if len(data) > self.length:
            raise FetchError("protocol", "bytes after the end of the answer (a body longer than its Content-Length)")
        self.body = bytearray(self.length)
        self.body[:len(data)] = data
        self.raw = len(data)
        self.done = self.raw == self.length

    # -- httptools' callbacks ------------------------------------------------------------------
    def on_message_begin(self) -> None:
        if self.done:  # a second answer where one was asked for
            raise self.fail(FetchError("protocol", "bytes after the end of the answer"))

    def on_status(self, reason: bytes) -> None:
        if _BAD_REASON.search(reason):  # llhttp lets NUL and DEL through in the reason phrase
            raise self.fail(FetchError("protocol", "unsound HTTP from the server (a control character in the status line)"))

    def on_header(self, name: bytes, value: bytes) -> None:
        if self.head_done:  # a trailer after a chunked body: read past (its bytes are capped)
            return
        self.lines += 1
        if self.lines > MAX_HEADER_LINES:
            raise self.fail(FetchError("protocol", f"more than {MAX_HEADER_LINES} header lines"))
        key, val = name.decode("latin-1").lower(), value.decode("latin-1").strip(" \t")
        hd = self.headers
        hd[key] = f"{hd[key]}, {val}" if key in hd else val

    def on_headers_complete(self) -> None:
        p = self.parser
        status = p.get_status_code()
        if status < 200:
            if status == 101:
                raise self.fail(FetchError("protocol", "the server switched protocols (HTTP 101)"))
            self.interim += 1
            if self.interim > MAX_INTERIM:
                raise self.fail(FetchError("protocol", f"more than {MAX_INTERIM} interim (1xx) answers"))
            return  # an interim answer (100 Continue, 103 Early Hints): the real one follows
        if p.get_http_version() not in ("1.1", "1.0"):
            raise self.fail(FetchError("protocol", "the answer does not start with an HTTP/1.x status line"))
        self.head_done = True
        self.status = status
        if status != 200:
            self.error = _STATUS  # the status is the answer; its body is not read
            raise _Stop()
        hd = self.headers
        te = hd.get("transfer-encoding")
        if te is not None and "content-length" in hd:  # (llhttp says so only after this callback)
            raise self.fail(FetchError("protocol", "both Transfer-Encoding and Content-Length"))
        if te is not None:
            if te.lower() != "chunked":
                raise self.fail(FetchError("protocol", "a Transfer-Encoding other than chunked"))
            self.chunked = True
        cl = hd.get("content-length")
        if cl is not None:  # (llhttp has refused anything but one number in ASCII digits, and it with chunked)
            self.length = int(cl)
            if self.length > self.max_bytes:
                raise self.fail(FetchError("too_large", f"page of {self.length} bytes is over the {self.max_bytes}-byte cap"))
        ce = hd.get("content-encoding", "identity").strip().lower()
        if ce not in ("identity", "", "gzip", "x-gzip"):
            raise self.fail(FetchError("protocol", f"Content-Encoding {ce[:40]!r} was not asked for"))
        gz = ce in ("gzip", "x-gzip")
        if self.length >= 0 and not gz:
            # a plain body of known length (vLLM's page): the fetcher receives it into one buffer
            # and llhttp stops here, as it would only count and copy the bytes
            self.keep = p.should_keep_alive() and p.get_http_version() == "1.1"
            self.error = _BODY
            raise _Stop()
        self.sink = _Sink(self.max_bytes, gz)

    def on_chunk_header(self) -> None:
        self.chunks += 1

    def on_body(self, data: bytes) -> None:
        self.raw += len(data)
        try:
            if self.raw > self.max_bytes:
                raise FetchError("too_large", f"page over the {self.max_bytes}-byte cap")
            self.sink.feed(data)  # type: ignore[union-attr]
        except FetchError as exc:
            self.error = exc
            raise _Stop() from None

    def on_message_complete(self) -> None:
        if not self.head_done:
            self.error = _INTERIM
            raise _Stop()
        self.done = True
        p = self.parser
        self.keep = p.should_keep_alive() and p.get_http_version() == "1.1"


class _Sink:
    """Collects the body, decompressing gzip when the answer says so; the cap applies to what
    comes out, while it comes out."""

    __slots__ = ("cap", "size", "parts", "z")

    def __init__(self, cap: int, gz: bool) -> None:
        self.cap = cap
        self.size = 0
        self.parts: list = []
        self.z = zlib.decompressobj(16 + zlib.MAX_WBITS) if gz else None

    def feed(self, data) -> None:
        z = self.z
        if z is None:
            self.size += len(data)
            if self.size > self.cap:
                raise FetchError("too_large", f"page over the {self.cap}-byte cap")
            self.parts.append(data)
            return
        try:
            while data:
                if z.eof:
                    raise FetchError("protocol", "bytes after the end of the gzip stream")
                out = z.decompress(data, self.cap - self.size + 1)
                self.size += len(out)
                if self.size > self.cap:
                    raise FetchError("too_large", f"page over the {self.cap}-byte cap after decompression")
                self.parts.append(out)
                data = z.unconsumed_tail
        except zlib.error:
            raise FetchError("protocol", "body is not valid gzip") from None

    def finish(self) -> bytes:
        if self.z is not None:
            if not self.z.eof:
                raise FetchError("protocol", "gzip stream cut short")
            if self.z.unused_data:
                raise FetchError("protocol", "bytes after the end of the gzip stream")
        if len(self.parts) == 1:
            return bytes(self.parts[0]) if isinstance(self.parts[0], bytearray) else self.parts[0]
        return b"".join(self.parts)


def _readable(sock) -> bool:
    """Whether reading would not block (``poll``: no limit on the descriptor's number)."""
    p = select.poll()
    p.register(sock, select.POLLIN | select.POLLPRI)
    return bool(p.poll(0))


def _status_error(status: int, headers: dict) -> FetchError:
    if status >= 500:
        return FetchError("http_5xx", f"HTTP {status}")
    if status in (401, 403):
        return FetchError("unauthorized", f"HTTP {status}, check the bearer token")
    if status >= 400:
        return FetchError("http_4xx", f"HTTP {status}")
    if 300 <= status < 400:
        where = redact_url(headers.get("location", "")[:200]) if headers.get("location") else "nowhere"
        return FetchError("http_other", f"HTTP {status} redirect to {where}; redirects are not followed, "
                                        "point the URL at the page itself")
    return FetchError("http_other", f"HTTP {status}")


def _llhttp_text(exc: Exception) -> str:
    """What llhttp said (its reasons are fixed texts, never the server's bytes)."""
    text = str(exc).strip()
    return text.splitlines()[0][:80] if text else type(exc).__name__


def _ssl_text(exc: ssl.SSLError) -> str:
    text = getattr(exc, "verify_message", "") or getattr(exc, "reason", "") or type(exc).__name__
    return str(text)[:160]


def _os_text(exc: OSError) -> str:
    text = exc.strerror or str(exc) or type(exc).__name__
    return text.splitlines()[0][:160] if text else type(exc).__name__
