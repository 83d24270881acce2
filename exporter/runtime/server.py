"""Serving ``/metrics``, ``/healthz`` and ``/readyz``: a small HTTP/1.1 server on one event loop.

``/healthz`` answers 200 while the process lives and its poll loop is not wedged; ``/readyz``
answers 200 once the configuration is loaded and the server is serving. Neither looks at vLLM:
a sidecar's probe must never take its vLLM pod out of service; vLLM's state is what
``vllm_sidecar_target_up{target="vllm"}`` says. Both are answered without authentication, on
purpose: a kubelet probe carries no credentials, and they say nothing but "ok".

Why not ``http.server``: its ThreadingHTTPServer takes a thread per connection, has a listen
backlog of 5 and no timeouts, so 500 slow or idle connections hold 500 threads, and a storm of
scrapers queues Prometheus' own scrape behind them (docs/performance.md has the numbers).

The design, chosen for being simple and hard to starve:

- One thread runs an asyncio event loop that owns every socket: it accepts (backlog 1024), does
  the TLS handshake, reads request heads and writes responses. A connection costs a file
  descriptor and a few KiB, never a thread, so idle and slow connections cannot use up workers.
- A request is looked at only once its whole head (request line and headers) has arrived. A new
  connection has ``header_timeout`` seconds for its TLS handshake and its first request head; an
  idle keep-alive connection is closed after ``idle_timeout`` seconds, and once the next request
  starts arriving the header timeout applies again. A head over 16 KiB gets 431; a request body
  gets 413 (nothing here takes one). A response the client does not read within the idle timeout
  is dropped with its connection.
- At most ``max_connections`` are open. When full, a new connection pushes out the oldest one
  still waiting for a complete request head (a slow or stalled client), else the oldest idle
  keep-alive one; one in the middle of a request is never pushed out, so a slowloris crowd cannot
  keep Prometheus out, nor hold more than the cap.
- ``/healthz`` and ``/readyz`` are answered right on the loop. ``/metrics`` (and ``/``) go
  through the web configuration (``webconfig``: rate limit, basic auth) first.
- A ``/metrics`` body is encoded once per published state and format, on a pool of two worker
  threads, and gzip-compressed once in the same step; every scrape of that state gets the same
  bytes. The poll loop swaps an immutable ``Published``, so the object itself is the generation;
  a body is also re-encoded when it is a second old, so the ``process_*`` series stay fresh
  between slow polls. While a new body is being encoded, scrapes get the previous one if it is
  under five seconds old (so a storm never queues behind an encoding); otherwise they wait for
  it, and at most ``max_requests`` may wait (node_exporter's ``--web.max-requests``): beyond
  that 503 with ``Retry-After``. So the limit bites exactly when bodies cannot be built fast
  enough, and answering from a ready body is never refused.
- Nothing waits when nothing has to: a request whose body is ready (and whose password's
  verdict is cached) is answered in the same loop step that read it; only a wait for bcrypt or
  for an encoding becomes a task.
- bcrypt runs on its own thread, one check at a time (as exporter-toolkit), and its verdicts are
  cached by a digest of user, hash and password, so a correct scrape costs one bcrypt check per
  password, and a crowd of wrong guesses (at most 32 waiting, then 503) never delays the encoder.
- TLS: the loop accepts each connection itself and hands it to ``connect_accepted_socket`` with
  the SSL context of the web configuration in force at that moment, so certificates rotated in a
  Kubernetes Secret are picked up by the next connection without a restart.

Threads: the loop, two workers and the bcrypt thread, whatever the load.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import ipaddress
import logging
import socket
import ssl
import sys
import threading
import time
from base64 import b64decode
from collections import OrderedDict
from email.utils import formatdate
from http import HTTPStatus
from queue import SimpleQueue
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Tuple, Union
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.process_collector import ProcessCollector

from .collectors import SidecarCollector, build_families
from .state import Published
from .webconfig import TLSSettings, WebConfigWatcher, sans_allowed

log = logging.getLogger("vllm_sidecar.http")

BACKLOG = 1024
MAX_HEAD = 16 * 1024
WORKERS = 2
AUTH_WAITING = 32  # bcrypt checks allowed to wait; beyond, 503
AUTH_CACHE = 1024
BODY_MAX_AGE = 1.0  # seconds a body is reused while the published state does not change
STALE_MAX = 5.0  # seconds a body may still be served while its successor is being encoded
TEXT = "text/plain; charset=utf-8"
LANDING = b"vllm-sidecar-exporter: /metrics /healthz /readyz\n"
REJECT_REASONS = ("max_requests", "unauthorized", "auth_busy", "rate_limit", "bad_request")
CLOSE_REASONS = ("header_timeout", "idle_timeout", "evicted", "tls")
# exporter-toolkit's: a bcrypt hash of "fakepassword", checked for unknown users so that timing
# does not tell which user names exist
_FAKE_HASH = b"$2y$10$QOauhQNbBCuQDKes6eFzPeMqBSjb7Mr5DUmpZ/VcEd00UAV/LDeSi"


def make_registry(state: Callable[[], Published]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SidecarCollector(state))
    ProcessCollector(namespace="vllm_sidecar", registry=registry)
    return registry


# -- HTTP pieces ---------------------------------------------------------------------------------

class BadRequest(Exception):
    def __init__(self, code: int, msg: str) -> None:
        super().__init__(msg)
        self.code = code


class Request:
    __slots__ = ("method", "target", "path", "version", "headers", "keep_alive", "has_body")

    def __init__(self, method: str, target: str, path: str, version: str, headers: Dict[str, str]) -> None:
        self.method, self.target, self.path, self.version, self.headers = method, target, path, version, headers
        tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
        self.keep_alive = ("keep-alive" in tokens) if version == "HTTP/1.0" else ("close" not in tokens)
        cl = headers.get("content-length")
        if cl is not None and not cl.strip().isdigit():
            raise BadRequest(400, "bad Content-Length")
        self.has_body = "transfer-encoding" in headers or (cl is not None and int(cl) > 0)


def parse_head(head: bytes) -> Request:
    """A request line and its headers (no blank line) -> Request; ``BadRequest`` if malformed."""
    lines = head.decode("latin-1").split("\n")
    parts = lines[0].rstrip("\r").split(" ")
    if len(parts) != 3 or not parts[0].isalpha():
        raise BadRequest(400, "bad request line")
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise BadRequest(505 if version.startswith("HTTP/") else 400, "HTTP/1.1 only")
    headers: Dict[str, str] = {}
    for line in lines[1:]:
        line = line.rstrip("\r")
        if not line:
            continue
        if line[0] in " \t":
            raise BadRequest(400, "folded header lines are not accepted")
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise BadRequest(400, "bad header line")
        name, value = name.lower(), value.strip(" \t")
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    if target.startswith("/"):
        path = target.split("?", 1)[0]
    elif target.startswith(("http://", "https://")):
        path = urlsplit(target).path or "/"
    else:
        raise BadRequest(400, "bad request target")
    return Request(method, target, path, version, headers)


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


def basic_credentials(header: str) -> Optional[Tuple[str, bytes]]:
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        raw = b64decode(value.strip(), validate=True)
    except ValueError:
        return None
    user, sep, password = raw.partition(b":")
    if not sep:
        return None
    try:
        return user.decode("utf-8"), password
    except UnicodeDecodeError:
        return None


_date_cache: Tuple[int, str] = (0, "")


def _http_date() -> str:
    global _date_cache
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache = (now, formatdate(now, usegmt=True))
    return _date_cache[1]


# -- threads the loop hands work to --------------------------------------------------------------

class _Pool:
    """A fixed number of daemon threads running blocking calls; results come back as futures of
    the loop. Daemon threads, so a collector stuck forever cannot keep the process from exiting."""

    def __init__(self, name: str, size: int) -> None:
        self._q: SimpleQueue = SimpleQueue()
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{i}" if size > 1 else name,
                                          daemon=True) for i in range(size)]
        for t in self._threads:
            t.start()

    def _work(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            loop, fut, fn, args = item
            try:
                result, ok = fn(*args), True
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting request
                result, ok = exc, False
            try:
                loop.call_soon_threadsafe(_settle, fut, ok, result)
            except RuntimeError:  # the loop is closed: the server is stopping
                pass

    def submit(self, loop: asyncio.AbstractEventLoop, fn: Callable, *args) -> asyncio.Future:
        fut = loop.create_future()
        self._q.put((loop, fut, fn, args))
        return fut

    def close(self, timeout: float = 2.0) -> None:
        for _ in self._threads:
            self._q.put(None)
        for t in self._threads:
            t.join(timeout)


def _settle(fut: asyncio.Future, ok: bool, result) -> None:
    if fut.cancelled():
        return
    if ok:
        fut.set_result(result)
    else:
        fut.set_exception(result)


def _checkpw(password: bytes, hashed: bytes) -> bool:
    import bcrypt

    try:
        return bcrypt.checkpw(password, hashed)
    except ValueError:  # a password over bcrypt's 72 bytes, or a hash bcrypt refuses
        return False


class _BasicAuth:
    """bcrypt checks on one thread, verdicts cached by a digest of (user, hash, password); a check
    already running for the same digest is shared."""

    def __init__(self, pool: _Pool) -> None:
        self._pool = pool
        self._cache: "OrderedDict[bytes, Union[bool, asyncio.Future]]" = OrderedDict()
        self.waiting = 0

    def _key(self, header: str, users: Mapping[str, bytes]) -> Optional[Tuple[bytes, bytes, bytes, bool]]:
        cred = basic_credentials(header) if header else None
        if cred is None:
            return None
        user, password = cred
        hashed = users.get(user)
        known = hashed is not None
        hashed = hashed if known else _FAKE_HASH
        return hashlib.sha256(b"\0".join((user.encode(), hashed, password))).digest(), password, hashed, known

    def cached(self, header: str, users: Mapping[str, bytes]) -> Optional[bool]:
        """The verdict when it needs no bcrypt check (no or unreadable credentials, or cached)."""
        k = self._key(header, users)
        if k is None:
            return False
        hit = self._cache.get(k[0])
        if isinstance(hit, bool):
            self._cache.move_to_end(k[0])
            return hit and k[3]
        return None

    async def check(self, loop: asyncio.AbstractEventLoop, header: str,
                    users: Mapping[str, bytes]) -> Optional[bool]:
        """True, False, or None when too many checks are waiting."""
        k = self._key(header, users)
        if k is None:
            return False
        key, password, hashed, known = k
        hit = self._cache.get(key)
        if isinstance(hit, bool):
            self._cache.move_to_end(key)
            return hit and known
        if hit is None:
            if self.waiting >= AUTH_WAITING:
                return None
            hit = self._pool.submit(loop, _checkpw, password, hashed)
            self._cache[key] = hit
        self.waiting += 1
        try:
            ok = bool(await asyncio.shield(hit))
        except Exception:  # noqa: BLE001
            ok = False
        finally:
            self.waiting -= 1
        self._cache[key] = ok
        while len(self._cache) > AUTH_CACHE:
            self._cache.popitem(last=False)
        return ok and known


class _Bucket:
    """exporter-toolkit's rate_limit: a token bucket of ``burst`` tokens, one every ``interval``."""

    def __init__(self) -> None:
        self.tokens: Optional[float] = None
        self.last = 0.0

    def take(self, interval: float, burst: int, now: float) -> bool:
        if self.tokens is None:
            self.tokens = float(burst)
        self.tokens = min(float(burst), self.tokens + (now - self.last) / interval)
        self.last = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


class _Entry:
    """One encoding of one published state in one format: (plain, gzipped) once done."""

    __slots__ = ("pub", "t", "fut")

    def __init__(self, pub: Published, t: float, fut: asyncio.Future) -> None:
        self.pub, self.t, self.fut = pub, t, fut


class _Slot:
    """The bodies of one format: the latest done encoding and the one under way."""

    __slots__ = ("ready", "pending")

    def __init__(self) -> None:
        self.ready: Optional[_Entry] = None
        self.pending: Optional[_Entry] = None


class _Families:
    """What one /metrics body shows: the published state, the process, the listener."""

    def __init__(self, pub: Published, *others) -> None:
        self.pub, self.others = pub, others

    def collect(self) -> Iterable[Metric]:
        yield from build_families(self.pub)
        for o in self.others:
            yield from o.collect()


class _ListenerCollector:
    def __init__(self, srv: "SidecarServer") -> None:
        self.srv = srv

    def collect(self) -> Iterable[Metric]:
        srv = self.srv
        yield GaugeMetricFamily("vllm_sidecar_http_connections_open", "Connections open on the listener.",
                                value=len(srv._conns))
        rej = CounterMetricFamily("vllm_sidecar_http_requests_rejected", "Requests the listener refused, by "
                                  "reason: max_requests (503), unauthorized (401), auth_busy (503), "
                                  "rate_limit (429), bad_request (4xx).", labels=["reason"])
        for r in REJECT_REASONS:
            rej.add_metric([r], srv.rejected[r])
        yield rej
        closed = CounterMetricFamily("vllm_sidecar_http_connections_closed", "Connections the listener "
                                     "closed itself, by reason: header_timeout, idle_timeout, evicted "
                                     "(pushed out when full), tls (handshake failed or client certificate "
                                     "refused).", labels=["reason"])
        for r in CLOSE_REASONS:
            closed.add_metric([r], srv.closed[r])
        yield closed
        if srv.web.enabled:
            yield GaugeMetricFamily("vllm_sidecar_web_config_last_reload_successful", "1 when the last "
                                    "read of --web.config.file succeeded, 0 when the previous one stays "
                                    "in force.", value=1 if srv.web.last_reload_ok else 0)


# -- one connection ------------------------------------------------------------------------------

NEW, IDLE, READING, BUSY, CLOSING, CLOSED = range(6)


class _Conn(asyncio.Protocol):
    """One client connection: reads heads, hands complete requests to the server, writes answers.

    States: NEW (connected, handshake and first head pending), IDLE (keep-alive, between requests),
    READING (the next head is arriving), BUSY (a request is being served), CLOSING, CLOSED."""

    def __init__(self, srv: "SidecarServer") -> None:
        self.srv = srv
        self.loop = srv._loop
        self.transport: Optional[asyncio.BaseTransport] = None
        self.buf = bytearray()
        self.state = NEW
        self.timer: Optional[asyncio.TimerHandle] = None
        self.keep = True
        self.http10 = False
        self.eof = False
        self.write_paused = False
        self.read_paused = False
        self.handshaking = False  # TLS accepted, handshake under way (no transport yet)
        self.tls: Optional[TLSSettings] = None
        self.raw: Optional[socket.socket] = None
        self.hs_task: Optional[asyncio.Task] = None

    # -- lifecycle ------------------------------------------------------------------------------
    def connection_made(self, transport) -> None:  # type: ignore[override]
        if self.handshaking:  # TLS: the handshake is done (the connection was counted at accept)
            self.transport = transport
            self.handshaking = False
            if self.state == CLOSED:
                transport.abort()
                return
            tls = self.tls
            if tls is not None and tls.allowed_sans and not sans_allowed(transport.get_extra_info("peercert"),
                                                                          tls.allowed_sans):
                log.debug("client certificate has none of client_allowed_sans")
                self.srv.closed["tls"] += 1
                self._abort()
            return
        self.transport = transport
        self.srv._opened(self)
        if self.state != CLOSED:
            self._arm(self.srv.header_timeout, "header_timeout")

    def accepted_tls(self, sock: socket.socket) -> None:
        """A TLS connection just accepted (plain TCP still): counted, timed, then handshaken with
        the context of the web configuration in force now."""
        self.handshaking = True
        self.raw = sock
        self.srv._opened(self)
        if self.state == CLOSED:
            return
        self._arm(self.srv.header_timeout, "header_timeout")
        self.hs_task = self.srv._spawn(self._handshake(sock))

    async def _handshake(self, sock: socket.socket) -> None:
        self.tls = tls = self.srv.web.current().tls
        assert tls is not None
        kw = {"ssl_shutdown_timeout": 5.0} if sys.version_info >= (3, 11) else {}
        self.raw = None  # from here on the loop's transport owns the socket
        try:
            await self.loop.connect_accepted_socket(lambda: self, sock, ssl=tls.context,
                                                    ssl_handshake_timeout=self.srv.header_timeout, **kw)
        except (OSError, asyncio.TimeoutError, ssl.SSLError, ConnectionError) as exc:
            if self.state != CLOSED:
                log.debug("TLS handshake failed: %s", exc)
                self.srv.closed["tls"] += 1
                self.state = CLOSED
                self._disarm()
                self.srv._gone(self)

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.state = CLOSED
        self._disarm()
        self.srv._gone(self)
        tr = self.transport
        if tr is not None and not tr.is_closing():
            try:  # (Python 3.10's TLS transport warns at exit when the peer closed it first)
                tr.close()
            except Exception:  # noqa: BLE001
                pass

    def eof_received(self) -> Optional[bool]:
        self.eof = True
        if self.state == BUSY and not self.srv.tls:
            return True  # a half-closed client still gets its answer
        return False

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.state in (IDLE, READING) and self.buf:
            self._next()

    # -- timers ---------------------------------------------------------------------------------
    def _arm(self, delay: float, reason: str) -> None:
        self._disarm()
        self.timer = self.loop.call_later(delay, self._expire, reason)

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _expire(self, reason: str) -> None:
        self.timer = None
        if self.state in (BUSY, CLOSED):
            return
        self.srv.closed[reason] += 1
        self._abort()

    def _abort(self) -> None:
        if self.state == CLOSED:
            return
        self.state = CLOSED
        self._disarm()
        if self.transport is not None:
            self.transport.abort()
        else:  # a TLS handshake not done yet
            if self.raw is not None:
                self.raw.close()
            if self.hs_task is not None and self.hs_task is not asyncio.current_task(self.loop):
                self.hs_task.cancel()  # asyncio closes the transport it had made
        self.srv._gone(self)

    def evict(self) -> None:
        self.srv.closed["evicted"] += 1
        self._abort()

    # -- reading ------------------------------------------------------------------------------
    def data_received(self, data: bytes) -> None:
        if self.state in (CLOSING, CLOSED):
            return
        self.buf += data
        if self.state == BUSY:
            if len(self.buf) > MAX_HEAD and not self.read_paused:
                self.read_paused = True
                self.transport.pause_reading()  # type: ignore[union-attr]
            return
        if self.state == IDLE:
            self.state = READING
            self._arm(self.srv.header_timeout, "header_timeout")
        self._next()

    def _next(self) -> None:
        if self.state not in (NEW, IDLE, READING) or self.write_paused:
            return
        buf = self.buf
        skip = 0
        while skip < len(buf) and buf[skip] in (10, 13):  # empty lines before a request line
            skip += 1
        if skip:
            del buf[:skip]
        if not buf:
            if self.eof:
                self._abort()
            return
        if self.state == NEW and not self.srv.tls and buf[0] == 0x16:  # a TLS handshake on plain HTTP
            self.srv.rejected["bad_request"] += 1
            self._abort()
            return
        end, sep = buf.find(b"\r\n\r\n"), 4
        lf = buf.find(b"\n\n")
        if lf != -1 and (end == -1 or lf < end):
            end, sep = lf, 2
        if end == -1 or end > MAX_HEAD:
            if len(buf) > MAX_HEAD or end > MAX_HEAD:
                self._begin()
                self.keep = False
                self.srv.rejected["bad_request"] += 1
                self.reply(431, b"request head too large\n", close=True)
            elif self.eof:
                self._abort()
            return
        head = bytes(buf[:end])
        del buf[:end + sep]
        self._begin()
        try:
            req = parse_head(head)
        except BadRequest as exc:
            self.keep = False
            self.srv.rejected["bad_request"] += 1
            self.reply(exc.code, f"{exc}\n".encode(), close=True)
            return
        self.keep = req.keep_alive and not self.eof
        self.http10 = req.version == "HTTP/1.0"
        self.srv._handle(self, req)

    def _begin(self) -> None:
        self.state = BUSY
        self._disarm()

    # -- writing ------------------------------------------------------------------------------
    def reply(self, code: int, body: bytes = b"", ctype: str = TEXT, headers: Iterable[Tuple[str, str]] = (),
              head_only: bool = False, close: bool = False) -> None:
        """Answer the request being served (once; a no-op when the connection is gone)."""
        if self.state != BUSY:
            return
        keep = self.keep and not close and not self.eof
        parts = [f"HTTP/1.1 {code} {HTTPStatus(code).phrase}\r\nServer: vllm-sidecar-exporter\r\n"
                 f"Date: {_http_date()}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"]
        parts.extend(f"{k}: {v}\r\n" for k, v in headers)
        parts.extend(f"{k}: {v}\r\n" for k, v in self.srv.web.cfg.headers)
        if not keep:
            parts.append("Connection: close\r\n")
        elif self.http10:
            parts.append("Connection: keep-alive\r\n")
        parts.append("\r\n")
        head = "".join(parts).encode("latin-1")
        tr = self.transport
        tr.write(head if head_only or not body else head + body)  # type: ignore[union-attr]
        if not keep:
            self.state = CLOSING
            tr.close()  # type: ignore[union-attr]
            self._arm(self.srv.idle_timeout, "idle_timeout")  # a client that never reads its answer
            return
        self.state = IDLE
        self._arm(self.srv.idle_timeout, "idle_timeout")
        if self.read_paused:
            self.read_paused = False
            tr.resume_reading()  # type: ignore[union-attr]
        if self.buf or self.eof:
            self.loop.call_soon(self._pipelined)

    def _pipelined(self) -> None:
        if self.state == IDLE and self.buf:
            self.state = READING
            self._arm(self.srv.header_timeout, "header_timeout")
        self._next()


# -- the server ----------------------------------------------------------------------------------

def bind(host: str, port: int, backlog: int = BACKLOG) -> socket.socket:
    """A listening socket: IPv4 or IPv6 by the address; ``::`` is dual-stack where the OS allows."""
    infos = socket.getaddrinfo(host or "0.0.0.0", port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, proto, _, addr = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6 and hasattr(socket, "IPV6_V6ONLY"):
            try:
                unspecified = ipaddress.ip_address(addr[0].split("%", 1)[0]).is_unspecified
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0 if unspecified else 1)
            except (OSError, ValueError):
                pass
        sock.bind(addr)
        sock.listen(backlog)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def _fd_cap(wanted: int) -> int:
    """``wanted`` connections, fewer when the open-files limit would not hold them."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return wanted
    if soft == resource.RLIM_INFINITY:
        return wanted
    cap = max(8, soft - 64)
    if cap < wanted:
        log.warning("web max connections lowered from %d to %d by the open-files limit (%d)", wanted, cap, soft)
    return min(wanted, cap)


class SidecarServer:
    """The listener. ``start`` serves in a thread; ``stop`` closes everything it opened."""

    def __init__(self, host: str, port: int, state: Callable[[], Published], healthy: Callable[[], bool],
                 *, web: Union[WebConfigWatcher, str, None] = None, max_requests: int = 40,
                 max_connections: int = 1000, header_timeout: float = 10.0, idle_timeout: float = 120.0,
                 backlog: int = BACKLOG, flight=None) -> None:
        self.state = state
        self.flight = flight  # flight.FlightService: /debug/flight*, behind the same web config as /metrics
        self.healthy = healthy
        self.ready = threading.Event()
        self.registry = make_registry(state)  # the whole registry, for callers; /metrics serves cached bodies
        self.web = web if isinstance(web, WebConfigWatcher) else WebConfigWatcher(web or "")
        self.tls = self.web.cfg.tls is not None
        self.max_requests = max_requests
        self.max_connections = _fd_cap(max_connections)
        self.header_timeout = header_timeout
        self.idle_timeout = idle_timeout
        self.backlog = backlog
        self.rejected: Dict[str, int] = {r: 0 for r in REJECT_REASONS}
        self.closed: Dict[str, int] = {r: 0 for r in CLOSE_REASONS}
        self.inflight = 0
        self._conns: Dict[_Conn, None] = {}  # oldest first
        self._tasks: set = set()
        self._slots: Dict[str, _Slot] = {}
        self._encoders: Dict[str, Tuple[Callable, str]] = {}
        self._bucket = _Bucket()
        self._process = ProcessCollector(namespace="vllm_sidecar", registry=None)
        self._listener = _ListenerCollector(self)
        self._sock = bind(host, port, backlog)
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._workers: Optional[_Pool] = None
        self._auth_pool: Optional[_Pool] = None
        self._auth: Optional[_BasicAuth] = None

    @property
    def address(self) -> Tuple[str, int]:
        return self._sock.getsockname()[:2]

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    # -- running --------------------------------------------------------------------------------
    def start(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._workers = _Pool("http-worker", WORKERS)
        self._auth_pool = _Pool("http-auth", 1)
        self._auth = _BasicAuth(self._auth_pool)
        started = threading.Event()
        errors: List[BaseException] = []
        self._thread = threading.Thread(target=self._run, args=(started, errors), name="http", daemon=True)
        self._thread.start()
        started.wait(10)
        if errors:
            self.stop()
            raise errors[0]
        self.ready.set()

    def _run(self, started: threading.Event, errors: List[BaseException]) -> None:
        loop = self._loop
        assert loop is not None
        asyncio.set_event_loop(loop)
        loop.set_exception_handler(_quiet_handler)
        server = None
        try:
            if self.tls:  # accepted here, handshaken per connection with the context in force then
                self._accepting = loop.create_task(self._accept_tls())
            else:
                server = loop.run_until_complete(
                    loop.create_server(lambda: _Conn(self), sock=self._sock, backlog=self.backlog))
        except BaseException as exc:  # noqa: BLE001 - handed to start()
            errors.append(exc)
            started.set()
            loop.close()
            return
        started.set()
        try:
            loop.run_forever()
        finally:
            if server is not None:
                server.close()
            for c in list(self._conns):
                c._abort()
            tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for t in tasks:
                t.cancel()
            loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.run_until_complete(asyncio.sleep(0))  # let the aborted transports close their sockets
            loop.close()

    async def _accept_tls(self) -> None:
        loop = self._loop
        assert loop is not None
        while True:
            try:
                sock, _ = await loop.sock_accept(self._sock)
            except OSError as exc:  # out of file descriptors, or the like: breathe, go on
                log.warning("accept failed: %s", exc)
                await asyncio.sleep(0.1)
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            _Conn(self).accepted_tls(sock)

    def stop(self) -> None:
        self.ready.clear()
        if self._thread is not None and self._thread.is_alive() and self._loop is not None:
            try:
                self._loop.call_soon_threadsafe(self._loop.stop)
            except RuntimeError:
                pass
            self._thread.join(timeout=5)
        for pool in (self._workers, self._auth_pool):
            if pool is not None:
                pool.close()
        try:
            self._sock.close()
        except OSError:
            pass

    # -- connections (loop thread) --------------------------------------------------------------
    def _opened(self, conn: _Conn) -> None:
        self._conns[conn] = None
        if len(self._conns) <= self.max_connections:
            return
        victim = None
        for c in self._conns:  # the oldest still waiting for a request head ...
            if c is not conn and c.state in (NEW, READING):
                victim = c
                break
        if victim is None:  # ... else the oldest idle keep-alive one, else the newcomer
            victim = next((c for c in self._conns if c.state == IDLE), conn)
        victim.evict()

    def _gone(self, conn: _Conn) -> None:
        self._conns.pop(conn, None)

    def _spawn(self, coro) -> asyncio.Task:
        task = self._loop.create_task(coro)  # type: ignore[union-attr]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- requests (loop thread) -----------------------------------------------------------------
    def _handle(self, conn: _Conn, req: Request) -> None:
        if req.method not in ("GET", "HEAD"):
            conn.reply(405, b"method not allowed\n", headers=(("Allow", "GET, HEAD"),))
            return
        if req.has_body:
            self.rejected["bad_request"] += 1
            conn.reply(413, b"request bodies are not accepted\n", close=True)
            return
        head_only = req.method == "HEAD"
        if req.path == "/healthz":  # probes: cheap, no authentication (see the module doc)
            if self.healthy():
                conn.reply(200, b"ok\n", head_only=head_only)
            else:
                conn.reply(503, b"poll loop wedged\n", head_only=head_only)
        elif req.path == "/readyz":
            if self.ready.is_set():
                conn.reply(200, b"ready\n", head_only=head_only)
            else:
                conn.reply(503, b"starting\n", head_only=head_only)
        else:
            try:
                self._serve(conn, req, head_only)
            except Exception:  # a collector bug must show as a 500, not kill the server
                log.exception("serving %s failed", req.path)
                conn.reply(500, b"building metrics failed\n", close=True)

    def _serve(self, conn: _Conn, req: Request, head_only: bool) -> None:
        """``/metrics`` and ``/``: answered right here when nothing has to wait (the usual case: a
        body is ready, a password's verdict is cached); otherwise a task waits for bcrypt or for
        the body."""
        cfg = self.web.current()
        if cfg.rate_interval > 0 and not self._bucket.take(cfg.rate_interval, cfg.rate_burst,
                                                           self._loop.time()):  # type: ignore[union-attr]
            self.rejected["rate_limit"] += 1
            conn.reply(429, b"too many requests\n", head_only=head_only)
            return
        if cfg.users:
            verdict = self._auth.cached(req.headers.get("authorization", ""), cfg.users)  # type: ignore[union-attr]
            if verdict is None:
                self._spawn(self._serve_after_auth(conn, req, head_only, cfg.users))
                return
            if not self._authorized(conn, verdict, head_only):
                return
        self._route(conn, req, head_only)

    async def _serve_after_auth(self, conn: _Conn, req: Request, head_only: bool, users) -> None:
        try:
            verdict = await self._auth.check(self._loop, req.headers.get("authorization", ""), users)  # type: ignore[union-attr]
            if self._authorized(conn, verdict, head_only):
                self._route(conn, req, head_only)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001
            log.exception("serving %s failed", req.path)
            conn.reply(500, b"building metrics failed\n", close=True)

    def _authorized(self, conn: _Conn, verdict: Optional[bool], head_only: bool) -> bool:
        if verdict is None:
            self.rejected["auth_busy"] += 1
            conn.reply(503, b"busy checking passwords, retry\n", headers=(("Retry-After", "1"),),
                       head_only=head_only)
            return False
        if not verdict:
            self.rejected["unauthorized"] += 1
            conn.reply(401, b"unauthorized\n", head_only=head_only, headers=(
                ("WWW-Authenticate", 'Basic realm="vllm-sidecar-exporter", charset="UTF-8"'),))
            return False
        return True

    def _route(self, conn: _Conn, req: Request, head_only: bool) -> None:
        if req.path == "/metrics":
            gz = accepts_gzip(req.headers.get("accept-encoding", ""))
            e, ctype = self._pick(req.headers.get("accept", ""))
            if e.fut.done():
                self._send_body(conn, e, ctype, gz, head_only)
            elif self.max_requests and self.inflight >= self.max_requests:
                self.rejected["max_requests"] += 1
                conn.reply(503, b"too many scrapes at once, retry\n", headers=(("Retry-After", "1"),),
                           head_only=head_only)
            else:
                self._spawn(self._wait_for_body(conn, e, ctype, gz, head_only))
        elif req.path == "/":
            conn.reply(200, LANDING, head_only=head_only)
        elif self.flight is not None and req.path.rstrip("/") in ("/debug/flight", "/debug/flight/events"):
            self._spawn(self._serve_flight(conn, req, head_only))
        else:
            conn.reply(404, b"not found\n", head_only=head_only)

    async def _serve_flight(self, conn: _Conn, req: Request, head_only: bool) -> None:
        """The flight record: encoded on the recorder's own thread, never on this loop."""
        try:
            gz = accepts_gzip(req.headers.get("accept-encoding", ""))
            code, body, ctype, headers = await self.flight.handle(self._loop, req.target, gz)  # type: ignore[union-attr]
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001
            log.exception("serving %s failed", req.path)
            conn.reply(500, b"building the flight record failed\n", close=True)
            return
        conn.reply(code, body, ctype, headers, head_only=head_only)

    async def _wait_for_body(self, conn: _Conn, e: "_Entry", ctype: str, gz: bool, head_only: bool) -> None:
        self.inflight += 1
        try:
            await asyncio.shield(e.fut)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - answered below
            pass
        finally:
            self.inflight -= 1
        try:
            self._send_body(conn, e, ctype, gz, head_only)
        except Exception:  # noqa: BLE001
            log.exception("serving /metrics failed")
            conn.reply(500, b"building metrics failed\n", close=True)

    def _send_body(self, conn: _Conn, e: "_Entry", ctype: str, gz: bool, head_only: bool) -> None:
        plain, zipped = e.fut.result()  # raises what the encoding raised
        headers = (("Vary", "Accept-Encoding"), ("Content-Encoding", "gzip")) if gz else (("Vary", "Accept-Encoding"),)
        conn.reply(200, zipped if gz else plain, ctype, headers, head_only=head_only)

    def _pick(self, accept: str) -> Tuple["_Entry", str]:
        """The body to answer with now, and its content type, for the current state: built once
        per state and format, and kept while fresh.

        A body whose encoding started less than BODY_MAX_AGE ago is served as it is; an older one
        or one of a previous state is encoded again, and while that runs (milliseconds; seconds
        on a starved CPU) scrapes get the previous body if it is under STALE_MAX old, so a storm
        of scrapers never queues behind an encoding. Otherwise (the first scrape, scrapes further
        apart than that, an encoder that hangs) the scrape waits for the new body: those waits are
        the requests in flight that ``max_requests`` counts."""
        loop = self._loop
        assert loop is not None
        chosen = self._encoders.get(accept)
        if chosen is None:
            chosen = choose_encoder(accept)
            if len(self._encoders) < 64:
                self._encoders[accept] = chosen
        encoder, ctype = chosen
        pub = self.state()
        now = loop.time()
        slot = self._slots.get(ctype)
        if slot is None:
            slot = self._slots[ctype] = _Slot()
        ready = slot.ready
        if ready is not None and ready.pub is pub and now - ready.t < BODY_MAX_AGE:
            return ready, ctype
        if slot.pending is None:
            self._start_encoding(slot, encoder, pub, now)
        if ready is not None and now - ready.t < STALE_MAX:
            return ready, ctype
        return slot.pending, ctype  # type: ignore[return-value]

    def _start_encoding(self, slot: _Slot, encoder: Callable, pub: Published, now: float) -> None:
        e = _Entry(pub, now, self._workers.submit(self._loop, self._encode_both, encoder, pub))  # type: ignore[union-attr, arg-type]
        slot.pending = e

        def done(fut: asyncio.Future) -> None:
            if slot.pending is e:
                slot.pending = None
            if fut.cancelled():
                return
            if fut.exception() is None and (slot.ready is None or slot.ready.t <= e.t):
                slot.ready = e  # (a failure reaches the scrapes waiting for it, which answer 500)

        e.fut.add_done_callback(done)

    def _encode_both(self, encoder: Callable, pub: Published) -> Tuple[bytes, bytes]:
        plain = self._encode(encoder, pub)
        return plain, gzip.compress(plain, 5)

    def _encode(self, encoder: Callable, pub: Published) -> bytes:
        """Runs on a worker thread. Tests override it to hold scrapes."""
        return encoder(_Families(pub, self._process, self._listener))


def _quiet_handler(loop: asyncio.AbstractEventLoop, context: dict) -> None:
    exc = context.get("exception")
    if isinstance(exc, (OSError, ssl.SSLError, asyncio.CancelledError)):
        log.debug("%s: %s", context.get("message"), exc)
        return
    loop.default_exception_handler(context)
