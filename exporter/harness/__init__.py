"""The simulation harness: a simulated vLLM (a real vLLM page with simulated values), simulated
GPUs shaped like the real NVML library, a local page server, real Prometheus and Alertmanager
processes on free ports, and the demo that puts them together with the real sidecar.

It may import the runtime and the pack (the demo runs both); neither of them imports it.
"""
