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
- HTTP/1.1 is read and written by h11 (sans-IO: it frames, this module owns the sockets, the
  timers and the caps). A request is looked at only once h11 has its whole head. A head h11
  refuses is answered with the status it names (400, or 501 for a transfer coding it does not
  know) and the connection closed; so is a head over 16 KiB (431), a version other than
  HTTP/1.x (505) and a request with a body (413: nothing here takes one; a ``POST`` gets 405).
  A body, if any, is read past by h11 when it has all arrived, otherwise the connection closes
  after the answer: a byte of a body is never read as the next request. Every refusal is
  counted (``bad_request``). A new connection has ``header_timeout`` seconds for its TLS
  handshake and its first request head; an idle keep-alive connection is closed after
  ``idle_timeout`` seconds, and once the next request starts arriving the header timeout applies
  again. A response the client does not read within the idle timeout is dropped with its
  connection. (h11 does not keep HTTP/1.0 connections alive: they close after one answer.)
- At most ``max_connections`` are open. When full, a new connection pushes out the oldest one
  still waiting for a complete request head (a slow or stalled client), else the oldest idle
  keep-alive one; one in the middle of a request is never pushed out, so a slowloris crowd cannot
  keep Prometheus out, nor hold more than the cap.
- Routing is one table (``SidecarServer._make_routes``: path -> handler, guarded or not).
  ``/healthz`` and ``/readyz`` are answered right on the loop. ``/metrics``, ``/debug/flight*``, ``/`` and unknown
  paths go through the web configuration (``webconfig``: rate limit, basic auth) first.
- A ``/metrics`` body is encoded once per published state and format, on a pool of two worker
  threads, and gzip-compressed once in the same step; every scrape of that state gets the same
  bytes. The poll loop swaps an immutable ``Published``, so the object itself is the generation.
  A scrape always gets the state of the latest completed poll: once a poll has published, a body
  of an earlier state is never served, the scrape waits for the new one (the encoding is shared
  by every scrape of that state). A body is also re-encoded when it is a second old, so the
  ``process_*`` series stay fresh between slow polls; while that runs, scrapes get the body at
  hand if it is under five seconds old (it shows the same poll). Any number of scrapes may wait
  for an encoding that started under a second ago; once one takes longer, at most
  ``max_requests`` may wait (node_exporter's ``--web.max-requests``): beyond that 503 with
  ``Retry-After``. So the limit bites exactly when bodies cannot be built fast enough, and
  answering from a ready body is never refused.
- Nothing waits when nothing has to: a request whose body is ready (and whose password's
  verdict is cached) is answered in the same loop step that read it; only a wait for bcrypt or
  for an encoding becomes a task.
- bcrypt runs on its own thread, one check at a time (as exporter-toolkit), and its verdicts are
  cached by a digest of user, hash and password, so a correct scrape costs one bcrypt check per
  password, and a crowd of wrong guesses (at most 32 waiting, then 503) never delays the encoder.
- TLS: the loop accepts each connection itself and hands it to ``connect_accepted_socket`` with
  the SSL context of the web configuration in force at that moment, so certificates rotated in a
  Kubernetes Secret are picked up by the next connection without a restart.

Threads: the loop, two workers and the bcrypt thread, whatever the load (and, with a flight recorder,
its service's threads, each waiting on an encoder child process while a /debug/flight download runs).
"""

from __future__ import annotations

import asyncio
import enum
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

import h11
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
STALE_MAX = 5.0  # seconds a body may still be served while the same state is encoded again
SLOW_ENCODING = 1.0  # an encoding running longer: bodies are not built fast enough, max_requests applies
TEXT = "text/plain; charset=utf-8"
LANDING = b"vllm-sidecar-exporter: /metrics /healthz /readyz\n"
_PHRASES = {s.value: s.phrase for s in HTTPStatus}
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
        return cls(ev.method.decode("latin-1"), target, _path_of(target),
                   "HTTP/" + ev.http_version.decode("latin-1"), headers)


def _path_of(target: str) -> str:
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


Handler = Callable[["_Conn", Request, bool], None]  # (connection, request, head_only)

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

class ConnState(enum.Enum):
    """Where one connection is. Eviction, the timers and what may be read or written go by it."""

    NEW = "new"          # connected; the TLS handshake and the first request head are pending
    IDLE = "idle"        # keep-alive, between requests
    READING = "reading"  # the next request head is arriving
    BUSY = "busy"        # a request is being served
    CLOSING = "closing"  # the last answer is written, the transport closes once it is sent
    CLOSED = "closed"


NEW, IDLE, READING, BUSY, CLOSING, CLOSED = (ConnState.NEW, ConnState.IDLE, ConnState.READING, ConnState.BUSY,
                                             ConnState.CLOSING, ConnState.CLOSED)
_WAITING = (NEW, IDLE, READING)  # states in which the next request head is read


class _Conn(asyncio.Protocol):
    """One client connection: feeds what arrives to its h11 state machine, hands each complete
    request to the server, writes the answer through h11. h11 does all the framing (request
    line, headers, bodies, keep-alive); the connection keeps the caps, the timers and the state.
    """

    def __init__(self, srv: "SidecarServer") -> None:
        self.srv = srv
        self.loop = srv._loop
        self.transport: Optional[asyncio.BaseTransport] = None
        self.h = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        self.fed = 0  # bytes handed to h11 since the current request head began
        self.head_req = False  # the request being served is a HEAD (its answer has no body)
        self.state = NEW
        self.timer: Optional[asyncio.TimerHandle] = None
        self.eof = False
        self.write_paused = False
        self.read_paused = False
        self.handshaking = False  # TLS accepted, handshake under way (no transport yet)
        self.tls: Optional[TLSSettings] = None
        self.raw: Optional[socket.socket] = None
        self.hs_task: Optional[asyncio.Task] = None
        self.on_gone: Optional[Callable[[], None]] = None  # a long answer's cancel, called when the client goes

    # -- lifecycle ------------------------------------------------------------------------------
    def connection_made(self, transport) -> None:  # type: ignore[override]
        if self.handshaking:  # TLS: the handshake is done (the connection was counted at accept)
            self.transport = transport
            self.handshaking = False
            if self.state is CLOSED:
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
        if self.state is not CLOSED:
            self._arm(self.srv.header_timeout, "header_timeout")

    def accepted_tls(self, sock: socket.socket) -> None:
        """A TLS connection just accepted (plain TCP still): counted, timed, then handshaken with
        the context of the web configuration in force now."""
        self.handshaking = True
        self.raw = sock
        self.srv._opened(self)
        if self.state is CLOSED:
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
            if self.state is not CLOSED:
                log.debug("TLS handshake failed: %s", exc)
                self.srv.closed["tls"] += 1
                self.state = CLOSED
                self._disarm()
                self.srv._gone(self)

    def _gone_now(self) -> None:
        hook, self.on_gone = self.on_gone, None
        if hook is not None:
            hook()

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.state = CLOSED
        self._gone_now()
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
        if self.on_gone is not None:  # a long answer (a flight record) is not made for a client that left
            self._gone_now()
            return False
        if self.state is BUSY and not self.srv.tls:
            return True  # a half-closed client still gets its answer
        return False  # between requests or in the middle of a head: closed quietly

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.state in (IDLE, READING):
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
        if self.state is CLOSED:
            return
        self.state = CLOSED
        self._disarm()
        self._gone_now()
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
        state = self.state
        if state is CLOSING or state is CLOSED:
            return
        if state is NEW and not self.srv.tls and data[:1] == b"\x16":  # a TLS handshake on plain HTTP
            self.srv.rejected["bad_request"] += 1
            self._abort()
            return
        self.h.receive_data(data)
        self.fed += len(data)
        if state is BUSY:  # pipelined, or a body: held (by h11) up to the cap, then reading pauses
            if self.fed > 2 * MAX_HEAD and not self.read_paused:
                self.read_paused = True
                self.transport.pause_reading()  # type: ignore[union-attr]
            return
        if state is IDLE:
            self.state = READING
            self._arm(self.srv.header_timeout, "header_timeout")
        self._next()

    def _next(self) -> None:
        """Take the next request out of what arrived, if it is all there. A head h11 refuses is
        answered with the status h11 names (400, 431, 501) and the connection closed."""
        if self.state not in _WAITING or self.write_paused:
            return
        h = self.h
        try:
            ev = h.next_event()
        except h11.RemoteProtocolError as exc:
            self._refuse(exc.error_status_hint, str(exc))
            return
        if ev is h11.NEED_DATA:
            if self.eof:  # the client went before its head was complete
                self._abort()
            return
        if type(ev) is h11.Request:
            head = self.fed - len(h.trailing_data[0]) if self.fed > MAX_HEAD else 0
            self._begin()
            self.head_req = ev.method == b"HEAD"
            if head > MAX_HEAD:  # a head over the cap that arrived whole, in one read
                self._refuse(431, "request head too large")
                return
            if ev.http_version not in (b"1.1", b"1.0"):
                self._refuse(505, "HTTP/1.1 only")
                return
            self.srv._handle(self, Request.from_h11(ev))
            return
        self._abort()  # ConnectionClosed (or anything else h11 may say between requests)

    def _refuse(self, code: int, why: str) -> None:
        """A request refused before it could be routed: counted, answered, the connection closed."""
        self._begin()
        self.srv.rejected["bad_request"] += 1
        log.debug("bad request (%d): %s", code, why)
        if code not in _PHRASES:
            code = 400
        self.reply(code, f"{_PHRASES[code].lower()}\n".encode(), close=True)

    def _begin(self) -> None:
        self.state = BUSY
        self._disarm()

    def _body_read(self) -> bool:
        """Whether the request's body (if any) has all arrived and been read past (it is thrown
        away); False means the connection must close after the answer, so that no byte of a
        body is ever read as the next request."""
        h = self.h
        try:
            while h.their_state is h11.SEND_BODY:
                ev = h.next_event()
                if ev is h11.NEED_DATA or ev is h11.PAUSED:
                    return False
        except h11.RemoteProtocolError:
            return False
        return h.their_state is h11.DONE

    # -- writing ------------------------------------------------------------------------------
    def reply(self, code: int, body: bytes = b"", ctype: str = TEXT, headers: Tuple[Tuple[str, str], ...] = (),
              head_only: bool = False, close: bool = False) -> None:
        """Answer the request being served (once; a no-op when the connection is gone)."""
        if self.state is not BUSY:
            return
        h = self.h
        keep = not close and not self.eof and self._body_read()
        date = _http_date()
        extra = self.srv.web.cfg.headers
        key = (code, ctype, len(body), date, headers, extra, keep)
        cache = self.srv._responses
        resp = cache.get(key)
        if resp is None:  # the same answer head is made once per second and reused (h11 events are immutable)
            hs = [("Server", "vllm-sidecar-exporter"), ("Date", date), ("Content-Type", ctype),
                  ("Content-Length", str(len(body))), *headers, *extra]
            if not keep:
                hs.append(("Connection", "close"))
            resp = h11.Response(status_code=code, headers=hs, reason=_PHRASES.get(code, ""))
            if len(cache) >= 64:
                cache.clear()
            cache[key] = resp
        tr = self.transport
        try:
            out = h.send(resp)
            if body and not head_only and not self.head_req:
                out += b"".join(h.send_with_data_passthrough(h11.Data(data=body)))  # type: ignore[arg-type]
            out += h.send(h11.EndOfMessage())  # type: ignore[operator]
        except h11.LocalProtocolError as exc:  # a header h11 refuses: a bug here, not the client's
            log.error("answer %d not sent: %s", code, exc)
            self._abort()
            return
        tr.write(out)  # type: ignore[union-attr, arg-type]
        if not keep or h.our_state is not h11.DONE:  # (h11 closes after an HTTP/1.0 request)
            self.state = CLOSING
            tr.close()  # type: ignore[union-attr]
            self._arm(self.srv.idle_timeout, "idle_timeout")  # a client that never reads its answer
            return
        h.start_next_cycle()
        self.head_req = False
        self.fed = len(h.trailing_data[0])  # a pipelined request, already here
        self.state = IDLE
        self._arm(self.srv.idle_timeout, "idle_timeout")
        if self.read_paused:
            self.read_paused = False
            tr.resume_reading()  # type: ignore[union-attr]
        if self.fed or self.eof:
            self.loop.call_soon(self._pipelined)

    def _pipelined(self) -> None:
        if self.state is IDLE and self.fed:
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
                 backlog: int = BACKLOG, clock: Callable[[], float] = time.monotonic, flight=None) -> None:
        self.state = state
        self.clock = clock  # ages of bodies and encodings (tests drive it)
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
        self.routes = self._make_routes()
        self._responses: Dict[tuple, h11.Response] = {}  # answer heads of this second, by what is in them

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
        """One request h11 has read: refused (405, 413, 400), or handed to its route."""
        if req.method not in ("GET", "HEAD"):
            conn.reply(405, b"method not allowed\n", headers=(("Allow", "GET, HEAD"),))
            return
        if req.has_body:
            self.rejected["bad_request"] += 1
            conn.reply(413, b"request bodies are not accepted\n", close=True)
            return
        if not req.path:
            self.rejected["bad_request"] += 1
            conn.reply(400, b"bad request target\n", close=True)
            return
        head_only = req.method == "HEAD"
        handler, guarded = self.routes.get(req.path, (self._not_found, True))
        try:
            if guarded:
                self._guarded(conn, req, head_only, handler)
            else:
                handler(conn, req, head_only)
        except Exception:  # a collector bug must show as a 500, not kill the server
            log.exception("serving %s failed", req.path)
            conn.reply(500, b"building metrics failed\n", close=True)

    def _make_routes(self) -> Dict[str, Tuple[Handler, bool]]:
        """path -> (handler, guarded). A guarded route goes through the web configuration (rate
        limit, basic auth) first; the probes are not guarded (see the module doc). A path not
        listed is a 404, guarded too. A new route is one line here and its handler."""
        return {
            "/healthz": (self._healthz, False),
            "/readyz": (self._readyz, False),
            "/metrics": (self._metrics, True),
            "/": (self._landing, True),
            **({"/debug/flight": (self._flight, True), "/debug/flight/events": (self._flight, True)}
               if self.flight is not None else {}),
        }

    def _healthz(self, conn: _Conn, req: Request, head_only: bool) -> None:
        if self.healthy():
            conn.reply(200, b"ok\n", head_only=head_only)
        else:
            conn.reply(503, b"poll loop wedged\n", head_only=head_only)

    def _readyz(self, conn: _Conn, req: Request, head_only: bool) -> None:
        if self.ready.is_set():
            conn.reply(200, b"ready\n", head_only=head_only)
        else:
            conn.reply(503, b"starting\n", head_only=head_only)

    def _landing(self, conn: _Conn, req: Request, head_only: bool) -> None:
        conn.reply(200, LANDING, head_only=head_only)

    def _flight(self, conn: _Conn, req: Request, head_only: bool) -> None:
        self._spawn(self._serve_flight(conn, req, head_only))

    def _not_found(self, conn: _Conn, req: Request, head_only: bool) -> None:
        conn.reply(404, b"not found\n", head_only=head_only)

    def _guarded(self, conn: _Conn, req: Request, head_only: bool, handler: Handler) -> None:
        """Rate limit and basic auth, then ``handler``: right here when nothing has to wait (the
        usual case: no users, or a password's verdict cached); otherwise a task waits for bcrypt."""
        cfg = self.web.current()
        if cfg.rate_interval > 0 and not self._bucket.take(cfg.rate_interval, cfg.rate_burst,
                                                           self._loop.time()):  # type: ignore[union-attr]
            self.rejected["rate_limit"] += 1
            conn.reply(429, b"too many requests\n", head_only=head_only)
            return
        if cfg.users:
            verdict = self._auth.cached(req.headers.get("authorization", ""), cfg.users)  # type: ignore[union-attr]
            if verdict is None:
                self._spawn(self._after_auth(conn, req, head_only, cfg.users, handler))
                return
            if not self._authorized(conn, verdict, head_only):
                return
        handler(conn, req, head_only)

    async def _after_auth(self, conn: _Conn, req: Request, head_only: bool, users, handler: Handler) -> None:
        try:
            verdict = await self._auth.check(self._loop, req.headers.get("authorization", ""), users)  # type: ignore[union-attr]
            if self._authorized(conn, verdict, head_only):
                handler(conn, req, head_only)
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

    def _metrics(self, conn: _Conn, req: Request, head_only: bool) -> None:
        gz = accepts_gzip(req.headers.get("accept-encoding", ""))
        e, ctype = self._pick(req.headers.get("accept", ""))
        if e.fut.done():
            self._send_body(conn, e, ctype, gz, head_only)
        elif self.max_requests and self.inflight >= self.max_requests and self.clock() - e.t >= SLOW_ENCODING:
            self.rejected["max_requests"] += 1
            conn.reply(503, b"too many scrapes at once, retry\n", headers=(("Retry-After", "1"),),
                       head_only=head_only)
        else:
            self._spawn(self._wait_for_body(conn, e, ctype, gz, head_only))

    async def _serve_flight(self, conn: _Conn, req: Request, head_only: bool) -> None:
        """The flight record: encoded by the flight service (in a child process), never on this
        loop; a client that goes away (or half-closes) meanwhile cancels it (its child is killed)."""
        if conn.state is not BUSY:
            return
        conn.on_gone = asyncio.current_task().cancel  # type: ignore[union-attr]
        try:
            gz = accepts_gzip(req.headers.get("accept-encoding", ""))
            code, body, ctype, headers = await self.flight.handle(self._loop, req.target, gz)  # type: ignore[union-attr]
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001
            log.exception("serving %s failed", req.path)
            conn.reply(500, b"building the flight record failed\n", close=True)
            return
        finally:
            conn.on_gone = None
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
        """The body to answer with now, and its content type: the encoding of the state the
        latest completed poll published, never of an older one.

        A body of the current state whose encoding started less than BODY_MAX_AGE ago is served
        as it is. An older body of the current state is encoded again (so that the ``process_*``
        series stay fresh between slow polls), and while that runs the body at hand is served if
        it is under STALE_MAX old: it shows the same poll. A body of a previous state is never
        served: once a poll has published, scrapes wait for the encoding of its state (shared,
        one per state and format; milliseconds, seconds on a starved CPU)."""
        chosen = self._encoders.get(accept)
        if chosen is None:
            chosen = choose_encoder(accept)
            if len(self._encoders) < 64:
                self._encoders[accept] = chosen
        encoder, ctype = chosen
        pub = self.state()
        now = self.clock()
        slot = self._slots.get(ctype)
        if slot is None:
            slot = self._slots[ctype] = _Slot()
        ready = slot.ready
        if ready is not None and ready.pub is pub:
            if now - ready.t < BODY_MAX_AGE:
                return ready, ctype
            if slot.pending is None:
                self._start_encoding(slot, encoder, pub, now)
            if now - ready.t < STALE_MAX:
                return ready, ctype
        elif slot.pending is None or slot.pending.pub is not pub:
            self._start_encoding(slot, encoder, pub, now)
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
