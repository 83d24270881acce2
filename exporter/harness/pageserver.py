"""A small, well-behaved HTTP server that serves a metrics page from a callable: the demo's
simulated vLLM and the scripted vLLM stand-in of the tests.

``mode`` (settable at any time): ``ok``, 200 with the page (gzip when the client accepts it and
``gzip`` is on); or ``status:N``, a plain HTTP N answer (vLLM failing the ordinary way). When the
page callable raises ``ConnectionError`` (a simulated vLLM that is down) the connection is
dropped unanswered; a closed port (connection refused) is had by stopping the server.

Servers that misbehave at the HTTP level (dribbling, lying about lengths, bombs, resets) are the
fault suite's business: ``tests/hostile_server.py``, never shipped.
"""

from __future__ import annotations

import gzip
import socket
import threading
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Deque, Optional


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt: str, *args) -> None:
        return

    def setup(self) -> None:
        super().setup()
        with self.server.app.lock:  # type: ignore[attr-defined]
            self.server.app.connections += 1  # type: ignore[attr-defined]
            self.server.app.open_sockets.add(self.connection)  # type: ignore[attr-defined]

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            with self.server.app.lock:  # type: ignore[attr-defined]
                self.server.app.open_sockets.discard(self.connection)  # type: ignore[attr-defined]

    def _send(self, code: int, body: bytes, ctype: str, encoding: Optional[str] = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        if encoding:
            self.send_header("Content-Encoding", encoding)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802, C901
        app: PageServer = self.server.app  # type: ignore[attr-defined]
        with app.lock:
            app.requests.append((self.path, dict(self.headers)))
        mode = app.mode
        path = self.path.split("?", 1)[0]
        if path == "/health":
            self._send(200 if mode == "ok" else 503, b"", "text/plain")
            return
        if path != app.path:
            self._send(404, b"not found\n", "text/plain")
            return
        if mode == "ok":
            try:
                body = app.page().encode()
            except ConnectionError:  # the simulated server is down: drop the connection unanswered
                self.close_connection = True
                return
            if app.gzip and "gzip" in self.headers.get("Accept-Encoding", ""):
                self._send(200, gzip.compress(body), app.content_type, "gzip")
            else:
                self._send(200, body, app.content_type)
        else:
            self._send(int(mode.split(":", 1)[1]), b"upstream error\n", "text/plain")


class PageServer:
    def __init__(self, page: Callable[[], str], host: str = "127.0.0.1", port: int = 0,
                 path: str = "/metrics", gzip_ok: bool = True) -> None:
        self.page = page
        self.path = path
        self.gzip = gzip_ok
        self._mode = "ok"
        self.content_type = "text/plain; version=0.0.4; charset=utf-8"
        self.lock = threading.Lock()
        self.connections = 0
        self.requests: Deque[tuple] = deque(maxlen=1000)  # the latest requests (path, headers)
        self.stopping = threading.Event()
        self.open_sockets: set = set()
        self.host, self.port = host, port
        self.httpd: Optional[ThreadingHTTPServer] = None
        self._thread: Optional[threading.Thread] = None

    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, value: str) -> None:
        kind, _, code = value.partition(":")
        if value != "ok" and not (kind == "status" and code.isdigit() and 200 <= int(code) <= 599):
            raise ValueError(f"mode {value!r}: ok or status:N (misbehaving servers live in tests/hostile_server.py)")
        self._mode = value

    def start(self) -> "PageServer":
        self.stopping.clear()
        self.httpd = ThreadingHTTPServer((self.host, self.port), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.app = self  # type: ignore[attr-defined]
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True, name=f"pageserver:{self.port}")
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop like a killed process: no new connections, and kept-alive ones closed."""
        self.stopping.set()
        if self.httpd is not None:
            self.httpd.shutdown()
            self.httpd.server_close()
            self.httpd = None
        with self.lock:
            socks = list(self.open_sockets)
            self.open_sockets.clear()
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"
