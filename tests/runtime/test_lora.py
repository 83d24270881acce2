"""LoRA adapters from vLLM's vllm:lora_requests_info, on the real pages of a vLLM 0.32 serving two
adapters (tests/fixtures/vllm/PROVENANCE.md), through the real parser and the sidecar.

vLLM 0.32 sets the series of the label combination of the moment to the current unix time and
keeps every earlier combination: the newest value is the state now. It fills both labels from
the same table (adapters with a request running or waiting), so on its pages they are always
equal: the sidecar serves ``lora_adapter_active`` and leaves running/waiting apart out."""

import math

import pytest

from conftest import page
from exporter.harness import pagetransform as pt
from exporter.runtime.exposition import parse
from helpers import cfg, names, scraped, sidecar_with, value

LORA = "vllm:lora_requests_info"
ADAPTERS = ("tiny-lora", "tiny-lora-b")
LORA_NAMES = {"lora_adapter_active", "lora_adapter_running", "lora_adapter_waiting", "lora_adapters_active",
              "lora_adapters_running", "lora_adapters_waiting", "lora_adapters_known", "lora_max_adapters"}


def lora_series(text):
    return [(dict(s.labels), s.value) for s in parse(text).samples if s.name == LORA]


def read(clock, *texts, **kw):
    """The sidecar's state after reading the pages one after another, a second apart."""
    sc, seq = sidecar_with(clock, cfg(poll_interval=1, window=10, **kw), texts[0])
    for text in texts:
        seq.text = text
        pub = sc.poll_once()
        clock.advance(1)
    return pub



def reorder(text, order):
    """The page with vllm:lora_requests_info's samples in another order (``order``: indices)."""
    fams = pt.split_families(text)
    out = []
    for name, comments, samples in fams:
        if name == LORA:
            assert sorted(order) == list(range(len(samples)))
            samples = [samples[i] for i in order]
        out.append((name, comments, samples))
    return pt.join_families(out)


def relabel(text, fn):
    """The page with each LoRA series' labels passed through ``fn(labels dict, value)``."""
    def one(name, labels, v):
        if name != LORA:
            return None
        d = dict(x.split("=", 1) for x in labels[1:-1].split('",') if x)
        d = {k: val.strip('"') for k, val in d.items()}
        d, v = fn(d, v)
        return [(name, "{" + ",".join(f'{k}="{val}"' for k, val in d.items()) + "}", v)]
    return pt.map_samples(text, one)


def test_the_real_pages_say_what_provenance_says():
    assert lora_series(page("lora_idle.txt")) == []
    assert "# TYPE vllm:lora_requests_info gauge" in page("lora_idle.txt")
    for name in ("lora_running.txt", "lora_after.txt"):
        series = lora_series(page(name))
        assert series and all(lab["max_lora"] == "2" and "model_name" not in lab and "engine" not in lab
                              for lab, _ in series)
        # vLLM 0.32 lists the same adapters under both labels, in every series
        assert all(lab["running_lora_adapters"] == lab["waiting_lora_adapters"] for lab, _ in series)
    newest = max(lora_series(page("lora_after.txt")), key=lambda s: s[1])[0]
    assert newest["running_lora_adapters"] == ""


def test_idle_lora_page_serves_nothing_and_no_error(clock):
    pub = read(clock, page("lora_idle.txt"), page("lora_idle.txt"))
    assert dict(pub.up)["vllm"] is True
    assert pub.signals.lora is None
    assert not names(pub) & LORA_NAMES
    assert pub.malformed_lines_total == 0 and not any(n for _, n in pub.dropped_by_reason)
    assert "vllm:lora_requests_info" not in dict(pub.input_missing)


def test_running_page_both_adapters_have_requests_max_two(clock):
    pub = read(clock, page("lora_running.txt"))
    lo = pub.signals.lora
    assert lo is not None and lo.max_adapters == 2 and lo.known == 2 and lo.active == 2
    assert [a.name for a in lo.adapters] == list(ADAPTERS) and all(a.active for a in lo.adapters)
    assert not lo.distinguished and lo.running is None and lo.waiting is None
    for a in ADAPTERS:
        assert value(pub, "lora_adapter_active", adapter=a) == 1
    assert value(pub, "lora_adapters_active") == 2
    assert value(pub, "lora_adapters_known") == 2
    assert value(pub, "lora_max_adapters") == 2
    # vLLM 0.32 does not tell running from waiting: nothing is made up
    assert not names(pub) & {"lora_adapter_running", "lora_adapter_waiting", "lora_adapters_running",
                             "lora_adapters_waiting"}
    m = scraped(pub)
    assert m[("vllm_sidecar_lora_adapter_active", (("adapter", "tiny-lora-b"),))] == 1
    assert m[("vllm_sidecar_lora_max_adapters", ())] == 2
    assert pub.malformed_lines_total == 0


def test_after_page_adapters_known_none_with_requests(clock):
    pub = read(clock, page("lora_after.txt"))
    lo = pub.signals.lora
    assert lo.known == 2 and lo.active == 0 and lo.max_adapters == 2
    for a in ADAPTERS:
        assert value(pub, "lora_adapter_active", adapter=a) == 0
    assert value(pub, "lora_adapters_active") == 0
    assert value(pub, "lora_adapters_known") == 2


def test_one_sidecar_follows_idle_running_after(clock):
    sc, seq = sidecar_with(clock, cfg(poll_interval=1, window=10), page("lora_idle.txt"))
    seen = []
    for name in ("lora_idle.txt", "lora_running.txt", "lora_after.txt"):
        seq.text = page(name)
        pub = sc.poll_once()
        clock.advance(2)
        seen.append((value(pub, "lora_adapters_active"), value(pub, "lora_adapters_known"),
                     value(pub, "lora_adapter_active", adapter="tiny-lora")))
    assert seen == [(None, None, None), (2, 2, 1), (0, 2, 0)]


@pytest.mark.parametrize("order", [(2, 0, 1), (1, 2, 0), (2, 1, 0)])
def test_the_newest_wins_by_value_not_position(clock, order):
    # the empty state is the newest series of lora_after (15 ms newer than tiny-lora's): first,
    # middle or last on the page, it is the state now
    pub = read(clock, reorder(page("lora_after.txt"), order))
    assert value(pub, "lora_adapters_active") == 0
    assert value(pub, "lora_adapter_active", adapter="tiny-lora") == 0
    # the same series with tiny-lora's made the newest: only tiny-lora has requests
    newest = max(v for _, v in lora_series(page("lora_after.txt")))
    swapped = relabel(reorder(page("lora_after.txt"), order),
                      lambda lab, v: (lab, newest + 1.0 if lab["running_lora_adapters"] == "tiny-lora" else v))
    pub = read(clock, swapped)
    assert value(pub, "lora_adapter_active", adapter="tiny-lora") == 1
    assert value(pub, "lora_adapter_active", adapter="tiny-lora-b") == 0
    assert value(pub, "lora_adapters_active") == 1 and value(pub, "lora_adapters_known") == 2


def test_running_page_newest_first(clock):
    pub = read(clock, reorder(page("lora_running.txt"), (1, 0)))
    assert value(pub, "lora_adapters_active") == 2


@pytest.mark.parametrize("name", ["idle.txt", "after_load.txt", "after_pressure.txt"])
def test_a_page_without_the_metric_serves_no_lora_and_no_error(clock, name):
    pub = read(clock, page(name), page(name))
    assert pub.signals.lora is None
    assert not names(pub) & LORA_NAMES
    assert dict(pub.up)["vllm"] is True and pub.malformed_lines_total == 0
    assert not any(v for _, v in pub.input_missing)


def test_running_and_waiting_apart_only_when_vllm_tells_them_apart(clock):
    # a vLLM that lists the adapters with a request running apart from those with one waiting:
    # the real running page with tiny-lora's requests all running in the newest series
    newest = max(v for _, v in lora_series(page("lora_running.txt")))
    text = relabel(page("lora_running.txt"), lambda lab, v: (
        {**lab, "waiting_lora_adapters": "tiny-lora-b"} if v == newest else lab, v))
    pub = read(clock, text)
    lo = pub.signals.lora
    assert lo.distinguished and lo.running == 2 and lo.waiting == 1 and lo.active == 2
    assert value(pub, "lora_adapter_running", adapter="tiny-lora") == 1
    assert value(pub, "lora_adapter_waiting", adapter="tiny-lora") == 0
    assert value(pub, "lora_adapter_running", adapter="tiny-lora-b") == 1
    assert value(pub, "lora_adapter_waiting", adapter="tiny-lora-b") == 1
    assert value(pub, "lora_adapters_running") == 2 and value(pub, "lora_adapters_waiting") == 1


def test_adapters_are_capped_like_other_label_values(clock):
    # the newest state's adapters are kept first; the count of known adapters is the whole truth
    after = page("lora_after.txt")
    newest = max(v for _, v in lora_series(after))
    only_b = relabel(after, lambda lab, v: (
        {**lab, "running_lora_adapters": "tiny-lora-b", "waiting_lora_adapters": "tiny-lora-b"} if v == newest else lab, v))
    pub = read(clock, only_b, only_b, max_label_values=1)
    assert [a.name for a in pub.signals.lora.adapters] == ["tiny-lora-b"]
    assert value(pub, "lora_adapter_active", adapter="tiny-lora-b") == 1
    assert value(pub, "lora_adapter_active", adapter="tiny-lora") is None
    assert value(pub, "lora_adapters_known") == 2 and value(pub, "lora_adapters_active") == 1
    # counted with the other label values over the cap (finished_reason here): one per page
    no_lora = pt.map_samples(only_b, lambda n, lab, v: [] if n == LORA else None)
    m, base = scraped(pub), scraped(read(clock, no_lora, no_lora, max_label_values=1))
    key = ("vllm_sidecar_input_dropped_samples_total", (("reason", "max_label_values"),))
    assert m[key] - base[key] == 2
    key = ("vllm_sidecar_input_over_cap", (("reason", "max_label_values"),))
    assert m[key] - base[key] == 1
    # none with requests: by name
    pub = read(clock, after, max_label_values=1)
    assert [a.name for a in pub.signals.lora.adapters] == ["tiny-lora"]


@pytest.mark.parametrize("bad", [math.nan, -1.0, math.inf])
def test_an_impossible_value_is_rejected_and_the_rest_kept(clock, bad):
    newest = max(v for _, v in lora_series(page("lora_running.txt")))
    text = relabel(page("lora_running.txt"), lambda lab, v: (lab, bad if v == newest else v))
    pub = read(clock, text)
    assert dict(pub.malformed_by_reason).get("invalid_value") == 1
    # the older series is all that is left: tiny-lora alone, with requests
    lo = pub.signals.lora
    assert lo.known == 1 and lo.active == 1 and value(pub, "lora_adapter_active", adapter="tiny-lora") == 1


def test_the_console_shows_adapters_when_present(clock):
    import io

    from exporter.view.console import Screen

    view = Screen(io.StringIO(), tty=False)
    text = view.render(read(clock, page("lora_running.txt")))
    assert "LoRA        2 of 2 known adapters with requests (max 2 per batch): tiny-lora, tiny-lora-b" in text
    assert "running:" not in text  # vLLM 0.32 does not say
    assert "0 of 2 known adapters with requests (max 2 per batch): none" in view.render(
        read(clock, page("lora_after.txt")))
    assert "LoRA" not in view.render(read(clock, page("after_load.txt")))


def test_series_written_in_the_same_instant_are_both_the_state_now(clock):
    # two engines (data parallel) share the series and may write in the same instant: both count
    series = lora_series(page("lora_after.txt"))
    t = max(v for _, v in series)
    text = relabel(page("lora_after.txt"), lambda lab, v: (lab, t if lab["running_lora_adapters"] == "tiny-lora" else v))
    pub = read(clock, text)
    assert value(pub, "lora_adapter_active", adapter="tiny-lora") == 1
    assert value(pub, "lora_adapter_active", adapter="tiny-lora-b") == 0


def test_an_unreadable_max_lora_leaves_only_that_out(clock):
    pub = read(clock, relabel(page("lora_running.txt"), lambda lab, v: ({**lab, "max_lora": "many"}, v)))
    assert value(pub, "lora_max_adapters") is None
    assert value(pub, "lora_adapters_active") == 2 and pub.malformed_lines_total == 0
