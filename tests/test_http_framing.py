"""HTTP/1.1 framing in both directions, by h11: the listener against hostile request heads and
the client (``fetch``) against hostile response heads, over real sockets on loopback. The
fuzzers are derandomized (the same examples every run) and bounded (150 each).

Regression tests for issue 18 (2): a ``POST`` whose body is a request (the shape of request
smuggling), ``Content-Length: ²`` (the byte 0xB2, which ``str.isdigit()`` took for a digit) on
both sides. Then two hypothesis fuzzers with a bounded number of examples (a few seconds):

- the listener: request heads built from valid and malformed pieces (methods, targets,
  versions, header names that are not tokens, control bytes, lengths that are not numbers,
  transfer codings, folded lines, over-long heads), with bodies that hold a second request, and
  raw random bytes. Every answer is well-framed HTTP/1.1 with a status from the listener's set
  (never a 500), one request sent is never more than one answer, every refusal (400, 413, 431,
  501, 505) is counted in ``bad_request``, and nothing is logged at ERROR (no traceback);
- the client: response heads built the same way, answered by ``tests/hostile_server.py``. A head
  with a malformed piece is a ``FetchError`` with reason ``protocol``; a valid one gives the body
  back byte for byte; random bytes give a ``FetchError`` with a known reason or a page, never
  another exception.
"""

from __future__ import annotations

import logging
import socket

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import FakeClock, page
from exporter.runtime.fetch import REASONS, FetchError, PageFetcher
from exporter.runtime.server import SidecarServer
from helpers import cfg, sidecar_with
from hostile_server import HostileServer

# bounded, and the same examples on every run (derandomized): a run's verdict never depends on luck
FUZZ = settings(max_examples=150, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
REFUSALS = {400, 413, 431, 501, 505}  # counted as bad_request
ANSWERS = REFUSALS | {200, 401, 404, 405, 429, 503}
SECOND = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"  # a request hidden in a body


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture(scope="module")
def listener():
    sc, _ = sidecar_with(FakeClock(), cfg(poll_interval=1, window=10), page("after_load.txt"))
    pub = sc.poll_once()
    errors = _Errors()
    logging.getLogger().addHandler(errors)
    srv = SidecarServer("127.0.0.1", 0, lambda: pub, lambda: True, header_timeout=30, idle_timeout=30)
    srv.start()
    try:
        yield srv, errors
    finally:
        srv.stop()
        logging.getLogger().removeHandler(errors)


def exchange(srv, data: bytes, shut: bool = True) -> bytes:
    """Send ``data`` on a new connection (then end the sending side), read until the server closes."""
    with socket.create_connection(srv.address[:2], timeout=30) as s:
        s.sendall(data)
        if shut:
            s.shutdown(socket.SHUT_WR)
        out = b""
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:  # closed with bytes unread: what was sent has come already
                break
            if not chunk:
                break
            out += chunk
        return out


def answers(data: bytes, head: bool = False) -> list:
    """The status codes of the well-framed HTTP/1.1 answers in ``data``; fails on anything else.
    ``head``: the request was a HEAD, its answer may come without the body it announces."""
    codes = []
    while data:
        head, sep, data = data.partition(b"\r\n\r\n")
        assert sep, f"an answer cut short: {head[:200]!r}"
        lines = head.split(b"\r\n")
        version, code, _ = lines[0].split(b" ", 2)
        assert version == b"HTTP/1.1", lines[0]
        headers = dict(line.lower().split(b": ", 1) for line in lines[1:])
        codes.append(int(code))
        n = int(headers[b"content-length"])
        if head and (not data or data.startswith(b"HTTP/1.1 ")):
            continue  # an answer to HEAD: no body
        assert len(data) >= n, "a body shorter than its Content-Length"
        data = data[n:]
    return codes


def checked(srv, errors, data: bytes, shut: bool = True) -> list:
    before = srv.rejected["bad_request"]
    codes = answers(exchange(srv, data, shut), head=data.startswith(b"HEAD "))
    assert all(c in ANSWERS for c in codes), codes
    tls = data.startswith(b"\x16")  # a TLS handshake on the plain port: counted, closed without an answer
    assert not (tls and codes), codes
    assert srv.rejected["bad_request"] - before == sum(c in REFUSALS for c in codes) + tls, codes
    assert not errors.records, [r.getMessage() for r in errors.records]
    return codes


# -- the listener: regressions ------------------------------------------------------------------

def test_a_post_whose_body_is_a_request_gets_one_answer(listener):
    srv, errors = listener
    smuggle = b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(SECOND), SECOND)
    assert checked(srv, errors, smuggle) == [405]
    chunked = (b"POST /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"%x\r\n%s\r\n0\r\n\r\n" % (len(SECOND), SECOND))
    assert checked(srv, errors, chunked) == [405]
    # a body that has not all arrived when the answer goes: the connection closes after it
    assert checked(srv, errors, smuggle[:-5], shut=False) == [405]
    # the same connection kept alive after a body read past: the next request is a real one
    two = smuggle + SECOND
    assert checked(srv, errors, two) == [405, 200]


def test_content_length_that_is_not_ascii_digits_is_a_counted_400(listener):
    srv, errors = listener
    for value in (b"\xb2", b"\xd9\xa3", b"-1", b"1, 2", b"0x10", b"1 2"):  # ², Arabic-Indic 3, ...
        head = b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: " + value + b"\r\n\r\n"
        assert checked(srv, errors, head) == [400], value


def test_heads_h11_refuses_are_answered_with_its_status(listener):
    srv, errors = listener
    cases = {
        b"GET /metrics HTTP/1.1\r\n\r\n": 400,  # no Host
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nBad Name: v\r\n\r\n": 400,  # a name that is not a token
        b"GET /metrics HTTP/1.1\r\n folded\r\nHost: x\r\n\r\n": 400,  # (a fold after a header h11 joins)
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n": 501,
        b"GET /metrics HTTP/2.0\r\nHost: x\r\n\r\n": 505,
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 17000 + b"\r\n\r\n": 431,
        b"GET metrics HTTP/1.1\r\nHost: x\r\n\r\n": 400,  # not a target this server has
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc": 413,
    }
    for head, code in cases.items():
        assert checked(srv, errors, head) == [code], head[:80]


# -- the listener: fuzzing ----------------------------------------------------------------------

_no_crlf = st.binary(max_size=24).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b""))
_token = st.sampled_from([b"GET", b"HEAD", b"POST", b"PUT", b"OPTIONS", b"get", b"G\xc9T", b""])
_target = st.one_of(st.sampled_from([b"/metrics", b"/healthz", b"/readyz", b"/", b"/nope", b"*",
                                     b"http://x/metrics", b"/metrics?x=1", b"metrics", b"/a b"]), _no_crlf)
_version = st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"HTTP/1.1 ", b"HTTP/11", b"http/1.1", b""])
_name = st.one_of(st.sampled_from([b"Host", b"Accept", b"Accept-Encoding", b"Connection", b"X-A", b"Bad Name",
                                   b"X\xb2", b"", b"X-A ", b" X-A", b"Content-Length", b"Transfer-Encoding"]),
                  _no_crlf)
_value = st.one_of(st.sampled_from([b"x", b"gzip", b"close", b"keep-alive", b"\xb2", b"-1", b"1, 2", b"chunked",
                                    b"gzip, chunked", b"text/plain", b"a\x00b", b"a\x7fb", b"0"]), _no_crlf)
_line = st.one_of(st.tuples(_name, _value).map(lambda nv: nv[0] + b": " + nv[1]),
                  st.sampled_from([b" folded", b"\tfolded", b"no colon", b":empty name"]), _no_crlf)


@st.composite
def requests(draw):
    """One request: a head of valid and malformed pieces, and a body only when a framing is
    declared (then it holds a second request, which must never be answered)."""
    lines = [draw(_token) + b" " + draw(_target) + b" " + draw(_version)]
    if draw(st.booleans()):
        lines.append(b"Host: x")
    lines += draw(st.lists(_line, max_size=6))
    if draw(st.integers(0, 9)) == 0:
        lines.append(b"X-Pad: " + b"a" * draw(st.sampled_from([16000, 16400, 40000])))
    framing = draw(st.sampled_from(["none", "length", "chunked"]))
    body = b""
    if framing == "length":
        lines.append(b"Content-Length: %d" % len(SECOND))
        body = SECOND
    elif framing == "chunked":
        lines.append(b"Transfer-Encoding: chunked")
        body = b"%x\r\n%s\r\n0\r\n\r\n" % (len(SECOND), SECOND)
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


@FUZZ
@given(data=requests())
def test_fuzzed_request_heads_get_one_counted_answer_at_most(listener, data):
    srv, errors = listener
    assert len(checked(srv, errors, data)) <= 1  # one request sent: never a second answer


@FUZZ
@given(data=st.one_of(st.binary(max_size=300), st.binary(max_size=300).map(lambda b: b"\x16" + b)))
def test_random_bytes_get_well_framed_counted_answers(listener, data):
    srv, errors = listener
    checked(srv, errors, data)


# -- the client ---------------------------------------------------------------------------------

BODY = page("idle.txt").encode()


@pytest.fixture(scope="module")
def hostile():
    server = HostileServer(lambda: BODY.decode()).start()
    try:
        yield server
    finally:
        server.stop()


def fetch(server, raw: bytes):
    server.set_raw(raw)
    fetcher = PageFetcher(server.url + "/metrics", timeout=10, max_bytes=1 << 20)
    try:
        return fetcher.fetch()
    finally:
        fetcher.close()


def test_content_length_that_is_not_ascii_digits_is_protocol_for_the_client(hostile):
    for value in (b"\xb2", b"\xd9\xa3", b"-1", b"1, 2", b"0x10"):
        with pytest.raises(FetchError) as e:
            fetch(hostile, b"HTTP/1.1 200 OK\r\nContent-Length: " + value + b"\r\n\r\n" + BODY)
        assert e.value.reason == "protocol", (value, e.value.message)


def test_a_poll_with_a_bad_content_length_counts_protocol_not_internal(hostile, caplog):
    """The issue's case end to end: the sidecar's poll fails as ``protocol``, not ``internal``
    (which would log a traceback and reset the windows), and nothing is logged with a traceback."""
    clock = FakeClock()
    fetcher = PageFetcher(hostile.url + "/metrics", timeout=10, max_bytes=1 << 20)
    sc, _ = sidecar_with(clock, cfg(poll_interval=1, window=10))
    sc.fetch = fetcher.fetch
    hostile.set_fault("ok")
    sc.poll_once()
    hostile.set_raw(b"HTTP/1.1 200 OK\r\nContent-Length: \xb2\r\n\r\n" + BODY)
    clock.advance(1)
    with caplog.at_level(logging.WARNING):
        sc.poll_once()
    fetcher.close()
    assert sc.counters.errors[("vllm", "protocol")] == 1
    assert sc.counters.errors[("vllm", "internal")] == 0
    assert not [r for r in caplog.records if r.exc_info]


_status = st.sampled_from([(b"HTTP/1.1 200 OK", True), (b"HTTP/1.0 200 OK", True), (b"HTTP/1.1 200 ", True),
                           (b"HTTP/1.1 2000 OK", False), (b"HTTP/1.1 abc OK", False), (b"HTTP/3.0 200 OK", False),
                           (b"HTTP/1.1 20 OK", False), (b"HTTP/1.1\x00200 OK", False), (b"HTTP/1.1 200 O\x00K", False)])
_good_header = st.sampled_from([b"Content-Type: text/plain; version=0.0.4", b"X-A: b", b"Server: hostile",
                                b"Date: Mon, 01 Jan 2024 00:00:00 GMT", b"X-Empty:"])
_bad_header = st.sampled_from([b"Bad Name: v", b"X\xb2: v", b"no colon", b": empty name",
                               b"X-A: a\x00b", b"Content-Length: \xb2", b"Content-Length: -1",
                               b"Content-Length: 1, 2", b"Transfer-Encoding: gzip", b"X-A : b"])


@st.composite
def responses(draw):
    """(raw answer, well-formed?): a status line, headers of which some may be malformed, the
    body framed by Content-Length (or by the close, for HTTP/1.0 style)."""
    status, ok = draw(_status)
    lines = [status] + draw(st.lists(_good_header, max_size=4))
    bad = draw(st.lists(_bad_header, max_size=2))
    ok = ok and not bad
    for b in bad:
        lines.insert(draw(st.integers(1, len(lines))), b)
    if draw(st.booleans()):
        lines.append(b"Content-Length: %d" % len(BODY))
    return b"\r\n".join(lines) + b"\r\n\r\n" + BODY, ok


@FUZZ
@given(case=responses())
def test_fuzzed_response_heads_are_protocol_or_the_page(hostile, case):
    raw, ok = case
    if ok:
        assert fetch(hostile, raw) == BODY.decode()
    else:
        with pytest.raises(FetchError) as e:
            fetch(hostile, raw)
        assert e.value.reason == "protocol", e.value.message


@FUZZ
@given(raw=st.one_of(st.binary(max_size=300), st.binary(max_size=300).map(lambda b: b"HTTP/1.1 " + b)))
def test_random_answers_are_a_known_reason_or_a_page(hostile, raw):
    try:
        fetch(hostile, raw)
    except FetchError as e:
        assert e.reason in REASONS and e.reason != "timeout", e.message
