"""Secrets, log lines and signals: units of ``config``/``logs``, then the real sidecar process
(token files rewritten under it, secrets in every place they can hide, a forged log line, a
huge model list, the OpenAI ``/v1`` URL, and each signal)."""

import io
import json
import logging
import os
import signal

import pytest

from conftest import page
from exporter.errors import ConfigError
from exporter.runtime import config, logs
from hostile_server import HostileServer
from sidecar_proc import Advancing, SidecarProcess

BASE = page("after_load.txt")


# -- units ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("url,shown", [
    ("http://u:pw@h:8000/metrics", "http://<redacted>@h:8000/metrics"),
    ("http://h/metrics?token=abc&api_key=def", "http://h/metrics?token=<redacted>&api_key=<redacted>"),
    ("http://h/metrics?SECRET", "http://h/metrics?<redacted>"),
    ("http://h/metrics#frag", "http://h/metrics"),
])
def test_redact_url(url, shown):
    assert config.redact_url(url) == shown


def test_redact_masks_credentials_wherever_they_appear():
    logs.add_secret("KNOWN-SECRET-VALUE")
    text = ("Authorization: Bearer abc.def-ghi Basic dXNlcjpwdw== api_key=xyz {'access_token': 'q'} "
            "see http://a:b@h/x?sig=1 and KNOWN-SECRET-VALUE; reason=token unauthorized: HTTP 401")
    out = logs.redact(text)
    for secret in ("abc.def-ghi", "dXNlcjpwdw", "xyz", "'q'", "a:b@", "sig=1", "KNOWN-SECRET-VALUE"):
        assert secret not in out, (secret, out)
    assert "reason=token unauthorized: HTTP 401" in out  # ordinary words survive


def _format(fmt, msg, **fields):
    stream = io.StringIO()
    log = logs.setup(fmt, "info", stream)
    log.warning(msg, extra={"fields": fields})
    return stream.getvalue()


def test_text_lines_are_key_value_and_cannot_be_forged():
    out = _format("text", "models served: evil\nts=2020-01-01T00:00:00Z level=error msg=forged",
                  model='a "quoted"\u2028name', n=3)
    assert out.count("\n") == 1 and out.startswith("ts=")
    assert 'msg="models served: evil\\nts=2020' in out
    assert 'model="a \\"quoted\\"\\u2028name"' in out and " n=3" in out


def test_json_lines_are_one_line_with_escapes():
    out = _format("json", "evil\nline", model="x\ny")
    assert out.count("\n") == 1
    rec = json.loads(out)
    assert rec["msg"] == "evil\nline" and rec["model"] == "x\ny"


def test_tracebacks_stay_on_their_line():
    stream = io.StringIO()
    log = logs.setup("text", "info", stream)
    try:
        raise ValueError("boom")
    except ValueError:
        log.exception("failed")
    assert stream.getvalue().count("\n") == 1 and 'exc="Traceback' in stream.getvalue()


def test_long_values_are_cut_and_lists_summarised():
    out = _format("text", "x" * 10_000)
    assert len(out) < logs.MAX_VALUE + 200 and "(+8000 chars)" in out
    assert logs.summarize([f"m{i}" for i in range(10_000)]) == "10000: m0, m1, m2, m3, m4 and 9995 more"
    assert logs.summarize(["a", "b"]) == "2: a, b"


@pytest.mark.parametrize("raw,ok", [
    (b"\xef\xbb\xbftoken-1\n", "token-1"),
    (b"  token-2\r\n", "token-2"),
    (b"QQ\xc3\xa9QQ", None), (b"QQa\nQQb", None), (b"QQ QQ", None), (b"", None), (b"Q" * 8193, None),
])
def test_parse_token(raw, ok):
    if ok:
        assert config.parse_token(raw) == ok
    else:
        with pytest.raises(ValueError) as e:
            config.parse_token(raw)
        assert "QQ" not in str(e.value) and "\n" not in str(e.value)


def test_a_bad_token_setting_is_a_config_error_that_does_not_show_it():
    with pytest.raises(ConfigError) as e:
        config.build({}, {"VLLM_SIDECAR_VLLM_BEARER_TOKEN": "FIRST\nSECOND-SECRET"})
    assert str(e.value).startswith("vllm_bearer_token (from env VLLM_SIDECAR_VLLM_BEARER_TOKEN): holds 2 lines")
    assert "SECRET" not in str(e.value)
    assert config.build({}, {"VLLM_SIDECAR_VLLM_BEARER_TOKEN": "\ufeffgood-token \n"}).vllm_bearer_token == "good-token"


@pytest.mark.parametrize("url", ["http://h:8000/metrics\r\nX-Injected: 1", "http://h :8000", "http://hé/metrics"])
def test_urls_that_could_inject_or_mislead_are_refused(url):
    with pytest.raises(ConfigError, match="^vllm_url: "):
        config.build({"vllm_url": url}, {})


def test_openai_v1_url_reads_metrics_at_the_root():
    assert config.metrics_url("http://h:8000/v1") == "http://h:8000/metrics"
    assert config.metrics_url("http://h:8000/v1/") == "http://h:8000/metrics"
    assert config.metrics_url("http://gw/vllm/v1?x=1") == "http://gw/vllm/metrics?x=1"
    assert config.metrics_url("http://h:8000/custom/metrics") == "http://h:8000/custom/metrics"
    assert config.metrics_url_note("http://h:8000") == ""
    assert "http://h:8000/metrics is read" in config.metrics_url_note("http://h:8000/v1")


# -- the real sidecar ------------------------------------------------------------------------------

@pytest.fixture
def vllm():
    s = HostileServer(Advancing()).start()
    yield s
    s.stop()


def _put(path, data: bytes) -> None:
    """Replace a file at once, as Kubernetes swaps a mounted secret (never seen half-written)."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _fast(*extra):
    return ("--poll-interval", "0.4", "--window", "1", "--vllm-timeout", "0.3", *extra)


def test_token_file_rewritten_under_the_sidecar(vllm, tmp_path):
    """BOM: accepted. A byte that is not ASCII, then a second line: reason ``token``, target
    down, nothing sent, one line, no traceback, no token text anywhere. A good file again:
    back without a signal. SIGHUP: re-read, said in one line."""
    vllm.require_auth = "Bearer good-token-1"
    tf = tmp_path / "token"
    _put(tf, b"\xef\xbb\xbfgood-token-1\n")
    sc = SidecarProcess(*_fast("--vllm-url", vllm.url, "--vllm-bearer-token-file", str(tf)))
    try:
        sc.healthy_again()
        _put(tf, b"good-token-\xff\n")
        first = sc.wait_metrics(lambda m: sc.up(m) == 0 and sc.errors(m, "token") >= 1, "token counted")
        sent = vllm.answered()
        later = sc.wait_metrics(lambda m: sc.errors(m, "token") >= sc.errors(first, "token") + 2,
                                "the broken token counted again on later polls")
        assert sc.up(later) == 0 and sc.errors(later, "unauthorized") == sc.errors(first, "unauthorized")
        assert vllm.answered() <= sent + 1, "no request is sent with a broken token"  # +1: one in flight
        assert sc.tokens(sc.metrics()) is None and sc.healthz() == 200
        before = sc.errors(sc.metrics(), "token")
        _put(tf, b"good-token-1\nSECOND-LINE-SECRET\n")
        sc.wait_metrics(lambda m: sc.errors(m, "token") >= before + 2, "two-line file refused")
        _put(tf, b"good-token-1\n")
        sc.healthy_again()
        down = [r for r in sc.records if r.get("target") == "vllm" and r["level"] == "warning"]
        sc.signal(signal.SIGHUP)
        sc.wait_for(lambda: any(r["msg"] == f"SIGHUP: bearer token re-read from {tf}" for r in sc.records),
                    what="the SIGHUP line")
        _put(tf, b"bad token\n")
        sc.signal(signal.SIGHUP)
        sc.wait_for(lambda: any(r["msg"].startswith("SIGHUP: bearer token file") and r["level"] == "warning"
                                for r in sc.records), what="the SIGHUP warning")
    finally:
        assert sc.stop() == 0
    err = "\n".join(sc.lines)
    for secret in ("good-token", "SECOND-LINE", "bad token"):
        assert secret not in err, secret
    assert len(down) == 1 and down[0]["reason"] == "token", down
    assert "not printable ASCII" in down[0]["msg"]
    assert not any("exc" in r for r in sc.records)


def test_no_secret_reaches_a_log_line_and_no_value_forges_one(tmp_path):
    """Text logs; a URL with a password, a query token and the OpenAI /v1 path; the token in the
    environment; a model name holding a newline; 1,001 models (16 kept by the cap, the rest left
    out and said so); then vLLM failing (messages that carry the URL). No secret anywhere, every
    line a record, both model lists summarised, the /v1 mapping said once."""
    models = "".join(f'vllm:num_requests_running{{model_name="m{i:05d}"}} 1\n' for i in range(1_000))
    evil = 'vllm:num_requests_running{model_name="evil\\nts=2020-01-01T00:00:00Z level=error msg=forged"} 1\n'
    s = HostileServer(lambda: models + evil).start()
    url = f"http://someone:URL-PASSWORD-1@127.0.0.1:{s.port}/v1?api_key=QUERY-SECRET-1"
    sc = SidecarProcess("--vllm-url", url, "--poll-interval", "0.5", "--window", "2", "--vllm-timeout", "0.4",
                        env={"VLLM_SIDECAR_VLLM_BEARER_TOKEN": "ENV-TOKEN-SECRET-1"}, log_format="text")
    try:
        sc.wait_metrics(lambda m: sc.up(m) == 1, "vllm up")
        path, headers, _ = s.requests[-1]
        assert path == "/metrics?api_key=QUERY-SECRET-1"  # /v1 mapped to /metrics, the query kept
        assert headers["authorization"] == "Bearer ENV-TOKEN-SECRET-1"
        s.set_fault("s503")
        sc.wait_metrics(lambda m: sc.up(m) == 0 and sc.errors(m, "http_5xx") >= 1, "503 counted")
        sc.wait_for(lambda: any("unreachable" in x for x in sc.lines), what="the down line")
    finally:
        assert sc.stop() == 0
        s.stop()
    err = "\n".join(sc.lines)
    for secret in ("URL-PASSWORD-1", "QUERY-SECRET-1", "ENV-TOKEN-SECRET-1"):
        assert secret not in err, secret
    assert all(x.startswith("ts=") for x in sc.lines), [x for x in sc.lines if not x.startswith("ts=")]
    assert sum("OpenAI API base URL" in x for x in sc.lines) == 1
    # the models kept (the cap: 16) and the ones left out, each summarised in one line
    served = [x for x in sc.lines if "models served" in x]
    assert len(served) == 1 and "16: " in served[0] and "and 11 more" in served[0] and len(served[0]) < 600
    capped = [x for x in sc.lines if "over the sidecar's caps" in x]
    assert len(capped) == 1 and "985: " in capped[0] and "and 980 more" in capped[0] and len(capped[0]) < 1000


def test_ignored_signals_are_said_and_survived(vllm):
    sc = SidecarProcess(*_fast("--vllm-url", vllm.url))
    try:
        sc.healthy_again()
        for sig in (signal.SIGUSR1, signal.SIGUSR1, signal.SIGPIPE, signal.SIGUSR2, signal.SIGHUP):
            sc.signal(sig)
        # signals pending together are delivered lowest number first (SIGHUP before the others), so
        # wait for every one's line, not for SIGHUP's alone
        sc.wait_for(lambda: any(r["msg"].startswith("SIGHUP: no bearer token file") for r in sc.records)
                    and all(any(r.get("signal") == n for r in sc.records) for n in ("SIGUSR1", "SIGUSR2", "SIGPIPE")),
                    what="the lines of SIGHUP, SIGUSR1, SIGUSR2 and SIGPIPE")
        for name in ("SIGUSR1", "SIGUSR2", "SIGPIPE"):
            said = [r for r in sc.records if r.get("signal") == name]
            assert len(said) == 1 and "ignored" in said[0]["msg"], (name, said)
        assert sc.proc.poll() is None and sc.healthz() == 200
        sc.healthy_again()
    finally:
        assert sc.stop() == 0


@pytest.mark.parametrize("sig", [signal.SIGQUIT, signal.SIGINT, signal.SIGTERM])
def test_stop_signals_stop_cleanly_and_say_which(vllm, sig):
    extra = ("--vllm-bearer-token", "FLAG-TOKEN-SECRET-1") if sig == signal.SIGQUIT else ()
    if extra:
        vllm.require_auth = "Bearer FLAG-TOKEN-SECRET-1"
    sc = SidecarProcess(*_fast("--vllm-url", vllm.url, *extra))
    try:
        sc.healthy_again()
        sc.signal(sig)
        assert sc.proc.wait(20) == 0
    finally:
        sc.stop()
    assert any(r["msg"] == f"stopping on {sig.name}" for r in sc.records), sc.lines[-5:]
    if extra:
        warn = [r for r in sc.records if "command line" in r["msg"]]
        assert len(warn) == 1 and warn[0]["level"] == "warning" and "/proc/PID/cmdline" in warn[0]["msg"]
        assert "FLAG-TOKEN-SECRET-1" not in "\n".join(sc.lines)


@pytest.fixture(autouse=True, scope="module")
def _logging_restored_for_other_tests():
    yield
    logging.getLogger("vllm_sidecar").handlers.clear()


def test_setting_the_log_up_again_replaces_its_handler_and_level():
    first, second = io.StringIO(), io.StringIO()
    logs.setup("text", "info", first)
    log = logs.setup("json", "warning", second)
    log.info("below the level")
    log.warning("said")
    assert len(log.handlers) == 1 and not log.propagate  # one line per record, not one per setup
    assert first.getvalue() == ""
    assert [json.loads(line)["msg"] for line in second.getvalue().splitlines()] == ["said"]
