"""vllm-sidecar-exporter: a Prometheus sidecar that turns vLLM's raw metrics and the pod's GPUs
into the signals an on-call engineer needs."""

__version__ = "0.1.0"
