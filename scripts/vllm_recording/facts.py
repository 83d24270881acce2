"""The measured facts of a recording, per phase: the client's (from the load generator's log), the
server's (from exported series or pages) and the alerts' first pending and firing times."""

from __future__ import annotations

import math
from typing import Dict, List, Optional

from .load import Result
from .promdata import hist_quantile, in_range, increase, parse_om, series


def pct(xs: List[float], q: float) -> Optional[float]:
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def client_stats(results: List[Result], phases: List[dict]) -> Dict[str, dict]:
    out = {}
    for ph in phases:
        rs = [r for r in results if r.phase == ph["name"]]
        dur = ph["end"] - ph["start"]
        by = {}
        for cls in sorted({r.cls for r in rs}):
            c = [r for r in rs if r.cls == cls]
            ok = [r for r in c if r.t_end is not None and r.error is None and r.status == 200]
            ttft = [r.t_first - r.t_start for r in ok if r.t_first is not None]
            lat = [r.t_end - r.t_start for r in ok]
            by[cls] = {
                "sent": sum(1 for r in c if r.t_start is not None),
                "sent_per_second": round(sum(1 for r in c if r.t_start is not None) / dur, 3),
                "completed_ok": len(ok),
                "errors_or_unfinished": sum(1 for r in c if r.t_start is not None) - len(ok),
                "prompt_tokens_mean": round(sum(r.prompt_tokens for r in c) / len(c), 1) if c else None,
                "output_tokens_mean": round(sum(r.max_tokens for r in c) / len(c), 1) if c else None,
                "client_ttft_p50_s": rnd(pct(ttft, 0.5)), "client_ttft_p95_s": rnd(pct(ttft, 0.95)),
                "latency_p50_s": rnd(pct(lat, 0.5)), "latency_p95_s": rnd(pct(lat, 0.95)),
                "last_finished": rnd(max((r.t_end for r in c if r.t_end), default=None), 3),
            }
        out[ph["name"]] = by
    return out


def rnd(x, n=4):
    return None if x is None else round(x, n)


def server_facts(data, phases: List[dict]) -> Dict[str, dict]:
    def inc(name, a, b, **m):
        return sum(increase(v, a, b) for _, v in series(data, name, **m))

    def gauge(name, a, b, **m):
        vals = []
        for _, v in series(data, name, **m):
            vals += in_range(v, a, b)
        return vals

    def quant(q, a, b, hname):
        by_le: Dict[float, float] = {}
        for ls, v in series(data, hname + "_bucket"):
            le = float(ls["le"])
            by_le[le] = by_le.get(le, 0.0) + increase(v, a, b)
        return hist_quantile(q, list(by_le.items()))

    out = {}
    for ph in phases:
        a, b = ph["start"], ph["end"]
        dur = b - a
        kv = gauge("vllm:kv_cache_usage_perc", a, b)
        cap = gauge("vllm:num_requests_waiting_by_reason", a, b, reason="capacity")
        waiting = gauge("vllm:num_requests_waiting", a, b)
        running = gauge("vllm:num_requests_running", a, b)
        long_done = inc("vllm:request_prompt_tokens_bucket", a, b, le="+Inf") - \
            inc("vllm:request_prompt_tokens_bucket", a, b, le="5000.0")
        side_p95 = gauge("vllm_sidecar_ttft_seconds", a, b, quantile="0.95")
        pressure = gauge("vllm_sidecar_kv_cache_pressure_level", a, b)
        long_rate = gauge("vllm_sidecar_long_prompt_requests_per_second", a, b)
        side_up = gauge("vllm_sidecar_target_up", a, b, target="vllm")
        out[ph["name"]] = {
            "finished_requests_per_second": rnd(inc("vllm:request_success_total", a, b) / dur, 3),
            "prompt_tokens_per_second": rnd(inc("vllm:prompt_tokens_total", a, b) / dur, 1),
            "generation_tokens_per_second": rnd(inc("vllm:generation_tokens_total", a, b) / dur, 1),
            "kv_usage_max": rnd(max(kv, default=None), 3),
            "kv_usage_mean": rnd(sum(kv) / len(kv), 3) if kv else None,
            "waiting_max": max(waiting, default=None),
            "running_max": max(running, default=None),
            "capacity_waiting_max": max(cap, default=None),
            "capacity_waiting_mean": rnd(sum(cap) / len(cap), 2) if cap else None,
            "capacity_waiting_scrapes": f"{sum(1 for x in cap if x > 0)}/{len(cap)}",
            "preemptions": inc("vllm:num_preemptions_total", a, b),
            "long_prompts_finished_over_5000": long_done,
            "ttft_p50_s": rnd(quant(0.5, a, b, "vllm:time_to_first_token_seconds")),
            "ttft_p95_s": rnd(quant(0.95, a, b, "vllm:time_to_first_token_seconds")),
            "queue_time_p95_s": rnd(quant(0.95, a, b, "vllm:request_queue_time_seconds")),
            "itl_p95_s": rnd(quant(0.95, a, b, "vllm:inter_token_latency_seconds")),
            "sidecar_ttft_p95_max_s": rnd(max(side_p95, default=None)),
            "sidecar_kv_pressure_level_max": max(pressure, default=None),
            "sidecar_long_prompt_per_second_max": rnd(max(long_rate, default=None), 3),
            "sidecar_vllm_read_timeouts": inc("vllm_sidecar_poll_errors_total", a, b, reason="timeout", target="vllm"),
            "sidecar_vllm_down_scrapes": sum(1 for x in side_up if x == 0),
        }
    return out


def alert_facts(alerts_om: str) -> Dict[str, dict]:
    data = parse_om(alerts_om)
    out: Dict[str, dict] = {}
    for ls, vals in data.get("ALERTS", []):
        a = out.setdefault(ls["alertname"], {"severity": ls.get("severity")})
        key = "first_" + ls["alertstate"]
        first = min(t for t, _ in vals)
        a[key] = min(first, a.get(key, first))
    return out
