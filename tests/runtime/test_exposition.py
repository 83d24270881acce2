"""The exposition parser against prometheus_client's own parser, on real vLLM pages."""

import math

import pytest

from conftest import VLLM_PAGES
from exporter.runtime.exposition import Parser, format_float, parse
from helpers import ours, reference, same

REAL_PAGES = sorted(p.name for p in VLLM_PAGES.glob("*.txt"))
# sample counts of the real pages, as prometheus_client reads them
EXPECTED_COUNTS = {"idle.txt": 420, "after_load.txt": 435, "after_pressure.txt": 510,
                   "lora_idle.txt": 450, "lora_running.txt": 452, "lora_after.txt": 468}



@pytest.mark.parametrize("name", REAL_PAGES)
def test_real_pages_match_prometheus_client(name):
    text = (VLLM_PAGES / name).read_text()
    page = parse(text)
    assert page.malformed == 0
    assert len(page.samples) == EXPECTED_COUNTS[name]
    same(ours(page), reference(text))


@pytest.mark.parametrize("name", REAL_PAGES)
def test_warm_parser_gives_the_same_samples(name):
    text = (VLLM_PAGES / name).read_text()
    p = Parser()
    first = p.parse(text)
    second = p.parse(text)
    assert second.samples == first.samples


def test_real_page_details(after_pressure):
    page = parse(after_pressure)
    by = {(s.name, s.labels): s.value for s in page.samples}
    # le written as a float string, +Inf bucket, _created series kept as samples
    assert by[("vllm:time_to_first_token_seconds_bucket",
               (("engine", "0"), ("le", "2.5"), ("model_name", "tiny-llama")))] == 11.0
    assert by[("vllm:request_prompt_tokens_bucket",
               (("engine", "0"), ("le", "5000.0"), ("model_name", "tiny-llama")))] == 66.0
    assert by[("vllm:time_to_first_token_seconds_bucket",
               (("engine", "0"), ("le", "+Inf"), ("model_name", "tiny-llama")))] == 80.0
    assert by[("vllm:num_preemptions_created", (("engine", "0"), ("model_name", "tiny-llama")))] == \
        pytest.approx(1.7959603755622528e09)
    assert page.types["vllm:time_to_first_token_seconds"] == "histogram"
    assert page.types["vllm:num_preemptions_total"] == "counter"


def test_escapes_special_values_and_timestamps():
    text = (
        '# TYPE x gauge\n'
        'x{a="quote \\" back \\\\ nl \\n end",b="plain"} NaN\n'
        'y_bucket{le="2.097152e+06"} +Inf\n'
        'y_bucket{le="+Inf"} -Inf 1700000000000\n'
        'z 1.5e-3\n'
        '  w{a="}"} 7\n'
    )
    page = parse(text)
    assert page.malformed == 0
    same(ours(page), reference(text))
    assert page.samples[0].labels[0] == ("a", 'quote " back \\ nl \n end')
    assert page.samples[1].labels == (("le", "2.097152e+06"),)
    assert math.isinf(page.samples[1].value)


def test_malformed_lines_are_skipped_and_counted(after_load):
    lines = after_load.splitlines()
    bad = ["vllm:broken{engine=\"0\" 1.0", "3startsWithDigit 1", "no_value_here",
           'vllm:x{a="1"} notanumber', '<html>', 'x{a="1",,b=} 2']
    text = "\n".join(lines[:50] + bad + lines[50:]) + "\n"
    page = parse(text)
    assert page.malformed == len(bad)
    assert page.first_error and "broken" in page.first_error
    assert len(page.samples) == EXPECTED_COUNTS["after_load.txt"]


def test_garbage_yields_nothing():
    page = parse("<!DOCTYPE html>\n<html><body>hello</body></html>\n")
    assert page.samples == []
    assert page.malformed == 2


@pytest.mark.parametrize("v,s", [(120.0, "120.0"), (2097152.0, "2097152.0"), (math.inf, "+Inf"), (0.001, "0.001")])
def test_format_float_like_python_client(v, s):
    assert format_float(v) == s


@pytest.mark.parametrize("name", REAL_PAGES)
def test_cached_and_careful_paths_agree(name):
    """The first read of a page parses every line completely; the next reads take each series
    text from the cache. Both give the same samples, and a changed value is read as changed."""
    text = (VLLM_PAGES / name).read_text()
    p = Parser()
    first = p.parse(text)
    assert p.cache_bytes > 0
    changed = text.replace("vllm:num_requests_running{", "vllm:num_requests_running{", 1)
    again = p.parse(changed)
    assert again.samples == first.samples == parse(text).samples


def test_one_bad_line_does_not_spoil_the_cached_lines(after_load):
    p = Parser()
    p.parse(after_load)
    page = p.parse(after_load + "broken{\n")
    assert page.malformed == 1 and page.reasons == {"syntax": 1}
    assert len(page.samples) == EXPECTED_COUNTS["after_load.txt"]
