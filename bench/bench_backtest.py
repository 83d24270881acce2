"""Backtest benchmark: the rules pack over a week of a vLLM fleet, against promtool.

    python bench/bench_backtest.py [--pods 20] [--days 7] [--step 30] [--scrape 30]

Generates the series the pack reads from vLLM and the sidecar, shaped like real vLLM 0.32 output
(names, labels, the histogram bounds of the real page in tests/fixtures), for every pod of a fleet
scraped every ``--scrape`` seconds: a daily load cycle with noise, one long-prompt flood, one vLLM
restart (counters back to zero) and one stalled engine. Then it runs the backtest over the whole
range at ``--step`` and reports the time and the peak memory.

The baseline, measured in the same run on the same machine, is one ``promtool test rules`` of the
same pack over a small slice (the harness's user's night: 3 pods, 3 hours of history and the
flood at 1-minute evaluations). Timings are reported as ratios to it, never as pass/fail.
"""

from __future__ import annotations

import argparse
import math
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from exporter.analysis import rulemanager as rule_runner  # noqa: E402
from exporter.analysis.promql.labels import make  # noqa: E402
from exporter.analysis.rulefile import groups_from_data, load_rule_file  # noqa: E402
from exporter.analysis.series import Store  # noqa: E402
from exporter.analysis.summary import summarize  # noqa: E402
from exporter.harness.scenarios.catalog import seed_night  # noqa: E402
from exporter.harness.scenarios.fleet import real_bounds  # noqa: E402
from exporter.harness.scenarios.judge import promtool_timeline  # noqa: E402
from exporter.pack.rules import render_groups  # noqa: E402
from exporter.slo import load_slo  # noqa: E402

RULES = ROOT / "rules" / "vllm.rules.yml"
HISTOGRAMS = ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds",
              "vllm:e2e_request_latency_seconds", "vllm:request_queue_time_seconds", "vllm:request_prompt_tokens")


def bounds(metric: str):
    return [le for le, _ in real_bounds(metric)]


def fleet(pods: int, days: float, scrape_s: int, seed: int = 7) -> Store:
    """Every series of the fleet in a store (one shared timestamp array)."""
    rng = np.random.default_rng(seed)
    n = int(days * 86400 // scrape_s) + 1
    t = np.arange(n, dtype=np.int64) * scrape_s * 1000 + 1_700_000_000_000
    hours = (t - t[0]) / 3_600_000
    store = Store()
    day = 24
    flood_pod, flood_at = 3 % pods, int(0.35 * n)
    restart_pod, restart_at = 5 % pods, int(0.6 * n)
    stall_pod, stall_at = 7 % pods, int(0.8 * n)
    window = lambda at, minutes: (np.arange(n) >= at) & (np.arange(n) < at + minutes * 60 // scrape_s)  # noqa: E731

    def counter(per_scrape, restart=None):
        c = np.cumsum(per_scrape)
        if restart is not None:
            c[restart:] -= c[restart - 1]
        return c

    for p in range(pods):
        pod = f"vllm-{p}"
        v = {"namespace": "llm", "pod": pod, "job": "llm/vllm", "instance": f"{pod}:8000", "model_name": "llama-70b",
             "engine": "0"}
        sc = {"namespace": "llm", "pod": pod, "job": "llm/vllm-sidecar", "instance": f"{pod}:9181"}
        load = 0.6 + 0.35 * np.sin(2 * math.pi * (hours / day + p / pods)) + 0.05 * rng.standard_normal(n)
        load = np.clip(load, 0.05, 1.0)
        reqs = rng.poisson(30 * scrape_s / 60 * load)
        flood = window(flood_at, 30) if p == flood_pod else np.zeros(n, bool)
        stall = window(stall_at, 10) if p == stall_pod else np.zeros(n, bool)
        long_n = rng.poisson(0.05 * scrape_s / 60, n) + np.where(flood, 10, 0)
        restart = restart_at if p == restart_pod else None
        add = lambda name, labels, vals: store.add(make({"__name__": name, **labels}), t, vals)  # noqa: E731
        total = reqs + long_n
        add("vllm:request_success_total", {**v, "finished_reason": "stop"}, counter(reqs * 0.9, restart))
        add("vllm:request_success_total", {**v, "finished_reason": "length"}, counter(reqs * 0.08, restart))
        add("vllm:request_success_total", {**v, "finished_reason": "abort"}, counter(reqs * 0.02, restart))
        add("vllm:request_success_total", {**v, "finished_reason": "error"}, counter(rng.poisson(0.01, n) * 1.0, restart))
        tokens = np.where(stall, 0, np.where(flood, 60, 6000 * load)) * scrape_s / 60
        add("vllm:generation_tokens_total", v, counter(np.round(tokens), restart))
        add("vllm:prompt_tokens_total", v, counter(total * 500.0 + long_n * 7500.0, restart))
        add("vllm:num_preemptions_total", v, counter(np.where(flood, 5, 0) * 1.0, restart))
        add("vllm:prefix_cache_queries_total", v, counter(total * 500.0, restart))
        add("vllm:prefix_cache_hits_total", v, counter(total * 350.0, restart))
        kv = np.where(flood, 0.99, np.clip(0.3 + 0.5 * load, 0, 0.93))
        add("vllm:kv_cache_usage_perc", v, kv)
        add("vllm:num_requests_running", v, np.round(16 * load))
        cap = np.where(flood, 12.0, 0.0)
        add("vllm:num_requests_waiting", v, cap + np.round(2 * load))
        add("vllm:num_requests_waiting_by_reason", {**v, "reason": "capacity"}, cap)
        add("vllm:num_requests_waiting_by_reason", {**v, "reason": "deferred"}, np.round(2 * load))
        lat = {"vllm:time_to_first_token_seconds": np.where(flood, 6.0, 0.3 + 0.6 * load),
               "vllm:inter_token_latency_seconds": np.where(flood, 0.08, 0.015 + 0.01 * load),
               "vllm:e2e_request_latency_seconds": np.where(flood, 30.0, 4 + 4 * load),
               "vllm:request_queue_time_seconds": np.where(flood, 5.0, 0.05 * load),
               "vllm:request_prompt_tokens": np.full(n, 500.0)}
        for metric in HISTOGRAMS:
            les = bounds(metric)
            ub = np.array([math.inf if b == "+Inf" else float(b) for b in les])
            obs = total if metric != "vllm:inter_token_latency_seconds" else total * 50
            centre = lat[metric]
            # a log-normal around the centre: the share of observations under each bound
            with np.errstate(divide="ignore"):
                z = (np.log(ub)[:, None] - np.log(centre)[None, :]) / 0.5
            share = 0.5 * (1 + np.tanh(0.8 * np.clip(z, -20, 20)))  # a normal CDF's shape, cheaply
            share[-1] = 1.0
            if metric == "vllm:request_prompt_tokens":
                share = np.where(ub[:, None] >= 5000.0, 1.0, share)
                per = np.round(share * reqs[None, :]) + np.where(ub[:, None] >= 5000.0, long_n[None, :], 0)
            else:
                per = np.round(share * obs[None, :])
            for i, le in enumerate(les):
                add(metric + "_bucket", {**v, "le": le}, counter(per[i], restart))
            add(metric + "_count", v, counter(per[-1], restart))
            add(metric + "_sum", v, counter(per[-1] * centre, restart))
        h = {**v, "handler": "/v1/chat/completions", "method": "POST"}
        h.pop("engine")
        h.pop("model_name")
        add("http_requests_total", {**h, "status": "2xx"}, counter(total * 1.0, restart))
        add("http_requests_total", {**h, "status": "4xx"}, counter(rng.poisson(0.05, n) * 1.0, restart))
        add("http_requests_total", {**h, "status": "5xx"}, counter(rng.poisson(0.005, n) * 1.0, restart))
        add("up", sc, np.ones(n))
        add("up", {**sc, "job": "llm/vllm", "instance": f"{pod}:8000"}, np.ones(n))
        add("vllm_sidecar_build_info", {**sc, "version": "0.1.0"}, np.ones(n))
        add("vllm_sidecar_target_up", {**sc, "target": "vllm"}, np.ones(n))
        add("vllm_sidecar_target_up", {**sc, "target": "gpu"}, np.ones(n))
        add("vllm_sidecar_gpu_busy_low_throughput", {**sc, "model_name": "llama-70b"}, np.where(flood, 1.0, 0.0))
        add("vllm_sidecar_engine_stalled", {**sc, "model_name": "llama-70b"}, np.where(stall, 1.0, 0.0))
        for metric in ("generation_tokens", "kv_cache_usage", "requests_running", "ttft"):
            add("vllm_sidecar_input_missing", {**sc, "metric": metric}, np.zeros(n))
        add("vllm_sidecar_inputs_missing", sc, np.zeros(n))
        for gpu in range(2):
            g = {**sc, "gpu": str(gpu), "uuid": f"GPU-{p:04d}-{gpu}"}
            add("vllm_sidecar_gpu_ecc_errors_total", {**g, "type": "uncorrected"}, np.zeros(n))
            for reason in ("hw_thermal_slowdown", "sw_thermal_slowdown", "hw_power_brake_slowdown"):
                add("vllm_sidecar_gpu_clock_throttle_active", {**g, "reason": reason}, np.zeros(n))
            add("vllm_sidecar_gpu_thermal_throttle_active", g, np.zeros(n))
    return store


def promtool_baseline(tmp: Path):
    """Wall and CPU time of one promtool run of the pack over the user's night (the harness's
    ``seed_night``: 3 replicas, 3 hours of history and the 30-minute flood, at 1-minute steps),
    every alert asked for at every evaluation from 5 minutes before onset."""
    sc = seed_night(history_h=3.0, step=60.0)
    alerts = sorted({r.name for g in load_rule_file(str(RULES)) for r in g.rules if r.kind == "alert"})
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    promtool_timeline(sc, RULES, alerts, from_step=sc.onset - 5, workdir=tmp)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, len(sc.book.series), sc.book.n - (sc.onset - 5)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pods", type=int, default=20)
    ap.add_argument("--days", type=float, default=7)
    ap.add_argument("--step", type=int, default=30, help="evaluation interval (s)")
    ap.add_argument("--scrape", type=int, default=30, help="scrape interval (s)")
    ap.add_argument("--block", type=int, default=2880, help="evaluations per vectorized block")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        base, base_cpu, base_series, base_evals = promtool_baseline(Path(tmp))
    print(f"baseline: promtool test rules, pack over {base_series} series x {base_evals} evaluations: "
          f"{base:.2f}s wall, {base_cpu:.2f}s CPU")

    t0 = time.perf_counter()
    store = fleet(args.pods, args.days, args.scrape)
    gen = time.perf_counter() - t0
    nseries = len(store)
    samples = sum(len(s) for s in store)
    print(f"fleet: {args.pods} pods, {nseries} series ({nseries / args.pods:.0f} per pod), {samples / 1e6:.1f}M samples "
          f"at {args.scrape}s, generated in {gen:.1f}s")

    groups = groups_from_data(render_groups(load_slo(None)), "pack")
    t_first = int(min(s.t[0] for s in store))
    t_last = int(max(s.t[-1] for s in store))
    step = args.step * 1000
    times = np.arange(t_first, t_last + 1, step, dtype=np.int64)
    t0, c0 = time.perf_counter(), time.process_time()
    run = rule_runner.run(groups, store, times, step, block_steps=args.block)
    took, cpu = time.perf_counter() - t0, time.process_time() - c0
    summary = summarize(run)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    work = nseries * len(times)
    base_work = base_series * base_evals
    print(f"backtest: {len(times)} evaluations x {sum(len(g.rules) for g in groups)} rules over {nseries} series: "
          f"{took:.1f}s wall, {cpu:.1f}s CPU, peak RSS {rss:.0f} MiB")
    print("alert episodes: " + ", ".join(f"{t.alertname} {t.episodes}" for t in summary.totals))
    print(f"ratio (wall): the range takes {took / base:.1f}x one promtool run of the slice, for {work / base_work:.0f}x "
          f"its work (series x evaluations): {(work / took) / (base_work / base):.0f}x promtool's throughput")
    print(f"ratio (CPU):  {cpu / base_cpu:.1f}x the promtool run's CPU time: "
          f"{(work / cpu) / (base_work / base_cpu):.0f}x promtool's throughput")


if __name__ == "__main__":
    main()
