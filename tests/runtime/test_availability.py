"""The availability SLI's counters (``signals.availability``) on vLLM 0.32's real page, its
finished requests and HTTP answers set poll by poll, read by the runtime's ``Reader`` with the
SLO's ``http_handlers``; and the reader's routing of ``http_requests_total``."""

import pytest

from exporter.harness import pagetransform as pt
from exporter.runtime.exposition import parse
from exporter.runtime.flight import route_key
from exporter.runtime.inputs import HTTP_KEY, Caps, Reader, normalize
from exporter.runtime.rolling import Windows
from exporter.runtime.signals import AvailabilityCounter, derive
from helpers import cfg, scraped, value

M = "tiny-llama"
HANDLERS = "/v1/.*"
START = 1.79595983136e9
T0 = START + 3600.0  # the first poll, an hour into vLLM's life


def page(base: str, stop=0.0, error=0.0, abort=0.0, http=None, start=START, engines=("0",), created=None) -> str:
    """``base`` with vLLM's finished requests (each engine alike), the OpenAI server's answers
    ({(handler, status): count}, their creation times in ``created`` where given) and the
    process start time set (None: no start time)."""
    reasons = {"stop": stop, "length": 0.0, "abort": abort, "error": error, "repetition": 0.0}

    def fn(name, labels, v):
        if name == "vllm:request_success_total":
            reason = labels.split('finished_reason="')[1].split('"')[0]
            return [(name, labels.replace('engine="0"', f'engine="{e}"'), reasons[reason]) for e in engines]
        if name in ("vllm:request_success_created", "http_requests_total", "http_requests_created"):
            return []  # no creation times: the windows judge a new series by its value
        if name == "process_start_time_seconds":
            return [] if start is None else [(name, labels, start)]
        return None

    text = pt.map_samples(base, fn)
    for (handler, status), v in (http or {}).items():
        text += f'http_requests_total{{handler="{handler}",method="POST",status="{status}"}} {v}\n'
    for (handler, status), c in (created or {}).items():
        text += f'http_requests_created{{handler="{handler}",method="POST",status="{status}"}} {c}\n'
    return text


def counted(base, pages, sli="combined"):
    """(requests, errors by source) after the windows and the counter read ``pages`` (2 s apart)."""
    reader, w, counter = Reader(http_handlers=HANDLERS), Windows(60, 60, 2), AvailabilityCounter(sli)
    for i, kw in enumerate(pages):
        _page, snap = reader.read(page(base, **kw), T0 + 2 * i)
        w.add(snap)
        counter.observe(w, snap.models)
    t = counter.totals(M)
    return t.requests_total, dict(t.errors_total)


CHAT, HEALTH = "/v1/chat/completions", "/health"


def test_reader_adds_up_the_counted_handlers_answers_by_status(after_load):
    text = page(after_load, http={(CHAT, "2xx"): 10, ("/v1/completions", "2xx"): 5, (CHAT, "5xx"): 2,
                                  (HEALTH, "2xx"): 99})
    _p, snap = Reader(http_handlers=HANDLERS).read(text, 100.0)
    assert {k: v for k, v in snap.values.items() if k[0] == HTTP_KEY} == {
        (HTTP_KEY, "", "", "2xx"): 15.0, (HTTP_KEY, "", "", "5xx"): 2.0}
    assert "" not in snap.models  # the pod's answers are no model
    # a full parse sorted by ``normalize`` reads the same
    assert normalize(parse(text), 100.0, http_handlers=HANDLERS).values == snap.values
    # without the handlers (the default), HTTP answers are not read
    assert not any(k[0] == HTTP_KEY for k in Reader().read(text, 100.0)[1].values)
    # matched whole, as PromQL's =~: "/v1" alone is not "/v1/.*"
    assert not any(k[0] == HTTP_KEY for k in Reader(http_handlers="/v1").read(text, 100.0)[1].values)
    # the answers are not vLLM's series: the page's vLLM sample count is unchanged
    assert snap.vllm_samples == Reader().read(text, 100.0)[1].vllm_samples


def test_a_bad_http_count_is_rejected_and_counted_and_statuses_are_capped(after_load):
    text = page(after_load, http={(CHAT, "2xx"): 10}) + \
        f'http_requests_total{{handler="{CHAT}",method="GET",status="5xx"}} -3\n'
    _p, snap = Reader(http_handlers=HANDLERS).read(text, 100.0)
    assert [k for k in snap.values if k[0] == HTTP_KEY] == [(HTTP_KEY, "", "", "2xx")]
    assert snap.rejected == {"invalid_value": 1} and "http_requests_total" in snap.rejected_detail
    many = page(after_load, http={(CHAT, str(200 + i)): 1 for i in range(5)})
    _p, snap = Reader(Caps(max_label_values=3), http_handlers=HANDLERS).read(many, 100.0)
    assert sum(1 for k in snap.values if k[0] == HTTP_KEY) == 3
    assert {n for n in snap.dropped_names["max_label_values"] if n.startswith("status=")} == {"status=203", "status=204"}


def test_the_flight_recorder_writes_an_answer_back_under_its_own_labels(after_load):
    p, _snap = Reader(http_handlers=HANDLERS).read(page(after_load, http={(CHAT, "5xx"): 2}), 100.0)
    keys = [route_key(r) for r, _v in p.selected if getattr(r, "role", None) == "http"]
    assert keys == [("http_requests_total", (("handler", CHAT), ("method", "POST"), ("status", "5xx")))]


def test_http_answers_count_the_requests_and_each_source_its_failures(after_load):
    # first page: the base; then 10 answers (2 of them 5xx) and 5 engine errors (3 inside 200 streams)
    pages = [dict(stop=100, error=1, http={(CHAT, "2xx"): 95, (CHAT, "5xx"): 6}),
             dict(stop=105, error=6, http={(CHAT, "2xx"): 103, (CHAT, "5xx"): 8})]
    assert counted(after_load, pages) == (10.0, {"engine": 5.0, "http": 2.0})
    assert counted(after_load, pages, sli="http") == (10.0, {"http": 2.0})
    # engine: vLLM's finished requests except aborts, its errors
    assert counted(after_load, pages, sli="engine") == (10.0, {"engine": 5.0})


def test_without_http_answers_vllms_finished_requests_count_aborts_left_out(after_load):
    pages = [dict(stop=10, abort=5), dict(stop=20, error=2, abort=50)]
    assert counted(after_load, pages) == (12.0, {"engine": 2.0, "http": 0.0})


def test_only_4xx_answers_leave_the_requests_to_vllm(after_load):
    # as PromQL's status!~"4xx" selects nothing there and the pack falls back to vLLM's count
    pages = [dict(stop=10, http={(CHAT, "4xx"): 3}), dict(stop=20, http={(CHAT, "4xx"): 9})]
    assert counted(after_load, pages) == (10.0, {"engine": 0.0, "http": 0.0})


def test_engines_add_up(after_load):
    pages = [dict(stop=10, engines=("0", "1")), dict(stop=13, error=1, engines=("0", "1"))]
    assert counted(after_load, pages, sli="engine") == (8.0, {"engine": 2.0})


def test_a_series_created_between_polls_counts_and_a_lost_one_goes_on_from_its_last_value(after_load):
    # the 5xx series is created at the server's first failures: its 3 count (no creation time:
    # the value is small beside what one series grew in the poll before)
    pages = [dict(stop=10, http={(CHAT, "2xx"): 10}),
             dict(stop=17, http={(CHAT, "2xx"): 17}),
             dict(stop=20, http={(CHAT, "2xx"): 17, (CHAT, "5xx"): 3}),
             # a page that lost the 5xx line, then it is back: nothing counted twice
             dict(stop=25, http={(CHAT, "2xx"): 22}),
             dict(stop=30, http={(CHAT, "2xx"): 27, (CHAT, "5xx"): 3})]
    assert counted(after_load, pages, sli="http") == (20.0, {"http": 3.0})
    # with its creation time on the page, the time decides, whatever the value
    burst = [dict(stop=10, http={(CHAT, "2xx"): 10}),
             dict(stop=50, http={(CHAT, "2xx"): 10, (CHAT, "5xx"): 40}, created={(CHAT, "5xx"): T0 + 1})]
    assert counted(after_load, burst, sli="http") == (40.0, {"http": 40.0})


def test_a_series_the_base_page_missed_never_counts_its_whole_life(after_load):
    # the 5xx line lost on the first page: 5000 failures since vLLM started are not 5000 now
    pages = [dict(stop=10, http={(CHAT, "2xx"): 10}),
             dict(stop=12, http={(CHAT, "2xx"): 12, (CHAT, "5xx"): 5000}, created={(CHAT, "5xx"): T0 - 600})]
    assert counted(after_load, pages, sli="http") == (2.0, {"http": 0.0})
    # nor without its creation time: far more than one poll's worth
    pages[1] = dict(stop=12, http={(CHAT, "2xx"): 12, (CHAT, "5xx"): 5000})
    assert counted(after_load, pages, sli="http") == (2.0, {"http": 0.0})


def test_a_restart_counts_from_zero_and_two_processes_behind_one_url_count_their_own(after_load):
    pages = [dict(stop=100, http={(CHAT, "2xx"): 100}),
             dict(stop=110, http={(CHAT, "2xx"): 110}),
             # vLLM restarted between two polls and already served more than before: the start
             # time says so (the counters alone would read 150 - 110 as 40)
             dict(stop=150, http={(CHAT, "2xx"): 150}, start=T0 + 3)]
    assert counted(after_load, pages)[0] == 10.0 + 150.0
    # two processes answering in turn (a Service): what each grew between its own answers; the
    # second one's first answer reads as a restart (a later start, never seen: its 1003 count
    # once, as every rate of the windows counts it), never again (the sidecar warns of the
    # two processes: vllm_sidecar_vllm_multiple_processes)
    alternating = [dict(stop=1000 + 3 * i, http={(CHAT, "2xx"): 1000 + 3 * i}, start=START + 600 * (i % 2))
                   for i in range(10)]
    assert counted(after_load, alternating)[0] == (1024 - 1000) + 1027


def test_several_models_count_vllms_own_requests_and_errors(after_load):
    two = pt.merge_models(after_load, pt.rename_model(after_load, "other"))
    reader, w, counter = Reader(http_handlers=HANDLERS), Windows(60, 60, 2), AvailabilityCounter()
    for i, (stop, ans) in enumerate(((10, 10), (20, 30))):
        snap = reader.read(page(two, stop=stop, http={(CHAT, "2xx"): ans, (CHAT, "5xx"): ans}), T0 + 2 * i)[1]
        w.add(snap)
        counter.observe(w, snap.models)
    for model in (M, "other"):  # the 40 answers (20 failed) belong to no model alone
        assert (counter.totals(model).requests_total, counter.totals(model).errors_total) == (10.0, {"engine": 0.0})


def test_served_from_the_first_page_at_zero_as_counters(after_load):
    s1 = Reader(http_handlers=HANDLERS).read(page(after_load, stop=10), 100.0)[1]
    pts = derive([s1], [s1], 100.0, cfg())
    assert value(pts, "availability_requests_total", model_name=M) == 0
    assert value(pts, "availability_errors_total", model_name=M, source="engine") == 0
    assert value(pts, "availability_errors_total", model_name=M, source="http") == 0


def test_the_windows_starting_again_take_a_new_base(after_load):
    reader, w, counter = Reader(http_handlers=HANDLERS), Windows(60, 60, 2), AvailabilityCounter()
    for t, stop in ((T0, 10), (T0 + 2, 20), (T0 - 50, 500), (T0 - 48, 505)):  # the clock went back
        snap = reader.read(page(after_load, stop=stop), t)[1]
        w.add(snap)
        counter.observe(w, snap.models)
    assert counter.totals(M).requests_total == 15.0


def test_an_unknown_sli_is_refused():
    with pytest.raises(ValueError, match="availability_sli"):
        AvailabilityCounter("dns")


def test_the_sidecar_serves_them_as_counters(after_load):
    from exporter.runtime.sidecar import Sidecar

    now = [T0]
    texts = iter(page(after_load, stop=s, error=e, http={(CHAT, "2xx"): s}) for s, e in ((10, 0), (20, 1), (31, 1)))
    sc = Sidecar(cfg(gpu="none"), lambda: next(texts), clock=lambda: now[0])
    for i in range(3):
        now[0] = T0 + 2 * i
        pub = sc.poll_once()
    got = scraped(pub)
    assert got[("vllm_sidecar_availability_requests_total", (("model_name", M),))] == 21.0
    assert got[("vllm_sidecar_availability_errors_total", (("model_name", M), ("source", "engine")))] == 1.0
    assert got[("vllm_sidecar_availability_errors_total", (("model_name", M), ("source", "http")))] == 0.0
