"""PromQL as Prometheus 2.42 parses and evaluates it, vectorized over a grid of evaluation times.

``lexer`` and ``parser`` turn text into the ``ast`` (``durations`` reads ``5m``); ``engine``
evaluates an expression at every step of a grid at once, an instant vector being a ``vector.Vec``
(a block of series by steps, absent samples masked); ``labels`` holds label-set operations;
``functions``, ``windows``, ``aggregate``, ``binops`` and ``quantile`` hold the operators, each a
transcription of the matching Go code so that results agree with Prometheus to the bit.
"""
