"""The listener's own series: connections open, requests refused and connections closed by
reason, and whether the last read of the web configuration succeeded. Read on every scrape from
what the listener counts (``server.SidecarServer``), through a small interface of its own."""

from __future__ import annotations

from typing import Iterable, Mapping, Protocol

from prometheus_client.core import Metric

from .base import counter, gauge

REJECT_REASONS = ("max_requests", "unauthorized", "auth_busy", "rate_limit", "bad_request")
CLOSE_REASONS = ("header_timeout", "idle_timeout", "evicted", "tls")


class WebConfigState(Protocol):
    enabled: bool
    last_reload_ok: bool


class ListenerCounts(Protocol):
    """What the collector reads of the listener."""

    rejected: Mapping[str, int]  # by REJECT_REASONS
    closed: Mapping[str, int]  # by CLOSE_REASONS
    web: WebConfigState

    @property
    def open_connections(self) -> int: ...


class ListenerCollector:
    def __init__(self, listener: ListenerCounts) -> None:
        self.listener = listener

    def collect(self) -> Iterable[Metric]:
        srv = self.listener
        conns = gauge("http_connections_open", "Connections open on the listener.")
        conns.add_metric([], srv.open_connections)
        yield conns
        rej = counter("http_requests_rejected", "Requests the listener refused, by reason: max_requests (503), "
                      "unauthorized (401), auth_busy (503), rate_limit (429), bad_request (4xx).", ["reason"])
        for r in REJECT_REASONS:
            rej.add_metric([r], srv.rejected[r])
        yield rej
        closed = counter("http_connections_closed", "Connections the listener closed itself, by reason: "
                         "header_timeout, idle_timeout, evicted (pushed out when full), tls (handshake failed "
                         "or client certificate refused).", ["reason"])
        for r in CLOSE_REASONS:
            closed.add_metric([r], srv.closed[r])
        yield closed
        if srv.web.enabled:
            ok = gauge("web_config_last_reload_successful", "1 when the last read of --web.config.file "
                       "succeeded, 0 when the previous one stays in force.")
            ok.add_metric([], 1 if srv.web.last_reload_ok else 0)
            yield ok
