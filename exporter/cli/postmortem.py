"""``postmortem``: fetch the flight records of one or more sidecars (or read saved ones), replay
them through the pack at poll resolution and at a 15 s scrape's, and write a report directory:
``report.md``, ``timeline.png``, the merged record ``record.om.gz`` (what ``backtest --file``
and ``promtool tsdb create-blocks-from openmetrics`` take) and each pod's events.

Exit status: 0 done; 2 bad flags, an unreachable sidecar or an unreadable record (one line).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Callable, List, Mapping, Sequence, Tuple

from .parsing import PROG, OneLineParser, fail

SUB = "postmortem"


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
    p.add_argument("--prometheus-url", metavar="URL", help="for the fleet context: the alerts Prometheus had firing "
                                                           "over the record's time")
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


def _prometheus_context(url: str, start_ms: int, end_ms: int) -> List[str]:
    import requests

    r = requests.get(url.rstrip("/") + "/api/v1/query_range",
                     params={"query": 'ALERTS{alertstate="firing"}', "start": start_ms / 1000, "end": end_ms / 1000,
                             "step": "15s"}, timeout=60)
    r.raise_for_status()
    out = []
    for s in r.json().get("data", {}).get("result", []):
        m = s["metric"]
        first = float(s["values"][0][0]) if s.get("values") else None
        who = ", ".join(f"{k}={v}" for k, v in sorted(m.items()) if k not in ("__name__", "alertstate", "alertname"))
        out.append(f"{m.get('alertname')} firing in Prometheus from unix {first:.0f} ({who})")
    return out or ["Prometheus had no alert firing over the record's time"]


def main(argv: Sequence[str], env: Mapping[str, str], now: Callable[[], float] = time.time) -> int:
    ns = _parser().parse_args(list(argv))
    if not ns.sidecar and not ns.file:
        return fail(SUB, "give at least one --sidecar URL or --file record")
    from ..analysis import backtest as bt
    from ..analysis import postmortem as pm
    from ..analysis.sources import SourceError
    from ..slo import load_slo
    from .backtest import parse_time

    try:
        slo = load_slo(ns.slo)
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
    scraped = out / "record-15s.om.gz"
    pm.write_openmetrics(store, raw)
    pm.write_openmetrics(pm.resample(store), scraped)
    poll = pm.poll_interval_ms(store)
    exprs = pm.timeline_exprs(slo)
    try:
        fine = bt.run_backtest(bt.Options(slo=slo, file=str(raw), step_ms=poll, plots=exprs),
                               now_ms=lambda: int(now() * 1000))
        coarse = bt.run_backtest(bt.Options(slo=slo, file=str(scraped)), now_ms=lambda: int(now() * 1000))
    except bt.BacktestError as exc:
        return fail(SUB, str(exc))
    report = pm.build(store, fine, coarse, slo)
    context: List[str] = []
    if ns.prometheus_url:
        try:
            context = _prometheus_context(ns.prometheus_url, report.start_ms, report.end_ms)
        except Exception as exc:  # noqa: BLE001
            context = [f"Prometheus at {ns.prometheus_url} could not be read: {str(exc).splitlines()[0]}"]
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
