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
import ipaddress
import logging
import socket
import ssl
import threading
import time
from typing import Callable, Coroutine, Dict, List, Optional, Tuple, Union

from prometheus_client import CollectorRegistry
from prometheus_client.process_collector import ProcessCollector

from .collectors import SidecarCollector
from .collectors.listener import CLOSE_REASONS, REJECT_REASONS, ListenerCollector
from .listener.auth import BasicAuth
from .listener.bodies import SLOW_ENCODING, Bodies, Entry, Families
from .listener.connection import BUSY, IDLE, NEW, READING, Conn
from .listener.framing import Request, ResponseHeads, accepts_gzip
from .listener.pool import Pool
from .listener.ratelimit import Bucket
from .state import Published
from .webconfig import WebConfigWatcher

log = logging.getLogger("vllm_sidecar.http")

BACKLOG = 1024
WORKERS = 2
LANDING = b"vllm-sidecar-exporter: /metrics /healthz /readyz\n"


def make_registry(state: Callable[[], Published]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SidecarCollector(state))
    ProcessCollector(namespace="vllm_sidecar", registry=registry)
    return registry


Handler = Callable[[Conn, Request, bool], None]  # (connection, request, head_only)


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
        self._conns: Dict[Conn, None] = {}  # oldest first
        self._tasks: set = set()
        self._bodies = Bodies(state, clock, self._encode)
        self._bucket = Bucket()
        self._process = ProcessCollector(namespace="vllm_sidecar", registry=None)
        self._listener = ListenerCollector(self)
        self._sock = bind(host, port, backlog)
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._thread: Optional[threading.Thread] = None
        self._workers: Optional[Pool] = None
        self._auth_pool: Optional[Pool] = None
        self._auth: Optional[BasicAuth] = None
        self.routes = self._make_routes()
        self.heads = ResponseHeads()  # answer heads of this second, by what is in them

    @property
    def address(self) -> Tuple[str, int]:
        return self._sock.getsockname()[:2]

    @property
    def scheme(self) -> str:
        return "https" if self.tls else "http"

    # -- running --------------------------------------------------------------------------------
    def start(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._workers = Pool("http-worker", WORKERS)
        self._auth_pool = Pool("http-auth", 1)
        self._auth = BasicAuth(self._auth_pool)
        self._bodies.start(self._loop, self._workers)
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
                    loop.create_server(lambda: Conn(self), sock=self._sock, backlog=self.backlog))
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
            Conn(self).accepted_tls(sock)

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

    # -- what a connection calls (listener.connection.ConnectionHost; loop thread) -----------------
    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "not started"
        return self._loop

    @property
    def open_connections(self) -> int:
        return len(self._conns)

    def opened(self, conn: Conn) -> None:
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

    def gone(self, conn: Conn) -> None:
        self._conns.pop(conn, None)

    def spawn(self, coro: Coroutine) -> asyncio.Task:
        task = self._loop.create_task(coro)  # type: ignore[union-attr]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- requests (loop thread) -----------------------------------------------------------------
    def handle(self, conn: Conn, req: Request) -> None:
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

    def _healthz(self, conn: Conn, req: Request, head_only: bool) -> None:
        if self.healthy():
            conn.reply(200, b"ok\n", head_only=head_only)
        else:
            conn.reply(503, b"poll loop wedged\n", head_only=head_only)

    def _readyz(self, conn: Conn, req: Request, head_only: bool) -> None:
        if self.ready.is_set():
            conn.reply(200, b"ready\n", head_only=head_only)
        else:
            conn.reply(503, b"starting\n", head_only=head_only)

    def _landing(self, conn: Conn, req: Request, head_only: bool) -> None:
        conn.reply(200, LANDING, head_only=head_only)

    def _flight(self, conn: Conn, req: Request, head_only: bool) -> None:
        self.spawn(self._serve_flight(conn, req, head_only))

    def _not_found(self, conn: Conn, req: Request, head_only: bool) -> None:
        conn.reply(404, b"not found\n", head_only=head_only)

    def _guarded(self, conn: Conn, req: Request, head_only: bool, handler: Handler) -> None:
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
                self.spawn(self._after_auth(conn, req, head_only, cfg.users, handler))
                return
            if not self._authorized(conn, verdict, head_only):
                return
        handler(conn, req, head_only)

    async def _after_auth(self, conn: Conn, req: Request, head_only: bool, users, handler: Handler) -> None:
        try:
            verdict = await self._auth.check(self._loop, req.headers.get("authorization", ""), users)  # type: ignore[union-attr]
            if self._authorized(conn, verdict, head_only):
                handler(conn, req, head_only)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001
            log.exception("serving %s failed", req.path)
            conn.reply(500, b"building metrics failed\n", close=True)

    def _authorized(self, conn: Conn, verdict: Optional[bool], head_only: bool) -> bool:
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

    def _metrics(self, conn: Conn, req: Request, head_only: bool) -> None:
        gz = accepts_gzip(req.headers.get("accept-encoding", ""))
        e, ctype = self._bodies.pick(req.headers.get("accept", ""))
        if e.fut.done():
            self._send_body(conn, e, ctype, gz, head_only)
        elif self.max_requests and self.inflight >= self.max_requests and self.clock() - e.t >= SLOW_ENCODING:
            self.rejected["max_requests"] += 1
            conn.reply(503, b"too many scrapes at once, retry\n", headers=(("Retry-After", "1"),),
                       head_only=head_only)
        else:
            self.spawn(self._wait_for_body(conn, e, ctype, gz, head_only))

    async def _serve_flight(self, conn: Conn, req: Request, head_only: bool) -> None:
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

    async def _wait_for_body(self, conn: Conn, e: Entry, ctype: str, gz: bool, head_only: bool) -> None:
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

    def _send_body(self, conn: Conn, e: Entry, ctype: str, gz: bool, head_only: bool) -> None:
        plain, zipped = e.fut.result()  # raises what the encoding raised
        headers = (("Vary", "Accept-Encoding"), ("Content-Encoding", "gzip")) if gz else (("Vary", "Accept-Encoding"),)
        conn.reply(200, zipped if gz else plain, ctype, headers, head_only=head_only)

    def _encode(self, encoder: Callable, pub: Published) -> bytes:
        """One body (``bodies.Bodies`` calls it on a worker thread). Tests override it to hold scrapes."""
        return encoder(Families(pub, self._process, self._listener))


def _quiet_handler(loop: asyncio.AbstractEventLoop, context: dict) -> None:
    exc = context.get("exception")
    if isinstance(exc, (OSError, ssl.SSLError, asyncio.CancelledError)):
        log.debug("%s: %s", context.get("message"), exc)
        return
    loop.default_exception_handler(context)
