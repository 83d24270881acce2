"""The recordings' sidecar series this commit's sidecar serves and the recording's did not, made
by replaying the real vLLM 0.32 pages through the real sidecar (``recorded_sidecar``)."""

from pathlib import Path

import numpy as np

from exporter.analysis.sources import load_file
from exporter.harness.scenarios.recorded_sidecar import with_current_sidecar

RECORDINGS = Path(__file__).resolve().parents[1] / "fixtures" / "recordings"
HELD = "vllm_sidecar_kv_cache_held_back_ratio"


def _series(store, name):
    return [s for s in store if dict(s.labels)["__name__"] == name]


def _load(name, file):
    return load_file(str(RECORDINGS / name / file)).store


def test_the_held_back_signal_is_added_at_the_sidecars_scrapes_and_recorded_series_stay():
    """steady-busy (a busy healthy run scraped every 30 s): the recording's sidecar predates the
    held-back signal; the replay adds it, with the sidecar target's labels at the times that
    Prometheus scraped the sidecar, far below the KV alert's 0.75; every recorded series keeps
    its samples."""
    before = _load("steady-busy", "prometheus-30s.om.gz")
    kept = {s.labels: (s.t.copy(), s.v.copy()) for s in before}
    assert not _series(before, HELD)
    store = with_current_sidecar(before, RECORDINGS / "steady-busy")
    for s in store:
        if s.labels in kept:
            assert np.array_equal(s.t, kept[s.labels][0]) and np.array_equal(s.v, kept[s.labels][1], equal_nan=True)
    (held,) = _series(store, HELD)
    labels = dict(held.labels)
    assert labels["instance"] == "10.0.0.12:9181" and labels["pod"] == "vllm-0" and labels["model_name"] == "tiny-llama"
    up = next(s for s in store if dict(s.labels) == {"__name__": "up", "instance": "10.0.0.12:9181",
                                                      "job": "llm/vllm", "namespace": "llm", "pod": "vllm-0"})
    assert set(held.t) <= set(up.t) and len(held.t) >= 5  # after the sidecar's first 2 minutes
    assert 0 < held.v.max() < 0.2


def test_a_real_flood_holds_requests_back_at_every_poll():
    """fill-flood (a real flood that fills the cache and preempts): the replayed signal reaches 1."""
    store = with_current_sidecar(_load("fill-flood", "prometheus-15s.om.gz"), RECORDINGS / "fill-flood")
    (held,) = _series(store, HELD)
    assert held.v.max() == 1.0
