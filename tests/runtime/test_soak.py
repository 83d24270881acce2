"""A day of polling (43,200 polls at 2 s, clock injected) over changing pages: memory and series
stay bounded. The pages and the churn are in ``soak.py``; ``bench/soak.py`` runs longer ones."""

from exporter.harness.soak import run


def test_a_day_of_changing_pages_stays_bounded():
    r = run(43_200, 2.0, traced_polls=1_800)  # allocations traced over the last hour
    assert r.up_polls == r.polls
    assert r.restarts == 3  # every six hours
    assert r.models_last == ("model-11",)
    # what is remembered is what the window and the memory hold, not what the day saw
    assert r.series_max <= 40, r
    assert r.totals_max <= 120, r
    assert r.ring_max <= 45, r  # 60 s window, 30 s stall, 2 s polls: about 36 snapshots
    assert r.cache_bytes_max <= 8 << 20
    # flat: of what the last hour allocated (a new model and label values came in it), less
    # than 1 MB is still held at the end
    assert r.traced_end - r.traced_after_warmup < 1 << 20, r
