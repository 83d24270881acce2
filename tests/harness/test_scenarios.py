"""The detection matrix, sampled (the whole matrix: ``make detection``, docs/detection.md): every
scenario, every replica count {1, 2, 3, 8} and every scrape interval {5, 15, 30, 60 s} at least
once, rules every 30 s, the sidecar's series derived by the runtime's own code over pages at its
2 s poll. Each cell must meet its expectations (the user's night warns within a minute and pages
within five, healthy and rollout stay silent, errors burn the budget, chronic overload is one
episode per overload and at most two a day) and never fire its first loud alert later than the
user's naive rules. Evaluated with the backtest engine (equal to promtool's, see
test_backtest_promtool.py), and one cell again through promtool itself.
"""

import numpy as np
import pytest

from conftest import ROOT
from exporter.harness import matrix
from exporter.harness.matrix import Cell
from exporter.harness.scenarios import pd_catalog
from exporter.harness.scenarios.catalog import churn_error_burst, seed_night
from exporter.harness.scenarios.catalog29 import SCENARIOS29
from exporter.harness.scenarios.judge import backtest_timeline, judge, promtool_timeline
from exporter.pack.rules import render_plain
from exporter.slo import load_slo

RULES = ROOT / "rules" / "vllm.rules.yml"

SAMPLE = [
    Cell("seed-night", 1, 60, "none"),
    Cell("seed-night", 2, 15, "none"),
    Cell("capacity-bound-flood", 1, 15, "1h"),
    Cell("busy-healthy-day", 1, 30, "none"),
    Cell("rolling-deploy", 2, 60, "none"),
    Cell("churn-error-burst", 1, 30, "none"),
    Cell("stream-errors", 3, 60, "none"),
    Cell("chronic-overload", 1, 30, "none"),
    Cell("chronic-overload-old-release", 8, 60, "none"),
    Cell("production-trace-code", 1, 5, "none"),
    Cell("production-trace-conv", 1, 15, "none"),
    Cell("recorded-long-prompt-flood", 1, 15, "recorded"),
    Cell("recorded-busy-healthy", 1, 60, "recorded"),
    Cell("recorded-busy-overloaded", 1, 30, "recorded"),
    # recorded at real intervals (both intervals of each: the tests at the end of this file)
    Cell("recorded-fill-flood", 1, 30, "recorded"),
    Cell("recorded-capacity-bound-flood", 1, 60, "recorded"),
    Cell("recorded-steady-busy", 1, 15, "recorded"),
]


def test_the_sample_covers_every_scenario_replica_count_and_interval():
    # the P/D fleet's scenarios and issue 29's shapes have their own sample (test_scenarios_pd.py)
    others = set(pd_catalog.PD_SCENARIOS) | set(SCENARIOS29)
    assert {c.scenario for c in SAMPLE} == (set(matrix.SYNTHETIC) - others) | set(matrix.RECORDED)
    assert {c.replicas for c in SAMPLE} == set(matrix.REPLICAS)
    assert {c.scrape for c in SAMPLE} == set(matrix.SCRAPES)
    assert len(matrix.all_cells()) == sum(
        len(matrix.grid(s, "replicas")) * len(matrix.grid(s, "scrapes")) * len(matrix.grid(s, "histories"))
        for s in matrix.SYNTHETIC) + sum(len(matrix.RECORDED_SCRAPES.get(s, matrix.SCRAPES)) for s in matrix.RECORDED)
    # the scenarios judged over the whole grid: as before
    assert len([c for c in matrix.all_cells() if c.scenario not in others]) == 501


def assert_cell_meets_its_expectations(cell, naive):
    """One matrix cell judged with the pack in rules/: its expectations met, and a quiet scenario
    with no loud alert (the report lists what fired)."""
    r = matrix.evaluate(cell, RULES, naive, exact=True)
    report = "\n".join(f"  {a} on {p}: first {f:+.1f}m, {e} episodes, {m:.0f} minutes" for a, p, f, e, m, _ in r.pack.rows)
    assert r.ok, f"{cell}: " + "; ".join(r.problems) + "\n" + report
    if r.scenario.quiet:
        assert not matrix.loud_alerts(r.pack_tl), report


@pytest.mark.parametrize("cell", SAMPLE, ids=str)
def test_cell_meets_its_expectations(cell, naive):
    assert_cell_meets_its_expectations(cell, naive)


def test_the_capacity_bound_flood_pages_from_raw_vllm_series_alone(naive):
    """No sidecar at all, Prometheus every 15 s: 8-11 requests held back for capacity at KV usage
    0.55-0.68 with 4 of 20 running. The batch ran far higher while nothing waited (the ceiling the
    rules learn from uncontended evaluations), so the waits are the cache's: a page within five
    minutes. The naive rules (KV usage over 0.95) never fire."""
    r = matrix.evaluate(Cell("capacity-bound-flood", 1, 15, "1h"), RULES, naive, exact=True, raw_only=True)
    assert not [k for k in r.scenario.book.series if k[0].startswith("vllm_sidecar_")]
    assert r.ok, r.problems
    assert r.pack.first_page is not None and r.pack.first_page <= 5.0
    assert matrix.first_loud(r.scenario, r.naive_tl) is None


def test_cells_label_the_vllm_series_of_pods_with_a_sidecar_and_raw_only_cells_none():
    """A cell as deploy/kubernetes scrapes it: vLLM's series (and its target's up) of a pod with a
    sidecar carry the SLO's sidecar_target_label, the sidecar's own series never; the same cell
    without the sidecar carries the label nowhere (pods without a sidecar, read from vLLM)."""
    label = matrix.SIDECAR_LABEL
    sc = matrix.scenario_for(Cell("seed-night", 2, 15, "none"), exact=True)
    marked = {(name, dict(lab).get("pod")) for name, lab in sc.book.series if dict(lab).get(label) == "true"}
    vllm = {(name, dict(lab).get("pod")) for name, lab in sc.book.series if name.startswith("vllm:")}
    side = [name for name, lab in sc.book.series if name.startswith("vllm_sidecar_") and label in dict(lab)]
    assert label and vllm and vllm <= marked and not side
    ups = {(dict(lab).get("job", ""), dict(lab).get(label)) for name, lab in sc.book.series if name == "up"}
    assert ups and all((value == "true") != job.endswith("sidecar") for job, value in ups), ups
    assert {pod for _, pod in marked} == {dict(lab)["pod"] for name, lab in sc.book.series
                                          if name.startswith("vllm_sidecar_")}
    raw = matrix.without_sidecar(sc)
    assert not [k for k in raw.book.series if label in dict(k[1])]
    assert {(n, dict(lab).get("pod")) for n, lab in raw.book.series if n.startswith("vllm:")} == vllm


def test_two_overloads_an_hour_apart_stay_two_episodes(naive):
    r = matrix.evaluate(Cell("chronic-overload", 1, 30, "none"), RULES, naive, exact=True)
    kv = [t for t in r.pack_tl.tracks if t.alert == "VLLMKVCacheExhausted"]
    assert len(kv) == 1 and len(kv[0].episodes(r.pack_tl.interval)) == 2
    # the naive rules flap on the same overload: that is what the pack is for
    naive_eps = max(len(t.episodes(r.naive_tl.interval)) for t in r.naive_tl.loud())
    assert naive_eps > 2


def test_an_old_release_scraped_every_minute_pages_once_per_overload_not_on_a_busy_day(naive):
    """An old release (no sidecar, no waiting reason) after a busy day, scraped every 60 s: two
    samples in the 2-minute held-back window, and a busy healthy replica shows a request waiting
    on two scrapes in a row every few hours. Sustained means many samples: the share is taken over
    ``windows.held_back_sparse`` there, so the busy day pages nothing and each overload is one
    episode. The same fleet scraped every 30 s keeps the 2-minute window (and pages sooner)."""
    r = matrix.evaluate(Cell("chronic-overload-old-release", 1, 60, "1d"), RULES, naive, exact=True)
    kv = [t for t in r.pack_tl.tracks if t.alert == "VLLMKVCacheExhausted"]
    assert len(kv) == 1, r.problems
    eps = kv[0].episodes(r.pack_tl.interval)
    onset = r.scenario.onset_s
    assert all(e.start >= onset for e in eps), [(e.start - onset) / 60 for e in eps]  # the busy day: silent
    assert len(eps) == 2, [((e.start - onset) / 60, (e.end - onset) / 60) for e in eps]
    fast = matrix.evaluate(Cell("chronic-overload-old-release", 1, 30, "1d"), RULES, naive, exact=True)
    assert fast.ok, fast.problems
    assert fast.pack.first_page < r.pack.first_page


def test_a_replaced_pods_errors_stay_in_the_burn_windows():
    """A pod served 50 % errors for 20 minutes and was replaced: at minute 35 the 1h error ratio
    still holds its errors (the right answer is the failed share of every request in the hour)."""
    from exporter.analysis.rulefile import load_rule_file
    from exporter.analysis.rulemanager import run as run_rules
    from exporter.analysis.series import Store

    sc = churn_error_burst(history_h=1.0, step=60.0, pods=2)
    book = sc.book
    times = np.array([int(round(book.t(i) * 1000)) for i in range(book.n)], dtype=np.int64)
    store = Store()
    for (name, labels), row in book.series.items():
        keep = ~np.isnan(row.v) | row.stale
        store.add(tuple(sorted((("__name__", name),) + labels)), times[keep], row.v[keep], row.stale[keep])
    run = run_rules(load_rule_file(str(RULES)), store, times, int(book.step * 1000))
    at = sc.onset + int(35 * 60 / book.step)
    got = None
    for s in run.store:
        if dict(s.labels).get("__name__") == "namespace_model:vllm_availability_errors:ratio_rate1h":
            idx = np.searchsorted(s.t, times[at])
            got = float(s.v[idx])
    # by hand: failed and valid answers over the hour, from the HTTP counters of every pod
    lo, hi = times[at] - 3_600_000, times[at]
    failed = valid = 0.0
    for (name, labels), row in book.series.items():
        if name != "http_requests_total":
            continue
        v = row.v
        inside = (times >= lo) & (times <= hi) & ~np.isnan(v)
        if not inside.any():
            continue
        vals = v[inside]
        inc = vals[-1] - vals[0]
        if dict(labels)["status"] == "5xx":
            failed += inc
        valid += inc
    expected = failed / valid
    assert 0.05 < expected and got is not None
    assert got == pytest.approx(expected, rel=0.08), (got, expected)


def test_backtest_and_promtool_judge_a_scenario_alike(tmp_path):
    """The user's night, two replicas, half an hour of history, scraped every 15 s and evaluated
    every 30 s, through both engines: the same alerts fire at the same evaluations."""
    slo_file = tmp_path / "slo.yaml"
    slo_file.write_text("windows: {baseline: 1h}\n")
    rules = tmp_path / "rules.yml"
    rules.write_text(render_plain(load_slo(str(slo_file))))
    sc = seed_night(history_h=0.5, step=15.0, pods=2)
    alerts = sorted({"VLLMLongPromptSurge", "VLLMKVCacheExhausted", "VLLMGPUBusyLowThroughput",
                     "VLLMPreemptionsSustained", "VLLMTTFTHigh"})
    start = sc.onset - int(10 * 60 / sc.book.step)
    ours = backtest_timeline(sc, rules, from_step=start)
    theirs = promtool_timeline(sc, rules, alerts, from_step=start, workdir=tmp_path)

    def table(tl):
        return {(t.alert, tuple(sorted(t.labels.items()))): sorted(t.firing_at) for t in tl.tracks if t.alert in alerts}

    assert table(theirs), "promtool saw no alert at all"
    assert table(ours) == table(theirs)
    assert judge(sc, ours).ok


def test_the_capacity_bound_flood_seen_from_its_middle_pages_once_the_ceiling_is_given(tmp_path, naive):
    """Prometheus starts in the middle of the flood: no batch was ever seen uncontended, so without
    a ceiling nothing can tell the waits from a full batch (the excused cell of the matrix). With
    kv_cache.max_num_seqs given (20, as the flood's vLLM ran), the raw series page at once."""
    slo_file = tmp_path / "slo.yaml"
    slo_file.write_text("kv_cache: {max_num_seqs: 20}\n")
    rules = tmp_path / "rules.yml"
    rules.write_text(render_plain(load_slo(str(slo_file))))
    cell = Cell("capacity-bound-flood", 1, 30, "none")
    blind = matrix.evaluate(cell, RULES, naive, exact=True, raw_only=True)
    assert blind.pack.first_page is None
    told = matrix.evaluate(cell, rules, naive, exact=True, raw_only=True)
    assert told.pack.first_page is not None and told.pack.first_page <= 5.0, told.pack.rows


REAL_INTERVALS = [(n, i) for n in ("fill-flood", "capacity-bound-flood") for i in (15, 30)]


@pytest.mark.parametrize("name,scrape", REAL_INTERVALS, ids=lambda x: str(x))
def test_real_floods_at_real_intervals_warn_and_page_and_the_naive_rules_beside_them(name, scrape, naive):
    """The real floods recorded with Prometheus every 15 s and every 30 s in the same run (no
    thinning: the export of the server at that interval), rules every 30 s: the pack warns and
    pages VLLMKVCacheExhausted within five minutes of the onset, never after the naive rules'
    first loud alert. What the naive rules give is measured beside it (and printed on failure)."""
    cell = Cell(f"recorded-{name}", 1, scrape, "recorded")
    r = matrix.evaluate(cell, RULES, naive)
    assert r.scenario.file.endswith(f"prometheus-{scrape}s.om.gz") and not r.scenario.scrape
    pack, theirs = matrix.first_loud(r.scenario, r.pack_tl), matrix.first_loud(r.scenario, r.naive_tl)
    report = f"pack first loud {pack}, naive {theirs}; " + "; ".join(
        f"{a} first {f:+.1f}m" for a, _, f, _, _, _ in r.pack.rows)
    assert r.ok, "; ".join(r.problems) + " | " + report
    assert r.pack.first_page is not None and r.pack.first_page <= 5.0, report
    assert "VLLMKVCacheExhausted" in matrix.loud_alerts(r.pack_tl), report
    assert theirs is None or pack <= theirs, report


@pytest.mark.parametrize("scrape", (15, 30))
def test_the_real_busy_run_at_real_intervals_never_pages(scrape, naive):
    """The real busy run must never page; what may fire is the preemption warning (two bursts of
    preemptions, the user's own P2). A burst of preemptions once held the held-back share at 1 for
    two minutes and paged the KV alert; preemptions now count only where the waits themselves
    reached the held-back share in the window (the sidecar saw waits at a few % of its polls)."""
    r = matrix.evaluate(Cell("recorded-steady-busy", 1, scrape, "recorded"), RULES, naive)
    assert r.scenario.file.endswith(f"prometheus-{scrape}s.om.gz")
    assert r.ok and r.pack.first_page is None, (r.problems, r.pack.rows)
    assert set(matrix.loud_alerts(r.pack_tl)) <= {"VLLMPreemptionsSustained"}, r.pack.rows
    assert not matrix.loud_alerts(r.naive_tl)


def test_a_recording_at_real_intervals_is_not_read_finer_than_it_was_scraped():
    from exporter.harness.scenarios.catalog import recorded_fill_flood
    with pytest.raises(ValueError):
        recorded_fill_flood(5.0)
    sixty = recorded_fill_flood(60.0)
    assert sixty.file.endswith("prometheus-30s.om.gz") and sixty.scrape == 60.0
