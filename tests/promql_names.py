"""Which metric names a PromQL expression reads, and which names real output has."""

import re

import yaml

from conftest import ROOT, VLLM_PAGES
from exporter.harness import pagetransform as pt
from exporter.runtime.exposition import parse

_KEYWORDS = {"by", "on", "without", "and", "or", "unless", "offset", "group_left", "group_right", "ignoring", "bool"}


def metric_names(expr: str) -> set:
    e = re.sub(r'"[^"]*"', '""', expr)  # strings
    e = re.sub(r"\{[^}]*\}", "", e)  # matchers
    e = re.sub(r"\[[^\]]*\]", "", e)  # ranges
    e = re.sub(r"\b\d+(ms|[smhdwy])\b", "", e)  # durations (offset 15m)
    e = re.sub(r"\b\d+(\.\d+)?(e[+-]?\d+)?\b", "", e)  # numbers
    e = re.sub(r"\b(by|on|without|ignoring|group_left|group_right)\s*\([^)]*\)", "", e)  # label lists
    names = set()
    for m in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", e):
        tok = m.group(0)
        rest = e[m.end():].lstrip()
        if tok in _KEYWORDS or rest.startswith("("):  # a function or aggregation, never a metric
            continue
        names.add(tok)
    return names


def sidecar_output_names():
    """Every name the sidecar serves, from a real run on real pages with a stand-in GPU."""
    from exporter.harness.fakenvml import FakeNvml, make_gpus
    from exporter.runtime import config
    from exporter.runtime.collectors import build_families
    from exporter.runtime.flight import Recorder
    from exporter.runtime.nvml import NvmlSource
    from exporter.runtime.sidecar import Sidecar

    gpus = make_gpus(1)
    gpus[0].utilization_percent = 95
    nv = FakeNvml(gpus)
    load = (VLLM_PAGES / "after_load.txt").read_text()
    kv = "vllm:kv_cache_usage_perc"
    pages = [(VLLM_PAGES / "idle.txt").read_text(), pt.set_values(load, {kv: 0.3}),
             pt.set_values(pt.scale_counters(load, 1.1), {kv: 0.5})]  # usage rising: a time to full
    t = [1000.0]
    it = iter(pages)
    sc = Sidecar(config.build({"window": 60, "poll_interval": 1, "stall_seconds": 5, "baseline_min_seconds": 0}, {}),
                 lambda: next(it), NvmlSource(nv), clock=lambda: t[0], recorder=Recorder())  # the recorder on, as by default
    sc.poll_once()
    nv.inject_xid(0, 79)
    t[0] += 10
    sc.poll_once()
    t[0] += 10
    pub = sc.poll_once()  # the baseline learned at the poll before shows now
    from exporter.runtime.server import make_registry

    served = {s.name for f in make_registry(lambda: pub).collect() for s in f.samples}  # with process_*
    return {s.name for f in build_families(pub) for s in f.samples} | served | {"up"}




def known_names():
    """Names in real vLLM pages (and their pre-rename form), the sidecar's output, and the
    recording rules; plus what vLLM emits only when enabled."""
    data = yaml.safe_load((ROOT / "rules" / "vllm.rules.yml").read_text())
    recorded = {r["record"] for g in data["groups"] for r in g["rules"] if "record" in r}
    real = set()
    for p in VLLM_PAGES.glob("*.txt"):
        text = p.read_text()
        real |= {s.name for s in parse(text).samples}
        real |= {s.name for s in parse(pt.legacy_names(text)).samples}  # the names before vLLM's renames
    # emitted by vLLM only when VLLM_COMPUTE_NANS_IN_LOGITS=1, which the captured servers did not set
    only_when_enabled = {"vllm:corrupted_requests_total"}
    # derived signals the sidecar declares but emits only when vLLM has the inputs (speculative
    # decoding is off on the captured servers; LoRA only on the LoRA pages)
    from exporter.runtime.collectors import DERIVED, POD_DERIVED

    declared = {"vllm_sidecar_" + n for n in (*DERIVED, *POD_DERIVED)}
    # the sidecar's role (--role), named by the shared plan for prefill/decode disaggregation; the
    # runtime declares it in its own branch (merged with this one, `declared` above holds it)
    planned = {"vllm_sidecar_role_info"}
    return real | sidecar_output_names() | recorded | only_when_enabled | declared | planned
