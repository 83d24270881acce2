"""Derivations over sequences of real vLLM pages with chosen timestamps, checked by hand."""

import math

import pytest

from exporter.harness import pagetransform as pt
from exporter.runtime.buckets import count_at_or_below, histogram_quantile
from exporter.runtime.signals import (
    HORIZON_SECONDS,
    MIN_SLOPE_PER_SECOND,
    Baseline,
    Signals,
    busy_low,
    derive,
    engine_stalled,
    kv_pressure_level,
    percentile,
    seconds_to_full,
)
from helpers import cfg, names, points, sample_value, snap, value

M = "tiny-llama"
T0 = 1_800_000_000.0


def run(pages_at, **kw):
    c = cfg(**{"window": 3600, "poll_interval": 1, **kw})
    snaps = [snap(text, t) for t, text in pages_at]
    now = snaps[-1].t
    return derive(snaps, snaps, now, c)


def test_rates_between_two_real_pages(idle, after_load):
    pts = run([(T0, idle), (T0 + 60, after_load)])
    gen = sample_value(after_load, "vllm:generation_tokens_total") - sample_value(idle, "vllm:generation_tokens_total")
    prompt = sample_value(after_load, "vllm:prompt_tokens_total") - sample_value(idle, "vllm:prompt_tokens_total")
    assert gen > 0 and prompt > 0
    assert value(pts, "generation_tokens_per_second", model_name=M) == pytest.approx(gen / 60)
    assert value(pts, "prompt_tokens_per_second", model_name=M) == pytest.approx(prompt / 60)
    length = sample_value(after_load, "vllm:request_success_total", finished_reason="length")
    stop = sample_value(after_load, "vllm:request_success_total", finished_reason="stop")
    assert value(pts, "requests_finished_per_second", model_name=M, finished_reason="length") == pytest.approx(length / 60)
    assert value(pts, "requests_finished_per_second", model_name=M, finished_reason="stop") == pytest.approx(stop / 60)
    assert value(pts, "request_error_ratio", model_name=M) == 0.0


def test_counter_reset_on_restart_counts_the_new_value(after_load, after_pressure):
    # after_pressure comes from a new vLLM process: its counters restarted from zero
    pts = run([(T0, after_load), (T0 + 30, after_pressure)])
    new = sample_value(after_pressure, "vllm:generation_tokens_total")
    old = sample_value(after_load, "vllm:generation_tokens_total")
    assert new != old
    assert value(pts, "generation_tokens_per_second", model_name=M) == pytest.approx(new / 30)
    assert all(p.value >= 0 for p in points(pts) if p.name.endswith("_per_second"))


def test_restart_detected_even_when_the_counter_climbed_past_the_old_value(after_load):
    # same process start time -> plain difference; new start time -> the whole value is new
    later = pt.scale_counters(after_load, 3.0)
    restarted = pt.set_process_start(later, sample_value(after_load, "process_start_time_seconds") + 500)
    g1 = sample_value(after_load, "vllm:generation_tokens_total")
    g3 = sample_value(later, "vllm:generation_tokens_total")
    same_proc = run([(T0, after_load), (T0 + 10, later)])
    new_proc = run([(T0, after_load), (T0 + 10, restarted)])
    assert value(same_proc, "generation_tokens_per_second", model_name=M) == pytest.approx((g3 - g1) / 10)
    assert value(new_proc, "generation_tokens_per_second", model_name=M) == pytest.approx(g3 / 10)


def test_counter_decrease_without_start_time_is_a_reset(after_load):
    def strip(t):
        return pt.map_samples(t, lambda n, _labels, v: [] if n == "process_start_time_seconds" else None)
    a = strip(pt.scale_counters(after_load, 2.0))
    b = strip(after_load)
    pts = run([(T0, a), (T0 + 20, b)])
    assert value(pts, "generation_tokens_per_second", model_name=M) == pytest.approx(
        sample_value(after_load, "vllm:generation_tokens_total") / 20)


def _bucket_deltas(a, b, name):
    sa = snap(a, 0).hists[(name, M, "0")]
    sb = snap(b, 1).hists[(name, M, "0")]
    return [(le, c - dict(sa.buckets)[le]) for le, c in sb.buckets]


def test_ttft_quantiles_follow_histogram_quantile_arithmetic(idle, after_load):
    pts = run([(T0, idle), (T0 + 60, after_load)])
    deltas = _bucket_deltas(idle, after_load, "ttft")
    total = deltas[-1][1]
    for q in (0.5, 0.95, 0.99):
        # by hand: find the bucket holding rank q*total, interpolate linearly from its lower bound
        rank = q * total
        prev_le, prev_c = 0.0, 0.0
        for le, c in deltas:
            if c >= rank:
                expected = prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
                break
            prev_le, prev_c = le, c
        assert value(pts, "ttft_seconds", model_name=M, quantile=repr(q)) == pytest.approx(expected)
    mean = (sample_value(after_load, "vllm:time_to_first_token_seconds_sum")
            - sample_value(idle, "vllm:time_to_first_token_seconds_sum")) / total
    assert value(pts, "ttft_mean_seconds", model_name=M) == pytest.approx(mean)


def test_histogram_quantile_edge_rules():
    inf = math.inf
    assert histogram_quantile(0.5, [(0.1, 2), (0.5, 6), (inf, 8)]) == pytest.approx(0.3)
    # rank in the +Inf bucket: the highest finite bound
    assert histogram_quantile(0.99, [(0.1, 2), (0.5, 6), (inf, 8)]) == 0.5
    # first bucket interpolates from 0
    assert histogram_quantile(0.25, [(0.1, 4), (inf, 4)]) == pytest.approx(0.025)
    assert math.isnan(histogram_quantile(0.5, [(0.1, 0), (inf, 0)]))
    assert math.isnan(histogram_quantile(0.5, [(0.1, 1), (0.2, 2)]))  # no +Inf bucket
    # non-monotonic input is fixed up as Prometheus does
    assert (histogram_quantile(0.5, [(1.0, 4), (2.0, 3), (inf, 8)])
            == pytest.approx(histogram_quantile(0.5, [(1.0, 4), (2.0, 4), (inf, 8)])))


def test_count_at_or_below_interpolates_like_histogram_fraction():
    b = [(2000.0, 10.0), (5000.0, 16.0), (math.inf, 20.0)]
    assert count_at_or_below(4000, b) == pytest.approx(10 + 6 * (2000 / 3000))
    assert count_at_or_below(5000, b) == 16.0
    assert count_at_or_below(9000, b) == 16.0  # beyond the last finite bound
    assert count_at_or_below(1000, b) == pytest.approx(5.0)


def test_long_prompts_from_the_prompt_histogram(idle, after_load):
    pts = run([(T0, idle), (T0 + 60, after_load)], long_prompt_tokens=5000)
    # 5000 is a bucket bound: long = count - bucket(le=5000)
    d = dict(_bucket_deltas(idle, after_load, "prompt_length"))
    long_n = d[math.inf] - d[5000.0]
    assert long_n > 0  # the load had 6,000-word prompts
    assert value(pts, "long_prompt_requests_per_second", model_name=M) == pytest.approx(long_n / 60)
    assert value(pts, "long_prompt_request_ratio", model_name=M) == pytest.approx(long_n / d[math.inf])


def test_slo_attainment_shares(idle, after_load):
    pts = run([(T0, idle), (T0 + 60, after_load)], slo_ttft_p95_seconds=2.5)
    d = dict(_bucket_deltas(idle, after_load, "ttft"))
    assert value(pts, "ttft_slo_attainment_ratio", model_name=M) == pytest.approx(d[2.5] / d[math.inf])
    tp = dict(_bucket_deltas(idle, after_load, "tpot_request"))
    share = value(pts, "itl_slo_attainment_ratio", model_name=M)
    expect = count_at_or_below(1 / 30, sorted(tp.items())) / tp[math.inf]
    assert share == pytest.approx(expect)


def test_legacy_page_gives_the_same_signals(idle, after_load):
    modern = run([(T0, idle), (T0 + 60, after_load)])
    legacy = run([(T0, pt.legacy_names(idle)), (T0 + 60, pt.legacy_names(after_load))])
    s = snap(pt.legacy_names(after_load), 0)
    assert s.resolved["kv_usage"] == "vllm:gpu_cache_usage_perc"
    assert s.resolved["itl"] == "vllm:time_per_output_token_seconds"
    assert s.resolved["prefix_cache_hits"] == "vllm:gpu_prefix_cache_hits_total"
    assert s.missing_required() == []
    for name in ("generation_tokens_per_second", "kv_cache_usage_ratio", "prefix_cache_hit_ratio"):
        assert value(legacy, name, model_name=M) == pytest.approx(value(modern, name, model_name=M))
    for q in ("0.5", "0.95"):
        assert value(legacy, "inter_token_latency_seconds", model_name=M, quantile=q) == pytest.approx(
            value(modern, "inter_token_latency_seconds", model_name=M, quantile=q))
    assert "kv_cache_pressure_level" in names(legacy)


def test_missing_input_leaves_signals_out_never_zero(idle, after_load):
    def drop(t):
        return pt.map_samples(t, lambda n, _labels, v: [] if n.startswith("vllm:kv_cache_usage_perc") else None)
    pts = run([(T0, drop(idle)), (T0 + 60, drop(after_load))])
    s = snap(drop(after_load), 0)
    assert s.missing_required() == ["vllm:kv_cache_usage_perc"]
    assert "kv_cache_usage_ratio" not in names(pts)
    assert "kv_cache_pressure_level" not in names(pts)
    assert "generation_tokens_per_second" in names(pts)


def test_two_engines_are_combined(idle, after_load):
    scales = [1.0, 0.5]
    pts = run([(T0, pt.with_engines(idle, scales)), (T0 + 60, pt.with_engines(after_load, scales))])
    one = run([(T0, idle), (T0 + 60, after_load)])
    s = snap(pt.with_engines(after_load, scales), 0)
    assert {e for (k, _m, e, _x) in s.values if k == "generation_tokens"} == {"0", "1"}
    g0 = sample_value(after_load, "vllm:generation_tokens_total") - sample_value(idle, "vllm:generation_tokens_total")
    g1 = (round(sample_value(after_load, "vllm:generation_tokens_total") * 0.5)
          - round(sample_value(idle, "vllm:generation_tokens_total") * 0.5))
    assert value(pts, "generation_tokens_per_second", model_name=M) == pytest.approx((g0 + g1) / 60)
    # summed histograms: the TTFT count is the sum of both engines' counts
    assert value(pts, "ttft_seconds", model_name=M, quantile="0.5") is not None
    # KV usage: the highest engine
    kv = pt.with_engines(pt.set_values(after_load, {"vllm:kv_cache_usage_perc": 0.8}), [1.0, 1.2])
    pts2 = run([(T0, pt.with_engines(idle, [1.0, 1.2])), (T0 + 60, kv)])
    assert value(pts2, "kv_cache_usage_ratio", model_name=M) == pytest.approx(0.96)
    assert value(one, "generation_tokens_per_second", model_name=M) == pytest.approx(g0 / 60)


def test_two_models_get_their_own_series(idle, after_load):
    a0, a1 = idle, after_load
    b0, b1 = pt.rename_model(idle, "big-70b"), pt.rename_model(pt.scale_counters(after_load, 2.0), "big-70b")
    pts = run([(T0, pt.merge_models(a0, b0)), (T0 + 60, pt.merge_models(a1, b1))])
    ga = value(pts, "generation_tokens_per_second", model_name=M)
    gb = value(pts, "generation_tokens_per_second", model_name="big-70b")
    g = sample_value(after_load, "vllm:generation_tokens_total") - sample_value(idle, "vllm:generation_tokens_total")
    assert ga == pytest.approx(g / 60)
    assert gb == pytest.approx((round(2 * sample_value(after_load, "vllm:generation_tokens_total"))
                                - sample_value(idle, "vllm:generation_tokens_total")) / 60)


def test_kv_pressure_levels(after_load):
    base = after_load
    def level(**vals):
        text = pt.set_values(base, {k: v for k, v in vals.items() if k != "capacity"})
        if "capacity" in vals:
            text = pt.set_values(text, {"vllm:num_requests_waiting_by_reason": vals["capacity"]}, 'reason="capacity"')
        pts = run([(T0, base), (T0 + 30, text)])
        return value(pts, "kv_cache_pressure_level", model_name=M)
    assert level(**{"vllm:kv_cache_usage_perc": 0.5}) == 0
    assert level(**{"vllm:kv_cache_usage_perc": 0.93}) == 1
    assert level(**{"vllm:kv_cache_usage_perc": 0.97, "capacity": 3}) == 2
    assert level(**{"vllm:kv_cache_usage_perc": 0.97, "vllm:num_preemptions_total": 5}) == 3
    # rejections alone make it saturated
    rej = pt.set_values(base, {"vllm:admission_rejections_total": 4}, 'reason="max_num_queued_reqs"')
    assert value(run([(T0, base), (T0 + 30, rej)]), "kv_cache_pressure_level", model_name=M) == 2
    assert kv_pressure_level(None, 0, 0, 0, 0.9) is None


def test_seconds_to_full():
    assert seconds_to_full([(0, 0.5), (10, 0.6), (20, 0.7)]) == pytest.approx(30.0)
    assert seconds_to_full([(0, 0.7), (10, 0.6)]) is None
    # already full: nothing to predict (never "full in 0 s")
    assert seconds_to_full([(0, 0.9), (10, 1.0)]) is None
    # a page that never changes, or float noise: no trend
    assert seconds_to_full([(0, 0.3), (2, 0.3), (4, 0.3 + 1e-15)]) is None
    # below the minimum slope (0.0001/s): not a real rising trend
    assert seconds_to_full([(0, 0.30), (60, 0.30 + 0.9 * MIN_SLOPE_PER_SECOND * 60)]) is None
    # rising, but full further away than the horizon
    slow = 1.5 * MIN_SLOPE_PER_SECOND
    assert (1 - 0.2) / slow > HORIZON_SECONDS
    assert seconds_to_full([(0, 0.2 - 60 * slow), (60, 0.2)]) is None
    # idle (no request running): nothing is filling the cache
    assert seconds_to_full([(0, 0.5), (10, 0.6), (20, 0.7)], running=0) is None
    assert seconds_to_full([(0, 0.5), (10, 0.6), (20, 0.7)], running=3) == pytest.approx(30.0)


def test_stall_needs_running_requests_and_no_tokens(after_load):
    running = pt.set_values(after_load, {"vllm:num_requests_running": 4})
    c = cfg(window=60, poll_interval=1, stall_seconds=30)
    snaps = [snap(running, T0 + i * 10) for i in range(5)]  # 40 s, counter flat
    assert engine_stalled(snaps, T0 + 40, 30, M) is True
    assert engine_stalled(snaps[:3], T0 + 20, 30, M) is None  # history shorter than the stall time
    moving = [snap(pt.scale_counters(running, 1 + i * 0.01), T0 + i * 10) for i in range(5)]
    assert engine_stalled(moving, T0 + 40, 30, M) is False
    idle_flat = [snap(after_load, T0 + i * 10) for i in range(5)]  # no request running
    assert engine_stalled(idle_flat, T0 + 40, 30, M) is False
    pts = derive(snaps, snaps, T0 + 40, c)
    assert value(pts, "engine_stalled", model_name=M) == 1.0


def test_gpu_busy_low_throughput_floor_then_learned_baseline():
    c = cfg(busy_utilization=0.9, low_throughput_fraction=0.3, throughput_floor=10, baseline_min_seconds=100)
    kw = dict(busy_utilization=c.busy_utilization, low_fraction=c.low_throughput_fraction, floor=c.throughput_floor,
              min_busy_seconds=c.baseline_min_seconds, quantile=c.baseline_quantile)
    # no baseline yet: the floor decides
    assert busy_low(M, 5.0, 0.97, None, **kw).flagged is True
    assert busy_low(M, 50.0, 0.97, None, **kw).flagged is False
    assert busy_low(M, 5.0, 0.5, None, **kw).flagged is False
    assert busy_low(M, 5.0, 0.97, None, **kw).baseline is None
    b = Baseline(horizon=3600, spacing=10)
    for i in range(20):  # 200 busy seconds at 900..1090 tokens/s
        b.record(M, T0 + i * 10, 900 + i * 10)
    r = busy_low(M, 200.0, 0.97, b, **kw)
    learned = percentile([900 + i * 10 for i in range(20)], 0.9)
    assert r.baseline == pytest.approx(learned)
    assert r.threshold == pytest.approx(0.3 * learned)
    assert r.flagged is True  # 200 < 0.3 * ~1070
    assert busy_low(M, 600.0, 0.97, b, **kw).flagged is False
    assert busy_low(M, 5.0, None, b, **kw) is None  # no GPU reading: left out


def test_baseline_forgets_beyond_its_horizon():
    b = Baseline(horizon=100, spacing=10)
    b.record(M, 0, 1000)
    b.record(M, 5, 1)  # closer than the spacing: ignored
    for t in range(10, 300, 10):
        b.record(M, t, 100)
    assert b.value(M, 0.9) == 100
    assert b.busy_seconds(M) <= 110


def test_first_read_gives_the_gauges_and_nothing_else(after_load):
    s = snap(after_load, T0)
    pts = derive([s], [s], T0, cfg())
    assert value(pts, "kv_cache_usage_ratio", model_name=M) == sample_value(after_load, "vllm:kv_cache_usage_perc")
    assert value(pts, "requests_running", model_name=M) == sample_value(after_load, "vllm:num_requests_running")
    assert value(pts, "requests_waiting", model_name=M) == sample_value(after_load, "vllm:num_requests_waiting")
    assert value(pts, "requests_waiting_for_capacity", model_name=M) == sample_value(
        after_load, "vllm:num_requests_waiting_by_reason", reason="capacity")
    assert sample_value(after_load, "vllm:num_preemptions_total") == 0  # never preempted: the level is known
    assert value(pts, "kv_cache_pressure_level", model_name=M) == 0
    assert names(pts) == {"kv_cache_usage_ratio", "kv_cache_pressure_level", "requests_running",
                          "requests_waiting", "requests_waiting_for_capacity", "requests_waiting_for_batch",
                          "capacity_wait_cause", "kv_cache_usage_peak_ratio", "kv_cache_warn_poll_ratio",
                          "kv_cache_capacity_wait_poll_ratio",
                          # a gauge (vLLM's sleep state) and the role given, both known from one page
                          "engine_sleep_level", "role_info",
                          # the availability counters, served from the first page at 0 (its base)
                          "availability_requests_total", "availability_errors_total"}
    assert value(pts, "availability_requests_total", model_name=M) == 0
    assert value(pts, "availability_errors_total", model_name=M, source="engine") == 0
    assert value(pts, "availability_errors_total", model_name=M, source="http") == 0
    # preemptions since vLLM started, maybe inside the window, maybe not: one page cannot say
    preempted = snap(pt.set_values(after_load, {"vllm:num_preemptions_total": 3}), T0)
    assert "kv_cache_pressure_level" not in names(derive([preempted], [preempted], T0, cfg()))
    assert derive([], [], T0, cfg()) == Signals()


def _with_spec(text, drafts, accepted):
    extra = (
        "# HELP vllm:spec_decode_num_draft_tokens_total Number of draft tokens.\n"
        "# TYPE vllm:spec_decode_num_draft_tokens_total counter\n"
        f'vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="{M}"}} {drafts}\n'
        "# HELP vllm:spec_decode_num_accepted_tokens_total Number of accepted tokens.\n"
        "# TYPE vllm:spec_decode_num_accepted_tokens_total counter\n"
        f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="{M}"}} {accepted}\n'
    )
    return text + extra


def test_speculative_decoding_acceptance_when_present(idle, after_load):
    pts = run([(T0, _with_spec(idle, 100.0, 50.0)), (T0 + 60, _with_spec(after_load, 1100.0, 730.0))])
    assert value(pts, "spec_decode_acceptance_ratio", model_name=M) == pytest.approx(680 / 1000)
    assert "spec_decode_acceptance_ratio" not in names(run([(T0, idle), (T0 + 60, after_load)]))


def test_quantiles_in_the_first_bucket_are_bounds_and_ordered(idle, after_load):
    """On the real page most queued requests waited less than vLLM's first queue-time bucket
    (0.3 s). A quantile that falls there is served as the bound (interpolating would invent
    0.15 s) and flagged; one beyond it is interpolated. No queue-time quantile exceeds the
    TTFT's or the e2e's, nor a TTFT quantile the e2e's."""
    pts = run([(T0, idle), (T0 + 60, after_load)])
    d = dict(_bucket_deltas(idle, after_load, "queue_time"))
    first = min(d)
    total = d[math.inf]
    assert 0.5 * total <= d[first] < 0.99 * total  # p50 in the first bucket, p99 beyond it
    for q in (0.5, 0.95, 0.99):
        queue = value(pts, "queue_time_seconds", model_name=M, quantile=repr(q))
        ttft = value(pts, "ttft_seconds", model_name=M, quantile=repr(q))
        e2e = value(pts, "e2e_request_latency_seconds", model_name=M, quantile=repr(q))
        assert queue <= ttft <= e2e
        bounded = value(pts, "quantile_resolution_limited", model_name=M, metric="vllm_sidecar_queue_time_seconds",
                        for_quantile=repr(q))
        assert bounded == (1.0 if q * total <= d[first] else 0.0)
        if bounded:
            assert queue == min(first, ttft, e2e)


def test_requests_waiting_behind_a_full_batch_are_not_waiting_for_kv(after_load):
    """vLLM's reason="capacity" counts every request waiting for scheduling capacity, a full batch
    as well as a full cache (vllm/v1/metrics/loggers.py: capacity = waiting minus deferred). With
    the cache nearly empty they wait for the batch: not waiting for KV capacity, not saturated;
    with the cache at the warn level they are the cache's doing."""
    def kv(usage):
        text = pt.set_values(after_load, {"vllm:kv_cache_usage_perc": usage})
        text = pt.set_values(text, {"vllm:num_requests_waiting_by_reason": 5}, 'reason="capacity"')
        return run([(T0, after_load), (T0 + 30, text)])

    empty, full = kv(0.03), kv(0.95)
    assert value(empty, "requests_waiting_for_capacity", model_name=M) == 0
    assert value(empty, "kv_cache_pressure_level", model_name=M) == 0
    assert value(full, "requests_waiting_for_capacity", model_name=M) == 5
    assert value(full, "kv_cache_pressure_level", model_name=M) == 2


def _busy(page, running, capacity=0, usage=0.5, preemptions=None):
    text = pt.set_values(page, {"vllm:kv_cache_usage_perc": usage, "vllm:num_requests_running": running,
                                "vllm:num_requests_waiting": capacity})
    text = pt.set_values(text, {"vllm:num_requests_waiting_by_reason": capacity}, 'reason="capacity"')
    if preemptions is not None:
        text = pt.set_values(text, {"vllm:num_preemptions_total": preemptions})
    return text


def test_capacity_waiters_below_the_batch_ceiling_are_held_back_by_kv_whatever_the_usage(after_load):
    """The capacity-bound flood recorded on the real CPU vLLM: 9 requests held back for capacity
    with KV usage at 0.62 and 4 of 20 sequences running. The batch ran 18 while nothing waited
    (the ceiling learned from uncontended polls), so the 9 do not fit in the cache: KV-bound,
    saturated; the cause says which explanation holds."""
    pages = [(T0 + 2 * i, _busy(after_load, 18)) for i in range(5)]
    pages += [(T0 + 10 + 2 * i, _busy(after_load, 4, capacity=9, usage=0.62)) for i in range(10)]
    pts = run(pages, window=60, poll_interval=2)
    assert value(pts, "requests_waiting_for_capacity", model_name=M) == 9
    assert value(pts, "requests_waiting_for_batch", model_name=M) == 0
    assert value(pts, "kv_cache_pressure_level", model_name=M) == 2
    assert value(pts, "capacity_wait_cause", model_name=M, cause="kv_batch") == 1
    assert value(pts, "batch_ceiling_requests", model_name=M, source="learned") == 18
    # 10 of the window's 15 polls held back by the cache; usage never at the warn level
    assert value(pts, "kv_cache_capacity_wait_poll_ratio", model_name=M) == pytest.approx(10 / 15)
    assert value(pts, "kv_cache_warn_poll_ratio", model_name=M) == 0
    assert value(pts, "kv_cache_usage_peak_ratio", model_name=M) == pytest.approx(0.62)


def test_a_full_batch_explains_capacity_waiters_and_a_flood_is_never_learned_as_the_ceiling(after_load):
    full = run([(T0 + 2 * i, _busy(after_load, 18)) for i in range(3)]
               + [(T0 + 6, _busy(after_load, 18, capacity=5, usage=0.4))], window=60, poll_interval=2)
    assert value(full, "requests_waiting_for_capacity", model_name=M) == 0
    assert value(full, "requests_waiting_for_batch", model_name=M) == 5
    assert value(full, "capacity_wait_cause", model_name=M, cause="batch_full") == 1
    # a sidecar started in the middle of the flood: it never saw an uncontended batch, so it has no
    # ceiling and cannot tell (only usage at the warn level would say KV) ...
    flood = [(T0 + 2 * i, _busy(after_load, 4, capacity=9, usage=0.62)) for i in range(20)]
    mid = run(flood, window=60, poll_interval=2)
    assert value(mid, "requests_waiting_for_capacity", model_name=M) == 0
    assert mid.models[0].kv.batch_ceiling is None
    # ... unless the operator gives max_num_seqs: then the 4 of 20 running are KV-bound at once
    told = run(flood, window=60, poll_interval=2, max_num_seqs=20)
    assert value(told, "requests_waiting_for_capacity", model_name=M) == 9
    assert value(told, "batch_ceiling_requests", model_name=M, source="config") == 20
    assert value(told, "kv_cache_capacity_wait_poll_ratio", model_name=M) == 1


def test_preemptions_and_usage_peaks_are_counted_at_every_poll(after_load):
    """A saw-tooth a 15 s scrape misses: usage at 0.99 on one poll in five, a preemption on two of
    the window's polls; the peak, the warn share and the preempting share come from every poll."""
    pages = []
    total = 0
    for i in range(30):
        if i in (7, 21):
            total += 1
        pages.append((T0 + 2 * i, _busy(after_load, 10, usage=0.99 if i % 5 == 0 else 0.4, preemptions=total)))
    pts = run(pages, window=60, poll_interval=2)
    assert value(pts, "kv_cache_usage_peak_ratio", model_name=M) == 0.99
    assert value(pts, "kv_cache_warn_poll_ratio", model_name=M) == pytest.approx(6 / 30)
    assert value(pts, "preemption_poll_ratio", model_name=M) == pytest.approx(2 / 29)
