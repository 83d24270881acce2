"""A small HTTP server that serves a metrics page from a callable: the demo's simulated vLLM,
and the scripted vLLM stand-in of the tests, which can also be told to misbehave.

``mode`` (settable at any time):

- ``ok``: 200 with the page (gzip when the client accepts it and ``gzip`` is on);
- ``status:N``: answer HTTP N;
- ``slow:S``: wait S seconds before answering;
- ``dribble:S``: send the headers at once, then the body a few bytes every S seconds;
- ``html``: a 200 HTML login page;
- ``garbage``: 200 with bytes that are not exposition text;
- ``huge:N``: 200 with an N-byte page (valid lines, repeated);
- ``gzipbomb:N``: 200, gzip-encoded, N bytes once decompressed;
- ``close``: accept and close the connection without answering.

A closed port (connection refused) is had by stopping the server.
"""

from __future__ import annotations

import gzip
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, List, Optional


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
        if mode.startswith("slow:"):
            time.sleep(float(mode.split(":", 1)[1]))
            mode = "ok"
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
        elif mode.startswith("status:"):
            self._send(int(mode.split(":", 1)[1]), b"upstream error\n", "text/plain")
        elif mode == "html":
            self._send(200, b"<!DOCTYPE html><html><body><form>Sign in</form></body></html>\n",
                       "text/html; charset=utf-8")
        elif mode == "garbage":
            self._send(200, bytes(range(32, 127)) * 40 + b"\n{{{ not metrics }}}\n", "text/plain")
        elif mode.startswith("huge:"):
            n = int(mode.split(":", 1)[1])
            line = b'vllm:num_requests_running{engine="0",model_name="m"} 1.0\n'
            self._send(200, (line * (n // len(line) + 1))[:n], app.content_type)
        elif mode.startswith("gzipbomb:"):
            n = int(mode.split(":", 1)[1])
            self._send(200, gzip.compress(b"#" * n), app.content_type, "gzip")
        elif mode.startswith("dribble:"):
            pause = float(mode.split(":", 1)[1])
            body = app.page().encode()
            self.send_response(200)
            self.send_header("Content-Type", app.content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                for i in range(0, len(body), 64):
                    self.wfile.write(body[i:i + 64])
                    self.wfile.flush()
                    time.sleep(pause)
                    if app.stopping.is_set():
                        return
            except OSError:
                return
        elif mode == "close":
            self.close_connection = True
            return
        else:
            self._send(500, f"unknown mode {mode}\n".encode(), "text/plain")


class PageServer:
    def __init__(self, page: Callable[[], str], host: str = "127.0.0.1", port: int = 0,
                 path: str = "/metrics", gzip_ok: bool = True) -> None:
        self.page = page
        self.path = path
        self.gzip = gzip_ok
        self.mode = "ok"
        self.content_type = "text/plain; version=0.0.4; charset=utf-8"
        self.lock = threading.Lock()
        self.connections = 0
        self.requests: List[tuple] = []
        self.stopping = threading.Event()
        self.open_sockets: set = set()
        self.host, self.port = host, port
        self.httpd: Optional[ThreadingHTTPServer] = None
        self._thread: Optional[threading.Thread] = None

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
