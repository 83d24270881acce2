"""The backtest, end to end: rules and history in, what the rules would have done out.

``plan`` resolves the options against the rules and the clock (which selectors to read, how far
back, the evaluation grid); ``run_backtest`` loads the history (a file or a Prometheus server),
evaluates the rules at every step and summarizes the alerts; ``plot_panels`` evaluates the
timeline's signals over the same steps. Nothing here prints or exits: the command line does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .promql.ast import Expr, MatrixSelector, SubqueryExpr, VectorSelector
from .promql.engine import DEFAULT_LOOKBACK_MS, Evaluator
from .promql.labels import MatcherSet
from .promql.lexer import PromQLSyntaxError
from .promql.parser import parse
from .promql.vector import EvalError, Vec
from .rulefile import Group, RuleFileError, evaluation_step, groups_from_data, load_rule_file
from .rulemanager import Run
from .rulemanager import run as run_rules
from .series import Store
from .sources import Loaded, SourceError, fetch_prometheus, load_file
from .summary import Summary, summarize

DEFAULT_STEP_MS = 30_000
# ``--engine auto``: ranges up to this are read raw and evaluated here (fast: a few queries); longer
# ones are evaluated by the server (this process then holds alerts, not samples)
AUTO_LOCAL_MAX_MS = 6 * 3600_000


class BacktestError(ValueError):
    """Options or input that make a backtest impossible; one line."""


@dataclass
class Options:
    rules_path: Optional[str] = None          # a rule file or PrometheusRule; else the pack from the SLO
    slo: Optional[dict] = None                # the loaded SLO (for the pack and the default plots)
    file: Optional[str] = None
    test_name: Optional[str] = None
    prometheus_url: Optional[str] = None
    start_ms: Optional[int] = None
    end_ms: Optional[int] = None
    step_ms: Optional[int] = None
    onset_ms: Optional[int] = None
    onset_after_start_ms: Optional[int] = None  # the onset as a delay after the first evaluation
    lookback_ms: int = DEFAULT_LOOKBACK_MS
    left_open: bool = False                   # Prometheus 3 range semantics
    fetch_chunk_ms: int = 2 * 3600_000
    block_steps: int = 2880
    plots: Sequence[str] = ()
    # against a server: "server" evaluates the alerts there (exporter.analysis.remote), "local"
    # reads the raw series and evaluates here, "auto" is local up to AUTO_LOCAL_MAX_MS of range
    engine: str = "auto"
    server_chunk_ms: int = 6 * 3600_000


@dataclass
class Result:
    groups: List[Group]
    loaded: Loaded
    run: Run
    summary: Summary
    source: str
    rules_source: str
    raw_series: int = 0
    fetched: List[Tuple[str, int]] = field(default_factory=list)
    engine: str = "local"                     # where the rules were evaluated: local or server
    server_url: Optional[str] = None
    server_stats: Optional[object] = None


def load_groups(opts: Options) -> Tuple[List[Group], str]:
    if opts.rules_path:
        return load_rule_file(opts.rules_path), opts.rules_path
    from ..pack.rules import render_groups

    if opts.slo is None:
        raise BacktestError("no rules: give --rules, or an SLO to render the pack from")
    from ..pack.longreads import exact

    groups = groups_from_data(render_groups(exact(opts.slo)), "<the pack rendered from the SLO>")
    return groups, "the pack (rendered from the SLO)"


def parse_plots(exprs: Sequence[str]) -> List[Expr]:
    out = []
    for text in exprs:
        try:
            e = parse(text)
        except PromQLSyntaxError as exc:
            raise BacktestError(f"--plot {text!r}: {exc}") from None
        if e.type not in ("vector", "scalar"):
            raise BacktestError(f"--plot {text!r}: a {e.type}; plot an instant vector or a scalar")
        out.append(e)
    return out


def reach(expr: Expr, lookback_ms: int) -> Dict[str, int]:
    """For each selector of ``expr``: how far before an evaluation it reads (ms)."""
    out: Dict[str, int] = {}

    def visit(e: Expr, extra: int) -> None:
        if isinstance(e, VectorSelector):
            need = extra + max(e.offset_ms, 0) + lookback_ms
            out[e.selector_text()] = max(out.get(e.selector_text(), 0), need)
            return
        if isinstance(e, MatrixSelector):
            vs = e.selector
            need = extra + max(vs.offset_ms, 0) + e.range_ms
            out[vs.selector_text()] = max(out.get(vs.selector_text(), 0), need)
            return
        if isinstance(e, SubqueryExpr):
            visit(e.expr, extra + max(e.offset_ms, 0) + e.range_ms)
            return
        for child in _children(e):
            visit(child, extra)

    visit(expr, 0)
    return out


def _children(e: Expr):
    for name in ("expr", "lhs", "rhs", "param"):
        c = getattr(e, name, None)
        if c is not None:
            yield c
    for a in getattr(e, "args", ()):
        yield a


def raw_selectors(groups: List[Group], extra: Sequence[Expr], lookback_ms: int) -> Tuple[Dict[str, int], List[str]]:
    """Selectors the rules (and plots) read that are not (only) recording-rule outputs, with how
    far back each reads; and the recorded names."""
    recorded = sorted({r.name for g in groups for r in g.rules if r.kind == "record"})
    need: Dict[str, int] = {}
    exprs = [r.expr for g in groups for r in g.rules] + list(extra)
    for e in exprs:
        for sel, ms in reach(e, lookback_ms).items():
            need[sel] = max(need.get(sel, 0), ms)
    out: Dict[str, int] = {}
    for sel, ms in need.items():
        node = parse(sel)
        assert isinstance(node, VectorSelector)
        name = MatcherSet(node.matchers).name_equal()
        if name is not None and name in recorded:
            continue
        out[sel] = ms
    return out, recorded


def grid(start_ms: int, end_ms: int, step_ms: int) -> np.ndarray:
    if end_ms < start_ms:
        raise BacktestError("the end is before the start")
    n = (end_ms - start_ms) // step_ms + 1
    if n > 5_000_000:
        raise BacktestError(f"{n} evaluations: too many; use a longer --step or a shorter range")
    return start_ms + step_ms * np.arange(n, dtype=np.int64)


def _step(opts: Options, groups: List[Group], hint: Optional[int]) -> int:
    if opts.step_ms:
        return opts.step_ms
    return evaluation_step(groups, hint or DEFAULT_STEP_MS)


def run_backtest(opts: Options, now_ms: Callable[[], int],
                 progress: Optional[Callable[[int, int], None]] = None, session=None) -> Result:
    if bool(opts.file) == bool(opts.prometheus_url):
        raise BacktestError("give exactly one source: --file or --prometheus-url")
    try:
        groups, rules_source = load_groups(opts)
    except RuleFileError as exc:
        raise BacktestError(str(exc)) from None
    plots = parse_plots(opts.plots)
    fetched: List[Tuple[str, int]] = []
    if opts.file:
        try:
            loaded = load_file(opts.file, opts.test_name)
        except SourceError as exc:
            raise BacktestError(str(exc)) from None
        step = _step(opts, groups, loaded.interval_ms)
        first, last = loaded.store.time_range()
        if first is None:
            raise BacktestError(f"{opts.file}: no samples")
        start = opts.start_ms if opts.start_ms is not None else -(-first // step) * step
        end = opts.end_ms if opts.end_ms is not None else last
        if end < start and opts.start_ms is None and opts.end_ms is None:  # no step of the grid falls in it
            raise BacktestError(f"{opts.file}: the record spans {(last - first) / 1000:g}s, and the rules are "
                                f"evaluated every {step / 1000:g}s on the step's grid: a record must span at least "
                                f"{step / 1000:g}s (or give a --step no longer than the record)")
    else:
        step = _step(opts, groups, None)
        end = opts.end_ms if opts.end_ms is not None else now_ms()
        start = opts.start_ms if opts.start_ms is not None else end - 7 * 86_400_000
        engine = opts.engine
        if engine == "auto":
            engine = "local" if end - start <= AUTO_LOCAL_MAX_MS else "server"
        if engine == "server":
            from .promapi import ServerError
            from .remote import ServerStats, Unsupported, run_on_server

            start = -(-start // step) * step  # subqueries step on multiples of the step: so must the grid
            times = grid(start, end, step)
            stats = ServerStats()
            try:
                run = run_on_server(groups, opts.prometheus_url, times, step, opts.server_chunk_ms, session=session,
                                    stats=stats)
            except Unsupported as exc:
                if opts.engine == "server":
                    raise BacktestError(str(exc)) from None
                engine = "local"
            except ServerError as exc:
                raise BacktestError(str(exc)) from None
            else:
                onset = opts.onset_ms
                if onset is None and opts.onset_after_start_ms is not None:
                    onset = int(times[0]) + opts.onset_after_start_ms
                loaded = Loaded(Store(), None, f"{opts.prometheus_url} (evaluated by the server)")
                return Result(groups, loaded, run, summarize(run, onset), loaded.description, rules_source,
                              engine="server", server_url=opts.prometheus_url, server_stats=stats)
        selectors, recorded = raw_selectors(groups, plots, opts.lookback_ms)
        fetched = [(sel, start - ms) for sel, ms in sorted(selectors.items())]
        try:
            loaded = fetch_prometheus(opts.prometheus_url, fetched, end, opts.fetch_chunk_ms, session=session,
                                      drop_names=recorded)
        except SourceError as exc:
            raise BacktestError(str(exc)) from None
    times = grid(start, end, step)
    raw_series = len(loaded.store)
    try:
        run = run_rules(groups, loaded.store, times, step, opts.lookback_ms, opts.left_open, opts.block_steps,
                        progress)
    except ValueError as exc:
        raise BacktestError(str(exc)) from None
    onset = opts.onset_ms
    if onset is None and opts.onset_after_start_ms is not None:
        onset = int(times[0]) + opts.onset_after_start_ms
    summary = summarize(run, onset)
    return Result(groups, loaded, run, summary, loaded.description, rules_source, raw_series, fetched)


def default_plots(slo: Optional[dict]) -> List[str]:
    """KV-cache usage and TTFT p95 per replica, as the pack records them."""
    from ..pack.names import Names
    from ..slo import load_slo

    names = Names(slo or load_slo(None))
    return [names.replica("vllm_kv_cache_usage", "max"),
            names.replica("vllm_time_to_first_token_seconds", "histogram_quantile") + '{quantile="0.95"}']


def plot_panels(result: Result, exprs: Sequence[str], lookback_ms: int = DEFAULT_LOOKBACK_MS,
                left_open: bool = False) -> list:
    """Each plot expression evaluated at every step of the backtest (rules' records included)."""
    from .timeline import Panel

    times = result.run.times
    out = []
    if result.engine == "server":
        from .promapi import ServerError
        from .remote import Unsupported, plot_on_server

        try:
            got = plot_on_server(result.groups, parse_plots(exprs), result.server_url, times, result.run.interval_ms)
        except (ServerError, Unsupported) as exc:
            raise BacktestError(f"--plot: {exc}") from None
        return [Panel(text, labels, vals) for text, (labels, vals) in zip(exprs, got)]
    for text, node in zip(exprs, parse_plots(exprs)):
        ev = Evaluator(result.run.store, times, result.run.interval_ms, lookback_ms, left_open)
        try:
            res = ev.eval(node)
        except EvalError as exc:
            raise BacktestError(f"--plot {text!r}: {exc}") from None
        if isinstance(res, Vec):
            out.append(Panel(text, res.labels, np.where(res.P, res.V, np.nan)))
        else:
            out.append(Panel(text, [()], np.asarray(res)[None, :]))
    return out


def lanes(result: Result) -> list:
    from .timeline import Lane

    out = []
    for tr in result.run.alerts:
        if not (tr.states.firing.any() or tr.states.pending.any()):
            continue
        own = {k for k, _ in tr.rule.labels}
        ident = " ".join(f"{k}={v}" for k, v in tr.labels if k not in own and k != "alertname"
                         and k not in ("namespace", "model_name"))
        out.append(Lane(f"{tr.alertname} {ident}".strip(), tr.alertname, tr.states.firing, tr.states.pending))
    return out

