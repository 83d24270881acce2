"""The sidecar: what runs next to each vLLM pod.

Data flows one way, one module a step:

    fetch, nvml, dcgm       sources: vLLM's page over HTTP, the GPUs through NVML or dcgm-exporter
    parser                  exposition text -> samples
    inputs                  samples -> the logical inputs (every name vLLM has used), a Snapshot
    windows                 snapshots over the sliding window, counter and histogram arithmetic
    signals                 pure derivations, clock passed in -> typed results
    state                   the immutable Published state the poll loop swaps in
    collectors              Published -> metric families, one collector per source
    server, webconfig       /metrics, /healthz, /readyz; TLS and basic auth from --web.config.file
    sidecar, app            the poll loop; wiring it all together

It imports nothing from ``exporter.pack``, ``exporter.harness`` or ``exporter.cli`` (a test
checks), only ``exporter.slo`` and ``exporter.errors`` below it.
"""
