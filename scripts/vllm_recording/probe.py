"""``record_vllm.py probe``: chat traffic (or a phase given as JSON) against a vLLM, and what the
server sustained, TTFT quantiles included (used to choose the scenarios' rates on a machine)."""

from __future__ import annotations

import json
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from .facts import client_stats
from .load import LoadGen, Prompts
from .processes import start_vllm, tiny_model, vllm_python
from .promdata import hist_quantile
from .scenarios import CHAT, PRESSURE_FLAGS


def probe(args) -> None:
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="probe-"))
    groups = []
    try:
        url = args.url
        if not url:
            py = vllm_python()
            g, url, _ = start_vllm(py, tiny_model(py), PRESSURE_FLAGS, workdir)
            groups.append(g)
        prompts = Prompts(url)
        gen = LoadGen(url, prompts, args.seed)
        spec = dict(CHAT, rate=args.rate, output=[int(x) for x in args.output.split("-")])
        phase = {"name": "probe", "duration": args.duration, "open": [spec]}
        if args.long_rate:
            phase["open"].append({"cls": "long", "rate": args.long_rate, "prompt": [int(x) for x in args.long_prompt.split("-")],
                                  "output": [20, 100], "stream_share": 0.0, "system_prefix": 0})
        if args.long_workers:
            phase["closed"] = [{"cls": "long", "workers": args.long_workers,
                                "prompt": [int(x) for x in args.long_prompt.split("-")],
                                "output": [20, 100], "think": 1.0, "stream_share": 0.0, "system_prefix": 0}]
        if args.phase:
            phase = dict(json.loads(args.phase), name="probe", duration=args.duration)
        samples = []
        stop = threading.Event()

        def watch():
            while not stop.wait(2):
                try:
                    text = urllib.request.urlopen(url + "/metrics", timeout=2).read().decode()
                except OSError:
                    continue
                vals = {}
                for line in text.splitlines():
                    for key in ("vllm:num_requests_waiting{", "vllm:num_requests_running{", "vllm:kv_cache_usage_perc{",
                                "vllm:num_preemptions_total{"):
                        if line.startswith(key):
                            vals[key[5:-1]] = float(line.rsplit(" ", 1)[1])
                    if line.startswith("vllm:num_requests_waiting_by_reason{") and 'reason="capacity"' in line:
                        vals["capacity"] = float(line.rsplit(" ", 1)[1])
                samples.append(vals)
        threading.Thread(target=watch, daemon=True).start()
        def ttft_buckets():
            text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
            out = {}
            for line in text.splitlines():
                if line.startswith("vllm:time_to_first_token_seconds_bucket{"):
                    le = float(line.split('le="')[1].split('"')[0])
                    out[le] = out.get(le, 0.0) + float(line.rsplit(" ", 1)[1])
            return out
        b0 = ttft_buckets()
        t0 = time.time()
        gen.play_phase(phase, t0)
        stop.set()
        b1 = ttft_buckets()
        delta = [(le, b1[le] - b0.get(le, 0.0)) for le in b1]
        print("server TTFT p50", hist_quantile(0.5, delta), "p95", hist_quantile(0.95, delta), "p99", hist_quantile(0.99, delta))
        st = client_stats(gen.results, [{"name": "probe", "start": t0, "end": time.time()}])
        print(json.dumps(st, indent=1))
        for k in ("num_requests_waiting", "num_requests_running", "kv_cache_usage_perc", "capacity", "num_preemptions_total"):
            xs = [s[k] for s in samples if k in s]
            print(k, "mean", round(sum(xs) / max(1, len(xs)), 3), "max", max(xs, default=None))
        print("in flight at end", gen.in_flight())
        gen.stop_all.set()
    finally:
        for g in groups:
            g.stop()
