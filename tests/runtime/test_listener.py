"""The listener against real sockets on loopback: TLS with certificates the test makes, basic
auth, mTLS, certificate rotation, the request limit, header and idle timeouts, a crowd of idle
connections, IPv6, gzip negotiation, and web-config errors at start. No timing assertions: a
wait for a condition has a generous deadline and only fails when the condition never comes."""

import base64
import contextlib
import gzip
import http.client
import os
import socket
import ssl
import subprocess
import sys
import threading
from contextlib import closing

import bcrypt
import pytest

from conftest import ROOT, page
from exporter.errors import ConfigError
from exporter.runtime import webconfig
from exporter.runtime.server import SidecarServer, accepts_gzip
from helpers import cfg, sidecar_with
from pki import PKI
from shared import poll_until, run_cli

# Timeouts sized for a loaded machine (two shared cores, other suites running): IO_TIMEOUT bounds
# any read a test makes and is never waited out when things work; WAITED is a server timeout a
# test waits out on purpose (header, idle), long enough that a TLS handshake or a request on a
# starved machine finishes well inside it (0.3 s did not), short enough to keep the test quick.
IO_TIMEOUT = 30
WAITED = 2.0

PASSWORD = "s3cret-scrape"
HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()  # cost 4: fast tests


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


IPV6 = _has_ipv6_loopback()


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return PKI(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def published():
    from conftest import FakeClock

    sc, _ = sidecar_with(FakeClock(), cfg(poll_interval=1, window=10), page("after_load.txt"))
    return sc.poll_once()


def _listener_threads():
    return [t for t in threading.enumerate() if t.name.startswith("http")]


@contextlib.contextmanager
def serving(published, cls=SidecarServer, host="127.0.0.1", lambda_state=None, **kw):
    srv = cls(host, 0, lambda_state or (lambda: published), lambda: True, **kw)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()
        assert not _listener_threads(), "the listener left threads behind"


def web_file(tmp_path, text, name="web.yml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def tls_yaml(pki, extra=""):
    return (f"tls_server_config:\n  cert_file: {pki.path('server.crt')}\n  key_file: {pki.path('server.key')}\n"
            + extra)


def client_ctx(pki, cert=None):
    ctx = ssl.create_default_context(cafile=pki.path("ca.crt"))
    if cert:
        ctx.load_cert_chain(pki.path(cert + ".crt"), pki.path(cert + ".key"))
    return ctx


def basic(user, password):
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def request(conn, path="/metrics", method="GET", **headers):
    conn.request(method, path, headers=headers)
    r = conn.getresponse()
    return r, r.read()


def https(srv, pki, cert=None):
    host, port = srv.address
    return http.client.HTTPSConnection(host, port, context=client_ctx(pki, cert), timeout=IO_TIMEOUT)


def plain(srv):
    host, port = srv.address
    return http.client.HTTPConnection(host, port, timeout=IO_TIMEOUT)


def read_response_head(sock):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    return data


# -- TLS and basic auth ----------------------------------------------------------------------------

def test_tls_and_basic_auth_over_real_connections(tmp_path, pki, published):
    path = web_file(tmp_path, tls_yaml(pki) + f"basic_auth_users:\n  prometheus: '{HASH}'\n"
                    "http_server_config:\n  headers:\n    X-Content-Type-Options: nosniff\n")
    with serving(published, web=path) as srv:
        assert srv.scheme == "https"
        c = https(srv, pki)
        r, _ = request(c)  # no password
        assert r.status == 401 and r.getheader("WWW-Authenticate").startswith("Basic")
        r, _ = request(c, Authorization=basic("prometheus", "wrong"))
        assert r.status == 401 and r.getheader("WWW-Authenticate").startswith("Basic")
        r, _ = request(c, Authorization=basic("nobody", PASSWORD))
        assert r.status == 401
        r, _ = request(c, Authorization="Bearer " + PASSWORD)
        assert r.status == 401
        r, body = request(c, Authorization=basic("prometheus", PASSWORD))  # the same TLS connection, kept alive
        assert r.status == 200 and b"vllm_sidecar_build_info" in body
        assert r.getheader("X-Content-Type-Options") == "nosniff"
        r, body = request(c, method="HEAD", Authorization=basic("prometheus", PASSWORD))
        assert r.status == 200 and body == b"" and int(r.getheader("Content-Length")) > 0
        r, _ = request(c, "/", Authorization=basic("prometheus", "wrong"))
        assert r.status == 401
        c.close()
        c = https(srv, pki)  # probes need no password
        assert request(c, "/healthz")[0].status == 200
        assert request(c, "/readyz")[0].status == 200
        c.close()
        assert srv.rejected["unauthorized"] == 5


def test_plain_http_to_the_tls_port_is_refused(tmp_path, pki, published):
    with serving(published, web=web_file(tmp_path, tls_yaml(pki))) as srv:
        c = plain(srv)
        with pytest.raises((http.client.HTTPException, ConnectionError)):
            request(c, "/healthz")
        c.close()
        c = https(srv, pki)
        assert request(c, "/healthz")[0].status == 200
        c.close()
        host, port = srv.address  # a client that does not trust the server's CA
        c = http.client.HTTPSConnection(host, port, context=ssl.create_default_context(), timeout=IO_TIMEOUT)
        with pytest.raises(ssl.SSLCertVerificationError):
            request(c, "/healthz")
        c.close()


def test_tls_handshake_to_a_plain_port_is_refused(published, pki):
    with serving(published) as srv:
        with closing(https(srv, pki)) as c, pytest.raises((ssl.SSLError, ConnectionError)):
            request(c, "/healthz")
        with closing(plain(srv)) as c:
            assert request(c, "/healthz")[0].status == 200


def test_mtls_needs_a_client_certificate_from_the_ca(tmp_path, pki, published):
    path = web_file(tmp_path, tls_yaml(pki, f"  client_auth_type: RequireAndVerifyClientCert\n"
                                            f"  client_ca_file: {pki.path('ca.crt')}\n"))
    with serving(published, web=path) as srv:
        for cert in (None, "rogue"):  # no certificate; one from a CA the server does not trust
            c = https(srv, pki, cert)
            with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException)):
                request(c)
            c.close()
        c = https(srv, pki, "client")
        r, body = request(c)
        assert r.status == 200 and b"vllm_sidecar_build_info" in body
        c.close()
        assert srv.closed["tls"] == 2


def test_client_allowed_sans(tmp_path, pki, published):
    path = web_file(tmp_path, tls_yaml(pki, f"  client_auth_type: RequireAndVerifyClientCert\n"
                                            f"  client_ca_file: {pki.path('ca.crt')}\n"
                                            "  client_allowed_sans: [prometheus.monitoring.svc]\n"))
    with serving(published, web=path) as srv:
        c = https(srv, pki, "other-client")  # signed by the CA, but not an allowed name
        with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException)):
            request(c)
        c.close()
        c = https(srv, pki, "client")
        assert request(c)[0].status == 200
        c.close()


def test_inline_pem_certificate_key_and_client_ca(tmp_path, pki, published):
    def block(name):
        return "|\n" + "".join("    " + line + "\n" for line in (pki.dir / name).read_text().splitlines())

    path = web_file(tmp_path, f"tls_server_config:\n  cert: {block('server.crt')}  key: {block('server.key')}"
                              f"  client_ca: {block('ca.crt')}  client_auth_type: RequireAndVerifyClientCert\n")
    with serving(published, web=path) as srv:
        with closing(https(srv, pki, "client")) as c:
            assert request(c)[0].status == 200


def _served_serial(srv, pki):
    host, port = srv.address
    with socket.create_connection((host, port), timeout=IO_TIMEOUT) as raw:
        with client_ctx(pki).wrap_socket(raw, server_hostname="localhost") as s:
            from cryptography import x509

            return x509.load_der_x509_certificate(s.getpeercert(binary_form=True)).serial_number


def test_certificate_rotation_and_a_bad_reread_without_restart(tmp_path, pki, published):
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes((pki.dir / "server.crt").read_bytes())
    key.write_bytes((pki.dir / "server.key").read_bytes())
    path = web_file(tmp_path, "tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n")  # relative
    with serving(published, web=path) as srv:
        assert _served_serial(srv, pki) == 1001
        pki.server_cert("rotated", serial=2002)  # as a Secret update does: new files renamed into place
        for name in ("crt", "key"):
            tmp = tmp_path / f"new.{name}"
            tmp.write_bytes((pki.dir / f"rotated.{name}").read_bytes())
            os.replace(tmp, tmp_path / f"tls.{name}")
        assert _served_serial(srv, pki) == 2002  # the next connection, no restart
        good = (tmp_path / "web.yml").read_text()
        (tmp_path / "web.yml").write_text(good + "basic_auth_users:\n  prometheus: not-a-hash\n")
        assert _served_serial(srv, pki) == 2002  # refused: the previous configuration stays
        assert srv.web.last_reload_ok is False
        with closing(https(srv, pki)) as c:
            r, body = request(c)
        assert r.status == 200 and b"vllm_sidecar_web_config_last_reload_successful 0.0" in body


# -- limits and timeouts -------------------------------------------------------------------------

class GatedServer(SidecarServer):
    """Encoding waits for the test's gate: scrapes stay in flight as long as the test wants."""

    gate: threading.Event
    encodes = 0

    def _encode(self, encoder, pub):
        type(self).encodes += 1
        self.gate.wait(IO_TIMEOUT)
        return super()._encode(encoder, pub)


def _send(srv, path="/metrics", extra=""):
    s = socket.create_connection(srv.address[:2], timeout=IO_TIMEOUT)
    s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n{extra}\r\n".encode())
    return s


class Clock:
    """The listener's clock (ages of bodies and encodings), moved by the test."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_503_with_retry_after_beyond_max_requests(published):
    GatedServer.gate = threading.Event()
    clock = Clock()
    with serving(published, cls=GatedServer, max_requests=2, clock=clock) as srv:
        held = []
        try:
            held = [_send(srv), _send(srv)]
            poll_until(lambda: srv.inflight == 2, "two scrapes in flight", every=0.01)
            clock.t += 2  # the encoding has run for two seconds: bodies are not built fast enough
            with closing(plain(srv)) as c:
                r, _ = request(c)
                assert r.status == 503 and r.getheader("Retry-After") == "1"
                assert request(c, "/healthz")[0].status == 200  # probes are not held up
            GatedServer.gate.set()
            for s in held:
                assert read_response_head(s).startswith(b"HTTP/1.1 200 ")
        finally:
            GatedServer.gate.set()
            for s in held:
                s.close()
        assert srv.rejected["max_requests"] == 1


def test_scrapes_answered_from_a_ready_body_are_never_refused(published):
    with serving(published, max_requests=1) as srv:
        with closing(plain(srv)) as c:
            assert request(c)[0].status == 200  # the body is built
        crowd = [_send(srv) for _ in range(20)]
        try:
            assert all(read_response_head(s).startswith(b"HTTP/1.1 200 ") for s in crowd)
        finally:
            for s in crowd:
                s.close()
        assert srv.rejected["max_requests"] == 0


def test_rate_limit_answers_429(tmp_path, published):
    with serving(published, web=web_file(tmp_path, "rate_limit:\n  interval: 1h\n  burst: 2\n")) as srv:
        with closing(plain(srv)) as c:
            assert [request(c)[0].status for _ in range(3)] == [200, 200, 429]
            assert request(c, "/healthz")[0].status == 200  # probes are not limited


def test_one_encoding_per_published_state(published):
    GatedServer.gate = threading.Event()
    GatedServer.gate.set()
    GatedServer.encodes = 0
    with serving(published, cls=GatedServer) as srv:
        with closing(plain(srv)) as c:
            bodies = [request(c)[1] for _ in range(5)]
            zipped = [request(c, **{"Accept-Encoding": "gzip"})[1] for _ in range(3)]
        assert len(set(bodies)) == 1 and len(set(zipped)) == 1
        assert gzip.decompress(zipped[0]) == bodies[0]
        assert GatedServer.encodes == 1  # within a second of the first, same state: one encoding


def _value(body: bytes, series: str) -> float:
    for line in body.decode().splitlines():
        if line.startswith(series + " "):
            return float(line.split(" ")[1])
    raise AssertionError(f"{series} not in the body")


@pytest.mark.parametrize("polls_between", [2, 8])
def test_a_scrape_shows_the_latest_completed_poll_whatever_the_cadence(polls_between):
    """Issue 18 (1): a steady page, a scrape, then a burst; the next scrape comes 4 s later,
    after several polls of the new page. It must show the newest poll (its success time, the
    burst's tokens/s and TTFT), never the body made for the scrape before. The poll loop and
    both clocks are driven by the test."""
    from conftest import FakeClock

    clock = FakeClock()
    interval = 4.0 / polls_between
    sc, seq = sidecar_with(clock, cfg(poll_interval=interval, window=10), page("after_load.txt"))
    for _ in range(3):  # vLLM's page is steady
        sc.poll_once()
        clock.advance(interval)
    listener_clock = Clock()
    last_success = 'vllm_sidecar_last_success_timestamp_seconds{target="vllm"}'
    tokens = 'vllm_sidecar_generation_tokens_per_second{model_name="tiny-llama"}'
    with serving(None, lambda_state=lambda: sc.published, clock=listener_clock) as srv, closing(plain(srv)) as c:
        r, before = request(c)
        assert r.status == 200 and _value(before, last_success) == sc.published.t
        assert _value(before, tokens) == 0.0  # steady: nothing generated
        seq.text = page("after_pressure.txt")  # the burst: every counter and histogram grows
        for _ in range(polls_between):
            sc.poll_once()
            clock.advance(interval)
            listener_clock.t += interval
        r, after = request(c)
        assert r.status == 200
        assert _value(after, last_success) == sc.published.t  # the newest completed poll ...
        assert _value(after, tokens) > 0  # ... with the burst in it
        assert 'vllm_sidecar_ttft_seconds{model_name="tiny-llama",quantile="0.99"}' in after.decode()
        listener_clock.t += 0.5  # a scrape soon after, same poll: the same body
        assert request(c)[1] == after


def test_header_timeout_closes_slow_and_silent_connections(published):
    with serving(published, header_timeout=WAITED) as srv:
        slow = socket.create_connection(srv.address[:2], timeout=IO_TIMEOUT)
        slow.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # ... and never the end of the head
        silent = socket.create_connection(srv.address[:2], timeout=IO_TIMEOUT)
        assert slow.recv(1024) == b""  # closed by the server
        assert silent.recv(1024) == b""
        slow.close()
        silent.close()
        assert srv.closed["header_timeout"] == 2
        with closing(plain(srv)) as c:
            assert request(c, "/healthz")[0].status == 200


def test_header_timeout_covers_the_tls_handshake(tmp_path, pki, published):
    with serving(published, web=web_file(tmp_path, tls_yaml(pki)), header_timeout=WAITED) as srv:
        silent = socket.create_connection(srv.address[:2], timeout=IO_TIMEOUT)  # never sends a ClientHello
        assert silent.recv(1024) == b""
        silent.close()
        with closing(https(srv, pki)) as c:
            c.connect()  # a handshake, then no request
            assert c.sock.recv(1024) == b""
        assert srv.closed["header_timeout"] == 2


def test_idle_keep_alive_connection_is_closed(published):
    with serving(published, idle_timeout=WAITED) as srv:
        s = _send(srv, "/healthz")
        head = read_response_head(s)
        assert head.startswith(b"HTTP/1.1 200 ") and b"Connection: close" not in head
        s.settimeout(IO_TIMEOUT)
        while s.recv(1024):
            pass  # ends when the server closes the idle connection
        s.close()
        assert srv.closed["idle_timeout"] == 1


def test_500_idle_and_slowloris_connections_do_not_starve_a_scrape(published):
    with serving(published, header_timeout=60) as srv:
        crowd = []
        try:
            for i in range(500):
                s = socket.create_connection(srv.address[:2], timeout=IO_TIMEOUT)
                if i % 2:
                    s.sendall(b"GET /metrics HTTP/1.1\r\nX-Slow: ")  # slowloris: a head that never ends
                crowd.append(s)
            poll_until(lambda: srv.open_connections >= 500, "500 connections held by the server", every=0.01)
            with closing(plain(srv)) as c:
                r, body = request(c)
                assert r.status == 200 and b"vllm_sidecar_build_info" in body
                assert request(c, "/healthz")[0].status == 200
            assert srv.open_connections >= 500  # nothing was pushed out to answer
            assert len(_listener_threads()) <= 4  # the loop, two workers, bcrypt: not a thread each
        finally:
            for s in crowd:
                s.close()


def test_when_full_the_oldest_waiting_connection_makes_room(published):
    with serving(published, max_connections=8, header_timeout=60) as srv:
        with closing(plain(srv)) as keep:
            assert request(keep, "/healthz")[0].status == 200  # an idle keep-alive connection
            stalled = [socket.create_connection(srv.address[:2], timeout=IO_TIMEOUT) for _ in range(20)]
            try:
                with closing(plain(srv)) as c:
                    assert request(c)[0].status == 200
                assert srv.closed["evicted"] >= 13
                assert request(keep, "/healthz")[0].status == 200  # stalled ones went first
            finally:
                for s in stalled:
                    s.close()


def test_bad_requests(published):
    with serving(published) as srv:
        with closing(plain(srv)) as c:
            r, _ = request(c, method="POST")
            assert r.status == 405 and r.getheader("Allow") == "GET, HEAD"
        s = _send(srv, "/metrics", "Content-Length: 5\r\n")
        assert read_response_head(s).startswith(b"HTTP/1.1 413 ")
        s.close()
        s = socket.create_connection(srv.address[:2], timeout=IO_TIMEOUT)
        s.sendall(b"GARBAGE\r\n\r\n")
        assert read_response_head(s).startswith(b"HTTP/1.1 400 ")
        s.close()
        s = socket.create_connection(srv.address[:2], timeout=IO_TIMEOUT)
        s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + b"X-Big: " + b"a" * 20000 + b"\r\n\r\n")
        assert read_response_head(s).startswith(b"HTTP/1.1 431 ")
        s.close()
        s = socket.create_connection(srv.address[:2], timeout=IO_TIMEOUT)  # two pipelined requests
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        s.close()
        assert data.count(b"HTTP/1.1 200 ") == 2 and data.endswith(b"ready\n")


# -- IPv6 ------------------------------------------------------------------------------------------

@pytest.mark.skipif(not IPV6, reason="this machine has no IPv6 loopback (::1 cannot be bound)")
def test_ipv6_loopback_and_dual_stack(published):
    with serving(published, host="::1") as srv:
        assert srv.address[0] == "::1"
        with closing(http.client.HTTPConnection("::1", srv.address[1], timeout=IO_TIMEOUT)) as c:
            assert request(c)[0].status == 200
    with serving(published, host="::") as srv:
        with closing(http.client.HTTPConnection("::1", srv.address[1], timeout=IO_TIMEOUT)) as c:
            assert request(c, "/healthz")[0].status == 200
        with closing(http.client.HTTPConnection("127.0.0.1", srv.address[1], timeout=IO_TIMEOUT)) as c:
            assert request(c, "/healthz")[0].status == 200  # dual-stack


# -- negotiation -----------------------------------------------------------------------------------

@pytest.mark.parametrize("value,expected", [
    ("gzip", True), ("gzip;q=0", False), ("gzip; q=0.0", False), ("GZIP;Q=0.5", True),
    ("identity", False), ("", False), ("*", True), ("*;q=0", False), ("gzip;q=0, *", False),
    ("deflate, gzip;q=1.0, *;q=0.5", True), ("gzip;q=bogus", False), ("x-gzip", True),
    ("br;q=1, gzip;q=0.001", True), ("gzip;q=2", False),
])
def test_accept_encoding_q_values(value, expected):
    assert accepts_gzip(value) is expected


def test_gzip_and_openmetrics_negotiation(published):
    with serving(published) as srv:
        with closing(plain(srv)) as c:
            r, raw = request(c, **{"Accept-Encoding": "gzip;q=0"})
            assert r.getheader("Content-Encoding") is None and raw.startswith(b"# HELP")
            r, zipped = request(c, **{"Accept-Encoding": "gzip, deflate"})
            assert r.getheader("Content-Encoding") == "gzip" and gzip.decompress(zipped) == raw
            r, om = request(c, Accept="application/openmetrics-text;version=1.0.0,text/plain;q=0.5")
            assert r.getheader("Content-Type").startswith("application/openmetrics-text")
            assert om.endswith(b"# EOF\n")


# -- the web config at start -----------------------------------------------------------------------

def _web_error(tmp_path, text):
    with pytest.raises(ConfigError) as e:
        webconfig.load(web_file(tmp_path, text))
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("web_config_file: ")
    return msg


def test_web_config_problems_are_named(tmp_path, pki):
    assert "missing one of key or key_file" in _web_error(
        tmp_path, f"tls_server_config:\n  cert_file: {pki.path('server.crt')}\n")
    assert "unknown key 'cert_fiel'" in _web_error(tmp_path, "tls_server_config:\n  cert_fiel: x\n")
    assert "unknown key 'basic_auth_user'" in _web_error(tmp_path, "basic_auth_user:\n  a: b\n")
    assert "not a bcrypt hash" in _web_error(tmp_path, "basic_auth_users:\n  prometheus: hunter2\n")
    assert "not a matching PEM certificate and key" in _web_error(
        tmp_path, f"tls_server_config:\n  cert_file: {pki.path('server.crt')}\n  key_file: {pki.path('client.key')}\n")
    assert "a client CA is given but client_auth_type is NoClientCert" in _web_error(
        tmp_path, tls_yaml(pki, f"  client_ca_file: {pki.path('ca.crt')}\n"))
    assert "needs client_ca_file" in _web_error(tmp_path, tls_yaml(pki, "  client_auth_type: RequireAndVerifyClientCert\n"))
    assert "min_version 'TLS14'" in _web_error(tmp_path, tls_yaml(pki, "  min_version: TLS14\n"))
    assert "unknown cipher" in _web_error(tmp_path, tls_yaml(pki, "  cipher_suites: [TLS_NOPE]\n"))
    assert "can not be configured" in _web_error(tmp_path, "http_server_config:\n  headers:\n    X-Mine: 1\n")
    assert "printable ASCII" in _web_error(  # a value h11 would refuse to send
        tmp_path, 'http_server_config:\n  headers:\n    Content-Security-Policy: "default-src \u00e9"\n')
    assert "not valid YAML" in _web_error(tmp_path, "tls_server_config: [\n")
    empty = webconfig.load(web_file(tmp_path, ""))  # exporter-toolkit: an empty file is plain HTTP
    assert empty.tls is None and not empty.users
    notes = webconfig.load(web_file(tmp_path, tls_yaml(pki, "  cipher_suites: [TLS_AES_128_GCM_SHA256, "
                                                            "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256]\n"))).notes
    assert any("TLS_AES_128_GCM_SHA256 ignored" in n for n in notes)


@pytest.mark.parametrize("how,text,needle", [
    ("--web.config.file", "tls_server_config:\n  cert_file: {d}/server.crt\n  key_file: {d}/absent.key\n",
     "key_file {d}/absent.key: cannot read: No such file or directory"),
    ("--web-config-file", "tls_server_config:\n  cert_file: {d}/server.crt\n  key_file: {d}/server.key\n"
                          "  client_auth_type: RequireClientCertPlease\n",
                          "client_auth_type 'RequireClientCertPlease' is not one of"),
    ("env", "basic_auth_users:\n  prometheus: '$2y$10$tooshort'\n", "user 'prometheus': not a bcrypt hash"),
    ("--web.config.file", "tls_server_config:\n  certfile: x\n", "unknown key 'certfile'"),
])
def test_cli_web_config_errors_exit_2_with_one_line(tmp_path, pki, how, text, needle):
    path = web_file(tmp_path, text.format(d=pki.dir))
    args = ["--gpu", "none", "--listen", "127.0.0.1:0"]
    env = {}
    if how == "env":
        env["VLLM_SIDECAR_WEB_CONFIG_FILE"] = path
    else:
        args += [how, path]
    r = run_cli(*args, env=env, timeout=2 * IO_TIMEOUT)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle.format(d=pki.dir) in lines[0], r.stderr
    assert lines[0].startswith("vllm-sidecar-exporter: error: web_config_file: ")


@pytest.mark.skipif(not IPV6, reason="this machine has no IPv6 loopback (::1 cannot be bound)")
def test_cli_serves_tls_and_auth_on_ipv6(tmp_path, pki):
    from exporter.harness.pageserver import PageServer

    vllm = PageServer(lambda: page("after_load.txt")).start()
    path = web_file(tmp_path, tls_yaml(pki) + f"basic_auth_users:\n  prometheus: '{HASH}'\n")
    with socket.socket(socket.AF_INET6) as s:
        s.bind(("::1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "exporter", "--vllm-url", f"http://127.0.0.1:{vllm.port}", "--listen",
         f"[::1]:{port}", "--web.config.file", path, "--web.max-requests", "5", "--poll-interval", "0.2",
         "--window", "2", "--gpu", "none"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT)
    ctx = client_ctx(pki)

    def scrape(auth):
        try:
            with closing(http.client.HTTPSConnection("::1", port, context=ctx, timeout=IO_TIMEOUT)) as c:
                headers = {"Authorization": auth} if auth else {}
                return request(c, **headers)
        except OSError:
            return None, b""

    try:
        poll_until(lambda: 'vllm_sidecar_target_up{target="vllm"} 1.0' in
                   scrape(basic("prometheus", PASSWORD))[1].decode(), "an authenticated HTTPS scrape over IPv6",
                   every=0.01)
        assert scrape(None)[0].status == 401
        assert scrape(basic("prometheus", "nope"))[0].status == 401
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=IO_TIMEOUT)
        vllm.stop()
    assert "serving on https://[::1]:" in err
