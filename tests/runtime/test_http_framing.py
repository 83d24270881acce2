"""HTTP/1.1 framing in both directions: the listener (h11) against hostile request heads and the
client (``fetch``, llhttp through httptools since issue 29) against hostile answers, over real
sockets on loopback. The fuzzers are derandomized (the same examples every run) and bounded
(150 each).

Regression tests for issue 18 (2): a ``POST`` whose body is a request (the shape of request
smuggling), ``Content-Length: ²`` (the byte 0xB2, which ``str.isdigit()`` took for a digit) on
both sides. Then two hypothesis fuzzers with a bounded number of examples (a few seconds):

- the listener: request heads built from valid and malformed pieces (methods, targets,
  versions, header names that are not tokens, control bytes, lengths that are not numbers,
  transfer codings, folded lines, over-long heads), with bodies that hold a second request, and
  raw random bytes. Every answer is well-framed HTTP/1.1 with a status from the listener's set
  (never a 500), one request sent is never more than one answer, every refusal (400, 413, 431,
  501, 505) is counted in ``bad_request``, and nothing is logged at ERROR (no traceback);
- the client: answers built the same way (status lines, headers, framed by length, by chunks
  with extensions and trailers, or by the close, after interim answers or not), answered by
  ``tests/hostile_server.py``. An answer with a malformed piece is a ``FetchError`` with reason
  ``protocol``; a valid one gives the body back byte for byte; random bytes give a
  ``FetchError`` with a known reason or a page, never another exception. The same answers cut
  into pieces at any points (one ``recv`` each) read the same as whole: the framing does not
  depend on where the network splits an answer. And what llhttp lets through that h11 refused
  (``RTSP/`` and ``ICE/`` status lines, NUL and DEL in the reason phrase, transfer codings
  other than ``chunked``, a CRLF after a body) is still refused, by the fetcher's own checks.
"""

from __future__ import annotations

import gzip
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
                           (b"HTTP/1.1 20 OK", False), (b"HTTP/1.1\x00200 OK", False), (b"HTTP/1.1 200 O\x00K", False),
                           # what llhttp itself takes and the fetcher refuses
                           (b"RTSP/1.0 200 OK", False), (b"ICE/1.0 200 OK", False), (b"HTTP/2.0 200 OK", False),
                           (b"HTTP/0.9 200 OK", False), (b"HTTP/1.1 200 O\x7fK", False), (b"HTTP/1.1 200 O\x01K", False),
                           (b"HTTP/1.1 200 O\tK \xff", True), (b"HTTP/1.1 200", True)])
_good_header = st.sampled_from([b"Content-Type: text/plain; version=0.0.4", b"X-A: b", b"Server: hostile",
                                b"Date: Mon, 01 Jan 2024 00:00:00 GMT", b"X-Empty:"])
_bad_header = st.sampled_from([b"Bad Name: v", b"X\xb2: v", b"no colon", b": empty name",
                               b"X-A: a\x00b", b"Content-Length: \xb2", b"Content-Length: -1",
                               b"Content-Length: 1, 2", b"Transfer-Encoding: gzip", b"X-A : b",
                               b"Transfer-Encoding: identity", b"Transfer-Encoding: chunked, gzip", b"X-A: a\rb",
                               b" folded"])  # obs-fold: h11 joined it, llhttp refuses it (docs/reliability.md)
_interim = st.sampled_from([b"", b"HTTP/1.1 100 Continue\r\n\r\n",
                            b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\nHTTP/1.1 100 Continue\r\n\r\n"])


def chunked(body: bytes, size: int, ext: bool, trailer: bool) -> bytes:
    out = [b"%x%s\r\n%s\r\n" % (len(body[i:i + size]), b";a=b" if ext else b"", body[i:i + size])
           for i in range(0, len(body), size)]
    return b"".join(out) + b"0\r\n" + (b"X-Trailer: yes\r\n" if trailer else b"") + b"\r\n"


@st.composite
def responses(draw):
    """(raw answer, well-formed?): interim answers or none, a status line, headers of which some
    may be malformed, the body framed by Content-Length, by chunks (extensions, a trailer), or by
    the close (HTTP/1.0 style), plain or gzip."""
    status, ok = draw(_status)
    lines = [status] + draw(st.lists(_good_header, max_size=4))
    bad = draw(st.lists(_bad_header, max_size=2))
    ok = ok and not bad
    for b in bad:
        lines.insert(draw(st.integers(1, len(lines))), b)
    body = BODY
    if draw(st.booleans()):
        body = gzip.compress(BODY, 1)
        lines.append(b"Content-Encoding: gzip")
    framing = draw(st.sampled_from(["length", "chunked", "close"]))
    if framing == "length":
        lines.append(b"Content-Length: %d" % len(body))
    elif framing == "chunked":
        lines.append(b"Transfer-Encoding: chunked")
        body = chunked(body, draw(st.sampled_from([1000, 7000, 1 << 20])), draw(st.booleans()), draw(st.booleans()))
    return draw(_interim) + b"\r\n".join(lines) + b"\r\n\r\n" + body, ok


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


# -- the client: an answer cut anywhere reads as the whole ----------------------------------------

class Pieces:
    """A socket that hands out ``pieces`` one per ``recv``, then the close. ``fileno`` is one end
    of a real socket pair, readable while pieces are left, so that the fetcher's idle and
    after-the-answer checks (``poll``, then a peek) see what a real connection would."""

    def __init__(self, pieces) -> None:
        self.pieces = list(pieces)
        self.a, self.b = socket.socketpair()
        self._signal()

    def _signal(self) -> None:
        self.a.setblocking(False)
        try:
            while self.a.recv(64):
                pass
        except BlockingIOError:
            pass
        if self.pieces:
            self.b.send(b"x")

    def fileno(self) -> int:
        return self.a.fileno()

    def settimeout(self, _t) -> None:
        pass

    def sendall(self, _data) -> None:
        pass

    def recv(self, n: int, flags: int = 0) -> bytes:
        if flags & socket.MSG_PEEK:
            return self.pieces[0][:n] if self.pieces else b""
        if not self.pieces:
            return b""
        head = self.pieces.pop(0)
        if len(head) > n:  # as a socket would: the rest at the next recv
            head, rest = head[:n], head[n:]
            self.pieces.insert(0, rest)
        self._signal()
        return head

    def recv_into(self, view, n: int) -> int:
        data = self.recv(n)
        view[:len(data)] = data
        return len(data)

    def shutdown(self, _how) -> None:
        pass

    def close(self) -> None:
        self.a.close()
        self.b.close()


def read_in_pieces(raw: bytes, cuts) -> str:
    """``raw`` as the answer, received in the pieces ``cuts`` makes of it."""
    at = sorted({c % (len(raw) + 1) for c in cuts} | {0, len(raw)})
    pieces = [raw[a:b] for a, b in zip(at, at[1:]) if b > a]
    # in memory: nothing waits, so the deadline only has to outlast the CPU work of up to 70,000
    # one-byte reads on a busy machine (10 s did not, beside the real vLLM test at the run's start)
    fetcher = PageFetcher("http://127.0.0.1:9/metrics", timeout=300, max_bytes=1 << 20)
    sock = Pieces(pieces)

    def connect(_deadline) -> None:
        fetcher._sock = sock
        fetcher.connections += 1
    fetcher._connect = connect  # type: ignore[method-assign]
    try:
        return fetcher.fetch()
    finally:
        sock.close()


def outcome(fn):
    try:
        return ("page", fn())
    except FetchError as e:
        return ("error", e.reason)


@FUZZ
@given(case=responses(), cuts=st.lists(st.integers(0, 1 << 30), max_size=12))
def test_an_answer_cut_anywhere_reads_as_the_whole(case, cuts):
    raw, ok = case
    whole = outcome(lambda: read_in_pieces(raw, []))
    assert whole == (("page", BODY.decode()) if ok else ("error", "protocol")), whole
    assert outcome(lambda: read_in_pieces(raw, cuts)) == whole
    # and byte by byte through the head (where the fetcher keeps its own offsets)
    assert outcome(lambda: read_in_pieces(raw, range(raw.find(b"\r\n\r\n", raw.find(b" 200")) + 5))) == whole


# -- the client: what llhttp lets through, refused by the fetcher's own checks ------------------

OK_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"


@pytest.mark.parametrize("raw,why", [
    (b"RTSP/1.0 200 OK\r\nContent-Length: 3\r\n\r\nabc", "does not start with an HTTP/1.x status line"),
    (b"ICE/1.0 200 OK\r\nContent-Length: 3\r\n\r\nabc", "does not start with an HTTP/1.x status line"),
    (b"HTTP/1.1 100 Continue\r\n\r\nRTSP/1.0 200 OK\r\nContent-Length: 3\r\n\r\nabc",
     "does not start with an HTTP/1.x status line"),
    (b"HTTP/2.0 200 OK\r\nContent-Length: 3\r\n\r\nabc", "does not start with an HTTP/1.x status line"),
    (b"HTTP/1.1 200 O\x00K\r\nContent-Length: 3\r\n\r\nabc", "control character"),
    (OK_HEAD + b"Transfer-Encoding: identity\r\n\r\nabc", "other than chunked"),
    (OK_HEAD + b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
     "other than chunked"),
    (OK_HEAD + b"Content-Length: 3\r\n\r\nabc\r\n", "bytes after the end of the answer"),
    (OK_HEAD + b"Content-Length: 3\r\n\r\nabcHTTP/1.1 200 OK\r\n\r\n", "bytes after the end of the answer"),
    (OK_HEAD + b"Content-Length: 3\r\nContent-Length: 3\r\n\r\nabc", "Duplicate Content-Length"),
    (OK_HEAD + b"Content-Length: 3\r\n\r\nabc\r\n" + b"HTTP/1.1 100 Continue\r\n\r\n" * 9,
     "bytes after the end of the answer"),
    (b"HTTP/1.1 100 Continue\r\n\r\n" * 9 + OK_HEAD + b"Content-Length: 3\r\n\r\nabc", "interim"),
    (b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n", "switched protocols"),
    (OK_HEAD + b"X-A: " + b"a" * 70000 + b"\r\nContent-Length: 3\r\n\r\nabc", "header block over 64 KiB"),
    (OK_HEAD + b"".join(b"X-%d: a\r\n" % i for i in range(101)) + b"Content-Length: 3\r\n\r\nabc", "header lines"),
])
def test_what_llhttp_takes_and_the_fetcher_refuses(raw, why):
    for cuts in ([], range(len(raw))):  # whole, and a byte per recv
        with pytest.raises(FetchError) as e:
            read_in_pieces(raw, cuts)
        assert e.value.reason == "protocol" and why in e.value.message, e.value.message


def test_chunk_framing_and_trailers_are_capped(hostile):
    """Bytes that are neither head nor body (chunk-size lines, extensions, trailers) are not kept
    but capped: an endless trailer or extension is ``protocol`` at about 128 KiB, not a timeout."""
    trailers = OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n" + b"X-T: " + b"a" * 60 + b"\r\n" * 1
    trailers += b"".join(b"X-T%d: %s\r\n" % (i, b"a" * 60) for i in range(4000))  # 270 KB of trailers
    ext = OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n3;" + b"a" * 300_000 + b"\r\nabc\r\n0\r\n\r\n"
    for raw in (trailers, ext):
        with pytest.raises(FetchError) as e:
            fetch(hostile, raw)
        assert e.value.reason == "protocol" and "cap" in e.value.message, e.value.message
    # a page in one-byte chunks (6 framing bytes per body byte) is read
    body = b"vllm:num_requests_running 1\n" * 400
    ok = OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n" + chunked(body, 1, False, True)
    assert fetch(hostile, ok) == body.decode()


def test_keep_alive_as_before():
    """HTTP/1.1 framed by length or chunks keeps the connection; HTTP/1.0 (even with
    ``Connection: keep-alive``), ``Connection: close`` and a body framed by the close do not."""
    cases = {
        OK_HEAD + b"Content-Length: 3\r\n\r\nabc": True,
        OK_HEAD + b"Transfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n": True,
        OK_HEAD + b"Connection: close\r\nContent-Length: 3\r\n\r\nabc": False,
        b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 3\r\n\r\nabc": False,
        OK_HEAD + b"\r\nabc": False,
    }
    for raw, kept in cases.items():
        fetcher = PageFetcher("http://127.0.0.1:9/metrics", timeout=10, max_bytes=1 << 20)
        sock = Pieces([raw])
        fetcher._connect = lambda _d, f=fetcher, s=sock: setattr(f, "_sock", s)  # type: ignore[method-assign]
        assert fetcher.fetch() == "abc"
        assert (fetcher._sock is sock) == kept, raw
        sock.close()
