"""The KV alert's held-back signal made by the sidecar at every poll
(``vllm_sidecar_kv_cache_held_back_ratio`` and ``..._recent_ratio``), over real vLLM 0.32 pages
with chosen values and timestamps; the expected means are worked out in each test from the
rule the pack writes for pods without the sidecar (``recording.kv_and_queue``)."""

import pytest

from exporter.harness import pagetransform as pt
from exporter.runtime.signals import derive
from helpers import cfg, snap, value

M = "tiny-llama"
T0 = 1_800_000_000.0
WINDOW, HELD, RECENT = 60, 120, 600  # windows.sidecar, windows.held_back, windows.episode_recent


def page(base, waits=0, preemptions=0, rejections=0, usage=0.97, running=4):
    text = pt.set_values(base, {"vllm:kv_cache_usage_perc": usage, "vllm:num_requests_running": running,
                                "vllm:num_requests_waiting": waits, "vllm:num_preemptions_total": preemptions})
    text = pt.set_values(text, {"vllm:num_requests_waiting_by_reason": waits}, 'reason="capacity"')
    return pt.set_values(text, {"vllm:admission_rejections_total": rejections}, 'reason="max_num_queued_reqs"')


def run(pages_at):
    c = cfg(window=WINDOW, poll_interval=2)
    snaps = [snap(text, t) for t, text in pages_at]
    return derive(snaps, snaps, snaps[-1].t, c)


def expected(held, times, now, span):
    """The mean, over the polls in (now - span, now], of each poll's share of the sidecar window's
    polls with requests held back (the per-poll signal without preemptions or rejections)."""
    def share(t):
        inside = [h for h, u in zip(held, times) if t - WINDOW < u <= t]
        return sum(inside) / len(inside)
    vals = [share(t) for t in times if now - span < t <= now]
    return sum(vals) / len(vals)


def test_served_once_the_polls_span_the_window_as_the_mean_of_each_polls_share(after_load):
    """Requests held back by a full cache on the polls of the last 50 s of 150: before 120 s of
    polls, nothing; then each poll's share of the last 60 s averaged over 120 s and over 10 min."""
    times = [T0 + 2 * i for i in range(76)]
    held = [t - T0 >= 100 for t in times]
    pages = [(t, page(after_load, waits=3 if h else 0)) for t, h in zip(times, held)]
    early = run(pages[:55])  # 108 s of polls
    assert value(early, "kv_cache_held_back_ratio", model_name=M) is None
    assert value(early, "kv_cache_held_back_recent_ratio", model_name=M) is None
    pts = run(pages)
    now = times[-1]
    ratio = value(pts, "kv_cache_held_back_ratio", model_name=M)
    assert ratio == pytest.approx(expected(held, times, now, HELD))
    assert value(pts, "kv_cache_held_back_recent_ratio", model_name=M) == pytest.approx(expected(held, times, now, RECENT))
    assert 0 < ratio < 0.5  # the last 50 s of 120, each poll's share still partly the quiet minute


def test_preempting_counts_as_held_back_only_where_the_waits_reached_the_share(after_load):
    """A preemption every poll: with requests held back on every third poll (a share of a third,
    never 0.75) it adds nothing; after a minute held back on every poll (the share reached 1) the
    same preemptions count the poll as held back whatever its share, for windows.sustain."""
    times = [T0 + 2 * i for i in range(90)]
    sparse = [(t, page(after_load, waits=3 if i % 3 == 2 else 0, preemptions=i)) for i, t in enumerate(times)]
    pts = run(sparse)
    held = [i % 3 == 2 for i in range(90)]
    assert value(pts, "kv_cache_held_back_ratio", model_name=M) == pytest.approx(expected(held, times, times[-1], HELD))
    # a minute at 1, then the sparse waits again with preemptions: every poll of those counts 1
    full = [(t, page(after_load, waits=3, preemptions=i)) for i, t in enumerate(times[:30])]
    after = [(t, page(after_load, waits=3 if i % 3 == 2 else 0, preemptions=30 + i))
             for i, t in enumerate(times[30:90])]
    pts = run(full + after)
    assert value(pts, "kv_cache_held_back_ratio", model_name=M) == pytest.approx(1.0)


def test_rejections_count_as_held_back_for_the_rate_window_and_a_restart_is_no_preemption(after_load):
    """One admission rejection, then none: every poll within windows.rate (5 minutes) of it counts
    held back, none later. A vLLM restart (the preemption counter falling to 0) is no preemption."""
    times = [T0 + 2 * i for i in range(400)]
    pages = [(t, page(after_load, rejections=1 if i >= 10 else 0)) for i, t in enumerate(times)]
    pts = run(pages[:100])
    assert value(pts, "kv_cache_held_back_ratio", model_name=M) == pytest.approx(1.0)
    pts = run(pages)  # 780 s: the rejection at 20 s is out of every window
    assert value(pts, "kv_cache_held_back_ratio", model_name=M) == 0
    # 10 of the last 10 minutes' 300 polls... counted while the rejection was within 5 minutes
    recent = value(pts, "kv_cache_held_back_recent_ratio", model_name=M)
    assert recent == pytest.approx(sum(1 for t in times if times[-1] - RECENT < t < T0 + 20 + 300) / 300)
    restart = [(t, page(after_load, waits=3 if i < 30 else 0, preemptions=50 if i < 60 else 0))
               for i, t in enumerate(times[:120])]
    pts = run(restart)
    held = [i < 30 for i in range(120)]
    assert value(pts, "kv_cache_held_back_ratio", model_name=M) == pytest.approx(expected(held, times[:120], times[119], HELD))


def test_a_gap_longer_than_the_window_starts_it_again(after_load):
    """vLLM unread for 3 minutes: the polls before the gap no longer count, so the signal is absent
    until 2 minutes of polls after it."""
    times = [T0 + 2 * i for i in range(80)] + [T0 + 340 + 2 * i for i in range(70)]
    pages = [(t, page(after_load, waits=3)) for t in times]
    assert value(run(pages[:80]), "kv_cache_held_back_ratio", model_name=M) == pytest.approx(1.0)
    assert value(run(pages[:120]), "kv_cache_held_back_ratio", model_name=M) is None  # 78 s after the gap
    assert value(run(pages), "kv_cache_held_back_ratio", model_name=M) == pytest.approx(1.0)


def test_two_processes_behind_one_url_are_no_rejections_or_preemptions(after_load):
    """Pages alternate between two vLLM processes (a Service, not the pod) whose rejection and
    preemption totals never move (3 and 5, 7 and 9): each process keeps its own total, so nothing
    grew and a healthy replica is never counted held back; the same totals from one process would
    be growth."""
    times = [T0 + 2 * i for i in range(80)]
    def alternating(i, t):
        text = page(after_load, usage=0.5, rejections=3 if i % 2 else 5, preemptions=7 if i % 2 else 9)
        return t, pt.set_values(text, {"process_start_time_seconds": T0 - 1000 - (i % 2)})
    pts = run([alternating(i, t) for i, t in enumerate(times)])
    assert value(pts, "kv_cache_held_back_ratio", model_name=M) == 0
    assert value(pts, "kv_cache_held_back_recent_ratio", model_name=M) == 0
    assert value(pts, "preemption_poll_ratio", model_name=M) == 0
    one = run([(t, page(after_load, usage=0.5, rejections=3 + i)) for i, t in enumerate(times)])
    assert value(one, "kv_cache_held_back_ratio", model_name=M) == 1


def test_the_means_kept_as_running_sums_match_the_polls_when_a_model_leaves_and_returns(after_load):
    """Two models on one page for 11 minutes, the second gone for 5 of them: each model's two means
    are those of its own polls (the second's since it came back, as a gap longer than the window
    starts it again), and with windows.held_back longer than windows.episode_recent the same polls
    give the same two means, swapped."""
    from exporter.runtime.signals import CapacityTracker, HeldBackRule

    other = pt.rename_model(after_load, "other")
    tracker = CapacityTracker(WINDOW, 0.9, 0.9, rule=HeldBackRule(window=120, recent=600))
    swapped = CapacityTracker(WINDOW, 0.9, 0.9, rule=HeldBackRule(window=600, recent=120))
    times = [T0 + 2 * i for i in range(360)]
    back = [i for i in range(360) if not 120 <= i < 270]  # the second model's polls
    brief = [i for i in range(360) if not 320 <= i < 345]  # a third model's: away for 50 s only
    third = pt.rename_model(after_load, "third")
    for i, t in enumerate(times):
        text = page(after_load, waits=3 if i % 4 == 0 else 0)
        if i in back:
            text = pt.merge_models(text, page(other, waits=3 if i % 3 == 0 else 0))
        if i in brief:
            text = pt.merge_models(text, page(third, waits=3 if i % 5 == 0 else 0))
        tracker.observe(snap(text, t))
        swapped.observe(snap(text, t))
    now = times[-1]
    mine = [i % 4 == 0 for i in range(360)]
    assert tracker.held_back(M, now) == pytest.approx((expected(mine, times, now, 120), expected(mine, times, now, 600)))
    assert swapped.held_back(M, now) == pytest.approx((expected(mine, times, now, 600), expected(mine, times, now, 120)))
    since = [i for i in back if i >= 270]
    theirs = [i % 3 == 0 for i in since]
    at = [times[i] for i in since]
    assert tracker.held_back("other", now) == pytest.approx((expected(theirs, at, now, 120), expected(theirs, at, now, 600)))
    assert tracker.held_back("other", times[300]) == (None, None)  # 60 s after it came back
    theirs, at = [i % 5 == 0 for i in brief], [times[i] for i in brief]
    assert tracker.held_back("third", now) == pytest.approx((expected(theirs, at, now, 120), expected(theirs, at, now, 600)))
