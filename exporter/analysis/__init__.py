"""The loop after launch: backtest now, capacity model and regression gate later; reads history,
never a live pod.

``promql`` evaluates PromQL over a whole time range at once with Prometheus 2.42's semantics;
``series`` holds the samples it reads; ``sources`` loads them (a promtool unit-test file, an
OpenMetrics file, a Prometheus server); ``rulefile`` reads rule groups; ``rules`` runs them
(recording rules in order, alerts through their ``for``/``keep_firing_for`` state machine);
``summary`` turns alert states into episodes; ``report`` and ``timeline`` write them;
``backtest`` ties it together for the command line.
"""
