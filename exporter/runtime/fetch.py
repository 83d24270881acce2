"""Fetching a metrics page over HTTP: vLLM's ``/metrics``, and dcgm-exporter's for the dcgm source.

A small HTTP/1.1 client on one socket (framed by h11), written for a peer that may be broken or
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
- **Framing by h11.** The request is written and the answer read by h11 (sans-IO: this module
  owns the socket, the deadline and the caps, h11 the HTTP/1.1 framing: status line, header
  syntax, ``Content-Length``, ``chunked``, read-to-close, keep-alive). Whatever h11 refuses (a
  malformed status line or header, a ``Content-Length`` that is not one number in ASCII digits,
  a bad chunk, a transfer coding other than ``chunked``) is ``protocol``, and so are a version
  other than HTTP/1.x, both framings at once, bytes after the answer (a body longer than its
  ``Content-Length``), a truncated or corrupt gzip stream and an unknown encoding; an answer
  that does not begin with ``HTTP/`` (another protocol's banner) fails at once rather than at
  the deadline. A body shorter than its ``Content-Length`` (the server closed) is
  ``connection``. Redirects are not followed (``http_other``, the redacted ``Location`` in the
  message): a sidecar reads one known address, and a redirect is usually a login page.
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
import select
import socket
import ssl
import stat
import threading
import time
import zlib
from typing import Callable, List, Optional, Tuple
from urllib.parse import unquote, urlsplit

import h11

from .. import __version__
from .config import TOKEN_MAX_BYTES, parse_token, redact_url
from .logs import add_secret

CHUNK = 64 * 1024
MAX_HEADER_BYTES = 64 * 1024
MAX_HEADER_LINES = 100
MAX_INTERIM = 8
DNS_CACHE_SECONDS = 30.0

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
        self._target = target.encode("ascii")
        self._headers = [(b"Host", host_header.encode("ascii")),
                         (b"User-Agent", f"vllm-sidecar-exporter/{__version__}".encode("ascii")),
                         # vLLM serves text either way; asking for text keeps other servers honest too
                         (b"Accept", b"text/plain;version=0.0.4;q=1,*/*;q=0.1"),
                         (b"Accept-Encoding", b"gzip")]
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
        self._h: Optional[h11.Connection] = None  # the HTTP/1.1 state of the open connection
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
            headers = self._headers + [(b"Authorization", auth)] if auth else self._headers
            body = self._exchange(h11.Request(method=b"GET", target=self._target, headers=headers), deadline)
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

    def _exchange(self, request: h11.Request, deadline: float) -> bytes:
        reused = self._sock is not None
        if reused and not self._idle_ok():
            self._drop()
            reused = False
        if self._sock is None:
            self._connect(deadline)
        try:
            status, headers = self._ask(request, deadline)
        except (_Eof, ConnectionResetError, BrokenPipeError):
            if not reused or self._got:
                raise
            # the server closed the kept-alive connection as we reused it: once, on a fresh one
            self._drop()
            self._connect(deadline)
            status, headers = self._ask(request, deadline)
        if status != 200:
            raise _status_error(status, headers)
        self._ctype = headers.get("content-type", "")
        body = self._read_body(headers, deadline)
        h = self._h
        assert h is not None
        if h.our_state is not h11.DONE or h.their_state is not h11.DONE:  # the server closes (or h11 will)
            self._drop()
        else:
            extra = self._pending()
            if h.trailing_data[0] or extra:
                raise FetchError("protocol", "bytes after the end of the answer (a body longer than its "
                                             "Content-Length)")
            if extra is None:  # the server closed after answering: fine, connect again next time
                self._drop()
        return body

    def _ask(self, request: h11.Request, deadline: float) -> Tuple[int, dict]:
        """Send the request; the status and headers of the answer (interim ones skipped)."""
        h = self._h
        assert h is not None
        if h.our_state is h11.DONE:
            h.start_next_cycle()
        self._got = 0
        self._phase = "sending the request"
        self._send(h.send(request) + h.send(h11.EndOfMessage()), deadline)  # type: ignore[operator]
        self._phase = "waiting for the status line and headers"
        for _ in range(MAX_INTERIM + 1):
            ev = self._event(deadline, lambda: "in the middle of the headers" if self._got else "before answering")
            if type(ev) is h11.InformationalResponse:
                if ev.status_code == 101:
                    raise FetchError("protocol", "the server switched protocols (HTTP 101)")
                continue  # an interim answer (100 Continue, 103 Early Hints): the real one follows
            assert type(ev) is h11.Response
            if self._got > MAX_HEADER_BYTES and self._got - len(h.trailing_data[0]) > MAX_HEADER_BYTES:
                raise FetchError("protocol", f"header block over {MAX_HEADER_BYTES // 1024} KiB")
            if ev.http_version not in (b"1.1", b"1.0"):
                raise FetchError("protocol", "the answer does not start with an HTTP/1.x status line")
            if len(ev.headers) > MAX_HEADER_LINES:
                raise FetchError("protocol", f"more than {MAX_HEADER_LINES} header lines")
            headers: dict = {}
            for name, value in ev.headers:
                key, val = name.decode("latin-1"), value.decode("latin-1")
                headers[key] = f"{headers[key]}, {val}" if key in headers else val
            return ev.status_code, headers
        raise FetchError("protocol", f"more than {MAX_INTERIM} interim (1xx) answers")

    def _event(self, deadline: float, where: Callable[[], str]):
        """The next thing h11 reads from the answer, receiving (bounded by the time left) until it
        has one. A close in the middle is ``_Eof(where)``; whatever h11 refuses is ``protocol``."""
        h = self._h
        assert h is not None
        while True:
            try:
                ev = h.next_event()
            except h11.RemoteProtocolError as exc:
                raise FetchError("protocol", f"unsound HTTP from the server ({_h11_text(exc)})") from None
            if ev is not h11.NEED_DATA:
                if type(ev) is h11.ConnectionClosed:
                    raise _Eof(where())
                return ev
            sock = self._sock
            sock.settimeout(self._left(deadline))  # type: ignore[union-attr]
            data = sock.recv(CHUNK)  # type: ignore[union-attr]
            if not self._got and data and not b"HTTP/".startswith(data[:5]):
                # another protocol on the port (an SSH banner): say so now, not at the deadline
                raise FetchError("protocol", "the answer does not start with an HTTP/1.x status line")
            self._got += len(data)
            if not data:
                h.receive_data(b"")
                try:
                    ev = h.next_event()  # the end of a read-to-close body, or a cut
                except h11.RemoteProtocolError:
                    raise _Eof(where()) from None
                if type(ev) is h11.EndOfMessage:
                    return ev
                raise _Eof(where())
            h.receive_data(data)

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
        self._h = h11.Connection(h11.CLIENT, max_incomplete_event_size=MAX_HEADER_BYTES)
        self.connections += 1

    def _idle_ok(self) -> bool:
        """A kept-alive connection is usable when nothing arrived on it while idle (neither the
        server's close nor stray bytes; TLS records without data, e.g. session tickets, are fine)."""
        if self._h is None or self._h.trailing_data[0]:
            return False
        state = self._peek()
        return state is False

    def _pending(self) -> Optional[bool]:
        """After an answer: None when the server closed, True when more bytes wait, else False."""
        return self._peek()

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
        self._h = None
        if sock is not None:
            try:
                sock.close()
            except OSError:
                pass

    def _send(self, data: bytes, deadline: float) -> None:
        self._sock.settimeout(self._left(deadline))  # sendall: the timeout bounds the whole send
        self._sock.sendall(data)

    # -- the body ------------------------------------------------------------------------------
    def _read_body(self, headers: dict, deadline: float) -> bytes:
        """The body as h11 frames it (Content-Length, chunked, or to the close), capped raw and
        after decompression while it is read."""
        te = headers.get("transfer-encoding")
        cl = headers.get("content-length")
        ce = headers.get("content-encoding", "identity").strip().lower()
        if ce not in ("identity", "", "gzip", "x-gzip"):
            raise FetchError("protocol", f"Content-Encoding {ce[:40]!r} was not asked for")
        if te is not None and cl is not None:
            raise FetchError("protocol", "both Transfer-Encoding and Content-Length")
        n = int(cl) if cl is not None else -1  # (h11 has checked it is one number in ASCII digits)
        if n > self.max_bytes:
            raise FetchError("too_large", f"page of {n} bytes is over the {self.max_bytes}-byte cap")
        sink = _Sink(self.max_bytes, ce in ("gzip", "x-gzip"))
        self._phase = "reading the body"
        raw = 0

        def where() -> str:
            return f"after {raw} of the {n} bytes it announced" if n >= 0 else "in the middle of the body"

        while True:
            ev = self._event(deadline, where)
            if type(ev) is h11.Data:
                raw += len(ev.data)
                if raw > self.max_bytes:
                    raise FetchError("too_large", f"page over the {self.max_bytes}-byte cap")
                sink.feed(ev.data)
            elif type(ev) is h11.EndOfMessage:
                return sink.finish()

    def close(self) -> None:
        """Close the connection; a read in flight on another thread fails at once (connection)."""
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()


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


def _h11_text(exc: h11.RemoteProtocolError) -> str:
    """What h11 said, without the bytes the server sent (h11 quotes an offending line)."""
    text = str(exc)
    for mark in (": bytearray(", ": b'", ': b"', ": '"):
        i = text.find(mark)
        if i >= 0:
            text = text[:i]
    return text.splitlines()[0][:80] if text.strip() else type(exc).__name__


def _ssl_text(exc: ssl.SSLError) -> str:
    text = getattr(exc, "verify_message", "") or getattr(exc, "reason", "") or type(exc).__name__
    return str(text)[:160]


def _os_text(exc: OSError) -> str:
    text = exc.strerror or str(exc) or type(exc).__name__
    return text.splitlines()[0][:160] if text else type(exc).__name__
