"""Reading vLLM: the HTTP client against a real misbehaving server (``hostile_server``), bearer
tokens, TLS, the reasons, and a sidecar in a thread going down and back. The same faults against
the real sidecar process: ``test_faults.py``."""

import base64
import shutil
import ssl
import subprocess
import threading

import pytest

from conftest import ROOT, page
from exporter.harness.localstack import wait_until
from exporter.harness.pageserver import PageServer
from exporter.runtime import config
from exporter.runtime.app import run_sidecar
from exporter.runtime.exposition import parse
from exporter.runtime.fetch import FetchError
from exporter.runtime.fetch import PageFetcher as VllmClient
from hostile_server import FAULTS, LEAK, HostileServer
from sidecar_proc import Advancing, scrape
from sidecar_proc import http_get as get
from sidecar_proc import value as val

BASE = page("after_load.txt")


@pytest.fixture
def running():
    vllm = PageServer(Advancing()).start()
    cfg = config.build({"vllm_url": vllm.url, "listen": "127.0.0.1:0", "poll_interval": 0.2,
                        "window": 2, "gpu": "none", "vllm_timeout": 0.15,
                        "vllm_max_page_bytes": 512 * 1024}, {})
    stop = threading.Event()
    ready = {}
    t = threading.Thread(target=run_sidecar, args=(cfg, {}), kwargs={
        "stop": stop, "on_ready": lambda srv, sc: ready.update(server=srv, sidecar=sc)}, daemon=True)
    t.start()
    wait_until(lambda: "server" in ready, 30, 0.05, "the sidecar serving")
    host, port = ready["server"].address
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: val(scrape(url), "vllm_sidecar_generation_tokens_per_second", model_name="tiny-llama") is not None,
               30, 0.05, "tokens per second")
    yield vllm, url
    stop.set()
    t.join(2)
    vllm.stop()


def test_refused_then_back(running):
    vllm, url = running
    vllm.stop()
    m = wait_until(lambda: (lambda m: m if val(m, "vllm_sidecar_target_up", target="vllm") == 0 else None)(scrape(url)),
                   30, 0.05, "target_up 0")
    assert (val(m, "vllm_sidecar_poll_errors_total", target="vllm", reason="refused") or 0) >= 1
    assert get(url + "/healthz")[0] == 200
    vllm.start()
    wait_until(lambda: val(scrape(url), "vllm_sidecar_target_up", target="vllm") == 1, 30, 0.05, "target_up 1")


def test_sidecar_output_has_no_colons_and_no_target_labels(running):
    _, url = running
    status, text = get(url + "/metrics")
    assert status == 200
    for s in parse(text).samples:
        assert ":" not in s.name
        assert not {"pod", "namespace", "container", "instance"} & {k for k, _ in s.labels}


# -- the client alone --------------------------------------------------------------------------

@pytest.fixture
def server():
    s = HostileServer(lambda: BASE).start()
    yield s
    s.stop()


def fetcher(server, **kw):
    kw.setdefault("timeout", 2.0)
    kw.setdefault("max_bytes", 8 << 20)
    return VllmClient(server.url + "/metrics", kw.pop("timeout"), kw.pop("max_bytes"), **kw)


def test_one_connection_is_reused(server):
    c = fetcher(server)
    for _ in range(5):
        assert "vllm:generation_tokens_total" in c.fetch()
    assert c.connections == 1 and server.answered() == 5


def test_a_connection_the_server_closed_while_idle_is_replaced_silently(server):
    c = fetcher(server)
    c.fetch()
    server.set_fault("ok")  # cuts the kept-alive connection, as a restarting server does
    assert c.fetch() == BASE
    assert c.connections == 2


def test_gzip_is_asked_for_and_decoded_only_when_the_answer_says_so(server):
    c = fetcher(server)
    assert c.fetch() == BASE  # gzip, with Content-Encoding
    assert server.requests[-1][1]["accept-encoding"] == "gzip"
    assert c.last_bytes == len(BASE.encode())
    server.set_fault("plain_though_gzip_asked")
    assert c.fetch() == BASE
    server.set_fault("chunked_gzip_ok")
    assert c.fetch() == BASE


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_each_fault_is_one_fetch_error_with_its_reason(server, fault):
    """Every fault ends the read with its reason: a deadline holds whatever the server does
    (the reason, not the time taken, is asserted)."""
    server.set_fault(fault)
    # a fault that stalls needs a short deadline to end the test soon; every other fault gets a
    # long one, so a loaded machine cannot turn its reason into a timeout
    c = fetcher(server, timeout=0.3 if FAULTS[fault] == "timeout" else 10.0, max_bytes=1 << 20)
    if fault == "garbage_200":  # HTTP is fine; the sidecar's parser refuses the page
        assert "not metrics" in c.fetch()
        return
    with pytest.raises(FetchError) as e:
        c.fetch()
    assert e.value.reason == FAULTS[fault], e.value.message
    assert "\n" not in e.value.message and e.value.message.startswith(server.url)
    if FAULTS[fault] != "parse":  # a page refused for its content came in a sound answer
        assert c._sock is None, "a failed read leaves no connection to reuse"


def test_a_redirect_is_not_followed_and_its_location_is_redacted(server):
    server.set_fault("redirect_loop")
    with pytest.raises(FetchError) as e:
        fetcher(server).fetch()
    assert e.value.reason == "http_other" and LEAK not in e.value.message and "token=<redacted>" in e.value.message
    assert server.answered() == 1


def test_bearer_token_is_sent_and_token_file_reread_when_it_changes(server, tmp_path):
    c = fetcher(server, token="s3cret-token")
    c.fetch()
    assert server.requests[-1][1]["authorization"] == "Bearer s3cret-token"
    f = tmp_path / "token"
    f.write_bytes(b"\xef\xbb\xbffirst-token\r\n")  # a BOM and a CRLF, as Windows editors write
    c = fetcher(server, token_file=str(f))
    c.fetch()
    assert server.requests[-1][1]["authorization"] == "Bearer first-token"
    f.write_text("rotated-token\n")
    c.fetch()
    assert server.requests[-1][1]["authorization"] == "Bearer rotated-token"


@pytest.mark.parametrize("content,needle", [
    (b"tok\xc3\xa9n-value\n", "not printable ASCII"),
    (b"\xff\xfe\x00t\x00", "not printable ASCII"),
    (b"FIRST-LINE\nSECOND-LINE-SECRET\n", "2 lines"),
    (b"two words", "space or tab"),
    (b"\n\n", "is empty"),
    (b"x" * 9000, "longer than 8192"),
])
def test_a_bad_token_file_is_reason_token_and_nothing_is_sent(server, tmp_path, content, needle):
    f = tmp_path / "token"
    f.write_bytes(content)
    c = fetcher(server, token_file=str(f))
    with pytest.raises(FetchError) as e:
        c.fetch()
    assert e.value.reason == "token" and needle in e.value.message, e.value.message
    assert "LINE" not in e.value.message and "\n" not in e.value.message
    assert server.answered() == 0, "no request with a broken token"
    f.write_text("good-token\n")
    c.fetch()
    assert server.requests[-1][1]["authorization"] == "Bearer good-token"


def test_token_file_missing_or_not_a_file(server, tmp_path):
    c = fetcher(server, token_file=str(tmp_path / "absent"))
    with pytest.raises(FetchError) as e:
        c.fetch()
    assert e.value.reason == "token" and "cannot read" in e.value.message
    c = fetcher(server, token_file=str(tmp_path))
    with pytest.raises(FetchError) as e:
        c.fetch()
    assert e.value.reason == "token" and "not a regular file" in e.value.message


def test_reload_token_says_what_it_did(server, tmp_path):
    f = tmp_path / "token"
    f.write_text("one-token\n")
    c = fetcher(server, token_file=str(f))
    assert c.reload_token() == (True, f"bearer token re-read from {f}")
    f.write_text("bad token\n")
    ok, msg = c.reload_token()
    assert not ok and "space or tab" in msg and "bad" not in msg
    assert fetcher(server).reload_token()[0]


def test_url_user_and_password_become_basic_auth(server):
    c = VllmClient(f"http://us%40er:p%3Ass@127.0.0.1:{server.port}/metrics", 2.0, 8 << 20)
    c.fetch()
    assert server.requests[-1][1]["authorization"] == "Basic " + base64.b64encode(b"us@er:p:ss").decode()
    assert "p:ss" not in c.safe_url and "p%3Ass" not in c.safe_url


def test_unauthorized_has_its_own_reason(server):
    server.require_auth = "Bearer right-token"
    with pytest.raises(FetchError) as e:
        fetcher(server, token="wrong-token").fetch()
    assert e.value.reason == "unauthorized"
    assert fetcher(server, token="right-token").fetch() == BASE


def test_size_cap_is_enforced_while_reading(server):
    with pytest.raises(FetchError) as e:
        fetcher(server, max_bytes=10_000).fetch()  # gzip: the cap applies after decompression
    assert e.value.reason == "too_large"
    server.set_fault("chunked_ok")
    with pytest.raises(FetchError) as e:
        fetcher(server, max_bytes=10_000).fetch()
    assert e.value.reason == "too_large"


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory):
    if not shutil.which("openssl"):
        pytest.skip("openssl is needed to make a test certificate")
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(d / "key.pem"), "-out", str(d / "cert.pem"), "-days", "2",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    return d / "cert.pem", d / "key.pem"


def test_https_with_a_ca_file_and_a_wrong_ca_is_reason_tls(tls_files):
    cert, key = tls_files
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(cert), str(key))
    s = HostileServer(lambda: BASE, tls=ctx).start()
    try:
        c = VllmClient(s.url + "/metrics", 2.0, 8 << 20, ca_file=str(cert))
        assert c.fetch() == BASE and c.fetch() == BASE and c.connections == 1
        with pytest.raises(FetchError) as e:
            VllmClient(s.url + "/metrics", 2.0, 8 << 20).fetch()  # the system's CAs do not know it
        assert e.value.reason == "tls" and "certificate" in e.value.message
    finally:
        s.stop()


def test_tls_handshake_stall_is_a_timeout():
    s = HostileServer(lambda: BASE).start()
    s.set_fault("never_answers")
    try:
        with pytest.raises(FetchError) as e:
            VllmClient(f"https://127.0.0.1:{s.port}/metrics", 0.3, 8 << 20).fetch()
        assert e.value.reason == "timeout" and "TLS handshake" in e.value.message
    finally:
        s.stop()


def test_a_name_that_does_not_resolve_is_reason_connection():
    with pytest.raises(FetchError) as e:
        VllmClient("http://no-such-host.invalid:8000/metrics", 2.0, 8 << 20).fetch()
    assert e.value.reason in ("connection", "timeout")


def test_every_fetch_failure_reason_is_known_and_starts_at_zero(clock):
    """Each FetchError the fetcher can raise names a reason in fetch.REASONS, and the sidecar
    exports every one of them at 0 before the first failure (so increase() sees the first)."""
    import ast

    from exporter.runtime import fetch
    from exporter.runtime.collectors import build_families
    from helpers import cfg, sidecar_with

    raised = set()
    for node in ast.walk(ast.parse(open(fetch.__file__).read())):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "FetchError":
            first = node.args[0]
            assert isinstance(first, ast.Constant), f"line {node.lineno}: reason must be a literal"
            raised.add(first.value)
    assert raised and raised <= set(fetch.REASONS), raised - set(fetch.REASONS)
    assert {"token", "http_other"} <= raised
    sc, _ = sidecar_with(clock, cfg(), page("idle.txt"))
    sc.poll_once()
    errs = {s.labels["reason"]: s.value for f in build_families(sc.published) if f.name == "vllm_sidecar_poll_errors"
            for s in f.samples if s.labels["target"] == "vllm"}
    assert set(fetch.REASONS) <= set(errs) and not any(errs.values())


def test_readme_lists_every_reason():
    from exporter.runtime import fetch

    readme = (ROOT / "README.md").read_text()
    for reason in fetch.REASONS:
        assert f"`{reason}`" in readme, reason
