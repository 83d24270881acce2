"""The loop after launch: the backtest, the capacity model and the regression gate; reads
history (and benchmark results), never a live pod.

``promql`` evaluates PromQL over a whole time range at once with Prometheus 2.42's semantics;
``series`` holds the samples it reads; ``sources`` loads them (a promtool unit-test file, an
OpenMetrics file, a Prometheus server); ``rulefile`` reads rule groups; ``rules`` runs them
(recording rules in order, alerts through their ``for``/``keep_firing_for`` state machine);
``summary`` turns alert states into episodes; ``report`` and ``timeline`` write them;
``backtest`` ties it together for the command line. ``capacity`` fills the capacity model from
history with the pack's capacity rules (``stats``: Student's t, least squares, Fieller's
interval) and ``capacity_report`` writes it; ``benchfile`` reads ``vllm bench serve`` results,
``gate`` compares candidate and baseline runs (or Prometheus ranges) with the sidecar's signals,
``gate_report`` writes the verdict.
"""
