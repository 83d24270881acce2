"""Checks the vLLM pages the P/D, speculative-decoding and sleep work is tested on
(tests/fixtures/vllm-0.33/, made by scripts/make_vllm_pages.py with vLLM 0.33.0's own logger, and
the real CPU-vLLM captures beside it): each page parses with prometheus_client's parser, carries
the vLLM series the sidecar reads with the type and labels docs and rules rely on, and each shape
shows what its PROVENANCE.md says it shows. A check of the fixtures, not of the product.
"""

import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import FIXTURES
from exporter.runtime.exposition import parse
from helpers import ours, reference, same

V033 = FIXTURES / "vllm-0.33"
SHAPES = sorted(p.name for p in V033.iterdir() if p.is_dir())
CONSUMERS = {"kv_consumer", "kv_consumer_failing", "kv_consumer_recomputing", "kv_both"}
CONNECTOR_SHAPES = CONSUMERS | {"kv_producer"}

NIXL_HISTOGRAMS = ["vllm:nixl_xfer_time_seconds", "vllm:nixl_post_time_seconds", "vllm:nixl_bytes_transferred",
                   "vllm:nixl_num_descriptors"]
NIXL_COUNTERS = ["vllm:nixl_num_failed_transfers", "vllm:nixl_num_failed_notifications",
                 "vllm:nixl_num_kv_expired_reqs", "vllm:nixl_num_notifications_after_expiry"]
SPEC_COUNTERS = ["vllm:spec_decode_num_drafts", "vllm:spec_decode_num_draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens"]
ALWAYS = {"vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge",
          "vllm:engine_sleep_state": "gauge", "vllm:prompt_tokens_by_source": "counter",
          "vllm:generation_tokens": "counter", "vllm:kv_cache_usage_perc": "gauge"}


class Page:
    def __init__(self, path: Path, text: str = "") -> None:
        self.path = path
        self.families = {f.name: f for f in text_string_to_metric_families(text or path.read_text())}

    def value(self, sample: str, **labels: str) -> float:
        """The one sample of that name whose labels include ``labels``."""
        family = self.families[_family_of(sample)]
        hits = [s.value for s in family.samples if s.name == sample and labels.items() <= s.labels.items()]
        assert len(hits) == 1, f"{self.path}: {sample}{labels}: {len(hits)} samples"
        return hits[0]

    def vllm_samples(self) -> dict:
        """Every vllm: sample but the *_created timestamps, keyed by name and labels."""
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for f in self.families.values() if f.name.startswith("vllm:")
                for s in f.samples if not s.name.endswith("_created")}


def _family_of(sample: str) -> str:
    for suffix in ("_total", "_bucket", "_count", "_sum"):
        if sample.endswith(suffix):
            return sample[: -len(suffix)]
    return sample


def polls(shape_dir: Path) -> list:
    paths = sorted(shape_dir.glob("poll-*.txt"), key=lambda p: int(p.stem.split("-")[1]))
    assert len(paths) >= 2, f"{shape_dir}: fewer than two polls"
    return [Page(p) for p in paths]


@pytest.mark.parametrize("shape", SHAPES)
def test_every_page_has_the_series_with_vllms_types_and_labels(shape):
    for page in polls(V033 / shape):
        fam = page.families
        for name, kind in ALWAYS.items():
            assert fam[name].type == kind, (page.path, name)
        assert {s.labels["sleep_state"] for s in fam["vllm:engine_sleep_state"].samples} == \
            {"awake", "weights_offloaded", "discard_all"}
        sources = {s.labels["source"] for s in fam["vllm:prompt_tokens_by_source"].samples if s.name.endswith("_total")}
        assert sources == {"local_compute", "local_cache_hit", "external_kv_transfer"}
        for f in fam.values():
            for s in f.samples:
                if f.name.startswith("vllm:") and "model_name" in s.labels:
                    assert s.labels["model_name"] == "llama-3-70b"
                    # vLLM's frontend-level admission_rejections has no engine label
                    assert s.labels.get("engine", "0") == "0"
        connector = shape in CONNECTOR_SHAPES
        for name in NIXL_HISTOGRAMS:
            assert (fam[name].type == "histogram") if connector else name not in fam, (page.path, name)
        for name in NIXL_COUNTERS:
            assert (fam[name].type == "counter") if connector else name not in fam, (page.path, name)
            if connector:
                page.value(name + "_total")
        for name in ("vllm:external_prefix_cache_hits", "vllm:external_prefix_cache_queries"):
            assert fam[name].type == "counter", (page.path, name)
        if shape in CONSUMERS:
            stages = {s.labels["stage"]: s.value for s in fam["vllm:num_requests_kv_fetch_by_stage"].samples}
            assert fam["vllm:num_requests_kv_fetch_by_stage"].type == "gauge"
            assert set(stages) == {"waiting_to_start", "in_progress", "completed_waiting"}
        else:  # vLLM registers the stage gauge for kv_consumer and kv_both only
            assert "vllm:num_requests_kv_fetch_by_stage" not in fam
        spec = shape.startswith("spec")
        for name in SPEC_COUNTERS + ["vllm:spec_decode_num_accepted_tokens_per_pos"]:
            assert (fam[name].type == "counter") if spec else name not in fam, (page.path, name)
        if spec:
            positions = {s.labels["position"] for s in fam["vllm:spec_decode_num_accepted_tokens_per_pos"].samples
                         if s.name.endswith("_total")}
            assert positions == {"0", "1", "2"}


@pytest.mark.parametrize("shape", SHAPES)
def test_counters_never_go_back_and_frozen_shapes_stay_frozen(shape):
    pages = polls(V033 / shape)
    for a, b in zip(pages, pages[1:]):
        sa, sb = a.vllm_samples(), b.vllm_samples()
        assert set(sa) == set(sb)
        for key, v in sa.items():
            if key[0].endswith(("_total", "_count", "_sum", "_bucket")):
                assert sb[key] >= v, key
        moved = {k for k in sa if sa[k] != sb[k]}
        if shape in ("wedged", "sleeping", "sleeping_level2"):
            assert not moved, f"{shape}: {sorted(moved)[:5]} changed between polls"
        else:
            assert ("vllm:generation_tokens_total", (("engine", "0"), ("model_name", "llama-3-70b"))) in moved


def delta(pages, sample, **labels):
    return pages[-1].value(sample, **labels) - pages[0].value(sample, **labels)


def transferred_share(pages) -> float:
    by = {s: delta(pages, "vllm:prompt_tokens_by_source_total", source=s)
          for s in ("local_compute", "local_cache_hit", "external_kv_transfer")}
    return by["external_kv_transfer"] / sum(by.values())


def test_pd_shapes_show_what_their_provenance_says():
    consumer, producer = polls(V033 / "kv_consumer"), polls(V033 / "kv_producer")
    recomputing, both = polls(V033 / "kv_consumer_recomputing"), polls(V033 / "kv_both")
    failing = polls(V033 / "kv_consumer_failing")
    assert transferred_share(consumer) > 0.8
    assert 0.2 < transferred_share(both) < 0.8
    assert transferred_share(producer) == 0 and transferred_share(recomputing) == 0
    # the silent failure: the connector is asked, finds nothing, no transfer and no failure counted
    assert delta(recomputing, "vllm:external_prefix_cache_queries_total") > 0
    assert delta(recomputing, "vllm:external_prefix_cache_hits_total") == 0
    assert delta(recomputing, "vllm:nixl_xfer_time_seconds_count") == 0
    assert recomputing[-1].value("vllm:nixl_num_failed_transfers_total") == 0
    # transfers on the reader, leases expiring on the producer
    assert delta(consumer, "vllm:nixl_xfer_time_seconds_count") > 0
    assert delta(producer, "vllm:nixl_xfer_time_seconds_count") == 0
    assert producer[-1].value("vllm:nixl_num_kv_expired_reqs_total") > 0
    assert producer[-1].value("vllm:nixl_num_notifications_after_expiry_total") > 0
    assert consumer[-1].value("vllm:nixl_num_failed_transfers_total") > 0
    assert max(p.value("vllm:num_requests_kv_fetch_by_stage", stage="in_progress") for p in consumer) > 0
    ok, failed = (delta(failing, "vllm:nixl_xfer_time_seconds_count"),
                  delta(failing, "vllm:nixl_num_failed_transfers_total"))
    assert failed / (ok + failed) > 0.2
    # a producer prefills: prompt tokens far above output tokens, nothing left running
    assert delta(producer, "vllm:generation_tokens_total") * 50 < delta(producer, "vllm:prompt_tokens_total")


def test_spec_sleep_and_wedge_shapes_show_what_their_provenance_says():
    spec = polls(V033 / "spec_eagle3")
    drafts, draft_tokens = delta(spec, "vllm:spec_decode_num_drafts_total"), \
        delta(spec, "vllm:spec_decode_num_draft_tokens_total")
    accepted = delta(spec, "vllm:spec_decode_num_accepted_tokens_total")
    assert draft_tokens == 3 * drafts and 0.3 < accepted / draft_tokens < 0.8
    per_pos = [delta(spec, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(i)) for i in range(3)]
    assert per_pos[0] > per_pos[1] > per_pos[2] > 0 and sum(per_pos) == accepted
    for shape, level in (("sleeping", "weights_offloaded"), ("sleeping_level2", "discard_all")):
        for page in polls(V033 / shape):
            assert page.value("vllm:engine_sleep_state", sleep_state="awake") == 0
            assert page.value("vllm:engine_sleep_state", sleep_state=level) == 1
            assert page.value("vllm:num_requests_running") == 0
            assert page.value("vllm:generation_tokens_total") > 0  # it served before it slept
    for page in polls(V033 / "wedged"):
        assert page.value("vllm:num_requests_running") == 0 and page.value("vllm:num_requests_waiting") > 0
        assert page.value("vllm:engine_sleep_state", sleep_state="awake") == 1


CPU_PD = FIXTURES / "vllm-cpu-pd"
CPU_NIXL = FIXTURES / "vllm-cpu-nixl"


def cpu_pd(name: str) -> Page:
    return Page(CPU_PD / f"{name}.txt")


def test_real_cpu_pd_pages_carry_the_connector_series_by_role():
    for name in ("prefill-before", "prefill-after", "decode-before", "decode-during", "decode-after",
                 "decode-after-bypass"):
        page = cpu_pd(name)
        fam = page.families
        assert fam["vllm:prompt_tokens_by_source"].type == "counter"
        assert fam["vllm:external_prefix_cache_hits"].type == "counter"
        assert fam["vllm:external_prefix_cache_queries"].type == "counter"
        assert not any(n.startswith("vllm:nixl_") for n in fam)  # ExampleConnector defines no metrics
        if name.startswith("decode"):
            assert fam["vllm:num_requests_kv_fetch_by_stage"].type == "gauge"
            stages = {s.labels["stage"] for s in fam["vllm:num_requests_kv_fetch_by_stage"].samples}
            assert stages == {"waiting_to_start", "in_progress", "completed_waiting"}
        else:
            assert "vllm:num_requests_kv_fetch_by_stage" not in fam


def test_real_cpu_decode_instance_loads_the_prefill_instances_kv():
    before, after, bypass = cpu_pd("decode-before"), cpu_pd("decode-after"), cpu_pd("decode-after-bypass")
    assert transferred_share([before, after]) > 0.9
    assert delta([before, after], "vllm:external_prefix_cache_hits_total") > 0
    # prompts that skipped the prefill instance were recomputed on the decode instance
    assert delta([after, bypass], "vllm:prompt_tokens_by_source_total", source="external_kv_transfer") == 0
    assert delta([after, bypass], "vllm:prompt_tokens_by_source_total", source="local_compute") > 1000
    assert delta([after, bypass], "vllm:external_prefix_cache_hits_total") == 0
    p0, p1 = cpu_pd("prefill-before"), cpu_pd("prefill-after")
    computed = delta([p0, p1], "vllm:prompt_tokens_by_source_total", source="local_compute")
    assert computed > 0 and transferred_share([p0, p1]) == 0
    assert delta([p0, p1], "vllm:external_prefix_cache_queries_total") == computed
    assert delta([p0, p1], "vllm:external_prefix_cache_hits_total") == 0
    # the prefill instance answers each request with one token; the decode instance does the rest
    assert delta([p0, p1], "vllm:generation_tokens_total") == delta([p0, p1], "vllm:request_success_total",
                                                                     finished_reason="length")


def test_real_cpu_ngram_pages_carry_the_spec_series_and_show_each_phase():
    d = FIXTURES / "vllm-cpu-spec"
    idle, rep, rnd, smp = (Page(d / f"{n}.txt") for n in ("idle", "after-repetitive", "after-random",
                                                           "after-sampled"))
    for page in (idle, rep, rnd, smp):
        for name in SPEC_COUNTERS + ["vllm:spec_decode_num_accepted_tokens_per_pos"]:
            assert page.families[name].type == "counter", (page.path, name)
        positions = {s.labels["position"] for s in page.families["vllm:spec_decode_num_accepted_tokens_per_pos"].samples
                     if s.name.endswith("_total")}
        assert positions == {"0", "1", "2"}
    accepted = delta([idle, rep], "vllm:spec_decode_num_accepted_tokens_total")
    assert 0 < accepted <= delta([idle, rep], "vllm:spec_decode_num_draft_tokens_total")
    assert sum(delta([idle, rep], "vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(i))
               for i in range(3)) == accepted
    # sampled at temperature 1: tokens generated, no draft made
    assert delta([rnd, smp], "vllm:generation_tokens_total") > 0
    assert delta([rnd, smp], "vllm:spec_decode_num_drafts_total") == 0


@pytest.mark.skipif(not os.environ.get("VLLM033_PYTHON"),
                    reason="VLLM033_PYTHON (a Python with vLLM 0.33.0, see scripts/make_vllm_pages.py) not set")
def test_make_vllm_pages_remakes_the_committed_pages(tmp_path):
    """The script re-makes the committed pages: the same vllm: samples, *_created aside."""
    shapes = ["kv_consumer", "spec_eagle3", "wedged"]
    r = subprocess.run([os.environ["VLLM033_PYTHON"], str(FIXTURES.parents[1] / "scripts" / "make_vllm_pages.py"),
                        "--out", str(tmp_path), "--only", ",".join(shapes)],
                       capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    for shape in shapes:
        for old, new in zip(polls(V033 / shape), polls(tmp_path / shape)):
            assert old.vllm_samples() == new.vllm_samples(), (shape, old.path.name)


def cpu_pd_series() -> tuple:
    """{server: [(unix seconds, Page)]} from series.tar.gz, and the phase boundaries."""
    meta = json.loads((CPU_PD / "series.json").read_text())["phases_unix_s"]
    out: dict = {}
    with tarfile.open(CPU_PD / "series.tar.gz") as tar:
        for m in tar.getmembers():
            server, name = m.name.split("/")
            page = Page(CPU_PD / "series.tar.gz" / m.name, tar.extractfile(m).read().decode())
            out.setdefault(server, []).append((float(name[: -len(".prom")]), page))
    return {k: sorted(v, key=lambda tp: tp[0]) for k, v in out.items()}, meta


def test_real_cpu_pd_series_shows_transfer_then_recompute():
    series, phases = cpu_pd_series()
    assert set(series) == {"prefill", "decode"} and all(len(v) >= 20 for v in series.values())

    def last_before(server, t):
        return [p for ts, p in series[server] if ts <= t][-1]

    dec = {name: last_before("decode", phases[name]) for name in ("through_pair", "bypass", "end")}
    # a poll is up to 5 s older than the boundary it precedes: the idle phase is read from a page
    # taken after every request had finished
    settled = [p for ts, p in series["decode"] if ts >= phases["idle"] + 1][0]
    through, bypass, idle = ([dec["through_pair"], dec["bypass"]], [dec["bypass"], settled], [settled, dec["end"]])
    assert transferred_share(through) > 0.8
    assert delta(bypass, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer") == 0
    assert delta(bypass, "vllm:prompt_tokens_by_source_total", source="local_compute") > 5000
    assert delta(idle, "vllm:generation_tokens_total") == 0
    pre = [last_before("prefill", phases["bypass"]), last_before("prefill", phases["end"])]
    assert delta(pre, "vllm:prompt_tokens_total") == 0  # the prefill side saw nothing of the bypass
    for _, page in series["decode"] + series["prefill"]:
        assert page.families["vllm:prompt_tokens_by_source"].type == "counter"


def all_new_pages() -> list:
    pages = [p for shape in SHAPES for p in sorted((V033 / shape).glob("poll-*.txt"))]
    pages += sorted(CPU_PD.glob("*.txt")) + sorted((FIXTURES / "vllm-cpu-spec").glob("*.txt"))
    pages += sorted(CPU_NIXL.glob("**/*.txt"))
    return pages


@pytest.mark.parametrize("path", all_new_pages(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_the_sidecars_parser_reads_every_new_page_as_prometheus_client_does(path):
    text = path.read_text()
    page = parse(text)
    assert page.malformed == 0
    same(ours(page), reference(text))



def test_real_cpu_nixl_pages_have_vllms_nixl_series_on_both_roles():
    for path in sorted(CPU_NIXL.glob("**/*.txt")):
        fam = Page(path).families
        for name in NIXL_HISTOGRAMS:
            assert fam[name].type == "histogram", (path.name, name)
        for name in NIXL_COUNTERS:
            assert fam[name].type == "counter", (path.name, name)
        assert ("vllm:num_requests_kv_fetch_by_stage" in fam) == path.name.startswith("decode")


def test_real_cpu_nixl_decode_reads_every_prompt_and_the_producer_counts_expiry():
    d0, d1, d2 = (Page(CPU_NIXL / f"decode-{n}.txt") for n in ("before", "during-1", "during-2"))
    p0, p1 = Page(CPU_NIXL / "prefill-before.txt"), Page(CPU_NIXL / "prefill-during-1.txt")
    transfers = delta([d0, d1], "vllm:nixl_xfer_time_seconds_count")
    assert transfers == 5 and delta([d0, d1], "vllm:nixl_bytes_transferred_sum") > 0
    assert transferred_share([d0, d1]) == 1.0
    assert d1.value("vllm:nixl_num_failed_transfers_total") == 0
    assert delta([d1, d2], "vllm:generation_tokens_total") > 0  # still decoding on the second page
    # the reader counts transfers; leases and late notifications are counted on the producer
    assert delta([p0, p1], "vllm:nixl_xfer_time_seconds_count") == 0
    assert p1.value("vllm:nixl_num_kv_expired_reqs_total") == 1
    assert p1.value("vllm:nixl_num_notifications_after_expiry_total") == 1
    assert transferred_share([p0, p1]) == 0


def test_real_cpu_nixl_small_flood_completes_with_a_request_seen_waiting_on_its_kv():
    run = CPU_NIXL / "run2"
    d0, fetching, d1 = (Page(run / f"decode-{n}.txt") for n in ("before", "fetching", "after"))
    p0, p1 = Page(run / "prefill-before.txt"), Page(run / "prefill-after.txt")
    assert sum(s.value for s in fetching.families["vllm:num_requests_kv_fetch_by_stage"].samples) > 0
    assert fetching.value("vllm:num_requests_waiting_by_reason", reason="deferred") > 0
    assert delta([d0, d1], "vllm:nixl_xfer_time_seconds_count") == 7
    assert transferred_share([d0, d1]) == 1.0
    assert delta([d0, d1], "vllm:prompt_tokens_by_source_total", source="external_kv_transfer") == \
        delta([p0, p1], "vllm:prompt_tokens_by_source_total", source="local_compute")
    assert d1.value("vllm:num_requests_running") == 0


def test_real_cpu_nixl_reads_from_a_lost_peer_fail_and_are_recomputed():
    run = CPU_NIXL / "peer-lost"
    d0, healthy, lost = (Page(run / f"decode-{n}.txt") for n in ("before", "healthy", "after-peer-lost"))
    assert delta([d0, healthy], "vllm:nixl_xfer_time_seconds_count") == 3
    assert healthy.value("vllm:nixl_num_failed_transfers_total") == 0
    assert transferred_share([d0, healthy]) == 1.0
    assert delta([healthy, lost], "vllm:nixl_num_failed_transfers_total") == 3
    assert delta([healthy, lost], "vllm:nixl_xfer_time_seconds_count") == 0
    assert delta([healthy, lost], "vllm:prompt_tokens_by_source_total", source="external_kv_transfer") == 0
    assert delta([healthy, lost], "vllm:prompt_tokens_by_source_total", source="local_compute") > 1000
    assert delta([healthy, lost], "vllm:request_success_total", finished_reason="length") == 3
