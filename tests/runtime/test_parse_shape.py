"""The page's shape kept between polls (``exposition._Plan``): a page of the same shape as the
last clean one is read without a step per line, and whatever the page, the answer is the one the
line-by-line loop gives with the same series cache."""

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import page as fixture_page
from exporter.harness import pagetransform as pt
from exporter.runtime.exposition import Parser
from exporter.runtime.inputs import route

SETTINGS = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PAGE = fixture_page("after_pressure.txt")


def _v(x):
    return "nan" if isinstance(x, float) and math.isnan(x) else x


def answer(p):
    """Everything a page says, NaN comparable."""
    return ([(n, _v(v)) for n, v in p.selected], p.counted, p.lines, p.malformed, dict(p.reasons),
            p.first_error, dict(p.types), p.samples)


class LineByLine(Parser):
    """The same parser with no shape kept: every page read by the loop."""

    def parse(self, text):
        self._plan = None
        return super().parse(text)


def both(*texts):
    """Each text read in turn by a parser keeping the shape and by one that does not; the same
    answers. Returns the first parser."""
    a, b = Parser(select=route), LineByLine(select=route)
    for t in texts:
        assert answer(a.parse(t)) == answer(b.parse(t))
    return a


def test_pages_of_one_shape_are_read_through_it():
    pages = [pt.scale_counters(PAGE, 1.0 + i * 0.01) for i in range(6)]
    a = both(*pages)
    assert a.plan_reads == 4  # the first page cold, the second builds the shape, the rest use it
    fresh = Parser(select=route).parse(pages[-1])  # and cold, the same values
    assert answer(a.parse(pages[-1])) == answer(fresh)


def test_a_cache_clear_drops_the_shape():
    a = both(PAGE, PAGE, PAGE)
    assert a.plan_reads == 1
    a.clear()
    assert a._plan is None
    a.parse(PAGE)  # cold again: no shape kept from a page read the careful way
    assert a.plan_reads == 1 and a._plan is None
    a.parse(PAGE)
    a.parse(PAGE)
    assert a.plan_reads == 2


def _lines():
    return PAGE.rstrip("\n").split("\n")


def _samples():
    return [i for i, line in enumerate(_lines()) if line and not line.startswith("#")]


ODD_VALUES = ["1_0", "abc", "", "NaN", "+Inf", "-Inf", "nan", "inf", "1e400", "0x10", " 1", "1 ",
              "1.0 1700000000000", "1\t", "1" * 41, "1." + "0" * 39, "١", "+1", "-0", "1e+06",
              "1 # {a=\"b\"} 1"]


@SETTINGS
@given(st.lists(st.tuples(st.integers(0, 10 ** 6), st.sampled_from(ODD_VALUES)), max_size=3),
       st.sampled_from(["none", "swap", "drop", "dup", "space", "comment", "blank", "crlf", "append"]),
       st.integers(0, 10 ** 6))
def test_any_change_reads_as_line_by_line(edits, shape, at):
    lines = _lines()
    samples = _samples()
    for k, value in edits:
        i = samples[k % len(samples)]
        lines[i] = lines[i].rpartition(" ")[0] + " " + value
    i = samples[at % len(samples)]
    j = samples[(at * 7 + 3) % len(samples)]
    if shape == "swap":
        lines[i], lines[j] = lines[j], lines[i]
    elif shape == "drop":
        del lines[i]
    elif shape == "dup":
        lines.insert(j, lines[i])
    elif shape == "space":
        lines[i] = lines[i].replace(" ", "  ", 1)
    elif shape == "comment":
        lines.insert(i, "# HELP odd a comment")
    elif shape == "blank":
        lines.insert(i, "")
    elif shape == "crlf":
        lines[i] += "\r"
    elif shape == "append":
        lines[i] = lines[i] + "0"
    odd = "\n".join(lines) + "\n"
    # clean page, its shape kept, then the odd one, then the clean one again and the odd one twice
    both(PAGE, PAGE, odd, PAGE, odd, odd, pt.scale_counters(PAGE, 1.5))


def test_the_builder_reads_a_kept_shape_as_the_rows_it_stands_for():
    """The reader hands the page's shape to the builder, which keeps the names each input is read
    under for it; the snapshots are those of a reader that never keeps a shape."""
    from exporter.runtime.inputs import Reader

    a, b = Reader(), Reader()
    b.parser = LineByLine(select=route)
    for i in range(5):
        text = pt.scale_counters(PAGE, 1.0 + i * 0.01)
        pa, sa = a.read(text, 1000.0 + i)
        pb, sb = b.read(text, 1000.0 + i)
        assert pb.shape is None and (pa.shape is not None) == (i >= 2)
        assert sa == sb
    assert a.builder._shape is pa.shape


def _two_models(text):
    """The page with each vLLM line twice: model tiny-llama on engine 0 and model other on engine 1."""
    out = []
    for line in text.split("\n"):
        out.append(line)
        if 'model_name="tiny-llama"' in line:
            out.append(line.replace('model_name="tiny-llama"', 'model_name="other"').replace('engine="0"', 'engine="1"'))
    return "\n".join(out)


def _both_readers(caps, texts):
    """Two readers, one keeping the page's shape (the builder's program), one reading every page
    line by line (the builder's loop): the same snapshots and the same admissions, page by page."""
    from exporter.runtime.inputs import Reader

    a, b = Reader(caps, memory=30.0), Reader(caps, memory=30.0)
    b.parser = LineByLine(select=route)
    for i, text in enumerate(texts):
        t = 1000.0 + 10.0 * i
        _pa, sa = a.read(text, t)
        _pb, sb = b.read(text, t)
        assert sa == sb
        assert list(sa.values) == list(sb.values) and list(sa.hists) == list(sb.hists)  # the same order
        for x, y in ((a.builder.models, b.builder.models), (a.builder.engines, b.builder.engines)):
            assert list(x.seen.items()) == list(y.seen.items())
    return a


BAD = ["-1", "NaN", "+Inf", "-Inf", "1e309", "-0", "0", "1e308", "2"]


@SETTINGS
@given(st.sampled_from(["one", "two", "lora"]), st.integers(1, 3), st.integers(1, 3), st.integers(1, 6),
       st.lists(st.tuples(st.integers(0, 6), st.integers(0, 10 ** 6), st.sampled_from(BAD)), max_size=4))
def test_the_builders_program_makes_the_loops_snapshot(kind, max_models, max_engines, max_extra, edits):
    from exporter.runtime.inputs import Caps

    base = {"one": PAGE, "two": _two_models(PAGE), "lora": fixture_page("lora_running.txt")}[kind]
    texts = [pt.scale_counters(base, 1.0 + i * 0.01) for i in range(7)]
    for page_no, k, value in edits:  # a value out of its range on one page (or not: "2", "0")
        lines = texts[page_no].split("\n")
        samples = [i for i, line in enumerate(lines) if line and not line.startswith("#")]
        i = samples[k % len(samples)]
        lines[i] = lines[i].rpartition(" ")[0] + " " + value
        texts[page_no] = "\n".join(lines)
    a = _both_readers(Caps(max_models, max_engines, max_extra), texts)
    assert a.builder._shape is not None


def test_the_builders_program_is_used_on_a_steady_page():
    from exporter.runtime import inputs

    runs = []
    real = inputs.Builder._run

    def spy(self, *args):
        ok = real(self, *args)
        runs.append(ok)
        return ok

    inputs.Builder._run = spy
    try:
        _both_readers(inputs.Caps(), [pt.scale_counters(PAGE, 1.0 + i * 0.01) for i in range(5)])
    finally:
        inputs.Builder._run = real
    assert runs == [True, True, True]
