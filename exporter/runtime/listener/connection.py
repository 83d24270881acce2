"""One client connection of the listener: an asyncio protocol feeding what arrives to its h11
state machine, handing each complete request head to the server, writing the answer through
h11, and keeping the caps, the timers and its state (``ConnState``). It reaches the server only
through ``ConnectionHost``: the counters, the timeouts, and four calls (opened, gone, handle,
spawn)."""

from __future__ import annotations

import asyncio
import enum
import logging
import socket
import ssl
import sys
from typing import Callable, Coroutine, Dict, Optional, Protocol, Tuple

import h11

from ..webconfig import TLSSettings, WebConfigWatcher, sans_allowed
from .framing import MAX_HEAD, PHRASES, TEXT, Request, ResponseHeads

log = logging.getLogger("vllm_sidecar.http")


class ConnectionHost(Protocol):
    """What a connection needs of the server that accepted it."""

    loop: asyncio.AbstractEventLoop
    web: WebConfigWatcher
    tls: bool
    header_timeout: float
    idle_timeout: float
    rejected: Dict[str, int]
    closed: Dict[str, int]
    heads: ResponseHeads

    def opened(self, conn: "Conn") -> None:
        """A connection is counted (and may push out an older one when the server is full)."""

    def gone(self, conn: "Conn") -> None:
        """A connection is closed: forgotten."""

    def handle(self, conn: "Conn", req: Request) -> None:
        """A complete request head: routed, answered through ``conn.reply``."""

    def spawn(self, coro: Coroutine) -> asyncio.Task:
        """A task the server cancels when it stops."""


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


class Conn(asyncio.Protocol):
    """One client connection: feeds what arrives to its h11 state machine, hands each complete
    request to the server, writes the answer through h11. h11 does all the framing (request
    line, headers, bodies, keep-alive); the connection keeps the caps, the timers and the state.
    """

    def __init__(self, srv: "ConnectionHost") -> None:
        self.srv = srv
        self.loop = srv.loop
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
        self.srv.opened(self)
        if self.state is not CLOSED:
            self._arm(self.srv.header_timeout, "header_timeout")

    def accepted_tls(self, sock: socket.socket) -> None:
        """A TLS connection just accepted (plain TCP still): counted, timed, then handshaken with
        the context of the web configuration in force now."""
        self.handshaking = True
        self.raw = sock
        self.srv.opened(self)
        if self.state is CLOSED:
            return
        self._arm(self.srv.header_timeout, "header_timeout")
        self.hs_task = self.srv.spawn(self._handshake(sock))

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
                self.srv.gone(self)

    def _gone_now(self) -> None:
        hook, self.on_gone = self.on_gone, None
        if hook is not None:
            hook()

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self.state = CLOSED
        self._gone_now()
        self._disarm()
        self.srv.gone(self)
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
        self.srv.gone(self)

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
            self.srv.handle(self, Request.from_h11(ev))
            return
        self._abort()  # ConnectionClosed (or anything else h11 may say between requests)

    def _refuse(self, code: int, why: str) -> None:
        """A request refused before it could be routed: counted, answered, the connection closed."""
        self._begin()
        self.srv.rejected["bad_request"] += 1
        log.debug("bad request (%d): %s", code, why)
        if code not in PHRASES:
            code = 400
        self.reply(code, f"{PHRASES[code].lower()}\n".encode(), close=True)

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
        resp = self.srv.heads.get(code, ctype, len(body), headers, self.srv.web.cfg.headers, keep)
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
