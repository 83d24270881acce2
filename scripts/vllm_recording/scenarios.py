"""What each recording plays: the served model, the target labels Prometheus gives, vLLM's flags,
and the scenarios (phases of open- and closed-loop load, what to expect, the recording's notes)."""

from __future__ import annotations

from typing import List, Optional

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


def flag_value(flags: List[str], flag: str) -> Optional[str]:
    return flags[flags.index(flag) + 1] if flag in flags else None
