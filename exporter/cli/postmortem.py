"""``postmortem``: fetch the flight records of one or more sidecars (or read saved ones), replay
them through the pack at poll resolution, set that beside the alerts at Prometheus' resolution,
and write a report directory: ``report.md``, ``timeline.png``, the merged record ``record.om.gz``
(what ``backtest --file`` and ``promtool tsdb create-blocks-from openmetrics`` take) and each
pod's events.

The alerts at Prometheus' resolution, with ``--prometheus-url``: what that Prometheus had, its own
``ALERTS{alertstate="firing"}`` samples over the record's window (from the longest ``for`` of the
pack before its start, at most 15 minutes, so an alert pending when the record began is seen), for the pack's alerts
it evaluates (its ``/api/v1/rules``; where that cannot be read, the pack's alerts it has ALERTS
of); for the others, the pack evaluated by that Prometheus over what it stored (``backtest
--engine server``). Without it: the record resampled as a scrape every ``--resample`` would have
stored it, said so in the report (a stand-in for what Prometheus had, not what it had).

Exit status: 0 done; 2 bad flags, an unreachable sidecar or an unreadable record (one line).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Callable, List, Mapping, Optional, Sequence, Tuple

from .parsing import PROG, OneLineParser, fail

SUB = "postmortem"
LEAD_MAX_MS = 15 * 60_000


def _parser() -> OneLineParser:
    p = OneLineParser(prog=f"{PROG} {SUB}",
                      description="Replay sidecars' flight records through the alerting pack and write a postmortem "
                                  "report (Markdown, PNG timeline, the order of first events, the alerts at poll "
                                  "resolution and at Prometheus').")
    p.add_argument("--sidecar", metavar="URL", action="append", default=[],
                   help="a sidecar's base URL (repeatable), e.g. http://127.0.0.1:9181 through kubectl port-forward; "
                        "its /debug/flight and /debug/flight/events are read")
    p.add_argument("--file", metavar="FILE", action="append", default=[],
                   help="a saved flight record (OpenMetrics with timestamps, gzip allowed; repeatable)")
    p.add_argument("--out", metavar="DIR", required=True, help="the report directory (created)")
    p.add_argument("--prometheus-url", metavar="URL",
                   help="the Prometheus that scraped these pods: its own ALERTS over the record's window for the "
                        "pack's alerts it evaluates, the pack evaluated over what it stored for those it does not, "
                        "and the other alerts it had firing (fleet context)")
    p.add_argument("--resample", metavar="DURATION", default="15s",
                   help="without --prometheus-url: the record resampled at this interval stands in for what "
                        "Prometheus stored (default 15s)")
    p.add_argument("--slo", metavar="FILE", help="SLO file the pack is rendered from (default: the built-in SLO)")
    p.add_argument("--start", metavar="TIME", help="only the record from here (RFC 3339 or unix seconds)")
    p.add_argument("--end", metavar="TIME", help="only the record up to here")
    p.add_argument("--event", metavar="ID", help="only this event's window (one --sidecar)")
    p.add_argument("--user", metavar="NAME", help="basic-auth user for the sidecars; the password from "
                                                  "VLLM_SIDECAR_POSTMORTEM_PASSWORD")
    p.add_argument("--ca-file", metavar="FILE", help="CA bundle for https sidecars")
    return p


def _fetch(url: str, query: dict, auth, verify) -> Tuple[bytes, dict]:
    import requests

    base = url.rstrip("/")
    r = requests.get(base + "/debug/flight", params=query, auth=auth, verify=verify, timeout=300,
                     headers={"Accept-Encoding": "gzip"})
    if r.status_code != 200:
        raise ValueError(f"{base}/debug/flight: HTTP {r.status_code}: {r.text[:200].strip()}")
    ev = requests.get(base + "/debug/flight/events", auth=auth, verify=verify, timeout=60)
    events = ev.json() if ev.status_code == 200 else {}
    return r.content, events


def _get(url: str, path: str, params: dict, timeout: float = 60) -> object:
    import requests

    r = requests.get(url.rstrip("/") + path, params=params, timeout=timeout)
    body = r.json()
    if body.get("status") != "success":
        raise ValueError(f"{path}: HTTP {r.status_code}: {body.get('error', '')}"[:300])
    return body.get("data")


def _evaluated_alerts(url: str) -> Optional[set]:
    """The alerting rules that Prometheus evaluates (by name), or None where it cannot say."""
    try:
        data = _get(url, "/api/v1/rules", {"type": "alert"})
    except Exception:  # noqa: BLE001 - a Prometheus-compatible server without the rules API
        return None
    return {r.get("name") for g in (data or {}).get("groups", []) for r in g.get("rules", [])
            if r.get("type") == "alerting"}


def _prometheus_coarse(url: str, slo: dict, start_ms: int, end_ms: int, now: Callable[[], float]):
    """(Coarse, fleet context lines) from the Prometheus at ``url`` over [start_ms, end_ms]."""
    from ..analysis import backtest as bt
    from ..analysis import postmortem as pm

    groups, _ = bt.load_groups(bt.Options(slo=slo))
    rules = [r for g in groups for r in g.rules if r.kind == "alert"]
    pack = {r.name for r in rules}
    own = {r.name: {k for k, _ in r.labels} for r in rules}
    from ..analysis.rulefile import evaluation_step
    from ..slo import parse_duration

    # how often the pack is evaluated: a group without an interval at the SLO's evaluation_interval
    step_ms = evaluation_step(groups, parse_duration(str(slo.get("evaluation_interval", "1m"))) or 60_000)
    # an alert pending when the record began: read from the pack's longest ``for`` before it, up to LEAD_MAX_MS
    lead = min(LEAD_MAX_MS, max((r.for_ms for r in rules), default=0) + step_ms)
    since = start_ms - lead
    window_s = max(1, -(-(end_ms - since) // 1000))
    result = _get(url, "/api/v1/query", {"query": f'ALERTS{{alertstate="firing"}}[{window_s}s]',
                                         "time": f"{end_ms / 1000:.3f}"})
    series = (result or {}).get("result") or []
    loaded = _evaluated_alerts(url)
    seen = {(s.get("metric") or {}).get("alertname") for s in series}
    evaluated = (pack & loaded) if loaded is not None else (pack & seen)
    fired = pm.fired_from_alerts(series, own, evaluated)
    notes = []
    if evaluated:
        how = ("its rules API lists them" if loaded is not None else
               "it has ALERTS of them; its rules could not be read")
        notes.append(f"Prometheus at {url} evaluates {len(evaluated)} of the pack's {len(pack)} alerts ({how}): "
                     f"for those, its own ALERTS{{alertstate=\"firing\"}} samples, as its rule evaluations wrote "
                     f"them, from {(start_ms - since) / 1000:.0f} s before the record's start.")
    rest = pack - evaluated
    kind = "alerts" if evaluated else ""
    if rest:
        try:
            res = bt.run_backtest(bt.Options(slo=slo, prometheus_url=url, start_ms=since, end_ms=end_ms,
                                             step_ms=step_ms, engine="server"),
                                  now_ms=lambda: int(now() * 1000))
            fired += pm.fired_from_summary(res.summary, rest)
            how = (f"The other {len(rest)} alerts" if evaluated else
                   f"Prometheus at {url} evaluates none of the pack's alerts ("
                   + ("none among its rules" if loaded is not None else "no ALERTS of them; its rules could not be read")
                   + "), so all of them")
            notes.append(f"{how}: the pack evaluated by that Prometheus over what it stored (`backtest --engine "
                         f"server`), every {step_ms / 1000:g} s from {(start_ms - since) / 1000:.0f} s before the "
                         "record's start.")
            kind = "alerts+server" if evaluated else "server"
        except bt.BacktestError as exc:
            notes.append(f"The pack's other {len(rest)} alerts could not be evaluated over what Prometheus stored: "
                         f"{str(exc).splitlines()[0][:300]}")
    header = {"alerts": "Prometheus (its ALERTS)", "server": "Prometheus (the pack over its data)",
              "alerts+server": "Prometheus (ALERTS; the pack over its data)"}.get(kind, "Prometheus")
    context = []
    for s in series:
        m = s.get("metric") or {}
        if m.get("alertname") in pack or not s.get("values"):
            continue
        who = ", ".join(f"{k}={v}" for k, v in sorted(m.items()) if k not in ("__name__", "alertstate", "alertname"))
        context.append(f"{m.get('alertname')} firing in Prometheus from unix {float(s['values'][0][0]):.0f} ({who})")
    return pm.Coarse(kind or "none", header, " ".join(notes), fired), context or [
        "Prometheus had no alert outside the pack firing over the record's time"]


def main(argv: Sequence[str], env: Mapping[str, str], now: Callable[[], float] = time.time) -> int:
    ns = _parser().parse_args(list(argv))
    if not ns.sidecar and not ns.file:
        return fail(SUB, "give at least one --sidecar URL or --file record")
    from ..analysis import backtest as bt
    from ..analysis import postmortem as pm
    from ..analysis.sources import SourceError
    from ..slo import load_slo
    from .parsing import duration_ms, parse_time

    try:
        slo = load_slo(ns.slo)
        resample_ms = duration_ms(ns.resample, "--resample")
        query = {}
        if ns.start:
            query["start"] = str(parse_time(ns.start, "--start") / 1000)
        if ns.end:
            query["end"] = str(parse_time(ns.end, "--end") / 1000)
        if ns.event:
            query["event"] = ns.event
    except ValueError as exc:
        return fail(SUB, str(exc))
    except Exception as exc:  # noqa: BLE001 - a bad SLO file
        return fail(SUB, str(exc).splitlines()[0])
    out = Path(ns.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return fail(SUB, f"--out {ns.out}: {exc.strerror}")
    auth = (ns.user, env.get("VLLM_SIDECAR_POSTMORTEM_PASSWORD", "")) if ns.user else None
    records: List[Tuple[str, bytes]] = []
    sources: List[str] = []
    events = {}
    for url in ns.sidecar:
        try:
            data, ev = _fetch(url, query, auth, ns.ca_file or True)
        except Exception as exc:  # noqa: BLE001 - one line for any failure to read a sidecar
            return fail(SUB, f"--sidecar {url}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
        records.append((url, data))
        sources.append(url)
        events[url] = ev
    for f in ns.file:
        try:
            records.append((f, Path(f).read_bytes()))
        except OSError as exc:
            return fail(SUB, f"--file {f}: {exc.strerror}")
        sources.append(f)
    try:
        store = pm.merge_records(records)
    except SourceError as exc:
        return fail(SUB, str(exc))
    if not len(store):
        return fail(SUB, "the records hold no samples")
    raw = out / "record.om.gz"
    pm.write_openmetrics(store, raw)
    poll = pm.poll_interval_ms(store)
    exprs = pm.timeline_exprs(slo)
    first, last = store.time_range()
    context: List[str] = []
    try:
        fine = bt.run_backtest(bt.Options(slo=slo, file=str(raw), step_ms=poll, plots=exprs),
                               now_ms=lambda: int(now() * 1000))
        if ns.prometheus_url:
            try:
                coarse, context = _prometheus_coarse(ns.prometheus_url, slo, int(first), int(last), now)
            except Exception as exc:  # noqa: BLE001 - the report says so, the record's column stands
                why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                coarse = pm.Coarse("none", "Prometheus", f"Prometheus at {ns.prometheus_url} could not be read: {why}.")
        else:
            scraped = out / f"record-{resample_ms / 1000:g}s.om.gz"
            pm.write_openmetrics(pm.resample(store, resample_ms), scraped)
            res = bt.run_backtest(bt.Options(slo=slo, file=str(scraped)), now_ms=lambda: int(now() * 1000))
            coarse = pm.Coarse("resample", f"the record resampled to {resample_ms / 1000:g} s",
                               f"what a scrape every {resample_ms / 1000:g} s would have stored, "
                               "the pack evaluated over that at the rule groups' interval: a stand-in, not what "
                               "Prometheus had (give --prometheus-url for that).", pm.fired_from_summary(res.summary))
    except bt.BacktestError as exc:
        return fail(SUB, str(exc))
    report = pm.build(store, fine, coarse, slo)
    png = None
    try:
        from ..analysis import timeline

        panels = bt.plot_panels(fine, exprs)
        timeline.render(str(out / "timeline.png"), fine.run.times, panels, bt.lanes(fine), None,
                        title=f"postmortem: {', '.join(report.pods)} at poll resolution")
        png = "timeline.png"
    except ImportError:
        report.notes.append("\n(no timeline: matplotlib is not installed)")
    (out / "report.md").write_text(pm.markdown(report, png, sources, context))
    if events:
        (out / "events.json").write_text(json.dumps(events, indent=1) + "\n")
    sys.stdout.write(f"{out / 'report.md'}: {len(report.pods)} pod(s), {len(report.first_events)} first events, "
                     f"{len(report.alerts)} alert series fired\n")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(sys.argv[1:], os.environ))
