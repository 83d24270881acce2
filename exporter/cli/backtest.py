"""``backtest``: run the rules pack (or any rule file) over recorded history and report what it
would have done. Flags, time parsing and exit codes live here; the work is ``exporter.analysis``.

Exit status: 0 done; 1 the CI gate failed (``--max-episodes-per-day``, ``--quiet-alerts``), one
line per violation on stderr; 2 bad flags or input, one line on stderr.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from typing import Callable, List, Mapping, Sequence

from ..errors import ConfigError
from .parsing import PROG, OneLineParser, duration_ms, fail, parse_time

SUB = "backtest"


def _parser() -> OneLineParser:
    p = OneLineParser(prog=f"{PROG} {SUB}",
                      description="Evaluate the alerting pack over recorded history with Prometheus' rule semantics "
                                  "and report, per alert and label set, what it would have done.")
    src = p.add_argument_group("history (one of)")
    src.add_argument("--file", metavar="FILE",
                     help="recorded series: OpenMetrics text with timestamps ending in '# EOF' (gzip allowed), or a "
                          "promtool unit-test file (input_series)")
    src.add_argument("--test-name", metavar="NAME", help="which test group of a promtool file holding several")
    src.add_argument("--prometheus-url", metavar="URL",
                     help="read the raw series the rules need from this Prometheus over its HTTP API")
    src.add_argument("--engine", choices=("auto", "server", "local"), default="auto",
                     help="with --prometheus-url: server evaluates each alert's expression on the server "
                          "(query_range, recorded series inlined; this process holds alerts, not samples), local "
                          "reads the raw series and evaluates here; auto (default): local up to 6h of range, else "
                          "server")
    src.add_argument("--server-chunk", metavar="DURATION", default="6h",
                     help="--engine server: the range one query covers (default 6h; at most 11000 evaluations)")
    rules = p.add_argument_group("rules")
    rules.add_argument("--rules", metavar="FILE", help="a Prometheus rule file or PrometheusRule manifest "
                                                       "(default: the pack rendered from --slo)")
    rules.add_argument("--slo", metavar="FILE", help="SLO file to render the pack from (default: the built-in SLO)")
    when = p.add_argument_group("time")
    when.add_argument("--start", metavar="TIME", help="first evaluation (RFC 3339 or unix seconds); default: the "
                                                      "file's first sample, or 7 days before --end")
    when.add_argument("--end", metavar="TIME", help="last evaluation; default: the file's last sample, or now")
    when.add_argument("--step", metavar="DURATION", help="evaluation interval (e.g. 30s); default: the rule group's "
                                                         "interval, a promtool file's evaluation_interval, or 30s")
    when.add_argument("--onset", metavar="TIME", help="when the trouble started (RFC 3339, unix seconds, or +DURATION "
                                                      "after --start): report each alert's first firing after it")
    out = p.add_argument_group("output")
    out.add_argument("--json", metavar="FILE", help="write the report as JSON to FILE ('-': stdout, instead of the table)")
    out.add_argument("--png", metavar="FILE", help="draw the postmortem timeline (needs matplotlib)")
    out.add_argument("--plot", metavar="EXPR", action="append", default=[],
                     help="a PromQL signal for the timeline (repeatable); default: KV-cache usage and TTFT p95")
    gate = p.add_argument_group("CI gate (exit 1 when violated)")
    gate.add_argument("--max-episodes-per-day", metavar="N", type=float,
                      help="fail when an alert (all its label sets) fired more episodes per day than N")
    gate.add_argument("--quiet-alerts", metavar="NAME,...", default="",
                      help="fail when any of these alerts fired at all")
    adv = p.add_argument_group("semantics")
    adv.add_argument("--lookback", metavar="DURATION", default="5m", help="lookback delta (default 5m, as Prometheus)")
    adv.add_argument("--prometheus3-ranges", action="store_true",
                     help="range selectors and the lookback exclude their left end, as in Prometheus 3 "
                          "(default: Prometheus 2.x, both ends included)")
    return p


def main(argv: Sequence[str], env: Mapping[str, str], now: Callable[[], float] = time.time) -> int:
    ns = _parser().parse_args(list(argv))
    if importlib.util.find_spec("numpy") is None:
        return fail(SUB, "the backtest needs numpy: pip install 'vllm-sidecar-exporter[analysis]'")
    from ..analysis import backtest as bt
    from ..analysis import report
    from ..analysis.summary import gate
    from ..slo import load_slo

    if bool(ns.file) == bool(ns.prometheus_url):
        return fail(SUB, "give exactly one source: --file or --prometheus-url")
    if ns.rules and ns.slo:
        return fail(SUB, "--rules and --slo exclude each other (--slo renders the pack)")
    if ns.max_episodes_per_day is not None and ns.max_episodes_per_day < 0:
        return fail(SUB, "--max-episodes-per-day must not be negative")
    try:
        start = parse_time(ns.start, "--start") if ns.start else None
        end = parse_time(ns.end, "--end") if ns.end else None
        step = duration_ms(ns.step, "--step") if ns.step else None
        lookback = duration_ms(ns.lookback, "--lookback")
        onset_rel = None
        onset = None
        if ns.onset:
            if ns.onset.startswith("+"):
                onset_rel = duration_ms(ns.onset[1:], "--onset")
            else:
                onset = parse_time(ns.onset, "--onset")
        server_chunk = duration_ms(ns.server_chunk, "--server-chunk")
        slo = None if ns.rules else load_slo(ns.slo)
    except (ValueError, ConfigError) as exc:
        return fail(SUB, str(exc))
    quiet = [q.strip() for q in ns.quiet_alerts.split(",") if q.strip()]
    plots: List[str] = list(ns.plot)
    if ns.png and not plots:
        plots = bt.default_plots(slo)
    opts = bt.Options(rules_path=ns.rules, slo=slo, file=ns.file, test_name=ns.test_name,
                      prometheus_url=ns.prometheus_url, start_ms=start, end_ms=end, step_ms=step, onset_ms=onset,
                      onset_after_start_ms=onset_rel, lookback_ms=lookback, left_open=ns.prometheus3_ranges,
                      plots=plots, engine=ns.engine, server_chunk_ms=server_chunk)
    t0 = time.perf_counter()
    try:
        result = bt.run_backtest(opts, now_ms=lambda: int(now() * 1000))
    except bt.BacktestError as exc:
        return fail(SUB, str(exc))
    unknown = [q for q in quiet if q not in result.summary.rule_alertnames]
    if unknown:
        return fail(SUB, f"--quiet-alerts: no alert named {unknown[0]!r} in the rules")
    violations = gate(result.summary, ns.max_episodes_per_day, quiet)
    took = time.perf_counter() - t0
    if ns.png:
        try:
            from ..analysis import timeline

            panels = bt.plot_panels(result, plots, lookback, ns.prometheus3_ranges)
            timeline.render(ns.png, result.run.times, panels, bt.lanes(result), result.summary.onset_ms,
                            title=f"backtest of {result.rules_source} on {result.source}")
        except ImportError:
            return fail(SUB, "--png needs matplotlib: pip install 'vllm-sidecar-exporter[analysis]'")
        except bt.BacktestError as exc:
            return fail(SUB, str(exc))
        except OSError as exc:
            return fail(SUB, f"--png {ns.png}: {exc.strerror}")
    if ns.json:
        text = report.to_json(result.summary, violations)
        if ns.json == "-":
            sys.stdout.write(text)
        else:
            try:
                with open(ns.json, "w", encoding="utf-8") as fh:
                    fh.write(text)
            except OSError as exc:
                return fail(SUB, f"--json {ns.json}: {exc.strerror}")
    if ns.json != "-":
        sys.stdout.write(report.table(result.summary, violations))
    rules_n = sum(len(g.rules) for g in result.groups)
    if result.engine == "server":
        st = result.server_stats
        sys.stderr.write(f"{PROG} {SUB}: {len(result.run.times)} evaluations of {rules_n} rules, evaluated by the "
                         f"server in {st.queries} queries ({st.points} points back) in {took:.1f}s\n")
    else:
        sys.stderr.write(f"{PROG} {SUB}: {len(result.run.times)} evaluations of {rules_n} rules over "
                         f"{result.raw_series} series in {took:.1f}s\n")
    for v in violations:
        sys.stderr.write(f"{PROG} {SUB}: gate: {v.reason}\n")
    return 1 if violations else 0
