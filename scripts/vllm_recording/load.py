"""The load generator: token-id prompts of an exact length, one request sent and timed (``Result``),
open-loop Poisson streams and closed-loop clients played phase by phase (``LoadGen``), and the
requests' log read back from ``requests.csv.gz``."""

from __future__ import annotations

import csv
import gzip
import http.client
import json
import random
import threading
import time
import urllib.parse
from pathlib import Path
from typing import List, Tuple

from .processes import http_json
from .scenarios import MODEL

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
