"""The flight recorder: what a poll keeps, the ring, eviction, pinning and the memory cap, all on
a fake clock (the recorder reads no clock: the poll's time is passed in)."""

import math

import pytest

from exporter.analysis.sources import load_openmetrics
from exporter.harness import pagetransform as pt
from exporter.harness.fakenvml import FakeNvml, make_gpus
from exporter.runtime.collectors import build_families
from exporter.runtime.config import parse_labels
from exporter.runtime.exposition import parse
from exporter.runtime.fetch import FetchError
from exporter.runtime.flight import Recorder, openmetrics
from exporter.runtime.inputs import Reader
from exporter.runtime.nvml import NvmlSource
from exporter.runtime.sidecar import Sidecar
from exporter.runtime.signals.results import Caches, KvQueue, Latency, ModelSignals, Prompts, Signals, Throughput
from exporter.runtime.state import Published
from helpers import PageSequence, cfg

M = "Qwen/Qwen2.5-0.5B-Instruct"


def _load(blocks, **kw):
    text = "".join(openmetrics(blocks, **kw))
    store = load_openmetrics(text.encode()).store
    out = {}
    for s in store:
        d = dict(s.labels)
        name = d.pop("__name__")
        out[(name, tuple(sorted(d.items())))] = list(zip((t / 1000 for t in s.t), s.v))
    return text, out


def test_a_poll_keeps_vllms_inputs_as_read_and_what_a_scrape_shows(clock, after_load):
    gpus = make_gpus(2)
    seq = PageSequence(clock, after_load)
    rec = Recorder()
    sc = Sidecar(cfg(poll_interval=1, window=10), seq, NvmlSource(FakeNvml(gpus)), clock=clock, recorder=rec)
    pubs = []
    for i in range(8):
        seq.text = pt.scale_counters(after_load, 1 + i * 0.01)
        pubs.append(sc.poll_once())
        clock.advance(1)
    _, got = _load(rec.snapshot()[0])
    # every sample a scrape of the last state shows is in the record at its time and value
    last = pubs[-1]
    for fam in build_families(last):
        for s in fam.samples:
            key = (s.name, tuple(sorted(s.labels.items())))
            assert key in got, key
            assert dict(got[key])[round(last.t, 3)] == pytest.approx(s.value, rel=0, abs=0), key
    # vLLM's own series under vLLM's names, counters as read from the page
    page = pt.scale_counters(after_load, 1.07)
    want = {(s.name, tuple(sorted(s.labels))): s.value for s in parse(page).samples}
    gen = [k for k in got if k[0] == "vllm:generation_tokens_total"]
    assert gen
    for k in gen:
        assert dict(got[k])[round(last.t, 3)] == want[k]
    buckets = [k for k in got if k[0] == "vllm:time_to_first_token_seconds_bucket"]
    assert len(buckets) > 5 and all(dict(got[k])[round(last.t, 3)] == want[k] for k in buckets)
    # one sample per poll for a series present all along
    assert len(got[gen[0]]) == 8


def test_labels_are_added_and_the_range_is_cut(clock, after_load):
    seq = PageSequence(clock, after_load)
    rec = Recorder(block_polls=4)
    sc = Sidecar(cfg(poll_interval=1, window=10), seq, None, clock=clock, recorder=rec)
    t0 = clock.t
    for i in range(20):
        seq.text = pt.scale_counters(after_load, 1 + i * 0.01)
        sc.poll_once()
        clock.advance(1)
    labels = parse_labels("pod=vllm-0, namespace=prod")
    text, got = _load(rec.snapshot()[0], start=t0 + 5, end=t0 + 9, labels=labels)
    assert text.endswith("# EOF\n")
    times = {t for series in got.values() for t, _ in series}
    assert times == {t0 + 5 + i for i in range(5)}
    assert all(("namespace", "prod") in k[1] and ("pod", "vllm-0") in k[1] for k in got)
    with pytest.raises(ValueError):
        parse_labels("pod")


def test_a_schema_change_closes_the_block_and_nothing_is_lost(clock, after_load, idle):
    seq = PageSequence(clock, idle)
    rec = Recorder(block_polls=100)
    sc = Sidecar(cfg(poll_interval=1, window=10), seq, None, clock=clock, recorder=rec)
    for i in range(6):
        seq.text = idle if i < 3 else after_load
        sc.poll_once()
        clock.advance(1)
    seq.error = FetchError("refused", "down")
    sc.poll_once()
    blocks, _ = rec.snapshot()
    assert len(blocks) >= 2
    assert sum(b.n for b in blocks) == 7
    _, got = _load(blocks)
    up = got[("vllm_sidecar_target_up", (("target", "vllm"),))]
    assert [v for _, v in up] == [1.0] * 6 + [0.0]


# -- the ring on a fake clock -----------------------------------------------------------------

def _rows(after_pressure):
    reader = Reader()
    page, _ = reader.read(after_pressure, 0.0)
    return page.selected


def _pub(t, level=0, up=True, model=M):
    kv = KvQueue(usage=0.99 if level >= 3 else 0.5, pressure_level=level)
    m = ModelSignals(model=model, throughput=Throughput(), kv=kv, latency=Latency(), prompts=Prompts(), caches=Caches())
    return Published(t=t, signals=Signals(models=(m,)), up=(("vllm", up),))


def _drive(rec, rows, t, seconds, step, level_at=lambda t: 0):
    """Polls every ``step`` s for ``seconds``; the counters advance; returns the end time."""
    n = int(seconds / step)
    for i in range(n):
        grown = [(r, v * (1 + (t % 997) * 1e-4) + (i % 7)) for r, v in rows]
        rec.record(t, grown, _pub(t, level_at(t)))
        t += step
    return t


def test_the_ring_keeps_the_last_minutes_and_drops_the_rest(after_pressure):
    rows = _rows(after_pressure)
    rec = Recorder(minutes=30, max_bytes=64 << 20)
    t = _drive(rec, rows, 1e9, 2 * 3600, 2.0)
    blocks, _ = rec.snapshot()
    now = t - 2.0
    assert blocks[0].t0 >= now - 30 * 60 - 60  # a block of at most 60 s at the edge
    assert blocks[0].t0 <= now - 30 * 60 + 60
    assert rec.evicted_blocks > 0
    # polls are contiguous: every poll of the last 30 minutes is there
    times = [x for b in blocks for x in b.times]
    assert times == sorted(times)
    assert all(abs(b - a - 2.0) < 1e-6 for a, b in zip(times, times[1:]))


def test_minutes_zero_is_off_in_the_sidecar(clock, after_load):
    from exporter.runtime.app import make_recorder

    assert make_recorder(cfg(flight_minutes=0)) is None
    rec = make_recorder(cfg(flight_minutes=5, flight_max_bytes=1 << 20))
    assert rec.horizon == 300 and rec.max_bytes == 1 << 20


def test_an_event_pins_its_window_beyond_the_horizon(after_pressure):
    rows = _rows(after_pressure)
    rec = Recorder(minutes=10, max_bytes=64 << 20, event_before=300, event_after=300)
    t_ev = 1e9 + 3600
    t = _drive(rec, rows, 1e9, 3 * 3600, 5.0, level_at=lambda t: 3 if t_ev <= t < t_ev + 60 else 0)
    blocks, events = rec.snapshot()
    assert [e.kind for e in events] == ["kv_thrashing"]
    ev = events[0]
    assert ev.t == t_ev and rec.events_total["kv_thrashing"] == 1
    pinned = [b for b in blocks if b.t1 < t - 3600]
    assert pinned, "the event's window outlived the 10-minute ring"
    assert min(b.t0 for b in pinned) <= t_ev - 300 < t_ev + 300 <= max(b.t1 for b in pinned)
    assert all(b.t1 >= ev.start - 60 and b.t0 <= ev.end + 60 for b in pinned)  # nothing else kept
    # ?event=ID: the window exactly
    _, got = _load(blocks, start=ev.start, end=ev.end)
    kv = got[("vllm_sidecar_kv_cache_pressure_level", (("model_name", M),))]
    assert kv[0][0] == ev.start and kv[-1][0] == ev.end
    assert dict(kv)[t_ev] == 3.0 and dict(kv)[t_ev - 5] == 0.0


def test_the_same_trouble_is_one_event_while_its_window_is_open(after_pressure):
    rows = _rows(after_pressure)
    rec = Recorder(event_before=60, event_after=120)
    flapping = lambda t: 3 if int(t) % 20 < 10 else 0  # noqa: E731 - on and off every 10 s
    _drive(rec, rows, 1e9, 100, 2.0, level_at=flapping)
    assert rec.events_total["kv_thrashing"] == 1
    _drive(rec, rows, 1e9 + 100, 150, 2.0, level_at=flapping)  # 140: the next one, 280 would be a third
    assert rec.events_total["kv_thrashing"] == 2  # after the window closed, a new one


def test_unreachable_and_restart_and_xid_open_events():
    rec = Recorder()
    t = 1e9
    rec.record(t, None, Published(t=t, up=(("vllm", True),)))
    rec.record(t + 1, None, Published(t=t + 1, up=(("vllm", False),)))
    rec.record(t + 2, None, Published(t=t + 2, up=(("vllm", True),), vllm_restarts_total=1))
    kinds = [e.kind for e in rec.events]
    assert kinds == ["vllm_unreachable", "vllm_restarted"]
    # a sidecar that never reached vLLM opens nothing: it has no incident to keep, only a setup problem
    rec2 = Recorder()
    rec2.record(t, None, Published(t=t, up=(("vllm", False),)))
    assert rec2.events == []


def test_a_simulated_day_stays_under_the_cap_with_pinned_events(after_pressure):
    rows = _rows(after_pressure)
    cap = 150_000
    rec = Recorder(minutes=30, max_bytes=cap, event_before=600, event_after=600, max_events=4)
    t = 1e9
    seen_max = 0
    for _hour in range(24):
        # one incident an hour, a minute of thrashing
        start = t + 1800
        t = _drive(rec, rows, t, 3600, 30.0, level_at=lambda x, s=start: 3 if s <= x < s + 60 else 0)
        seen_max = max(seen_max, rec.nbytes)
        assert rec.nbytes <= cap
    blocks, events = rec.snapshot()
    assert rec.events_total["kv_thrashing"] == 24
    assert 1 <= len(events) <= 4
    assert events[-1].t == t - 3600 + 1800
    assert rec.nbytes <= cap
    assert seen_max > cap * 0.5  # the cap was what bounded it
    # the newest event's window is whole
    ev = events[-1]
    _, got = _load(blocks, start=ev.start, end=ev.end)
    kv = got[("vllm_sidecar_kv_cache_pressure_level", (("model_name", M),))]
    assert kv[0][0] == ev.start and kv[-1][0] == ev.end


def test_the_cap_forgets_the_oldest_event_when_only_pinned_blocks_are_left(after_pressure):
    rows = _rows(after_pressure)
    cap = 400_000
    rec = Recorder(minutes=1, max_bytes=cap, event_before=300, event_after=300, max_events=100)
    t = 1e9
    for _ in range(18):  # an incident every 10 minutes for 3 hours
        t = _drive(rec, rows, t, 600, 5.0, level_at=lambda x, s=t: 3 if s <= x < s + 10 else 0)
        assert rec.nbytes <= cap
    assert rec.events_total["kv_thrashing"] == 18
    assert 1 <= len(rec.events) < 18  # the oldest were forgotten for the cap, not for max_events
    ev = rec.events[-1]
    assert ev.t == t - 600
    blocks, _ = rec.snapshot()
    _, got = _load(blocks, start=ev.start, end=ev.end)
    kv = got[("vllm_sidecar_kv_cache_pressure_level", (("model_name", M),))]
    assert kv[0][0] == ev.start and kv[-1][0] == ev.end  # its window, whole


def test_values_survive_compression_exactly():
    rec = Recorder(block_polls=5)
    vals = [0.1, -0.0, math.inf, 1e-300, 123456789.123, 0.9934, 0.2]
    for i, v in enumerate(vals):
        rec.record(1e9 + i, None, Published(t=1e9 + i, last_success=(("vllm", v),)))
    blocks, _ = rec.snapshot()
    _, got = _load(blocks)
    series = got[("vllm_sidecar_last_success_timestamp_seconds", (("target", "vllm"),))]
    assert [v for _, v in series] == vals
