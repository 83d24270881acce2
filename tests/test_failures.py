"""The sidecar against a real local HTTP server that misbehaves in every way vLLM can."""

import threading
import time
import urllib.request

import pytest

from exporter.harness import pagetransform as pt
from exporter.runtime import config
from exporter.runtime.app import run_sidecar
from exporter.runtime.parser import parse
from exporter.harness.pageserver import PageServer
from exporter.runtime.fetch import FetchError, PageFetcher as VllmClient
from conftest import page

BASE = page("after_load.txt")


class Advancing:
    """A vLLM page whose counters advance on every read, like a server under load."""

    def __init__(self):
        self.n = 0

    def __call__(self):
        self.n += 1
        return pt.scale_counters(BASE, 1 + self.n * 0.01)


def get(url, timeout=2.0):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def scrape(url):
    status, text = get(url + "/metrics")
    assert status == 200
    return {(s.name, s.labels): s.value for s in parse(text).samples}


def val(metrics, name, **labels):
    want = tuple(sorted(labels.items()))
    for (n, l), v in metrics.items():
        if n == name and tuple(sorted(l)) == want:
            return v
    return None


def wait_for(fn, timeout=5.0, every=0.05):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        r = fn()
        if r:
            return r
        time.sleep(every)
    raise AssertionError("condition not met in time")


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
    wait_for(lambda: "server" in ready)
    host, port = ready["server"].address
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: val(scrape(url), "vllm_sidecar_generation_tokens_per_second", model_name="tiny-llama") is not None)
    yield vllm, url
    stop.set()
    t.join(2)
    vllm.stop()


MODES = [
    ("status:503", "http_5xx"),
    ("status:404", "http_4xx"),
    ("html", "parse"),
    ("garbage", "parse"),
    ("huge:2000000", "too_large"),
    ("gzipbomb:3000000", "too_large"),
    ("slow:0.5", "timeout"),
    ("dribble:0.05", "timeout"),
    ("close", "connection"),
]


@pytest.mark.parametrize("mode,reason", MODES)
def test_misbehaving_vllm_keeps_the_sidecar_serving(running, mode, reason):
    vllm, url = running
    before = val(scrape(url), "vllm_sidecar_poll_errors_total", target="vllm", reason=reason) or 0
    vllm.mode = mode
    m = wait_for(lambda: (lambda m: m if val(m, "vllm_sidecar_target_up", target="vllm") == 0 else None)(scrape(url)))
    m = wait_for(lambda: (lambda m: m if (val(m, "vllm_sidecar_poll_errors_total", target="vllm", reason=reason) or 0) > before else None)(scrape(url)))
    # derived series go stale (absent), never wrong
    assert val(m, "vllm_sidecar_generation_tokens_per_second", model_name="tiny-llama") is None
    assert val(m, "vllm_sidecar_kv_cache_usage_ratio", model_name="tiny-llama") is None
    # probes do not depend on vLLM
    assert get(url + "/healthz")[0] == 200
    assert get(url + "/readyz")[0] == 200
    vllm.mode = "ok"
    m = wait_for(lambda: (lambda m: m if val(m, "vllm_sidecar_generation_tokens_per_second", model_name="tiny-llama") is not None else None)(scrape(url)))
    assert val(m, "vllm_sidecar_target_up", target="vllm") == 1
    assert val(m, "vllm_sidecar_generation_tokens_per_second", model_name="tiny-llama") > 0


def test_refused_then_back(running):
    vllm, url = running
    vllm.stop()
    m = wait_for(lambda: (lambda m: m if val(m, "vllm_sidecar_target_up", target="vllm") == 0 else None)(scrape(url)))
    assert (val(m, "vllm_sidecar_poll_errors_total", target="vllm", reason="refused") or 0) >= 1
    assert get(url + "/healthz")[0] == 200
    vllm.start()
    wait_for(lambda: val(scrape(url), "vllm_sidecar_target_up", target="vllm") == 1)


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
    s = PageServer(lambda: BASE).start()
    yield s
    s.stop()


def test_one_connection_is_reused(server):
    c = VllmClient(server.url + "/metrics", 1.0, 8 << 20)
    for _ in range(5):
        assert "vllm:generation_tokens_total" in c.fetch()
    assert server.connections == 1


def test_gzip_is_accepted_and_decoded(server):
    c = VllmClient(server.url + "/metrics", 1.0, 8 << 20)
    text = c.fetch()
    assert server.requests[-1][1].get("Accept-Encoding") == "gzip"
    assert text == BASE
    assert c.last_bytes == len(BASE.encode())


def test_bearer_token_is_sent_and_token_file_reread(server, tmp_path):
    c = VllmClient(server.url + "/metrics", 1.0, 8 << 20, token="s3cret")
    c.fetch()
    assert server.requests[-1][1]["Authorization"] == "Bearer s3cret"
    f = tmp_path / "token"
    f.write_text("first\n")
    c = VllmClient(server.url + "/metrics", 1.0, 8 << 20, token_file=str(f))
    c.fetch()
    assert server.requests[-1][1]["Authorization"] == "Bearer first"
    f.write_text("rotated\n")
    c.fetch()
    assert server.requests[-1][1]["Authorization"] == "Bearer rotated"


def test_unauthorized_has_its_own_reason(server):
    server.mode = "status:401"
    with pytest.raises(FetchError) as e:
        VllmClient(server.url + "/metrics", 1.0, 8 << 20).fetch()
    assert e.value.reason == "unauthorized"


def test_size_cap_is_enforced_while_reading(server):
    server.mode = "huge:300000"
    c = VllmClient(server.url + "/metrics", 1.0, 100_000)
    with pytest.raises(FetchError) as e:
        c.fetch()
    assert e.value.reason == "too_large"


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
