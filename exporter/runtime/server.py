"""Serving ``/metrics``, ``/healthz`` and ``/readyz``.

``/healthz`` answers 200 while the process lives and its poll loop is not wedged; ``/readyz``
answers 200 once the configuration is loaded and the server is serving. Neither looks at vLLM:
a sidecar's probe must never take its vLLM pod out of service; vLLM's state is what
``vllm_sidecar_target_up{target="vllm"}`` says.
"""

from __future__ import annotations

import gzip
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable, Optional, Tuple

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.process_collector import ProcessCollector

from .collectors import SidecarCollector
from .state import Published

log = logging.getLogger("vllm_sidecar.http")


def make_registry(state: Callable[[], Published]) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(SidecarCollector(state))
    ProcessCollector(namespace="vllm_sidecar", registry=registry)
    return registry


class _Handler(BaseHTTPRequestHandler):
    server_version = "vllm-sidecar-exporter"
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt: str, *args) -> None:  # access logs would be one line per scrape
        return

    def _send(self, code: int, body: bytes, ctype: str = "text/plain; charset=utf-8", extra=None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_HEAD(self) -> None:  # noqa: N802
        self.do_GET()

    def do_GET(self) -> None:  # noqa: N802
        app: "SidecarServer" = self.server.app  # type: ignore[attr-defined]
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            encoder, ctype = choose_encoder(self.headers.get("Accept", ""))
            try:
                body = encoder(app.registry)
            except Exception:  # a collector bug must show as a 500, not kill the server
                log.exception("building /metrics failed")
                self._send(500, b"building metrics failed\n")
                return
            extra = {}
            if "gzip" in self.headers.get("Accept-Encoding", ""):
                body = gzip.compress(body, compresslevel=5)
                extra["Content-Encoding"] = "gzip"
            self._send(200, body, ctype, extra)
        elif path == "/healthz":
            if app.healthy():
                self._send(200, b"ok\n")
            else:
                self._send(503, b"poll loop wedged\n")
        elif path == "/readyz":
            if app.ready.is_set():
                self._send(200, b"ready\n")
            else:
                self._send(503, b"starting\n")
        elif path == "/":
            self._send(200, b"vllm-sidecar-exporter: /metrics /healthz /readyz\n")
        else:
            self._send(404, b"not found\n")


class SidecarServer:
    def __init__(self, host: str, port: int, state: Callable[[], Published], healthy: Callable[[], bool]) -> None:
        self.registry = make_registry(state)
        self.healthy = healthy
        self.ready = threading.Event()
        self.httpd = ThreadingHTTPServer((host, port), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.app = self  # type: ignore[attr-defined]
        self._thread: Optional[threading.Thread] = None

    @property
    def address(self) -> Tuple[str, int]:
        return self.httpd.server_address[:2]

    def start(self) -> None:
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="http", daemon=True)
        self._thread.start()
        self.ready.set()

    def stop(self) -> None:
        self.ready.clear()
        self.httpd.shutdown()
        self.httpd.server_close()
