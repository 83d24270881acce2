"""``record_vllm.py lora``: pages of vLLM serving two tiny LoRA adapters beside the base model,
before, during and after a load that keeps both adapters busy."""

from __future__ import annotations

import http.client
import json
import random
import subprocess
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import List

from . import ROOT
from .load import Prompts, Result
from .processes import http_json, log, start_vllm, tiny_model, vllm_python
from .scenarios import MODEL, PRESSURE_FLAGS

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
