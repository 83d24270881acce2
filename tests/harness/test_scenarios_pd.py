"""The matrix's P/D fleet scenarios (issue 28) and issue 29's shapes, sampled: each new scenario
once, at a cheap cell, judged as test_scenarios.py judges its sample (its own expectations and
never a first loud alert later than the naive rules). What the simulated pods write is checked
against what vLLM 0.33 writes for each role, and the expectation syntax (alert labels matched,
deadlines rounded to the evaluation) on hand-made timelines.
"""

import math

import numpy as np
import pytest

from conftest import ROOT
from exporter.harness import matrix
from exporter.harness.matrix import Cell
from exporter.harness.scenarios import pd, pd_catalog
from exporter.harness.scenarios.catalog import Scenario
from exporter.harness.scenarios.catalog29 import SCENARIOS29
from exporter.harness.scenarios.judge import AlertTrack, Timeline, judge, matching, selector
from exporter.harness.scenarios.series import Book
from test_scenarios import assert_cell_meets_its_expectations

RULES = ROOT / "rules" / "vllm.rules.yml"


SAMPLE = [
    Cell("pd-prefill-busy-healthy", 2, 30, "none"),
    Cell("pd-decode-healthy", 3, 15, "none"),
    Cell("pd-transfer-failing", 1, 15, "none"),
    Cell("pd-transfer-silent", 2, 30, "none"),
    Cell("pd-prefill-flooded", 2, 60, "none"),
    Cell("pd-decode-saturated", 3, 30, "none"),
    Cell("pd-spec-acceptance-halved", 1, 30, "1h"),
    Cell("pd-engine-sleeping", 8, 60, "none"),
    Cell("pd-engine-wedged", 1, 5, "none"),
    Cell("decode-flood", 1, 30, "none"),
    Cell("long-prompt-surge", 2, 60, "none"),
    Cell("busy-healthy-long-bursts", 2, 15, "none"),
    Cell("busy-healthy-long-bursts", 3, 30, "1h"),  # a burst of 3 long prompts beside two quiet peers: no surge
    Cell("chronic-overload-2d", 1, 60, "none"),
]


def test_the_sample_covers_every_new_scenario_and_the_matrix_lists_them():
    new = set(pd_catalog.PD_SCENARIOS) | set(SCENARIOS29)
    assert {c.scenario for c in SAMPLE} == new
    assert new <= set(matrix.SYNTHETIC)
    cells = matrix.all_cells()
    for name in new:
        mine = [c for c in cells if c.scenario == name]
        assert len(mine) == (len(matrix.grid(name, "replicas")) * len(matrix.grid(name, "scrapes"))
                             * len(matrix.grid(name, "histories")))
    # the balance scenarios hold both sides in every cell
    for name in ("pd-prefill-flooded", "pd-decode-saturated"):
        assert min(c.replicas for c in cells if c.scenario == name) == 2
        first = pd_catalog.layout(name.split("-")[1], 2)
        assert set(first) == {"prefill", "decode"}


@pytest.mark.parametrize("cell", SAMPLE, ids=str)
def test_cell_meets_its_expectations(cell, naive):
    assert_cell_meets_its_expectations(cell, naive)


# -- what the simulated pods write ---------------------------------------------------------------

@pytest.fixture(scope="module")
def failing():
    return pd_catalog.pd_transfer_failing(history_h=0.25, step=15.0, pods=3)


def _rows(sc, name, pod_prefix="", **match):
    return [(dict(lab), r.v) for (n, lab), r in sc.book.series.items()
            if n == name and dict(lab).get("pod", "").startswith(pod_prefix)
            and all(dict(lab).get(k) == v for k, v in match.items())]


def _rate(v: np.ndarray, step: float, a: int, b: int) -> float:
    return (v[b] - v[a]) / ((b - a) * step)


def test_each_role_writes_what_vllm_033_writes_for_it(failing):
    sc, step = failing, failing.book.step
    a, b = sc.onset - 20, sc.onset - 1  # before the failure
    # a prefill instance: busy on prompts, one output token per request, no inter-token gap
    (_, gen), = _rows(sc, "vllm:generation_tokens_total", "vllm-prefill")
    (_, req), = _rows(sc, "vllm:request_success_total", "vllm-prefill", finished_reason="stop")
    (_, prompt), = _rows(sc, "vllm:prompt_tokens_total", "vllm-prefill")
    (_, itl), = _rows(sc, "vllm:inter_token_latency_seconds_count", "vllm-prefill")
    assert _rate(prompt, step, a, b) > 100 * _rate(gen, step, a, b) > 0
    assert _rate(gen, step, a, b) == pytest.approx(_rate(req, step, a, b) / 0.8)
    assert _rate(itl, step, a, b) == 0
    # KV fetches are a consumer's series only; the connector's counters on both sides
    assert _rows(sc, "vllm:num_requests_kv_fetch_by_stage", "vllm-decode")
    assert not _rows(sc, "vllm:num_requests_kv_fetch_by_stage", "vllm-prefill")
    for side in ("vllm-prefill", "vllm-decode"):
        assert _rows(sc, "vllm:nixl_num_failed_transfers_total", side)
        assert {lab["sleep_state"] for lab, _ in _rows(sc, "vllm:engine_sleep_state", side)} == set(pd.SLEEP_STATES)
    # a decode instance's prompts arrive by transfer: the sources add up to vLLM's prompt tokens
    pod = _decode_pod(sc)
    src = {lab["source"]: _rate(v, step, a, b) for lab, v in _rows(sc, "vllm:prompt_tokens_by_source_total", pod)}
    (_, dprompt), = _rows(sc, "vllm:prompt_tokens_total", pod)
    assert sum(src.values()) == pytest.approx(_rate(dprompt, step, a, b))
    assert src["external_kv_transfer"] / sum(src.values()) == pytest.approx(0.7 * 0.985, rel=1e-6)
    # the transfer histograms count the transfers read, with vLLM's bounds
    les = {lab["le"] for lab, _ in _rows(sc, "vllm:nixl_xfer_time_seconds_bucket", pod)}
    assert les == {*(repr(x) for x in pd.NIXL_HISTOGRAMS["vllm:nixl_xfer_time_seconds"]), "+Inf"}
    assert "0.001" not in les and "0.005" in les  # the wheel drops the first bound for xfer time only


def _decode_pod(sc) -> str:
    return next(dict(lab)["pod"] for (n, lab) in sc.book.series if n == "up" and dict(lab)["pod"].startswith("vllm-decode")
                and matrix.REPLICA_INDEX.get(dict(lab)["pod"]) == 0)


def test_the_sidecar_series_of_a_failing_transfer(failing):
    sc = failing
    pod = _decode_pod(sc)
    (_, ratio), = [x for x in _rows(sc, "vllm_sidecar_kv_transfer_failure_ratio", pod)]
    (_, share), = [x for x in _rows(sc, "vllm_sidecar_prompt_tokens_transferred_ratio", pod)]
    assert ratio[sc.onset - 5] == 0.0
    assert ratio[sc.onset + 10] == pytest.approx(0.4)  # 40 % of the reads fail, over the whole 60 s window
    assert share[sc.onset + 10] == pytest.approx(0.7 * 0.985 * 0.6, rel=1e-6)
    roles = {lab["role"] for lab, _ in _rows(sc, "vllm_sidecar_role_info")}
    assert roles == {"prefill", "decode"}
    assert all("model_name" not in lab for lab, _ in _rows(sc, "vllm_sidecar_role_info"))


def test_speculative_series_fall_when_acceptance_halves():
    sc = pd_catalog.pd_spec_halved(history_h=0.25, step=15.0, pods=1)
    length = _rows(sc, "vllm_sidecar_spec_decode_mean_accepted_length")[0][1]
    pos0 = _rows(sc, "vllm_sidecar_spec_decode_position_acceptance_ratio", position="0")[0][1]
    before, after = sc.onset - 2, sc.onset + 10
    assert length[before] == pytest.approx(1 + sum(0.78 * 0.8 ** p for p in range(4)))
    assert length[after] == pytest.approx(1 + sum(0.39 * 0.8 ** p for p in range(4)))
    assert pos0[before] == pytest.approx(0.78) and pos0[after] == pytest.approx(0.39)
    positions = {lab["position"] for lab, _ in _rows(sc, "vllm:spec_decode_num_accepted_tokens_per_pos_total")}
    assert positions == {"0", "1", "2", "3"}


def test_a_sleeping_engine_says_so_and_a_wedged_one_does_not():
    sleep = pd_catalog.pd_sleeping(history_h=0.25, step=15.0, pods=1)
    wedged = pd_catalog.pd_wedged(history_h=0.25, step=15.0, pods=1)
    i = sleep.onset + 10
    awake = _rows(sleep, "vllm:engine_sleep_state", sleep_state="awake")[0][1]
    level = _rows(sleep, "vllm_sidecar_engine_sleep_level")[0][1]
    assert awake[sleep.onset - 2] == 1 and awake[i] == 0 and level[i] == 1
    assert _rows(wedged, "vllm_sidecar_engine_sleep_level")[0][1][i] == 0
    run = _rows(wedged, "vllm:num_requests_running")[0][1]
    wait = _rows(wedged, "vllm:num_requests_waiting")[0][1]
    steps = _rows(wedged, "vllm:iteration_tokens_total_count")[0][1]
    assert run[i] == 0 and wait[i] == 6 and steps[i] == steps[wedged.onset]
    assert steps[wedged.onset - 2] > steps[wedged.onset - 10]


# -- the expectation syntax ----------------------------------------------------------------------

def _timeline(*tracks):
    return Timeline(30.0, [AlertTrack(a, labels, list(ts)) for a, labels, ts in tracks])


def _scenario(**kw):
    book = Book(0.0, 30.0, 100)
    return Scenario("t", "t", book, onset=10, **kw)


def test_selectors_match_alert_labels():
    assert selector('VLLMDisaggregationImbalance{scale_side="prefill"}') == (
        "VLLMDisaggregationImbalance", {"scale_side": "prefill"})
    assert selector("VLLMEngineStalled") == ("VLLMEngineStalled", {})
    with pytest.raises(ValueError):
        selector("not a selector{")
    tl = _timeline(("VLLMDisaggregationImbalance", {"scale_side": "decode", "severity": "warning"}, [600.0]))
    assert matching(tl, "VLLMDisaggregationImbalance")
    assert not matching(tl, 'VLLMDisaggregationImbalance{scale_side="prefill"}')
    sc = _scenario(must_fire=('VLLMDisaggregationImbalance{scale_side="prefill"}',),
                   never=('VLLMDisaggregationImbalance{scale_side="decode"}',))
    v = judge(sc, tl)
    assert not v.ok and len(v.problems) == 2, v.problems
    ok = judge(sc, _timeline(("VLLMDisaggregationImbalance", {"scale_side": "prefill"}, [600.0])))
    assert ok.ok, ok.problems


def test_within_rounds_the_deadline_up_to_the_next_evaluation():
    # onset at 300 s; within 0: the evaluation at 300 s; within 0.25 min (315 s): the one at 330 s
    sc = _scenario(within={"VLLMLongPromptSurge": 0.25})
    assert judge(sc, _timeline(("VLLMLongPromptSurge", {}, [330.0]))).ok
    assert not judge(sc, _timeline(("VLLMLongPromptSurge", {}, [360.0]))).ok
    strict = _scenario(within={"VLLMLongPromptSurge": 0.0})
    assert judge(strict, _timeline(("VLLMLongPromptSurge", {}, [300.0, 330.0]))).ok
    late = judge(strict, _timeline(("VLLMLongPromptSurge", {}, [330.0])))
    assert late.problems == ["VLLMLongPromptSurge: first at +0.5m, needed by +0m"]
    # a firing before the onset does not count as the first after it
    assert not judge(strict, _timeline(("VLLMLongPromptSurge", {}, [0.0]))).ok
    assert math.isclose(sc.onset_s, 300.0)
