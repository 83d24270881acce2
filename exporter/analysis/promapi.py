"""The Prometheus HTTP API as the analysis commands read it: one place that sends a query
(``/api/v1/query`` or ``/api/v1/query_range``) and reads the answer (``status``, ``errorType``,
``error``, ``data.resultType``, ``data.result``), for the raw-sample reads of ``sources`` and the
server-evaluated queries of ``remote``.

The errors are one hierarchy: ``SourceError`` is history that cannot be read (a file or a
server); ``ServerError``, a ``SourceError``, is a server that could not be reached, did not
answer as the API does, or refused a query. Both are one line naming the URL; a refusal keeps
its reason, which Prometheus puts after the query it quotes (long when recorded series are
inlined), so a long message keeps its start and its end.
"""

from __future__ import annotations

from typing import Mapping, Optional


class SourceError(ValueError):
    """History that cannot be read; ``str()`` is one line naming the file or URL."""


class ServerError(SourceError):
    """The server could not be reached, did not answer as the Prometheus API does, or refused
    or failed a query; one line naming the URL. ``too_big``: the query ran into the server's own
    limits (its timeout, its samples per query), so a shorter range of it may pass."""

    too_big: bool = False


# what Prometheus (errorType timeout; --query.max-samples) and VictoriaMetrics (-search.max*) say
# when one query is too big for them
_TOO_BIG = ("too many samples", "maxSamplesPerQuery", "maxPointsPerTimeseries", "maxSeries",
            "query timed out", "timeout exceeded")


def _shorten(text: str, head: int = 200, tail: int = 400) -> str:
    return text if len(text) <= head + tail else text[:head] + " ... " + text[-tail:]


def fmt_seconds(ms: int) -> str:
    """Milliseconds as the API's seconds, exactly (``1700000000.250``)."""
    return f"{ms // 1000}.{ms % 1000:03d}" if ms >= 0 else f"{ms / 1000:.3f}"


def call(session, url: str, endpoint: str, params: Mapping[str, str], timeout_s: float, post: bool = False,
         expect: Optional[str] = None) -> list:
    """``data.result`` of one API call (``endpoint``: ``query`` or ``query_range``); ``expect``, a
    ``resultType`` the answer must have. ``ServerError`` on anything else."""
    import requests

    api = url.rstrip("/") + "/api/v1/" + endpoint
    query = str(params.get("query", ""))
    try:
        if post:
            resp = session.post(api, data=dict(params), timeout=timeout_s)
        else:
            resp = session.get(api, params=dict(params), timeout=timeout_s)
    except requests.RequestException as exc:
        raise ServerError(f"{url}: {type(exc).__name__}: {str(exc)[:200]}") from None
    try:
        body = resp.json()
    except ValueError:
        raise ServerError(f"{url}: HTTP {resp.status_code}, not a Prometheus API answer to "
                          f"{_shorten(query, 100, 60)!r}") from None
    if not isinstance(body, dict) or body.get("status") != "success":
        body = body if isinstance(body, dict) else {}
        full = str(body.get("error", ""))
        exc = ServerError(f"{url}: {endpoint} {_shorten(query, 100, 60)!r} failed: "
                          f"{body.get('errorType', '')} {_shorten(full)}".rstrip())
        exc.too_big = body.get("errorType") == "timeout" or any(x in full for x in _TOO_BIG)
        raise exc
    data = body.get("data") or {}
    if expect is not None and data.get("resultType") != expect:
        raise ServerError(f"{url}: {endpoint} {_shorten(query, 100, 60)!r} returned {data.get('resultType')!r}, "
                          f"expected a {expect}")
    return data.get("result") or []


def query_range(session, url: str, query: str, start_ms: int, end_ms: int, step_ms: int, timeout_s: float) -> list:
    """A range query (sent as a form: an inlined query can be longer than a URL may be)."""
    return call(session, url, "query_range", {"query": query, "start": fmt_seconds(start_ms),
                                              "end": fmt_seconds(end_ms), "step": f"{step_ms / 1000:g}s"},
                timeout_s, post=True, expect="matrix")


def query_range_split(session, url: str, query: str, times, step_ms: int, timeout_s: float,
                      on_query=None) -> list:
    """``query_range`` over the grid ``times`` (aligned to ``step_ms``), halved and sent again
    where the server finds a range too big for its limits (its timeout, ``--query.max-samples``),
    down to one evaluation; the answers of the pieces, concatenated (a series that spans pieces
    comes back once per piece). ``on_query(points)`` is told of each answered query."""
    pieces: list = []

    def go(a: int, b: int) -> None:
        try:
            result = query_range(session, url, query, int(times[a]), int(times[b - 1]), step_ms, timeout_s)
        except ServerError as exc:
            if not exc.too_big or b - a <= 1:
                raise
            mid = (a + b) // 2
            go(a, mid)
            go(mid, b)
            return
        if on_query is not None:
            on_query(sum(len(item.get("values") or []) for item in result))
        pieces.extend(result)

    if len(times):
        go(0, len(times))
    return pieces


def query(session, url: str, query: str, at_ms: int, timeout_s: float, post: bool = False,
          expect: Optional[str] = None) -> list:
    """An instant query at ``at_ms``."""
    return call(session, url, "query", {"query": query, "time": fmt_seconds(at_ms)}, timeout_s, post=post,
                expect=expect)
