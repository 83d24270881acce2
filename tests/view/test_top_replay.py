"""`top --replay FILE`: the live view over a flight record the real sidecar made of a simulated
long-prompt flood (fake clock). A replayed screen is the screen `top` showed at that poll; the
replay walks the record at the speed asked, flags every kind of trouble and every flight event
at the poll it happened, reads gzip and plain records, several pods merged, and says in one line
what it cannot read."""

import gzip
import re
import threading

import pytest

from exporter.analysis import postmortem as pm
from exporter.analysis import replay as rp
from exporter.harness.flightsim import simulated_record
from exporter.view import playback
from exporter.view.console import Screen
from shared import run_cli

T0 = 1_800_000_000.0
SECONDS = 180
ONSET = 40


@pytest.fixture(scope="module")
def flood(tmp_path_factory):
    d = tmp_path_factory.mktemp("replay")
    pubs = []
    text, rec = simulated_record(seconds=SECONDS, onset=ONSET, t0=T0, on_poll=pubs.append)
    plain = d / "flight.om"
    plain.write_text(text)
    gz = d / "flight.om.gz"
    gz.write_bytes(gzip.compress(text.encode()))
    return {"plain": plain, "gz": gz, "pubs": {round(p.t, 3): p for p in pubs}, "rec": rec, "text": text, "dir": d}


def top(*args, timeout=300):
    return run_cli("top", *args, timeout=timeout)


def test_each_replayed_poll_is_the_state_top_showed_then(flood):
    frames = rp.load_record(flood["gz"].read_bytes())
    assert list(frames) == ["demo/vllm-demo-0"]
    got = frames["demo/vllm-demo-0"]
    pubs = flood["pubs"]
    assert [round(f.t, 3) for f in got] == sorted(pubs)  # every poll, in order
    view = Screen(None, False)
    for f in got:
        live = pubs[round(f.t, 3)]
        assert f.pub.signals == live.signals, f.t
        assert f.pub.up == live.up and f.pub.gpu.gpus == live.gpu.gpus and f.pub.gpu.xid_totals == live.gpu.xid_totals
        assert view.render(f.pub) == view.render(live)


@pytest.mark.parametrize("which", ["gz", "plain"])
def test_once_shows_the_screen_at_end_with_what_was_flagged(flood, which):
    at = T0 + 120
    r = top("--replay", str(flood[which]), "--once", "--end", str(at))
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "\x1b" not in out and r.stderr == ""
    assert f"replay of {flood[which].name} (1 pod(s), one poll every 1s)" in out
    assert "+120s of 179s" in out and "poll at 08:02:00" in out
    live = Screen(None, False).render(flood["pubs"][round(at, 3)])
    assert live in out  # the screen top showed at that poll, line for line
    # the recorder's own event: opened from the state published at one poll, counted in the
    # state of the next one (a scrape sees it there too)
    ev = next(e for e in flood["rec"].events if e.kind == "kv_thrashing")
    flagged = next(line for line in out.splitlines() if line.startswith("  flagged"))
    assert f"flight event kv_thrashing (first at {playback._utc(ev.t + 1)}, +{ev.t + 1 - T0:.0f}s)" in flagged
    assert "long-prompt surge" in flagged and "KV pressure thrashing" in flagged
    assert ev.t >= T0 + ONSET


def test_a_replay_walks_the_record_one_step_per_screen(flood):
    r = top("--replay", str(flood["gz"]), "--speed", "0", "--refresh", "10", "--start", "+20", "--end", "+100")
    assert r.returncode == 0, r.stderr
    blocks = [b for b in r.stdout.split("\n\n") if b.strip()]
    offs = [int(m) for b in blocks for m in re.findall(r"\+(\d+)s of 179s", b)]
    assert offs == list(range(20, 101, 10))
    # calm before the onset: nothing flagged; after it the flood is
    assert "flagged     nothing so far" in blocks[0]
    assert "long-prompt surge" in blocks[-1]
    # the state at each screen is the live one at that poll
    for b, off in zip(blocks, offs):
        assert Screen(None, False).render(flood["pubs"][round(T0 + off, 3)]) in b


def test_speed_sets_the_wait_between_screens(flood):
    """At 10x with a 1 s refresh, each screen moves the record 10 s and waits 1 s; at 1x, real time."""
    frames = rp.load_record(flood["plain"].read_bytes())

    class Waits(threading.Event):
        def __init__(self):
            super().__init__()
            self.asked = []

        def wait(self, timeout=None):
            self.asked.append(timeout)
            return False

    for speed, refresh, step, wait in ((10, 1.0, 10, 1.0), (1, 2.0, 2, 2.0), (60, 0.5, 30, 0.5), (0.5, 1.0, 1, 2.0)):
        out = Collect()
        stop = Waits()
        n = playback.run_replay(frames, out, tty=False, speed=speed, refresh=refresh, start=T0, end=T0 + 60, stop=stop)
        offs = [int(m) for m in re.findall(r"\+(\d+)s of 179s", out.text)]
        assert offs == list(range(0, 61, step)), (speed, offs)
        assert n == len(offs) and stop.asked == [wait] * (n - 1), (speed, stop.asked)


class Collect:
    def __init__(self):
        self.text = ""

    def write(self, s):
        self.text += s

    def flush(self):
        pass


def test_a_merged_record_of_two_pods(flood, tmp_path):
    other, _ = simulated_record("normal", seconds=60, onset=1000, t0=T0 + 30,
                                labels=(("namespace", "demo"), ("pod", "vllm-demo-1")))
    merged = tmp_path / "record.om.gz"
    pm.write_openmetrics(pm.merge_records([("a", flood["text"].encode()), ("b", other.encode())]), merged)
    r = top("--replay", str(merged), "--once", "--end", "+60")
    assert r.returncode == 0, r.stderr
    assert "(2 pod(s)" in r.stdout
    assert "  pod         demo/vllm-demo-0   poll at 08:01:00" in r.stdout
    assert "  pod         demo/vllm-demo-1   poll at 08:01:00" in r.stdout
    r = top("--replay", str(merged), "--once", "--end", "+10")
    assert r.returncode == 0, r.stderr
    assert "  pod         demo/vllm-demo-1\n  (no poll yet)" in r.stdout  # its record starts at +30 s
    r = top("--replay", str(merged), "--once", "--end", "+10", "--pod", "vllm-demo-1")
    assert r.returncode == 0, r.stderr
    assert "(1 pod(s)" in r.stdout and "demo/vllm-demo-0" not in r.stdout
    assert "  pod         demo/vllm-demo-1   poll at 08:00:40" in r.stdout  # +10 s of its own record


def test_replay_says_in_one_line_what_it_cannot_read(flood, tmp_path):
    def one_line(r, *words):
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        for w in words:
            assert w in r.stderr, r.stderr

    one_line(top("--replay", str(tmp_path / "none.om")), "--replay", "No such file")
    bad = tmp_path / "bad.om"
    bad.write_text("vllm_sidecar_build_info 1\n")
    one_line(top("--replay", str(bad)), "--replay", "timestamp")
    vllm_only = tmp_path / "vllm.om"
    vllm_only.write_text("vllm:num_requests_running 1 1800000000\n# EOF\n")
    one_line(top("--replay", str(vllm_only)), "no vllm_sidecar_ series")
    one_line(top("--replay", str(flood["plain"]), "--vllm-url", "http://x"), "--replay", "--vllm-url")
    one_line(top("--replay", str(flood["plain"]), "--pod", "nope"), "--pod nope")
    one_line(top("--replay", str(flood["plain"]), "--start", "+50", "--end", "+10"), "--end")
    one_line(top("--replay", str(flood["plain"]), "--speed", "-1"), "--speed")
    one_line(top("--start", "+5", "--once"), "--replay only")
