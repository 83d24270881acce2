"""/debug/flight through the sidecar's own listener: behind basic auth like /metrics, gzip when
asked, ranges and events, and the output loaded by real promtool and by ``backtest --file``."""

import gzip
import json
import os
import shutil
import socket
import subprocess
import sys
import threading

import bcrypt
import pytest
import requests

from exporter.harness import pagetransform as pt
from exporter.runtime.flight import FlightService, Recorder, openmetrics
from exporter.runtime.server import SidecarServer
from exporter.runtime.sidecar import Sidecar
from helpers import PageSequence, cfg
from shared import poll_until

PASSWORD = "flight-pw"
HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()


@pytest.fixture
def served(tmp_path, clock, after_load, after_pressure):
    web = tmp_path / "web.yml"
    web.write_text(f"basic_auth_users:\n  prometheus: '{HASH}'\n")
    seq = PageSequence(clock, after_load)
    rec = Recorder(block_polls=8, event_before=30, event_after=30)
    sc = Sidecar(cfg(poll_interval=1, window=10), seq, None, clock=clock, recorder=rec)
    t0 = clock.t
    for i in range(40):
        base = after_pressure if 20 <= i < 25 else after_load
        seq.text = pt.scale_counters(base, 1 + i * 0.01)
        sc.poll_once()
        clock.advance(1)
    flight = FlightService(rec, threading.Lock(), (("namespace", "prod"), ("pod", "vllm-0")))
    srv = SidecarServer("127.0.0.1", 0, lambda: sc.published, lambda: True, web=str(web), flight=flight)
    srv.start()
    try:
        yield f"http://127.0.0.1:{srv.address[1]}", t0, rec
    finally:
        srv.stop()
        flight.close()


AUTH = ("prometheus", PASSWORD)


def test_flight_is_behind_the_same_auth_as_metrics(served):
    url, _, _ = served
    for path in ("/metrics", "/debug/flight", "/debug/flight/events"):
        assert requests.get(url + path, timeout=30).status_code == 401
        assert requests.get(url + path, auth=("prometheus", "wrong"), timeout=30).status_code == 401
    assert requests.get(url + "/debug/flight", auth=AUTH, timeout=30).status_code == 200


def test_ranges_gzip_and_events(served):
    url, t0, rec = served
    r = requests.get(url + "/debug/flight", params={"start": t0 + 10, "end": t0 + 19}, auth=AUTH,
                     headers={"Accept-Encoding": "gzip"}, timeout=60, stream=True)
    assert r.status_code == 200 and r.headers["Content-Encoding"] == "gzip"
    text = gzip.decompress(r.raw.read()).decode()
    assert text.endswith("# EOF\n")
    stamps = {float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if not line.startswith("#")}
    assert stamps == {t0 + 10 + i for i in range(10)}
    assert 'namespace="prod"' in text and 'pod="vllm-0"' in text
    import datetime as dt
    iso = dt.datetime.fromtimestamp(t0 + 10, dt.timezone.utc).isoformat().replace("+00:00", "Z")
    r2 = requests.get(url + "/debug/flight", params={"start": iso, "end": t0 + 19}, auth=AUTH, timeout=60)
    assert r2.text == text
    assert requests.get(url + "/debug/flight?start=yesterday", auth=AUTH, timeout=30).status_code == 400
    events = requests.get(url + "/debug/flight/events", auth=AUTH, timeout=30).json()
    assert events["labels"] == {"namespace": "prod", "pod": "vllm-0"}
    assert events["recorder"]["polls"] == 40
    kinds = [e["kind"] for e in events["events"]]
    assert kinds == [e.kind for e in rec.events] == ["vllm_restarted"]  # the page after the flood is a new process
    for e in events["events"]:
        body = requests.get(url + "/debug/flight", params={"event": e["id"]}, auth=AUTH, timeout=60).text
        ts = [float(line.rsplit(" ", 1)[1]) for line in body.splitlines() if not line.startswith("#")]
        assert min(ts) >= e["start"] and max(ts) <= e["end"]
    assert requests.get(url + "/debug/flight?event=999", auth=AUTH, timeout=30).status_code == 404


def test_promtool_and_backtest_load_the_record(served, tmp_path):
    url, _, _ = served
    body = requests.get(url + "/debug/flight", auth=AUTH, timeout=60).content
    f = tmp_path / "flight.om"
    f.write_bytes(body)
    assert shutil.which("promtool"), "promtool not installed (make deps)"
    r = subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(f), str(tmp_path / "tsdb")],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    out = tmp_path / "bt.json"
    r = subprocess.run(["vllm-sidecar-exporter", "backtest", "--file", str(f), "--step", "1s", "--json", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report  # the pack ran over the record


# -- the encoder child ---------------------------------------------------------------------------

SLOW_CHILD = [sys.executable, "-c", "import sys, time; sys.stdin.buffer.read(); time.sleep(600)"]


@pytest.fixture
def service(clock, after_load):
    """A sidecar with 30 polls recorded, its listener (no auth) and its FlightService (one encoder)."""
    seq = PageSequence(clock, after_load)
    rec = Recorder(block_polls=8)
    sc = Sidecar(cfg(poll_interval=1, window=10), seq, None, clock=clock, recorder=rec)
    for i in range(30):
        seq.text = pt.scale_counters(after_load, 1 + i * 0.01)
        sc.poll_once()
        clock.advance(1)
    flight = FlightService(rec, threading.Lock(), (("pod", "vllm-0"),), max_encoders=1)
    srv = SidecarServer("127.0.0.1", 0, lambda: sc.published, lambda: True, flight=flight)
    srv.start()
    try:
        yield srv, flight, rec
    finally:
        srv.stop()
        flight.close()


def _children_of_us():
    """Live processes whose parent is this one, by /proc."""
    me = str(os.getpid())
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if fields[1] == me and fields[0] != "Z":
            out.append(int(d))
    return out


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _request(srv, target="/debug/flight"):
    s = socket.create_connection(srv.address, timeout=60)
    s.sendall(f"GET {target} HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\n\r\n".encode())
    return s


def test_the_child_answers_what_the_recorder_holds_and_none_is_left(service):
    srv, flight, rec = service
    url = f"http://127.0.0.1:{srv.address[1]}"
    blocks, _ = rec.snapshot()
    want = "".join(openmetrics(blocks, labels=(("pod", "vllm-0"),), chunk_chars=1 << 16))
    for _ in range(3):
        r = requests.get(url + "/debug/flight", headers={"Accept-Encoding": "gzip"}, timeout=120, stream=True)
        assert r.status_code == 200 and r.headers["Content-Encoding"] == "gzip"
        assert gzip.decompress(r.raw.read()).decode() == want
        assert requests.get(url + "/debug/flight", timeout=120).text == want  # plain, no gzip asked
    assert flight.children() == [] and not [p for p in _children_of_us() if _alive(p)]
    flight.argv = [sys.executable, "-c", "import sys; sys.stdin.buffer.read(); sys.exit(3)"]
    r = requests.get(url + "/debug/flight", timeout=120)  # the answer is the child's: a failing one is a 500
    assert r.status_code == 500
    assert requests.get(url + "/metrics", timeout=30).status_code == 200


def test_a_client_that_goes_away_kills_its_encoder(service):
    srv, flight, _ = service
    flight.argv = SLOW_CHILD
    s = _request(srv)
    pid = poll_until(flight.children, "the encoder to start", timeout=120)[0]
    assert _alive(pid)
    s.close()
    poll_until(lambda: not _alive(pid), "the encoder to be killed", timeout=120)
    poll_until(lambda: flight.children() == [] and flight.busy == 0, "the service to forget it", timeout=120)


def test_beyond_max_encoders_503_with_retry_after_then_served_again(service):
    srv, flight, _ = service
    url = f"http://127.0.0.1:{srv.address[1]}"
    real = flight.argv
    flight.argv = SLOW_CHILD
    s = _request(srv)
    pid = poll_until(flight.children, "the encoder to start", timeout=120)[0]
    r = requests.get(url + "/debug/flight", timeout=60)
    assert r.status_code == 503 and r.headers["Retry-After"] == "2"
    assert requests.get(url + "/metrics", timeout=30).status_code == 200  # scrapes are not held
    assert requests.get(url + "/debug/flight/events", timeout=60).json()["recorder"]["polls"] == 30  # nor the events
    s.close()
    poll_until(lambda: not _alive(pid) and flight.busy == 0, "the encoder to be killed", timeout=120)
    flight.argv = real
    assert requests.get(url + "/debug/flight", timeout=120).text.endswith("# EOF\n")


def test_shutdown_kills_the_encoders(clock, after_load):
    seq = PageSequence(clock, after_load)
    rec = Recorder()
    sc = Sidecar(cfg(poll_interval=1, window=10), seq, None, clock=clock, recorder=rec)
    sc.poll_once()
    flight = FlightService(rec, threading.Lock())
    flight.argv = SLOW_CHILD
    srv = SidecarServer("127.0.0.1", 0, lambda: sc.published, lambda: True, flight=flight)
    srv.start()
    s = _request(srv)
    try:
        pid = poll_until(flight.children, "the encoder to start", timeout=120)[0]
        srv.stop()
        flight.close()
        assert not _alive(pid)
    finally:
        s.close()
        srv.stop()
        flight.close()
