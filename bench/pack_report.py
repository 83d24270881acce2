"""The report of a ``bench_pack.py`` run, as markdown: one table per instance kind, the pack's rules
with their samples, times and quiet figures, the variants' differences; and the introduction of
the section it writes into docs/performance.md ("The pack on Prometheus")."""

from __future__ import annotations

import statistics
from typing import Optional, Tuple

SECTION = "## The pack on Prometheus"
SECTION_INTRO = """`bench/bench_pack.py` (`make bench-pack`) runs a real Prometheus per rule set, all at once,
scraping one simulated fleet: 100 pods (a simulated vLLM 0.32.0 page each and its real sidecar's
page), three models in two namespaces, some idle, some busy, one thrashing its KV cache, one in a
long-prompt storm, two answering a share of requests with 5xx. `none` has no rules (the baseline
for series and ingestion), `naive` the user's four naive alerts, `pack` this pack, and each
`--variant` another rule file in the same run (below: `before`, the pack before the round the
section "The pack at fleet scale" describes first: one group, every read that round cut). A rule
file of several groups is measured per evaluation: each group's time weighed by how often it runs
(the slow alerts' and the views' groups, every 2 minutes, a quarter each). vLLM's targets carry
the SLO's `sidecar_target_label`, as the deploy monitors write it for a pod with the sidecar
(every pod here has one). Windows longer than the warm-up are backfilled first (a subquery's
series as far back as it reaches; a recorded series' past is made up, with nothing held back and
nobody waiting), so the 1-day, 3-day and 14-day reads read full windows from the first evaluation.
"Samples read" is Prometheus' own count (`stats=all`), independent of how busy the machine is;
times are not, and the load average is given beside them. The quiet lines and the table's last two
columns come from the pass after the run: each rule asked of one Prometheus over the stored data
with nothing else running (`bench/bench_rule_cost.py`). Each instance's alerting group runs at its
own moment of every 30 s, spread over the interval in whole ticks of the fleet (a copy of its rule
file under a name whose hash puts it there: `bench/phases.py`), so that no two evaluate at once
and each meets the fleet at the same point of its tick; its slower groups (every minute or two)
at that point of the tick too, never at another group's moment. Left where Prometheus hashes
them, the same rules measured up to 20 % apart between two instances of one run, and a views
group that met the fleet's busy moment took 83 ms where the same rules took 27 ms elsewhere.

What a user should expect: the recording rules add about as many series per pod as the
"per pod" figure below (a pod that serves no traffic adds fewer: some rules record only where
there is something to divide), plus a few per model; on a fleet of P pods and M models,
`P x per pod + M x per model` series. The alerts add `ALERTS` and `ALERTS_FOR_STATE` series
only while they are pending or firing.

Measured on {machine}, Python {python}, {prometheus}:
"""


# -- the report -----------------------------------------------------------------------------------

def fmt_ms(s: Optional[float]) -> str:
    return "" if s is None else f"{s * 1000:.2f}"


def _recorded_levels(r: dict) -> Tuple[int, int]:
    rec = [x for x in r.get("rules", []) if x["kind"] == "record"]
    return (sum(x["series"] for x in rec if x["level"] == "namespace_pod_model"),
            sum(x["series"] for x in rec if x["level"] == "namespace_model"))


def _samples_read(r: dict) -> int:
    """Samples the rules read per evaluation interval (a group evaluated less often, weighed so)."""
    return round(sum((x["samples_read"] or 0) * x.get("weight", 1.0) for x in r.get("rules", [])))


def report(res: dict, say) -> None:
    """The run as markdown: one table per instance kind, the pack's rules, the variants' differences."""
    inst = res["instances"]
    none, naive = inst["none"], inst["naive"]
    pods = res["pods"]
    n_pods = len(pods)
    n_models = len({(p["namespace"], p["model"]) for p in pods})
    ev = res["eval_s"]
    lo, hi, mid = min(res["load_1m"]), max(res["load_1m"]), statistics.median(res["load_1m"])
    say(f"\n### Scrape every {res['scrape_s']:g} s, rules every {ev:g} s: {n_pods} pods, {n_models} (namespace, model) "
        f"pairs; measured over {res['measure_s']:.0f} s after {res['warmup_s']:.0f} s of warm-up; load average (1 min) "
        f"{lo:.1f} to {hi:.1f}, median {mid:.1f}\n")
    say("| instance | head series | added by its rules | samples appended/s | samples read per evaluation | "
        "group time per evaluation, median (p90, max) | share of the interval | "
        "CPU above `none`, s per evaluation | missed | failures |")
    say("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, r in inst.items():
        gt = r.get("group_time_s") or {}
        cpu = (r["cpu_s_per_s"] - none["cpu_s_per_s"]) * ev
        say(f"| {name} | {r['head_series']:,.0f} | {r['head_series'] - none['head_series']:,.0f} | "
            f"{r['samples_appended_per_s']:,.0f} | {_samples_read(r):,} | "
            + (f"{fmt_ms(gt['median'])} ms ({fmt_ms(gt['p90'])}, {fmt_ms(gt['max'])})" if gt else "–") + " | "
            + (f"{gt['median'] / ev:.2%}" if gt else "–") + " | "
            + ("–" if name == "none" else f"{cpu:.3f}")
            + f" | {r['iterations_missed']:.0f} | {r['evaluation_failures']:.0f} |")
    say("")
    # max(0, ...): a saved run from before both counts were read at one instant could show -1
    say("Scrapes: " + "; ".join(f"{name} {r.get('scrapes', 0):,.0f}, {max(0, r.get('scrapes_failed', 0)):,.0f} failed"
                                 for name, r in inst.items())
        + " (the slowest target's longest scrape: "
        f"{max((r.get('scrape_duration_p99_of_max_s') or 0) for r in inst.values()):.2f} s).")
    if res.get("phases"):
        say("Each instance's alerting group evaluated at its own moment of every interval (seconds into it, "
            "predicted / observed): " + ", ".join(f"{name} {p['predicted']:.2f} / {p['observed']}"
                                                  for name, p in res["phases"].items()) + ".")
    for name, r in inst.items():
        if not any(x["kind"] == "record" for x in r.get("rules", [])):
            continue
        pod_level, model_level = _recorded_levels(r)
        ngt, gt = naive.get("group_time_s") or {}, r.get("group_time_s") or {}
        say(f"- {name}: {pod_level:,} per-pod recorded series ({pod_level / n_pods:.2f} per pod; by load: "
            + ", ".join(f"{k} {v['min']}" + (f"–{v['max']}" if v["max"] != v["min"] else "") + f" ({v['pods']} pods)"
                        for k, v in r["recorded_per_pod_by_load"].items())
            + f"), {model_level} per-model ({model_level / n_models:.2f} per model), ALERTS {r['ALERTS']} and "
            f"ALERTS_FOR_STATE {r['ALERTS_FOR_STATE']}; head series {r['head_series'] / none['head_series']:.3f}× `none`'s, "
            f"samples appended {r['samples_appended_per_s'] / none['samples_appended_per_s']:.3f}×; against `naive`: "
            f"samples read {_samples_read(r) / max(1, _samples_read(naive)):.0f}×, group time "
            + (f"{gt['median'] / ngt['median']:.0f}× (medians)" if gt and ngt else "–") + ".")
        if len(r.get("groups") or {}) > 1:
            say("  Its groups (the group time above is theirs per evaluation, each weighed by how often it runs): "
                + "; ".join(f"`{g}` every {ev / x['weight']:g} s, a median of {fmt_ms(x['median'])} ms over {x['evals']} "
                            "evaluations" for g, x in r["groups"].items()) + ".")
        say("  Alerts at the end: " + (", ".join(f"{k} {v}" for k, v in sorted(r["alerts"].items())) or "none") + ".")
        if r.get("rule_errors"):
            say(f"  RULE ERRORS: {r['rule_errors']}")
    quiet = res.get("quiet") or {}
    for name, q in quiet.items():
        f, nv = q["files"][name], q["files"]["naive"]
        say(f"\nQuiet, over `{name}`'s stored data (each rule asked {q['repeat']} times of one Prometheus with "
            f"nothing else running; Prometheus' own `evalTotalTime`, the median: selecting and evaluating, "
            f"not parsing, writing the results, the alerts' state or their annotations' queries; a rule weighed by "
            f"how often its group runs): `{name}` {f['total_ms']:.1f} ms per {ev:g} s for {len(f['rules'])} rules "
            f"selecting {f['series']:,} series, the naive rules {nv['total_ms']:.1f} ms selecting {nv['series']:,}: "
            f"**{f['total_ms'] / nv['total_ms']:.1f}x**"
            + ("" if f.get("total_ms_every_rule", f["total_ms"]) == f["total_ms"] else
               f" ({f['total_ms_every_rule']:.1f} ms, {f['total_ms_every_rule'] / nv['total_ms']:.1f}x, at an "
               f"evaluation where every group runs)") + ".")
    pack = inst["pack"]
    qp = {x["rule"]: x for x in (quiet.get("pack") or {}).get("files", {}).get("pack", {}).get("rules", [])}
    total_t = sum(x["median_s"] or 0 for x in pack["rules"])
    total_s = _samples_read(pack)
    say(f"\nThe pack's rules, by samples read (time: the median of {pack.get('group_evals', 0)} evaluations; "
        "quiet: as above):\n")
    say("| rule | output series | samples read per evaluation | share | median time, ms | share | series selected "
        "| quiet, ms |")
    say("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for x in sorted(pack["rules"], key=lambda x: (-(x["samples_read"] or 0), -(x["median_s"] or 0))):
        q = qp.get(x["rule"], {})
        say(f"| `{x['rule']}` | {x.get('series', '')} | {x['samples_read'] or 0:,} | "
            f"{(x['samples_read'] or 0) / max(1, total_s):.1%} | {fmt_ms(x['median_s'])} | "
            f"{(x['median_s'] or 0) / total_t:.1%} | {q.get('series', '–')} | "
            + (f"{q['ms']:.2f}" if q else "–") + " |")
    pod_level, model_level = _recorded_levels(pack)
    qf = (quiet.get("pack") or {}).get("files", {}).get("pack")
    say(f"| all {len(pack['rules'])} rules | {pod_level + model_level:,} | {total_s:,} | 100 % | {total_t * 1000:.1f} | "
        f"100 % | " + (f"{qf['series']:,} | {qf['total_ms']:.1f}" if qf else "– | –") + " |")
    top = sorted(pack["rules"], key=lambda x: -(x["median_s"] or 0))[:5]
    say("\nFive slowest (median): " + "; ".join(f"`{x['rule']}` {fmt_ms(x['median_s'])} ms" for x in top) + ".")
    for name, r in inst.items():
        if name in ("none", "naive", "pack") or not r.get("rules"):
            continue
        theirs = {x["rule"]: x for x in r["rules"]}
        ours = {x["rule"]: x for x in pack["rules"]}
        say(f"\nRules that differ between `pack` and `{name}`:\n")
        say(f"| rule | samples read, pack | samples read, {name} | median ms, pack | median ms, {name} |")
        say("| --- | ---: | ---: | ---: | ---: |")
        for rule in sorted(set(theirs) | set(ours)):
            a, b = ours.get(rule, {}), theirs.get(rule, {})
            if a.get("samples_read") != b.get("samples_read") or not a or not b:
                say(f"| `{rule}` | {a.get('samples_read', '–')} | {b.get('samples_read', '–')} | "
                    f"{fmt_ms(a.get('median_s'))} | {fmt_ms(b.get('median_s'))} |")
