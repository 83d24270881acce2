"""``gate``: the regression gate for CI. Compares candidate runs with baseline runs (``vllm bench
serve --save-result`` files, or time ranges of one Prometheus) figure by figure and fails when
one regressed by more than the threshold beyond the run-to-run noise; with ``--prometheus-url``
the sidecar's signals during the runs are summarised beside the figures, with the likely cause.
Over a Prometheus, ``--engine server`` has the server evaluate each figure and signal (instant
queries), ``--engine local`` reads the raw series and evaluates here; the result files are read
here either way (no server computes those).
The work, including which engine reads the ranges and the store it reads them into, is
``exporter.analysis.gate``; here are the flags, the output files and the exit status.

Exit status: 0 no regression; 1 a regression (one line per regressed figure on stderr); 2 bad
flags or input, one line on stderr.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from typing import Callable, List, Mapping, Optional, Sequence, Tuple

from ..errors import ConfigError
from .parsing import PROG, OneLineParser, fail, parse_time

SUB = "gate"


def _parser() -> OneLineParser:
    p = OneLineParser(prog=f"{PROG} {SUB}",
                      description="Compare a candidate with a baseline (vllm bench serve --save-result files, or two "
                                  "time ranges of one Prometheus) and exit 1 when a figure regressed by more than "
                                  "the threshold, beyond the run-to-run spread.")
    runs = p.add_argument_group("runs (files, or Prometheus ranges)")
    runs.add_argument("--baseline", metavar="FILE", nargs="+", action="extend", default=[],
                      help="baseline result file(s) of `vllm bench serve --save-result` (several: repeat runs)")
    runs.add_argument("--candidate", metavar="FILE", nargs="+", action="extend", default=[],
                      help="candidate result file(s), the same load as the baseline")
    runs.add_argument("--prometheus-url", metavar="URL",
                      help="the Prometheus that scraped vLLM and the sidecar: the sidecar's signals during each run "
                           "(the files' time ranges, or the ranges below); with ranges only, the figures too")
    runs.add_argument("--engine", choices=("auto", "server", "local"), default="auto",
                      help="with --prometheus-url: server has the server evaluate each figure and each max and mean "
                           "signal over a range (instant queries: one number back each; only the share signals' own "
                           "series are read raw), local reads the raw series (every histogram bucket of every "
                           "replica) and evaluates here; auto (default): local when every range is at most 6h, "
                           "else server. The result files of --baseline and --candidate are read here either way: "
                           "no server computes those")
    runs.add_argument("--baseline-range", metavar="START/END", action="append", default=[],
                      help="a baseline time range (RFC 3339 or unix seconds, START/END); repeatable")
    runs.add_argument("--candidate-range", metavar="START/END", action="append", default=[],
                      help="a candidate time range; repeatable")
    runs.add_argument("--selector", metavar="MATCHERS",
                      help="label matchers narrowing the Prometheus series to the deployment under test, e.g. "
                           "'namespace=\"bench\", model_name=\"llama\"' (default: the SLO file's selector)")
    runs.add_argument("--baseline-selector", metavar="MATCHERS",
                      help="more matchers for the baseline's series only (a canary against the stable pods, two "
                           "deployments side by side)")
    runs.add_argument("--candidate-selector", metavar="MATCHERS", help="more matchers for the candidate's series only")
    runs.add_argument("--bench-utc-offset", metavar="HOURS", type=float,
                      help="the time zone of the result files' `date` (default: this machine's)")
    rule = p.add_argument_group("the rule")
    rule.add_argument("--slo", metavar="FILE", help="the SLO file whose gate section gives the defaults below")
    rule.add_argument("--threshold", metavar="SHARE", type=float,
                      help="a figure worse by more than this share regresses (default: SLO gate.max_regression)")
    rule.add_argument("--min-effect-ms", metavar="MS", type=float,
                      help="latency differences smaller than this never regress (default: SLO gate.min_effect_ms)")
    rule.add_argument("--confidence", metavar="LEVEL", type=float, default=0.95,
                      help="with repeat runs, a difference must clear the run-to-run spread at this confidence "
                           "(one-sided t test; default 0.95)")
    rule.add_argument("--figures", metavar="PATTERNS", default="",
                      help="comma-separated figure names or shell patterns that gate, e.g. "
                           "'*_throughput,mean_*,p99_*' (default: every figure); the others are shown only")
    rule.add_argument("--allow-different-load", action="store_true",
                      help="compare runs whose benchmark load differs (rate, prompts, concurrency)")
    out = p.add_argument_group("output")
    out.add_argument("--markdown", metavar="FILE", help="write the result as Markdown (a pull-request comment)")
    out.add_argument("--json", metavar="FILE", help="write the result as JSON ('-': stdout, instead of the table)")
    return p


def _range(text: str, flag: str) -> Tuple[int, int]:
    if "/" not in text:
        raise ValueError(f"{flag}: {text!r} is not START/END")
    a, b = text.split("/", 1)
    start, end = parse_time(a, flag), parse_time(b, flag)
    if end <= start:
        raise ValueError(f"{flag}: {text!r} ends before it starts")
    return start, end


def _write(path: str, text: str, flag: str) -> Optional[str]:
    if path == "-":
        sys.stdout.write(text)
        return None
    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as exc:
        return f"{flag} {path}: {exc.strerror}"
    return None


def main(argv: Sequence[str], env: Mapping[str, str], now: Callable[[], float] = time.time) -> int:
    ns = _parser().parse_args(list(argv))
    if importlib.util.find_spec("numpy") is None:
        return fail(SUB, "the gate needs numpy: pip install 'vllm-sidecar-exporter[analysis]'")
    from ..analysis import gate
    from ..analysis import gate_report as rep
    from ..analysis.backtest import AUTO_LOCAL_MAX_MS
    from ..analysis.promql.lexer import PromQLSyntaxError
    from ..analysis.promql.parser import parse
    from ..analysis.report import fmt_time
    from ..analysis.sources import SourceError
    from ..slo import load_slo

    files = bool(ns.baseline or ns.candidate)
    ranges = bool(ns.baseline_range or ns.candidate_range)
    if files and not (ns.baseline and ns.candidate):
        return fail(SUB, "give both --baseline and --candidate files")
    if ranges and not (ns.baseline_range and ns.candidate_range):
        return fail(SUB, "give both --baseline-range and --candidate-range")
    if not files and not ranges:
        return fail(SUB, "nothing to compare: give --baseline and --candidate files, or --baseline-range and "
                         "--candidate-range with --prometheus-url")
    if ranges and not ns.prometheus_url:
        return fail(SUB, "--baseline-range and --candidate-range need --prometheus-url")
    try:
        slo = load_slo(ns.slo)
        b_ranges = [_range(t, "--baseline-range") for t in ns.baseline_range]
        c_ranges = [_range(t, "--candidate-range") for t in ns.candidate_range]
    except (ValueError, ConfigError) as exc:
        return fail(SUB, str(exc))
    threshold = slo["gate"]["max_regression"] if ns.threshold is None else ns.threshold
    min_effect = slo["gate"]["min_effect_ms"] if ns.min_effect_ms is None else ns.min_effect_ms
    if not threshold > 0:
        return fail(SUB, "--threshold must be positive")
    if not min_effect >= 0:
        return fail(SUB, "--min-effect-ms must not be negative")
    if not 0.5 <= ns.confidence < 1:
        return fail(SUB, "--confidence must be at least 0.5 and below 1")
    selector = (slo["selector"] if ns.selector is None else ns.selector).strip().strip(",")
    sides = {}
    for side, extra, flag in (("baseline", ns.baseline_selector, "--baseline-selector"),
                              ("candidate", ns.candidate_selector, "--candidate-selector")):
        sel = ", ".join(x for x in (selector, (extra or "").strip().strip(",")) if x)
        if sel:
            try:
                parse("x{" + sel + "}")
            except PromQLSyntaxError as exc:
                return fail(SUB, f"{flag if extra else '--selector'} {sel!r}: {exc}")
        sides[side] = sel
    patterns = [x.strip() for x in ns.figures.split(",") if x.strip()]
    offset = None if ns.bench_utc_offset is None else int(round(ns.bench_utc_offset * 3600))
    notes: List[str] = []
    baseline, candidate = [], []
    if files:
        try:
            baseline, candidate, notes = gate.load_runs(ns.baseline, ns.candidate, offset, ns.allow_different_load)
        except gate.GateInputError as exc:
            return fail(SUB, str(exc))
    reader = None
    if ns.prometheus_url:
        if not b_ranges:
            b_ranges = [(r.start_ms, r.end_ms) for r in baseline if r.start_ms is not None]
            c_ranges = [(r.start_ms, r.end_ms) for r in candidate if r.start_ms is not None]
            missing = [r.source for r in baseline + candidate if r.start_ms is None]
            if missing:
                notes.append(f"no date and duration in {', '.join(missing)}: its signals are left out")
        wanted = [(sides["baseline"], a, b) for a, b in b_ranges] + [(sides["candidate"], a, b) for a, b in c_ranges]
        try:
            reader = gate.open_ranges(ns.prometheus_url, ns.engine, wanted, AUTO_LOCAL_MAX_MS)
            if not files:
                baseline = [reader.run(sides["baseline"], a, b, f"{fmt_time(a)}/{fmt_time(b)}") for a, b in b_ranges]
                candidate = [reader.run(sides["candidate"], a, b, f"{fmt_time(a)}/{fmt_time(b)}")
                             for a, b in c_ranges]
        except (ValueError, SourceError) as exc:
            return fail(SUB, str(exc))
        if not files:
            empty = [r.source for r in baseline + candidate if not r.figures]
            if empty:
                return fail(SUB, f"{ns.prometheus_url}: no vLLM requests in {empty[0]}")
    try:
        comparison = gate.compare(baseline, candidate, gate.Settings(threshold, min_effect, patterns, ns.confidence))
    except ValueError as exc:
        return fail(SUB, f"--figures: {exc}" if patterns else str(exc))
    bad = gate.unmatched_patterns(comparison.rows, patterns)
    if bad:
        return fail(SUB, f"--figures: no figure matches {bad[0]!r}")
    result = rep.GateResult(comparison, baseline, candidate, "files" if files else "prometheus", notes=notes)
    if reader is not None and b_ranges and c_ranges:
        try:
            sb = gate.median_signals([reader.signals(sides["baseline"], a, b) for a, b in b_ranges])
            sc = gate.median_signals([reader.signals(sides["candidate"], a, b) for a, b in c_ranges])
        except SourceError as exc:
            return fail(SUB, str(exc))
        result.signals_baseline, result.signals_candidate = sb, sc
        if not result.passed:
            result.likely_cause = gate.likely_cause(sb, sc, slo["kv_cache"]["warn"])
    if isinstance(reader, gate.ServerRanges):
        result.notes.append(f"figures and signals evaluated by the server at {ns.prometheus_url} in "
                            f"{reader.queries} queries (--engine server)")
    for path, text, flag in ((ns.markdown, rep.markdown, "--markdown"), (ns.json, rep.to_json, "--json")):
        if path:
            err = _write(path, text(result), flag)
            if err:
                return fail(SUB, err)
    if ns.json != "-" and ns.markdown != "-":
        sys.stdout.write(rep.text(result))
    if not result.passed:
        for r in comparison.regressed:
            sys.stderr.write(f"{PROG} {SUB}: {r.spec.label} regressed {rep.fmt_change(r)} "
                             f"({rep.fmt_value(r.baseline_median, r.spec.unit)} -> "
                             f"{rep.fmt_value(r.candidate_median, r.spec.unit)})\n")
        return 1
    return 0
