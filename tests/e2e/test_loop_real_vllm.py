"""The loop after launch on the real CPU vLLM: ``capacity`` read against a load ramp whose right
answer is measured, and ``gate`` failing a configuration that really costs latency while passing
the same configuration run again.

One setup serves both tests (a module fixture), about five minutes on 2 shared cores:

- two vLLM servers start together (an idle vLLM costs about 1 % of a core): **A**, the
  end-to-end test's configuration (``--max-num-seqs 16``), and **B**, the same but
  ``--max-num-seqs 1``; each with the real sidecar beside it, a real Prometheus scraping all
  four every second; B carries another namespace label, as a second deployment would;
- the ramp: closed-loop clients against A, 2, then 8, then 24 at a time, 30 s each. Beyond 16
  requests at once A queues, so TTFT p95 jumps at the last step (seen here: 50-85 ms at 8,
  0.25-0.5 s at 24) while tokens/s still grow. The test measures each step with Prometheus itself (tokens/s and
  TTFT p95 over the step's last 18 s), puts the TTFT objective at the geometric middle of the
  largest jump, and the right answer is the throughput of the step below the jump;
- the benchmark: ``vllm bench serve`` (60 random 256-token prompts, 64 output tokens, Poisson at
  10 req/s, seed 1) eight times, alternating: A, A, B, A, A, B, A, B. B (one request at a time)
  serves 4 to 6 req/s here depending on what else runs, so at 10 req/s it always queues: request
  throughput drops by a third or more and TTFT grows several times. Identical runs of A differed
  here by up to 9 % in throughput but 4x in median TTFT (other
  engineers' jobs share the 2 cores), so the same-configuration check gates on what this machine
  can measure reliably: the throughputs and the failed share, at the default 10 % threshold with
  alternated runs (three baseline, two of the same configuration, three candidate). With every
  figure gated the costly candidate fails as well.

Everything started here is stopped (vLLM by its process group) also when a test fails.
"""

import json
import math
import os
import signal
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from realvllm import MODEL, Load, tiny_model, vllm_python

from exporter.harness.localstack import Process, SidecarThread, Stack, free_port, wait_until
from shared import run_main

pytestmark = [pytest.mark.vllm, pytest.mark.prometheus, pytest.mark.perf]

ROOT = Path(__file__).resolve().parents[2]
STEP_S = 30                  # each ramp step
INTERIOR_S = 18              # measured over the last 18 s of a step (rate window and sustain settle first)
RAMP = (2, 8, 24)            # clients at once
SIDECAR_SLO = "windows: {rate: 10s, sidecar: 10s, sustain: 10s}\n"
BENCH = ["--backend", "vllm", "--model", MODEL, "--dataset-name", "random", "--random-input-len", "256",
         "--random-output-len", "64", "--num-prompts", "60", "--request-rate", "10", "--seed", "1", "--ignore-eos",
         "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,95,99", "--save-result"]
PAUSE_S = 6  # seconds between benchmark runs
ORDER = ("A1", "A2", "B1", "A3", "A4", "B2", "A5", "B3")  # A1 A3 A5 baseline, A2 A4 the same again, B1-3 candidate
ENV = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false"}


class Server:
    """A vLLM API server in its own session; stopped by killing its process group."""

    def __init__(self, py, model, workdir, name, max_num_seqs):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.vocab = json.loads((model / "vocab-size.json").read_text())["vocab_size"]
        self.proc = Process(name, [py, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
                                   "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(self.port),
                                   "--max-model-len", "8192", "--dtype", "bfloat16", "--enforce-eager",
                                   "--enable-prefix-caching", "--num-gpu-blocks-override", "300", "--block-size", "32",
                                   "--max-num-seqs", str(max_num_seqs)], workdir, ENV)

    def healthy(self) -> bool:
        if self.proc.proc.poll() is not None:
            raise AssertionError(f"vLLM exited:\n{self.proc.tail(60)}")
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    # what realvllm's Load calls
    def complete(self, prompt_len, max_tokens):
        import random

        ids = [random.randrange(3, self.vocab) for _ in range(prompt_len)]
        body = json.dumps({"model": MODEL, "prompt": ids, "max_tokens": max_tokens, "ignore_eos": True}).encode()
        req = urllib.request.Request(self.url + "/v1/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=300) as r:
            r.read()

    def stop(self):
        p = self.proc.proc
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(20)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(10)
        try:  # children (EngineCore) left in the group after the server itself exited
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.log.close()


class BenchRunner:
    """tests/e2e/bench_runner.py in the vLLM environment: imports vLLM once, runs on request."""

    def __init__(self, py, workdir):
        self.log = open(workdir / "bench.log", "w")
        self.proc = subprocess.Popen([py, str(ROOT / "tests" / "e2e" / "bench_runner.py")], cwd=workdir,
                                     env={**os.environ, **ENV}, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, text=True, start_new_session=True)
        self.lines = []
        self.cond = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            with self.cond:
                self.lines.append(line.rstrip("\n"))
                self.cond.notify_all()

    def _wait(self, prefix, timeout):
        end = time.monotonic() + timeout
        with self.cond:
            while True:
                hit = [ln for ln in self.lines if ln.startswith(prefix)]
                if hit:
                    self.lines = [ln for ln in self.lines if not ln.startswith(prefix)]
                    return hit[0]
                left = end - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise AssertionError(f"bench runner: no {prefix!r} ({self.tail()})")
                self.cond.wait(min(left, 1))

    def tail(self):
        self.log.flush()
        return "\n".join(Path(self.log.name).read_text(errors="replace").splitlines()[-30:])

    def ready(self, timeout=600):
        self._wait("@@ready", timeout)

    def run(self, args, timeout=300):
        self.proc.stdin.write(json.dumps(args) + "\n")
        self.proc.stdin.flush()
        done = self._wait("@@done", timeout)
        errors = [ln for ln in self.lines if ln.startswith("@@error")]
        assert done == "@@done 0", f"vllm bench serve failed: {errors} {self.tail()}"

    def stop(self):
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.log.close()


def _query(stack, promql, at):
    got = stack.query(promql, at=at)
    return float(got[0]["value"][1]) if got else float("nan")


@pytest.fixture(scope="module")
def loop(tmp_path_factory):
    """Everything both tests read: Prometheus (kept up), the ramp's steps, the benchmark files."""
    if not __import__("shutil").which("prometheus"):
        pytest.fail("prometheus is not installed (make test installs it)")
    work = tmp_path_factory.mktemp("loop")
    py = vllm_python()
    model = tiny_model(py)
    slo = work / "sidecar-slo.yaml"
    slo.write_text(SIDECAR_SLO)
    stack = Stack(work)
    servers, sidecars, loads = [], [], []
    runner = None
    out = {"work": work, "stack": stack, "model": model}
    try:
        a = Server(py, model, work, "vllm-a", 16)
        b = Server(py, model, work, "vllm-b", 1)
        servers += [a, b]
        runner = BenchRunner(py, work)
        for s in servers:
            wait_until(s.healthy, 400, every=1, what=f"{s.proc.name} /health", diag=lambda s=s: s.proc.tail(40))
        for s in servers:
            # 1.4 s per read (the default is 80 % of the poll): a CPU vLLM busy on two shared cores
            # can take over a second to answer /metrics, and a read that times out is a sample lost
            sidecars.append(SidecarThread({"vllm_url": s.url, "poll_interval": 1.5, "vllm_timeout": 1.4, "gpu": "none",
                                           "slo": str(slo)}))
        la = {"namespace": "e2e", "pod": "vllm-a"}
        lb = {"namespace": "e2e-candidate", "pod": "vllm-b"}
        stack.start_prometheus([{"job": "vllm-a", "address": f"127.0.0.1:{a.port}", "labels": la},
                                {"job": "sidecar-a", "address": sidecars[0].address, "labels": la},
                                {"job": "vllm-b", "address": f"127.0.0.1:{b.port}", "labels": lb},
                                {"job": "sidecar-b", "address": sidecars[1].address, "labels": lb}], [])
        wait_until(stack.targets_up, 60, what="targets up", diag=stack.diag)
        runner.ready()
        first = [Load(s).add(2, 100, 16) for s in servers]  # first requests warm up: measured nowhere
        loads += first
        time.sleep(4)
        for ld in first:
            ld.stop()

        # the ramp on A
        warm = Load(a).add(1, 150, 64)
        loads.append(warm)
        time.sleep(5)
        warm.stop()
        steps = []
        ramp_start = time.time()
        for clients in RAMP:
            t0 = time.time()
            ld = Load(a).add(clients, 150, 64)
            loads.append(ld)
            time.sleep(STEP_S)
            t1 = time.time()
            ld.stop()
            steps.append((clients, t0, t1))
        ramp_end = time.time()
        time.sleep(3)  # the last scrapes
        measured = []
        for clients, t0, t1 in steps:
            sel = 'namespace="e2e", pod="vllm-a"'
            tok = _query(stack, f"increase(vllm:generation_tokens_total{{{sel}}}[{INTERIOR_S}s]) / {INTERIOR_S}", t1)
            p95 = _query(stack, f"histogram_quantile(0.95, sum by (le) (increase("
                                f"vllm:time_to_first_token_seconds_bucket{{{sel}}}[{INTERIOR_S}s])))", t1)
            measured.append({"clients": clients, "start": t0, "end": t1, "tokens_per_second": tok, "ttft_p95": p95})
        out.update(ramp_start=ramp_start, ramp_end=ramp_end, steps=measured)

        # the benchmark, alternating A and B
        files = {}
        for i, name in enumerate(ORDER):
            server = a if name.startswith("A") else b
            if i:
                # every run from the same rest: in one run on two cores, the two A runs that followed
                # another A run at once measured a third slower (6.4 req/s against 9.7 for A1, A3 and
                # A5), and the gate rightly called the same configuration a regression
                time.sleep(PAUSE_S)
            runner.run(BENCH + ["--base-url", server.url, "--tokenizer", str(model), "--label", name,
                                "--result-dir", str(work), "--result-filename", f"{name}.json"])
            files[name] = work / f"{name}.json"
        out["files"] = files
        time.sleep(3)
    except BaseException:
        for ld in loads:
            ld.stop_event.set()
        if runner is not None:
            runner.stop()
        for sc in sidecars:
            sc.close()
        for s in servers:
            s.stop()
        stack.close()
        raise
    # the servers go; Prometheus stays for the commands under test
    for ld in loads:
        ld.stop_event.set()
    runner.stop()
    for sc in sidecars:
        sc.close()
    for s in servers:
        s.stop()
    try:
        yield out
    finally:
        stack.close()


def _note(loop, key, value):
    """What the run measured, kept in results.json beside the run's files (for reports)."""
    f = loop["work"] / "results.json"
    doc = json.loads(f.read_text()) if f.exists() else {}
    doc[key] = value
    f.write_text(json.dumps(doc, indent=1))


_cli = run_main


def test_capacity_reads_the_ramp(loop, capsys):
    steps = loop["steps"]
    table = "\n".join(f"{s['clients']:>3} clients: {s['tokens_per_second']:.0f} tokens/s, TTFT p95 "
                      f"{s['ttft_p95']:.3f} s" for s in steps)
    jumps = [(steps[i + 1]["ttft_p95"] / steps[i]["ttft_p95"], i) for i in range(len(steps) - 1)]
    ratio, k = max(jumps)
    assert ratio >= 2.5, f"no clear knee in the ramp (TTFT p95 jumps at most {ratio:.1f}x):\n{table}"
    objective = math.sqrt(steps[k]["ttft_p95"] * steps[k + 1]["ttft_p95"])
    right, above = steps[k]["tokens_per_second"], steps[k + 1]["tokens_per_second"]
    # the objective at the knee; the other two out of the way (mean TTFT 1000 s, ITL 1000 s)
    slo = loop["work"] / "capacity-slo.yaml"
    slo.write_text(SIDECAR_SLO + 'selector: \'namespace="e2e"\'\n'
                   f"objectives: {{ttft_p95_seconds: {objective:.4f}, ttft_mean_seconds: 1000, "
                   f"output_tokens_per_second: 0.001}}\n"
                   "capacity: {sustain: 10s, history: 1d, peak_window: 1d}\n")
    rc, out, err = _cli(capsys, "capacity", "--prometheus-url", loop["stack"].prom_url, "--slo", str(slo),
                        "--start", f"{loop['ramp_start']:.3f}", "--end", f"{loop['ramp_end']:.3f}", "--step", "1s",
                        "--json", "-", "--png", str(loop["work"] / "capacity.png"))
    assert rc == 0, err
    doc = json.loads(out)
    assert [m["labels"] for m in doc["models"]] == [{"namespace": "e2e", "model_name": MODEL}], doc["notes"]
    m = doc["models"][0]
    got = m["sustainable"]["tokens_per_second"]
    info = f"sustainable {got} tokens/s; objective TTFT p95 {objective:.3f} s; ramp:\n{table}"
    _note(loop, "capacity", {"steps": steps, "objective_ttft_p95": objective, "sustainable": m["sustainable"],
                             "right": right, "above": above, "curve": m["curve"]})
    assert got is not None, info
    # the step below the knee, not the one above it
    # (at least half of it: on two shared cores the 8-client step itself misses the objective now
    # and then, and the level held through a whole sustain window is lower; seen: 0.63 of it)
    if above > right:
        assert 0.5 * right <= got and abs(got - right) < abs(got - above), info
    else:
        # past the knee the two shared cores made fewer tokens than below it (seen in CI: 1,219
        # against 1,494), so "nearer the step below" cannot tell the two apart; the figure must
        # still be the step below's level, never above it
        assert 0.5 * right <= got <= 1.1 * right, info
    assert m["sustainable"]["bound"] == "observed", info  # the objective was missed above it
    assert m["replicas_now"] == 1
    # the curve it was read from: where the load is that of the step above the knee, TTFT is over it
    top = [b for b in m["curve"] if b["tokens_per_second"] >= 0.9 * above and b["ttft_p95"] is not None]
    assert top and max(b["ttft_p95"] for b in top) > objective, (m["curve"], info)
    assert m["peak_tokens_per_second"]["value"] >= 0.7 * above, info
    assert (loop["work"] / "capacity.png").stat().st_size > 10_000


def test_gate_fails_the_costly_candidate_and_passes_the_same_configuration(loop, capsys):
    f = {k: str(v) for k, v in loop["files"].items()}
    prom = loop["stack"].prom_url
    sides = ["--baseline-selector", 'namespace="e2e"', "--candidate-selector", 'namespace="e2e-candidate"']
    # 1. every figure, the default rule, the sidecar's signals from Prometheus over the files' time ranges
    base, cand = [f["A1"], f["A3"], f["A5"]], [f["B1"], f["B2"], f["B3"]]
    rc, out, err = _cli(capsys, "gate", "--baseline", *base, "--candidate", *cand,
                        "--prometheus-url", prom, *sides, "--json", "-",
                        "--markdown", str(loop["work"] / "gate.md"))
    doc = json.loads(out)
    figures = {r["key"]: r for r in doc["figures"]}
    info = json.dumps({k: (r["baseline_median"], r["candidate_median"], r["verdict"]) for k, r in figures.items()})
    _note(loop, "gate_costly", {"rc": rc, "figures": figures, "signals": doc["signals"],
                                "likely_cause": doc["likely_cause"]})
    assert rc == 1 and doc["verdict"] == "fail", info
    for key in ("request_throughput", "output_throughput", "mean_ttft_ms", "mean_e2el_ms"):
        assert figures[key]["verdict"] == "regressed", (key, info)
    assert figures["mean_ttft_ms"]["candidate_median"] > 2 * figures["mean_ttft_ms"]["baseline_median"], info
    sig = doc["signals"]
    assert sig["candidate"]["running_max"] == 1, sig  # --max-num-seqs 1
    assert sig["candidate"]["waiting_mean"] > sig["baseline"]["waiting_mean"], sig
    # The batch sizes are samples of a gauge, read only when the sidecar's read of vLLM succeeds.
    # On two cores shared with the benchmark, reads during the 7-second runs can time out while
    # the ones between runs succeed (seen in CI: baseline unreadable 29 % of its runs, largest
    # batch seen 1); the gate then cannot see a smaller batch, and says what it saw instead.
    if sig["baseline"]["down_share"] <= 0.1:
        assert sig["baseline"]["running_max"] > 1, sig
        assert "smaller batch" in doc["likely_cause"], doc["likely_cause"]
    else:
        assert doc["likely_cause"], doc
    assert "**FAIL**" in (loop["work"] / "gate.md").read_text()
    assert "request throughput regressed" in err

    # 2. the figures this shared machine measures reliably: the same configuration passes ...
    robust = ["--figures", "*_throughput,failed_ratio"]
    rc, out, err = _cli(capsys, "gate", "--baseline", *base, "--candidate", f["A2"], f["A4"], *robust)
    _note(loop, "gate_same", {"rc": rc, "table": out})
    assert rc == 0, out + err
    assert out.startswith("gate: PASS")
    # ... and the same settings fail the costly candidate
    rc, out, err = _cli(capsys, "gate", "--baseline", *base, "--candidate", *cand, *robust)
    assert rc == 1 and "request throughput" in err, out + err

    # 3. the same comparison from Prometheus alone: the runs' time ranges
    def rng(name):
        d = json.loads(Path(f[name]).read_text())
        end = time.mktime(time.strptime(d["date"], "%Y%m%d-%H%M%S"))
        return f"{end - d['duration']:.3f}/{end:.3f}"

    rc, out, err = _cli(capsys, "gate", "--prometheus-url", prom, *sides, "--json", "-",
                        *[x for n in ("A1", "A3", "A5") for x in ("--baseline-range", rng(n))],
                        *[x for n in ("B1", "B2", "B3") for x in ("--candidate-range", rng(n))])
    doc = json.loads(out)
    figures = {r["key"]: r for r in doc["figures"]}
    _note(loop, "gate_ranges", {"rc": rc, "figures": {k: (r["baseline_median"], r["candidate_median"], r["verdict"])
                                                       for k, r in figures.items()}})
    assert rc == 1, out + err
    assert figures["mean_ttft_ms"]["verdict"] == "regressed" and figures["request_throughput"]["verdict"] == \
        "regressed", json.dumps(figures)[:3000]
