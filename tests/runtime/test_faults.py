"""The fault suite: the real sidecar process against a real misbehaving HTTP server.

For one fault of each reason of ``hostile_server.FAULTS`` (every fault's reason is proven one
level down, through the fetcher, in ``test_failures.py``; what the sidecar does with a failed
read depends only on its reason): the sidecar keeps serving /metrics,
``target_up{target="vllm"}`` goes to 0 and the fault's reason is counted, derived series are
absent (not frozen), /healthz stays 200 (the loop is alive: every poll ends within its
deadline), the log has one line for going down (another only if the reason changes) and one for
coming back, and everything recovers when the server behaves again. The odd-but-valid answers
(1xx first, chunked, gzip chunked, HTTP/1.0 read-to-close) are read without an error.

Waits are on state with generous limits; nothing asserts how long anything took.
"""

import time

import pytest

from conftest import page
from hostile_server import FAULTS, GOOD, LEAK, HostileServer
from sidecar_proc import Advancing, SidecarProcess

BASE = page("after_load.txt")


@pytest.fixture(scope="module")
def vllm():
    server = HostileServer(Advancing()).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def sidecar(vllm):
    sc = SidecarProcess("--vllm-url", vllm.url, "--poll-interval", "0.4", "--window", "1",
                        "--vllm-timeout", "0.3", "--vllm-max-page-bytes", str(1 << 20))
    try:
        sc.healthy_again()
        yield sc
    finally:
        assert sc.stop() == 0


def _episode(records):
    """The vllm state lines from the first going down to the next coming back, else None.

    A line of being down counts as the start whether it is the first ("vllm unreachable") or a
    change of reason ("vllm still unreachable, now ..."): a starved machine can miss a deadline
    just before the fault is switched on, and that hiccup's first line then falls before the
    test's own start."""
    lines = [r for r in records if r.get("target") == "vllm"]
    down = ("vllm unreachable", "vllm still unreachable")
    first = next((i for i, r in enumerate(lines) if r["msg"].startswith(down)), None)
    if first is None:
        return None
    last = next((i for i in range(first, len(lines)) if lines[i]["msg"] == "vllm reachable"), None)
    return lines[first:last + 1] if last is not None else None


# reason -> the first of its faults by name
ONE_PER_REASON = {reason: fault for fault, reason in sorted(FAULTS.items(), reverse=True)}


@pytest.mark.parametrize("fault,reason", sorted((f, r) for r, f in ONE_PER_REASON.items()))
def test_fault(vllm, sidecar, fault, reason):
    vllm.set_fault("ok")
    sidecar.healthy_again()
    before = sidecar.errors(sidecar.metrics(), reason)

    since = time.time()  # the log is read by a thread: lines are told apart by their own time
    vllm.set_fault(fault)
    m = sidecar.wait_metrics(lambda m: sidecar.up(m) == 0 and sidecar.errors(m, reason) > before,
                             f"target_up 0 and {reason} counted")
    assert sidecar.tokens(m) is None, "derived series must be absent while vLLM cannot be read"
    assert sidecar.value(m, "vllm_sidecar_kv_cache_usage_ratio", model_name="tiny-llama") is None
    # the loop lives on: more polls fail under the same reason, and the probe is green
    seen = sidecar.errors(m, reason)
    sidecar.wait_metrics(lambda m: sidecar.errors(m, reason) > seen, f"{reason} counted again")
    assert sidecar.healthz() == 200

    vllm.set_fault("ok")
    sidecar.healthy_again()
    # from going down to coming back (a hiccup of this loaded machine around the switch, a
    # missed deadline just before it or just after recovery, is another story's lines)
    lines = sidecar.wait_for(lambda: _episode(sidecar.records_since(since)), what="down, then back up")
    # one line per change of state: a further line only when the reason changed
    reasons = [r.get("reason") for r in lines[:-1]]
    assert all(a != b for a, b in zip(reasons, reasons[1:])), reasons
    assert reason in reasons
    assert not any("exc" in r for r in sidecar.records_since(since)), "a fault is not a crash: no traceback"
    assert LEAK not in "\n".join(sidecar.lines)


@pytest.mark.parametrize("answer", [g for g in GOOD if g != "ok"])
def test_valid_but_unusual_answers_are_read(vllm, sidecar, answer):
    """Served only such answers, the sidecar is up with its derived series, and no reason but
    ``timeout`` (a starved test machine can miss a deadline) was counted meanwhile."""
    vllm.set_fault("ok")
    sidecar.healthy_again()
    reasons = set(FAULTS.values()) - {"timeout"}
    errors = {r: sidecar.errors(sidecar.metrics(), r) for r in reasons}
    vllm.set_fault(answer)
    start = vllm.answered(answer)
    sidecar.wait_for(lambda: vllm.answered(answer) >= start + 3, what=f"three {answer} answers")
    m = sidecar.healthy_again()
    assert {r: sidecar.errors(m, r) for r in reasons} == errors


def test_tls_handshake_that_never_comes_is_a_timeout(vllm):
    """An https URL whose server accepts and never says a TLS word: each poll ends at its
    deadline with ``timeout``; the sidecar serves on."""
    stall = HostileServer(lambda: BASE).start()
    stall.set_fault("never_answers")
    sc = SidecarProcess("--vllm-url", f"https://127.0.0.1:{stall.port}", "--poll-interval", "0.4",
                        "--window", "1", "--vllm-timeout", "0.3")
    try:
        sc.wait_metrics(lambda m: sc.up(m) == 0 and sc.errors(m, "timeout") >= 3, "TLS stall timeouts")
        assert sc.healthz() == 200
        down = [r for r in sc.records if r.get("target") == "vllm"]
        assert len(down) == 1 and "TLS handshake" in down[0]["msg"], down
    finally:
        assert sc.stop() == 0
        stall.stop()


def test_reliability_doc_has_a_row_for_every_fault():
    from conftest import ROOT

    doc = (ROOT / "docs" / "reliability.md").read_text()
    block = doc.split("## Reading vLLM, secrets, signals", 1)[1]
    for name in list(FAULTS) + list(GOOD[1:]):
        assert f"(`{name}`)" in block, name
