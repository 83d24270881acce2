"""Property tests of the exposition parser (hypothesis).

- Valid pages, generated (families, label sets with every escape, special values, timestamps),
  read exactly as prometheus_client reads them, whether cold or from the series cache.
- Arbitrary text never raises anything: every sample line is either read or counted as
  malformed under one of the known reasons.
- Prometheus 3's quoted UTF-8 names and OpenMetrics float timestamps read as prometheus_client
  reads them.
"""


from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.runtime.exposition import MALFORMED_REASONS, Limits, Parser, format_float, parse
from exporter.runtime.inputs import route
from helpers import ours, reference, same

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

metric_names = st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,20}", fullmatch=True)
label_names = st.from_regex(r"[a-zA-Z][a-zA-Z0-9_]{0,12}", fullmatch=True)
label_values = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=24)
values = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**6, 10**6).map(float))


def escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


@st.composite
def pages(draw):
    lines = []
    expected = []
    names = draw(st.lists(metric_names, min_size=1, max_size=6, unique=True))
    for name in names:
        kind = draw(st.sampled_from(["gauge", "untyped", "counter"]))
        lines.append(f"# HELP {name} some help")
        lines.append(f"# TYPE {name} {kind}")
        seen = set()
        sample_name = name + "_total" if kind == "counter" else name  # as clients write counters
        for _ in range(draw(st.integers(1, 4))):
            keys = draw(st.lists(label_names, max_size=3, unique=True))
            labels = tuple((k, draw(label_values)) for k in keys)
            ident = tuple(sorted(labels))
            if ident in seen:
                continue
            seen.add(ident)
            v = draw(values)
            text = ",".join(f'{k}="{escape(x)}"' for k, x in labels)
            ts = draw(st.one_of(st.none(), st.integers(0, 2**40)))
            tail = f" {format_float(v)}" + (f" {ts}" if ts is not None else "")
            lines.append(f"{sample_name}{{{text}}}{tail}" if labels else f"{sample_name}{tail}")
            expected.append((sample_name, ident, v))
    return "\n".join(lines) + "\n", expected



@SETTINGS
@given(pages())
def test_valid_pages_read_as_prometheus_client_reads_them(gen):
    text, _expected = gen
    ref = reference(text)
    p = Parser()
    cold = p.parse(text)
    assert cold.malformed == 0, cold.first_error
    same(ours(cold), ref)
    warm = p.parse(text)  # the second read comes from the series cache
    same(ours(warm), ref)


@SETTINGS
@given(st.text(max_size=400))
def test_arbitrary_text_never_raises_and_every_line_is_accounted_for(text):
    for p in (Parser(), Parser(select=route)):
        page = p.parse(text)
        assert set(page.reasons) <= set(MALFORMED_REASONS)
        assert page.malformed == sum(page.reasons.values())
        assert len(page.samples) + len(page.selected) + page.counted + page.malformed <= page.lines + page.malformed
        again = p.parse(text)  # and from the cache: the same answer
        assert again.malformed == page.malformed and len(again.samples) == len(page.samples)


@SETTINGS
@given(st.binary(max_size=400))
def test_arbitrary_bytes_decoded_never_raise(data):
    page = Parser(select=route).parse(data.decode("utf-8", errors="replace"))
    assert page.malformed == sum(page.reasons.values())


@SETTINGS
@given(pages(), st.integers(0, 10_000), st.text(st.characters(blacklist_characters="\n\r#"), max_size=30))
def test_a_real_page_with_a_line_broken_keeps_every_other_line(gen, at, junk):
    text, _ = gen
    lines = text.rstrip("\n").split("\n")
    i = at % len(lines)
    broken = "\n".join(lines[:i] + [junk + "{"] + lines[i:]) + "\n"
    p = Parser()
    p.parse(text)
    page = p.parse(broken)
    assert page.malformed == 1 and page.reasons == {"syntax": 1}
    same(ours(page), reference(text))


def test_quoted_utf8_names_read_as_prometheus_client_reads_them():
    text = ('# TYPE "vllm:kv.cache usage" gauge\n'
            '{"vllm:kv.cache usage", model_name="m", "engine.id"="0"} 0.5\n'
            '{"vllm:kv.cache usage",model_name="m","engine.id"="1"} 0.25\n'
            'plain_name{"quoted.label"="x"} 3\n')
    page = parse(text)
    assert page.malformed == 0
    same(ours(page), reference(text))
    assert page.samples[0].name == "vllm:kv.cache usage"


def test_openmetrics_float_timestamps_and_exemplars(after_load):
    lines = []
    for line in after_load.splitlines():
        if line and not line.startswith("#"):
            line += " 1700000000.125"
        lines.append(line)
    text = "\n".join(lines) + "\n"
    p = Parser()
    page = p.parse(text)
    assert page.malformed == 0
    same(ours(page), reference(text))
    same(ours(p.parse(text)), reference(text))  # and through the cache
    ex = 'vllm:e2e_request_latency_seconds_bucket{le="0.5"} 4 # {trace_id="abc"} 0.31 1700000000.5\n'
    assert parse(ex).samples[0].value == 4 and parse(ex).malformed == 0


def test_limits_reject_and_count_too_long():
    lim = Limits(max_line_chars=200, max_label_value_chars=20, max_name_chars=30)
    p = Parser(limits=lim)
    text = ('ok{a="short"} 1\n'
            f'long_value{{a="{"x" * 21}"}} 1\n'
            f'{"n" * 31} 1\n'
            f'long_line{{a="{"y" * 15}"}} 1 {"9" * 200}\n')
    page = p.parse(text)
    assert [s.name for s in page.samples] == ["ok"]
    assert page.reasons == {"too_long": 3}
