"""``capacity``: the capacity model filled from history (a Prometheus server or a recorded file):
peak request rate, token distributions, cache and speculative-decoding ratios, what one replica
sustains within the SLO in weighted tokens/s (output + a fitted weight x prompt tokens, per load
mix, with the load-latency curve), replicas needed for a target, the trend of the peaks, and what
it all costs at the SLO file's prices (the month against the budget, per token and per request, a
spot share). Where replicas have the role prefill or decode (their sidecars say so), the two sides
are sized apart for the target: instances and GPUs per side, their cost (OpenCost's prices where
the Prometheus has them), and first of all whether the GPU budget (``--gpus``) carries it at all;
``--plan`` does that from the SLO file's planned figures without history. Flags and output files
live here; the work is ``exporter.analysis.capacity``, ``capacity_sides`` and ``capacity_cost``.

Exit status: 0 done; 1 with ``--fail-when-short`` when a model's replicas are not enough for the
target, or prefill and decode together need more GPUs than the budget; 2 bad flags or input, one
line on stderr.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from typing import Callable, Mapping, Sequence

from ..errors import ConfigError
from .parsing import PROG, OneLineParser, duration_ms, fail, parse_time

SUB = "capacity"


def _parser() -> OneLineParser:
    p = OneLineParser(prog=f"{PROG} {SUB}",
                      description="Fill the capacity model from history: peak request rate, token distributions, "
                                  "prefix-cache and speculative-decoding ratios, the throughput one replica sustains "
                                  "within the SLO's latency objectives (weighted tokens/s: output plus a fitted weight "
                                  "times prompt tokens, per load mix), replicas needed for a target, the trend of the "
                                  "daily peaks, and the cost at the SLO file's prices (month against the budget, per "
                                  "million output tokens and per thousand requests, a spot share).")
    src = p.add_argument_group("history (one of)")
    src.add_argument("--prometheus-url", metavar="URL", help="read vLLM's raw series from this Prometheus")
    src.add_argument("--file", metavar="FILE", help="recorded series: OpenMetrics with timestamps ending in '# EOF' "
                                                     "(gzip allowed), or a promtool unit-test file")
    src.add_argument("--engine", choices=("auto", "server", "local"), default="auto",
                     help="with --prometheus-url: server has the server evaluate every recording rule over raw "
                          "series (query_range in --server-chunk pieces) and the whole-range figures (instant "
                          "queries), the rest runs here on the recorded series it answers (this process holds "
                          "recorded series, not samples); local reads the raw series and evaluates here; auto "
                          "(default): local up to 6h of range, else server")
    src.add_argument("--plan", action="store_true",
                     help="read no history: size prefill and decode from the SLO file's planned capacity.* figures "
                          "and the flags alone (needs --target-qps, --prompt-tokens and --output-tokens)")
    src.add_argument("--server-chunk", metavar="DURATION", default="6h",
                     help="--engine server: the range one query covers (default 6h; at most 11000 evaluations)")
    when = p.add_argument_group("range")
    when.add_argument("--start", metavar="TIME", help="RFC 3339 or unix seconds; default: capacity.history (SLO) "
                                                      "before --end")
    when.add_argument("--end", metavar="TIME", help="default: now (a file: its last sample)")
    when.add_argument("--step", metavar="DURATION", default="1m",
                      help="evaluation step of the recording rules (default 1m)")
    model = p.add_argument_group("model")
    model.add_argument("--slo", metavar="FILE", help="the SLO file (objectives, rate window, capacity settings); "
                                                     "default: the built-in one")
    model.add_argument("--model", metavar="NAME", help="only this model_name (default: every model)")
    model.add_argument("--target-qps", metavar="QPS", type=float,
                       help="the request rate to plan for (default: the observed peak plus --headroom)")
    model.add_argument("--prompt-tokens", metavar="N", type=float,
                       help="prompt tokens per request for the target (default: the mean over the range)")
    model.add_argument("--output-tokens", metavar="N", type=float,
                       help="output tokens per request for the target (default: the mean over the range)")
    model.add_argument("--gpus", metavar="N", type=int,
                       help="the GPU budget prefill and decode must fit in together (default: SLO capacity.gpus; "
                            "0: none)")
    model.add_argument("--prefill-gpus-per-instance", metavar="N", type=int,
                       help="GPUs in one prefill instance (default: SLO capacity.prefill_gpus_per_instance)")
    model.add_argument("--decode-gpus-per-instance", metavar="N", type=int,
                       help="GPUs in one decode instance (default: SLO capacity.decode_gpus_per_instance)")
    model.add_argument("--headroom", metavar="SHARE", type=float,
                       help="headroom over the peak when no --target-qps is given (default: SLO capacity.headroom)")
    model.add_argument("--trend-period", metavar="DURATION", default="1d",
                       help="the period whose peaks the trend is fitted to (default 1d: daily peaks, UTC days)")
    model.add_argument("--confidence", metavar="LEVEL", type=float, default=0.95,
                       help="confidence level of the trend's intervals (default 0.95)")
    out = p.add_argument_group("output")
    out.add_argument("--markdown", metavar="FILE", help="write the Markdown report to FILE too")
    out.add_argument("--json", metavar="FILE", help="write the report as JSON to FILE ('-': stdout, instead of Markdown)")
    out.add_argument("--png", metavar="FILE", help="draw the load-latency curve with the objectives (needs matplotlib)")
    out.add_argument("--fail-when-short", action="store_true",
                     help="exit 1 when the replicas serving now are not enough for the target, or prefill and "
                          "decode together need more GPUs than the budget")
    return p


def _write(path: str, text: str, flag: str) -> None:
    if path == "-":
        sys.stdout.write(text)
        return
    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as exc:
        raise ValueError(f"{flag} {path}: {exc.strerror}") from None


def _output(ns, report, rep) -> int:
    """Write the report where the flags say; the per-side verdict on stderr when the GPU budget cannot
    carry the target (exit 1 with --fail-when-short), 2 when a file cannot be written."""
    from ..analysis.capacity_sides import verdict

    try:
        if ns.png:
            try:
                rep.render_png(report, ns.png)
            except ImportError:
                return fail(SUB, "--png needs matplotlib: pip install 'vllm-sidecar-exporter[analysis]'")
            except OSError as exc:
                return fail(SUB, f"--png {ns.png}: {exc.strerror}")
        md = rep.markdown(report)
        if ns.markdown:
            _write(ns.markdown, md, "--markdown")
        if ns.json:
            _write(ns.json, rep.to_json(report), "--json")
    except ValueError as exc:
        return fail(SUB, str(exc))
    if ns.json != "-" and ns.markdown != "-":
        sys.stdout.write(md)
    impossible = [(t, sp) for t, sp in [("", report.plan)] + [(rep.model_title(m) + ": ", m.sides)
                                                               for m in report.models] if sp is not None and sp.fits is False]
    for title, sp in impossible:
        sys.stderr.write(f"{PROG} {SUB}: {title}{verdict(sp)}\n")
    return 1 if ns.fail_when_short and impossible else 0


def main(argv: Sequence[str], env: Mapping[str, str], now: Callable[[], float] = time.time) -> int:
    ns = _parser().parse_args(list(argv))
    if importlib.util.find_spec("numpy") is None:
        return fail(SUB, "the capacity model needs numpy: pip install 'vllm-sidecar-exporter[analysis]'")
    from ..analysis import capacity as cap
    from ..analysis import capacity_report as rep
    from ..analysis.backtest import AUTO_LOCAL_MAX_MS
    from ..analysis.capacity_sides import Asked
    from ..analysis.series import Store
    from ..analysis.sources import SourceError, fetch_prometheus, load_file
    from ..slo import load_slo, seconds

    if ns.plan and (ns.file or ns.prometheus_url):
        return fail(SUB, "--plan reads no history: give it without --prometheus-url and --file")
    if not ns.plan and bool(ns.file) == bool(ns.prometheus_url):
        return fail(SUB, "give exactly one source: --prometheus-url or --file (or --plan, no history)")
    if ns.plan and ns.png:
        return fail(SUB, "--png draws the load-latency curve of the history: --plan reads none")
    if ns.plan and None in (ns.target_qps, ns.prompt_tokens, ns.output_tokens):
        return fail(SUB, "--plan needs --target-qps, --prompt-tokens and --output-tokens")
    for flag, v, lo in (("--target-qps", ns.target_qps, 0), ("--prompt-tokens", ns.prompt_tokens, 0),
                        ("--output-tokens", ns.output_tokens, 0), ("--gpus", ns.gpus, -1),
                        ("--prefill-gpus-per-instance", ns.prefill_gpus_per_instance, 0),
                        ("--decode-gpus-per-instance", ns.decode_gpus_per_instance, 0)):
        if v is not None and not v > lo:
            return fail(SUB, f"{flag} must be {'positive' if lo == 0 else 'at least 0'}")
    if ns.headroom is not None and not ns.headroom >= 0:
        return fail(SUB, "--headroom must not be negative")
    if not 0 < ns.confidence < 1:
        return fail(SUB, "--confidence must be between 0 and 1")
    try:
        slo = load_slo(ns.slo)
        step = duration_ms(ns.step, "--step")
        server_chunk = duration_ms(ns.server_chunk, "--server-chunk")
        period = duration_ms(ns.trend_period, "--trend-period")
        start = parse_time(ns.start, "--start") if ns.start else None
        end = parse_time(ns.end, "--end") if ns.end else None
    except (ValueError, ConfigError) as exc:
        return fail(SUB, str(exc))
    asked = Asked(ns.target_qps, ns.prompt_tokens, ns.output_tokens, None if ns.gpus == 0 else ns.gpus,
                  ns.prefill_gpus_per_instance, ns.decode_gpus_per_instance, ns.headroom)
    if ns.gpus == 0:
        slo = {**slo, "capacity": {**slo["capacity"], "gpus": 0}}
    if ns.plan:
        t = int(now() * 1000)
        return _output(ns, cap.plan_only(cap.Options(slo, t, t, step, asked=asked)), rep)
    history_ms = int(seconds(slo["capacity"]["history"]) * 1000)
    loaded = None
    if ns.file:
        try:
            loaded = load_file(ns.file)
        except SourceError as exc:
            return fail(SUB, str(exc))
        first, last = loaded.store.time_range()
        if first is None:
            return fail(SUB, f"{ns.file}: no samples")
        end = end if end is not None else last
        start = start if start is not None else max(first, end - history_ms)
    else:
        end = end if end is not None else int(now() * 1000)
        start = start if start is not None else end - history_ms
    if end <= start:
        return fail(SUB, "--end must be after --start")
    opts = cap.Options(slo, start, end, step, ns.target_qps, ns.headroom, period, ns.confidence, ns.model,
                       asked=asked)
    engine = "local" if ns.file else ns.engine
    if engine == "auto":
        engine = "local" if end - start <= AUTO_LOCAL_MAX_MS else "server"
    server = None
    t0 = time.perf_counter()
    if engine == "server":
        server = cap.server_for(opts, ns.prometheus_url, server_chunk)
        store = Store()
    elif loaded is None:
        sels, recorded = cap.selectors(opts)
        try:
            loaded = fetch_prometheus(ns.prometheus_url, sels, end, drop_names=recorded)
        except SourceError as exc:
            return fail(SUB, str(exc))
    if server is None:
        store = loaded.store
        raw_series = len(store)
    try:
        report = cap.compute(store, opts, server)
    except (cap.CapacityError, SourceError) as exc:
        return fail(SUB, str(exc))
    rc = _output(ns, report, rep)
    if rc == 2:
        return rc
    if server is not None:
        st = server.stats
        sys.stderr.write(f"{PROG} {SUB}: {len(report.models)} model(s), {(end - start) // step + 1} steps, evaluated "
                         f"by the server in {st.queries} queries ({st.points} points back, {len(store)} recorded "
                         f"series here) in {time.perf_counter() - t0:.1f}s\n")
    else:
        sys.stderr.write(f"{PROG} {SUB}: {len(report.models)} model(s), {(end - start) // step + 1} steps over "
                         f"{raw_series} series in {time.perf_counter() - t0:.1f}s\n")
    short = [m for m in report.models if m.target is not None and m.target.enough is False]
    if ns.fail_when_short and short:
        for m in short:
            sys.stderr.write(f"{PROG} {SUB}: {rep.model_title(m)}: {rep.verdict_text(m)}\n")
        return 1
    return rc
