"""Small helpers shared by the tests."""

import math
from typing import Optional, Sequence, Tuple

from prometheus_client.parser import text_string_to_metric_families

from exporter.runtime import config
from exporter.runtime.collectors import Point, build_families, signal_points
from exporter.runtime.exposition import parse
from exporter.runtime.inputs import Snapshot, normalize
from exporter.runtime.sidecar import Sidecar
from exporter.runtime.signals import Signals
from exporter.runtime.state import Published


def cfg(**kw):
    return config.build({k: v for k, v in kw.items()}, {})


def snap(text: str, t: float) -> Snapshot:
    return normalize(parse(text), t)


def points(x) -> Sequence[Point]:
    """The derived samples of a Published state or of Signals, as (name, labels, value)."""
    if isinstance(x, Published):
        x = x.signals
    return list(signal_points(x)) if isinstance(x, Signals) else list(x)


def value(x, name: str, **labels) -> Optional[float]:
    found = [p.value for p in points(x) if p.name == name and all(p.labels.get(k) == v for k, v in labels.items())]
    assert len(found) <= 1, f"{name}{labels} matched {len(found)} points"
    return found[0] if found else None


def scraped(pub) -> dict:
    """Every sample the collectors make of a Published state: {(name, sorted labels): value}."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in build_families(pub) for s in f.samples}


def names(x) -> set:
    return {p.name for p in points(x)}


def sample_value(text: str, name: str, **labels) -> float:
    vals = [s.value for s in parse(text).samples
            if s.name == name and all(dict(s.labels).get(k) == v for k, v in labels.items())]
    assert vals, f"{name}{labels} not on the page"
    return sum(vals)


class PageSequence:
    """A fetch function serving pages a test sets, with a controllable clock."""

    def __init__(self, clock, text: str = ""):
        self.clock = clock
        self.text = text
        self.error = None

    def __call__(self) -> str:
        if self.error is not None:
            raise self.error
        return self.text


def sidecar_with(clock, cfg_obj, text: str = "", gpu=None) -> Tuple[Sidecar, PageSequence]:
    seq = PageSequence(clock, text)
    return Sidecar(cfg_obj, seq, gpu, clock=clock), seq


# -- golden comparison with prometheus_client's parser ----------------------------------------------

def reference(text):
    """The samples prometheus_client reads from ``text``: (name, sorted labels, value)."""
    return [(s.name, tuple(sorted(s.labels.items())), s.value)
            for fam in text_string_to_metric_families(text) for s in fam.samples]


def ours(page):
    """The same triples from this project's parser's page."""
    return [(s.name, tuple(sorted(s.labels)), s.value) for s in page.samples]


def same(a, b):
    """Both read the same samples in the same order (NaN equal to NaN)."""
    assert len(a) == len(b), (a, b)
    for x, y in zip(a, b):
        assert x[:2] == y[:2], (x, y)
        assert x[2] == y[2] or (math.isnan(x[2]) and math.isnan(y[2])), (x, y)
