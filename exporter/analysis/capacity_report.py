"""Writing a ``CapacityReport``: Markdown for the capacity review (the model the user used to fill
in by hand, each number with where it comes from), JSON for machines, and a PNG of the
load-latency curve with the objectives and the sustainable throughput marked.
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional

from . import capacity_sides as sides_model
from .capacity import CapacityReport, ModelCapacity, Trend
from .report import fmt_span, fmt_time


def _n(v: Optional[float], digits: int = 3) -> str:
    """A number for people: thousands separators for big ones, ``digits`` significant ones for small."""
    if v is None:
        return "-"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 100:
        return f"{v:.0f}"
    return f"{v:.{digits}g}"


def _pct(v: Optional[float], signed: bool = False) -> str:
    if v is None:
        return "-"
    return f"{v:+.0%}" if signed else f"{v:.0%}"


def _s(v: Optional[float]) -> str:
    if v is None:
        return "-"
    if v < 1:
        return f"{v * 1000:.3g} ms"
    return f"{v:.3g} s" if v < 1000 else f"{v:,.0f} s"


def _date(ms: Optional[int]) -> str:
    return "open" if ms is None else fmt_time(ms)[:10]


def model_title(m: ModelCapacity) -> str:
    rest = ", ".join(f"{k}={v}" for k, v in sorted(m.labels.items()) if k != "model_name")
    return f"{m.name}" + (f" ({rest})" if rest else "")


def trend_text(t: Trend, capacity_qps: Optional[float]) -> str:
    if t.status == "too-few":
        return f"not enough history: {t.note}"
    ci = f"{t.confidence:.0%} CI {t.slope_low:+.3g} … {t.slope_high:+.3g}"
    head = f"daily peak {t.slope_per_day:+.3g} req/s per day ({ci}, {len(t.peaks)} periods)"
    if t.status == "no-trend":
        return f"no trend: {head}; {t.note}"
    if t.crosses_at_ms is None:
        return f"{t.status}: {head}; {t.note}"
    when = f"reaches the capacity ({_n(capacity_qps)} req/s) around {_date(t.crosses_at_ms)} " \
           f"({t.confidence:.0%}: {_date(t.crosses_earliest_ms)} … {_date(t.crosses_latest_ms)})"
    return f"{t.status}: {head}; the trend {when}" + (f"; {t.note}" if t.note else "")


def _replicas(n: int) -> str:
    return f"{n} replica{'' if n == 1 else 's'}"


def verdict_text(m: ModelCapacity) -> str:
    tg = m.target
    if tg is None:
        return "no target: no request rate in the range and no --target-qps"
    if tg.enough is None:
        return "unknown: no replica met every objective under load, so what one sustains is not known"
    lower = (m.weighted.bound if m.weighted is not None else m.sustainable.bound) == "lower"
    if tg.enough:
        word = "ENOUGH" + (" (at least: the replicas never reached their limit)" if lower else "")
        return f"{word}: capacity {_n(tg.capacity_qps)} req/s with {_replicas(tg.replicas_now)}, " \
               f"{_pct(tg.margin, True)} against the target; {_replicas(tg.replicas_now - tg.replicas_needed)} to spare"
    short = tg.replicas_needed - tg.replicas_now
    return f"NOT ENOUGH: capacity {_n(tg.capacity_qps)} req/s with {_replicas(tg.replicas_now)}, " \
           f"{_pct(tg.margin, True)} against the target; {_replicas(short)} short" + \
           (" (at most: the replicas never reached their limit, they may sustain more)" if lower else "")


def weight_text(wc) -> str:
    pw = wc.weight
    if pw.source == "fitted":
        ci = "" if pw.low is None else f"; interval {pw.low:.3g} … {pw.high:.3g}"
        return f"{pw.weight:.3g} (fitted {pw.note}{ci}; a replica at its limit makes {_n(pw.level)} weighted tokens/s)"
    return f"{pw.weight:.3g} (capacity.prefill_weight of the SLO file: {pw.note})"


def weighted_rows(m: ModelCapacity, wc) -> List[str]:
    out = [f"| capacity unit | weighted tokens/s = output tokens/s + {wc.weight.weight:.3g} × prompt tokens/s | "
           f"prefill weight {weight_text(wc)} |"]
    if wc.tokens_per_second is None:
        sus = "unknown: no replica met every objective for the sustain window under load"
    else:
        who = ", ".join(f"{k}={v}" for k, v in sorted(wc.replica.items()) if k != "model_name")
        sus = f"{_n(wc.tokens_per_second)} weighted tokens/s ({who}, {fmt_time(wc.at_ms)}); " + \
            ("objectives missed just above it" if wc.bound == "observed"
             else "a lower bound: no objective was missed at or above 90% of it")
    out.append(f"| sustainable per replica | {sus} | highest weighted tokens/s held for the sustain window within "
               f"every objective |")
    if wc.request_cost is not None:
        out.append(f"| a request of the range's mix | {_n(wc.request_cost)} weighted tokens | {wc.weight.weight:.3g} × "
                   f"{_n(m.prompt_tokens.mean)} prompt + {_n(m.output_tokens.mean)} output tokens (means over the range) |")
    if m.capacity_qps is not None:
        out.append(f"| capacity now | {m.replicas_now} × {_n(wc.tokens_per_second)} / {_n(wc.request_cost)} ≈ "
                   f"{_n(m.capacity_qps)} req/s | at the range's mix; per mix below |")
    return out


def mix_table(wc, moved: bool) -> List[str]:
    head = "The load mix moved in the range" if moved else "One load mix in the range"
    out = ["", f"{head} (steps grouped by prompt tokens per output token; capacity: what one replica sustains at "
               f"that mix within every objective, {_n(wc.tokens_per_second)} weighted tokens/s / (weight × prompt + "
               f"output)):", "",
           "| prompt/output tokens | seen | steps | prompt, output per request | held (req/s, output tokens/s) | "
           "saturated | objectives met | capacity per replica | replicas for the target |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for x in wc.mixes:
        band = "no prompt" if x.hi == 0 else f"{x.lo:g} … {x.hi:g}"
        cap = "-" if x.capacity_qps is None else \
            f"{_n(x.capacity_qps)} req/s ({_n(x.capacity_tokens_per_second)} output tokens/s)"
        out.append(f"| {band} | {fmt_time(x.first_ms)[11:19]} … {fmt_time(x.last_ms)[11:19]} | {x.steps} | "
                   f"{_n(x.prompt_tokens)}, {_n(x.output_tokens)} | {_n(x.held_qps)}, {_n(x.held_tokens_per_second)} | "
                   f"{_pct(x.saturated_share)} | {_pct(x.within_share)} | {cap} | "
                   f"{'-' if x.replicas_needed is None else x.replicas_needed} |")
    return out


def _money(v: Optional[float], cur: str) -> str:
    if v is None:
        return "-"
    return f"{v:,.0f} {cur}" if abs(v) >= 100 else f"{v:.3g} {cur}"


def cost_rows(m: ModelCapacity) -> List[str]:
    c = m.cost
    p = c.prices
    cur = p.currency
    if p.gpus_per_replica is not None:
        where = "counted by the sidecars" if p.gpus_source == "sidecar" else "cost.gpus_per_replica"
        rate = f"{p.fleet} at {p.unit_prices[p.fleet]:g} {cur} per GPU-hour × {p.gpus_per_replica:g} GPUs per " \
               f"replica ({where}) = {_money(p.replica_hour, cur)} per replica-hour"
    else:
        rate = f"{p.fleet} at {_money(p.replica_hour, cur)} per replica-hour"
    month = f"× {p.hours_per_month:g} h + {_money(p.monthly_fixed, cur)} fixed"
    out = ["", "Cost (prices from the SLO file's cost section; " + rate + "):", "",
           "| figure | value | from |", "| --- | --- | --- |",
           f"| fleet now, a month | {_money(c.monthly_now, cur)} | {c.replicas_now} × {_money(p.replica_hour, cur)} "
           f"{month} |"]
    if c.monthly_needed is not None:
        budget = _money(p.monthly_budget, cur)
        verdict = f"within the budget of {budget} ({_pct(c.budget_margin, True)} to spare)" if c.within_budget \
            else f"OVER the budget of {budget} by {_money(c.monthly_needed - p.monthly_budget, cur)}"
        out.append(f"| replicas the target needs, a month | {_money(c.monthly_needed, cur)}: {verdict} | "
                   f"{c.replicas_needed} × {_money(p.replica_hour, cur)} {month} |")
    out.append(f"| per million output tokens, observed | {_money(c.per_million_output_observed, cur)} | "
               f"{c.observed_hours:.3g} replica-hours in the range ({_money(c.observed_cost, cur)}) over the output "
               f"tokens served |")
    out.append(f"| per thousand requests, observed | {_money(c.per_thousand_requests_observed, cur)} | the same over "
               f"the requests finished |")
    out.append(f"| per million output tokens, at the sustainable load | {_money(c.per_million_output_sustainable, cur)} | "
               f"a replica-hour over what one replica sustains in an hour at the range's mix |")
    out.append(f"| per thousand requests, at the sustainable load | {_money(c.per_thousand_requests_sustainable, cur)} | "
               f"the same over requests |")
    if m.gpu_utilization is not None:
        out.append(f"| GPU utilization, mean | {_pct(m.gpu_utilization)} | the sidecars' NVML utilization over the range, "
                   f"each replica's GPUs then the replicas (busy GPUs of what is paid for) |")
    if m.tokens_per_joule is not None:
        out.append(f"| output tokens per joule | {_n(m.tokens_per_joule)} | output tokens over the GPUs' energy "
                   f"(NVML's counter) in the range, replicas whose GPUs count it |")
    sp = c.spot
    if sp is not None:
        out.append(f"| {sp.share:.0%} of the needed replicas on spot | saves {_money(sp.saving, cur)} a month "
                   f"({_pct(sp.saving_share)}): {_money(sp.monthly, cur)} | {sp.replicas} replica(s) at "
                   f"{_money(p.spot_replica_hour, cur)} per replica-hour. Risk: {sp.risk} |")
    return out


def _fig(f: sides_model.Figure, unit: str = "", pct: bool = False) -> str:
    v = "-" if f.value is None else (_pct(f.value) if pct else f"{_n(f.value)}{unit}")
    src = {"given": "given", "history": "from history", "slo": "planned, SLO file", "none": "unknown"}[f.source]
    return f"{v} | {src}" + (f": {f.note}" if f.note else "")


def sides_rows(sp: sides_model.SidesPlan) -> List[str]:
    """The per-side sizing as Markdown: the verdict first, then every figure with where it comes from."""
    out = ["", "### Prefill and decode apart", "", f"**{sides_model.verdict(sp)}**", ""]
    out += ["| figure | value | from |", "| --- | --- | --- |",
            f"| target | {_fig(sp.qps, ' req/s')} |", f"| prompt tokens per request | {_fig(sp.prompt_tokens)} |",
            f"| output tokens per request | {_fig(sp.output_tokens)} |",
            f"| prefix-cache hit ratio | {_fig(sp.prefix_hit_ratio, pct=True)} |",
            f"| speculative speedup (tokens per decode step) | {_fig(sp.speculative_speedup, 'x')} |"]
    for side in (sp.prefill, sp.decode):
        if side is None:
            continue
        what = "prompt tokens computed" if side.role == "prefill" else "output tokens"
        need = (f"{_n(sp.qps.value)} × {_n(sp.prompt_tokens.value)} × (1 − {_pct(sp.prefix_hit_ratio.value)})"
                if side.role == "prefill" else f"{_n(sp.qps.value)} × {_n(sp.output_tokens.value)}")
        now = "" if side.instances_now is None else f"; {side.instances_now} serving now"
        out += [f"| {side.role}: one instance sustains | {_fig(side.per_instance, ' ' + what + '/s')} |",
                f"| {side.role}: needed | {_n(side.needed_tokens_per_second)} {what}/s | {need} |",
                f"| {side.role}: instances | {side.instances} × {side.gpus_per_instance} GPUs = {side.gpus} GPUs "
                f"| each {_pct(side.load)} loaded{now} |",
                f"| {side.role}: a month | {_money(side.monthly, sp.price.currency)} | {sp.price.detail} |"]
    if sp.monthly is not None:
        budget = "within" if sp.within_money else "OVER"
        out.append(f"| a month, both sides | {_money(sp.monthly, sp.price.currency)} | with "
                   f"{_money(sp.monthly_fixed, sp.price.currency)} fixed; {budget} the budget of "
                   f"{_money(sp.monthly_budget, sp.price.currency)} |")
    for role, h in sorted(sp.history.items()):
        if not h.instances:
            continue
        bound = "objectives missed just above it" if h.bound == "observed" else "a lower bound: never pushed to its limit"
        held = "never within the objectives for the sustain window" if h.tokens_per_second is None else \
            f"{_n(h.tokens_per_second)} tokens/s held ({bound})"
        out.append(f"| history: {role} | {h.instances} instance{'s' * (h.instances != 1)}; {held}; highest "
                   f"{_n(h.held_max)} | roles from vllm_sidecar_role_info |")
    return out


def sides_dict(sp: Optional[sides_model.SidesPlan]) -> Optional[Dict[str, Any]]:
    if sp is None:
        return None
    best = sp.best_split()
    return {"verdict": sides_model.verdict(sp), "fits": sp.fits, "gpus_needed": sp.gpus_needed,
            "gpus_budget": sp.gpus_budget, "max_qps_in_budget": None if best is None else best[0],
            "best_split": None if best is None else {"prefill": best[1], "decode": best[2]},
            **{k: vars(getattr(sp, k)) for k in ("qps", "prompt_tokens", "output_tokens", "prefix_hit_ratio",
                                                 "speculative_speedup")},
            "prefill": None if sp.prefill is None else {**vars(sp.prefill), "per_instance": vars(sp.prefill.per_instance)},
            "decode": None if sp.decode is None else {**vars(sp.decode), "per_instance": vars(sp.decode.per_instance)},
            "price": vars(sp.price), "monthly": sp.monthly, "monthly_budget": sp.monthly_budget,
            "within_budget": sp.within_money, "missing": list(sp.missing),
            "history": {k: vars(v) for k, v in sp.history.items()}}


def markdown(r: CapacityReport) -> str:
    o = r.objectives
    objs = f"TTFT p95 ≤ {_s(o.ttft_p95_seconds)}, TTFT mean ≤ {_s(o.ttft_mean_seconds)}, " \
           f"inter-token latency mean ≤ {_s(o.itl_mean_seconds)}"
    if r.plan is not None and not r.models:
        out = ["# Capacity plan: prefill and decode apart", "",
               "From the SLO file's planned capacity figures and the flags alone; no history was read. Each figure "
               "says where it comes from."]
        return "\n".join(out + sides_rows(r.plan)) + "\n"
    out: List[str] = [
        f"# Capacity model, {fmt_time(r.start_ms)} … {fmt_time(r.end_ms)}",
        "",
        f"From vLLM's own series over {fmt_span(r.end_ms - r.start_ms)} (the pack's recording rules evaluated every "
        f"{fmt_span(r.step_ms)}). Objectives from the SLO file: {objs}. A replica's throughput counts as sustainable "
        f"when every objective held for {r.settings['sustain']} at that load.",
    ]
    for note in r.notes:
        out += ["", f"Note: {note}"]
    # a target the GPU budget cannot carry is said first, before any detail
    for m in r.models:
        if m.sides is not None and m.sides.fits is False:
            out += ["", f"**{model_title(m)}: {sides_model.verdict(m.sides)}**"]
    for m in r.models:
        s, tg = m.sustainable, m.target
        out += ["", f"## {model_title(m)}", "", "| figure | value | from |", "| --- | --- | --- |"]
        pk = m.peak_qps
        out.append(f"| peak request rate | {_n(pk.value) if pk else '-'} req/s"
                   f"{' at ' + fmt_time(pk.at_ms) if pk else ''} | finished requests per second over the rate "
                   f"window (`{r.rule_names.get('qps', 'vllm:request_success_total')}`), highest in the range |")
        pt = m.peak_tokens_per_second
        out.append(f"| peak generation throughput | {_n(pt.value) if pt else '-'} tokens/s | all replicas, highest in "
                   f"the range |")
        for what, d in (("prompt tokens", m.prompt_tokens), ("output tokens", m.output_tokens)):
            hist = "request_prompt_tokens" if what.startswith("prompt") else "request_generation_tokens"
            out.append(f"| {what} per request | mean {_n(d.mean)}, p50 {_n(d.p50)}, p95 {_n(d.p95)} | "
                       f"`vllm:{hist}` over the whole range (quantiles interpolated in vLLM's buckets) |")
        out.append(f"| prefix-cache hit ratio | {_pct(m.prefix_cache_hit_ratio)} | hit over queried tokens, whole range |")
        out.append(f"| speculative decoding acceptance | "
                   f"{_pct(m.spec_decode_acceptance) if m.spec_decode_acceptance is not None else 'not in use'} | "
                   f"accepted over drafted tokens, whole range |")
        out.append(f"| replicas serving now | {m.replicas_now} | at the end of the range |")
        if s.tokens_per_second is None:
            sus = "unknown: no replica met every objective for the sustain window under load"
        else:
            who = ", ".join(f"{k}={v}" for k, v in sorted(s.replica.items()) if k != "model_name")
            sus = f"{_n(s.tokens_per_second)} tokens/s ({who}, {fmt_time(s.at_ms)}); " + \
                  ("objectives missed just above it" if s.bound == "observed"
                   else "a lower bound: no objective was missed at or above 90% of it")
        out.append(f"| sustainable output tokens per replica | {sus} | highest output tokens/s held {r.settings['sustain']} "
                   f"within every objective (best single step: {_n(s.instantaneous_max)}); the curve below |")
        if m.output_only_capacity_qps is not None:
            out.append(f"| output tokens only | {m.replicas_now} × {_n(s.tokens_per_second)} = "
                       f"{_n(m.capacity_tokens_per_second)} tokens/s ≈ {_n(m.output_only_capacity_qps)} req/s | "
                       f"at {_n(m.output_tokens.mean)} output tokens per request: the dashboard's headroom unit, "
                       f"not the capacity (prefill work is left out; it misleads when the prompt mix moves) |")
        wc = m.weighted
        if wc is not None:
            out += weighted_rows(m, wc)
        if tg is not None:
            src = "given" if tg.source == "given" else \
                f"peak {_n(m.peak_qps.value)} req/s + {r.settings['headroom']:.0%} headroom"
            out.append(f"| target | {_n(tg.qps)} req/s | {src} |")
            if tg.replicas_needed is not None and wc is not None:
                out.append(f"| replicas needed | {tg.replicas_needed} | ⌈{_n(tg.qps)} req/s × "
                           f"{_n(wc.request_cost)} weighted tokens / {_n(wc.tokens_per_second)} weighted tokens/s⌉ |")
        out.append(f"| verdict | {verdict_text(m)} | |")
        out.append(f"| trend | {trend_text(m.trend, m.capacity_qps)} | daily peaks of the request rate, "
                   f"least squares |")
        h = m.rules_at_end.get("headroom")
        out.append(f"| headroom (dashboard) | {_pct(h, True)} | `{r.rule_names['headroom']}` at the end: "
                   f"sustainable × replicas against the peak over {r.settings['peak_window']} |")
        if m.curve:
            out += ["", "Load–latency curve (every replica at every step with traffic, binned by its tokens/s; "
                        "medians):", "",
                    "| tokens/s per replica | steps | TTFT p95 | TTFT mean | ITL mean | objectives met |",
                    "| --- | --- | --- | --- | --- | --- |"]
            for b in m.curve:
                out.append(f"| {_n(b.lo)} … {_n(b.hi)} (median {_n(b.tokens_per_second)}) | {b.points} | "
                           f"{_s(b.ttft_p95)} | {_s(b.ttft_mean)} | {_s(b.itl_mean)} | {_pct(b.within_share)} |")
        if m.sides is not None:
            out.append("")
            out.append("Some replicas of this model have the role prefill or decode: the per-replica figures above "
                       "mix both roles; the sides are sized apart below.")
            out += sides_rows(m.sides)
        if m.cost is not None:
            out += cost_rows(m)
        if m.weighted is not None and m.weighted.mixes:
            out += mix_table(m.weighted, len(m.weighted.mixes) > 1)
        if m.trend.peaks:
            out += ["", "Periodic peaks: " + ", ".join(f"{fmt_time(p.start_ms)[:10]} {_n(p.value)}"
                                                       for p in m.trend.peaks)]
    return "\n".join(out) + "\n"


def _opt_time(ms: Optional[int]) -> Optional[str]:
    return None if ms is None else fmt_time(ms)


def to_dict(r: CapacityReport) -> Dict[str, Any]:
    o = r.objectives
    models = []
    for m in r.models:
        s, t, tg = m.sustainable, m.trend, m.target
        models.append({
            "labels": m.labels,
            "peak_qps": None if m.peak_qps is None else {"value": m.peak_qps.value, "at": fmt_time(m.peak_qps.at_ms)},
            "peak_tokens_per_second": None if m.peak_tokens_per_second is None else
            {"value": m.peak_tokens_per_second.value, "at": fmt_time(m.peak_tokens_per_second.at_ms)},
            "prompt_tokens": vars(m.prompt_tokens), "output_tokens": vars(m.output_tokens),
            "prefix_cache_hit_ratio": m.prefix_cache_hit_ratio,
            "spec_decode_acceptance": m.spec_decode_acceptance,
            "replicas_now": m.replicas_now,
            "sustainable": {"tokens_per_second": s.tokens_per_second, "at": _opt_time(s.at_ms), "replica": s.replica,
                            "instantaneous_max": s.instantaneous_max, "bound": s.bound,
                            "missed_near_limit_steps": s.missed_near_limit},
            "capacity": {"tokens_per_second": m.capacity_tokens_per_second, "qps": m.capacity_qps,
                         "output_only_qps": m.output_only_capacity_qps},
            "weighted": None if m.weighted is None else weighted_dict(m.weighted),
            "cost": None if m.cost is None else cost_dict(m.cost),
            "gpu_utilization": m.gpu_utilization, "tokens_per_joule": m.tokens_per_joule,
            "target": None if tg is None else {
                "qps": tg.qps, "source": tg.source, "replicas_now": tg.replicas_now,
                "replicas_needed": tg.replicas_needed, "capacity_qps": tg.capacity_qps, "margin": tg.margin,
                "enough": tg.enough, "verdict": verdict_text(m)},
            "trend": {"status": t.status, "period_seconds": t.period_ms / 1000, "confidence": t.confidence,
                      "slope_qps_per_day": t.slope_per_day, "slope_low": t.slope_low, "slope_high": t.slope_high,
                      "level_now": t.level_now, "crosses_capacity_at": _opt_time(t.crosses_at_ms),
                      "crosses_earliest": _opt_time(t.crosses_earliest_ms),
                      "crosses_latest": _opt_time(t.crosses_latest_ms), "note": t.note,
                      "peaks": [{"period_start": fmt_time(p.start_ms), "qps": p.value, "at": fmt_time(p.at_ms)}
                                for p in t.peaks]},
            "curve": [vars(b) for b in m.curve],
            "points": int(len(m.points.tokens_per_second)),
            "recording_rules_at_end": {r.rule_names[k]: v for k, v in m.rules_at_end.items()},
            "sides": sides_dict(m.sides),
        })
    return {"start": fmt_time(r.start_ms), "end": fmt_time(r.end_ms), "step_seconds": r.step_ms / 1000,
            "objectives": vars(o), "settings": r.settings, "models": models, "notes": list(r.notes),
            "plan": sides_dict(r.plan)}


def weighted_dict(wc) -> Dict[str, Any]:
    pw = wc.weight
    return {"unit": f"output tokens/s + {pw.weight:.6g} x prompt tokens/s",
            "prefill_weight": {"value": pw.weight, "source": pw.source, "saturated_steps": pw.saturated_steps,
                               "level": pw.level, "low": pw.low, "high": pw.high, "note": pw.note},
            "sustainable_per_replica": wc.tokens_per_second, "at": _opt_time(wc.at_ms), "replica": wc.replica,
            "bound": wc.bound, "missed_near_limit_steps": wc.missed_near_limit, "request_cost": wc.request_cost,
            "mixes": [{**vars(x), "first": fmt_time(x.first_ms), "last": fmt_time(x.last_ms)} for x in wc.mixes]}


def cost_dict(c) -> Dict[str, Any]:
    out = {k: v for k, v in vars(c).items() if k not in ("prices", "spot")}
    out["prices"] = {**vars(c.prices), "unit_prices": dict(c.prices.unit_prices)}
    out["spot"] = None if c.spot is None else vars(c.spot)
    return out


def to_json(r: CapacityReport) -> str:
    return json.dumps(to_dict(r), indent=2) + "\n"


def render_png(r: CapacityReport, path: str) -> None:
    """One row per model: TTFT p95, TTFT mean and ITL mean against tokens/s per replica, each
    point coloured by whether every objective held, the bins' medians, the objective as a
    horizontal line and the sustainable throughput as a vertical one."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    o = r.objectives
    rows = max(len(r.models), 1)
    fig, axes = plt.subplots(rows, 3, figsize=(15, 4.2 * rows), squeeze=False)
    panels = (("TTFT p95 (s)", "ttft_p95", o.ttft_p95_seconds), ("TTFT mean (s)", "ttft_mean", o.ttft_mean_seconds),
              ("inter-token latency mean (s)", "itl_mean", o.itl_mean_seconds))
    for row, m in zip(axes, r.models):
        p = m.points
        for ax, (title, attr, objective) in zip(row, panels):
            y = getattr(p, attr)
            ax.scatter(p.tokens_per_second[p.within], y[p.within], s=6, alpha=0.35, color="tab:green",
                       label="every objective met")
            ax.scatter(p.tokens_per_second[~p.within], y[~p.within], s=6, alpha=0.35, color="tab:red",
                       label="an objective missed")
            bins = [b for b in m.curve if getattr(b, attr) is not None]
            ax.plot([b.tokens_per_second for b in bins], [getattr(b, attr) for b in bins], "o-", color="black",
                    label="median per load bin")
            top = float(np.nanmax(y)) if np.isfinite(y).any() else objective
            note = ""
            if objective <= 3 * top:
                ax.axhline(objective, color="tab:orange", linestyle="--", label=f"objective {objective:g} s")
            else:  # far above everything measured: drawn, it would flatten the curve
                note = f"\n(objective {objective:g} s: off the chart)"
            if m.sustainable.tokens_per_second:
                ax.axvline(m.sustainable.tokens_per_second, color="tab:blue", linestyle=":",
                           label=f"sustainable {_n(m.sustainable.tokens_per_second)} tokens/s")
            ax.set_xlabel("generation tokens/s per replica")
            ax.set_ylabel(title)
            ax.set_title(f"{model_title(m)}: {title.split(' (')[0]}{note}", fontsize=10)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7, loc="upper left")
    if not r.models:
        axes[0][0].text(0.5, 0.5, "no data", ha="center")
    fig.suptitle(f"load–latency curve, {fmt_time(r.start_ms)} … {fmt_time(r.end_ms)}", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
