"""What the alerting pack costs a real Prometheus: series the recording rules add per pod and per
model, the rule group's evaluation time, and the same Prometheus without rules and with the
user's naive rules as baselines, all in one run.

    python bench/bench_pack.py [--pods 100] [--scrape 15,5] [--warmup 330] [--measure 300]
                               [--rules rules/vllm.rules.yml] [--variant NAME=RULEFILE ...]
                               [--json FILE] [--keep DIR] [--write docs/performance.md]

The fleet (one process of its own): ``--pods`` simulated vLLM servers (``SimVllm``: a real vLLM
0.32.0 page with simulated values), each on its own port, and beside each its sidecar's page on a
second port: a real ``Sidecar`` polling that pod's page in-process (with simulated GPUs through
the stand-in NVML) and its exposition built by the real collectors, as the sidecar's listener
encodes it (text or OpenMetrics, as asked; gzip when asked). Pods are spread over two
namespaces and three models; a tenth of them idle, a tenth busy (their queue builds), one in KV
trouble (``kv-thrashing``), one in a long-prompt storm, two answering a share of requests with
HTTP 5xx. The simulators advance and the sidecars poll every ``--tick`` seconds (5 s; the
sidecar's default is 2 s: that changes values, not series).

Prometheus (the installed one, 2.42 here) runs once per instance, all at the same time, scraping
the same fleet every ``--scrape`` seconds (``namespace`` and ``pod`` as static target labels, as
a PodMonitor gives them, and on vLLM's targets the SLO's ``sidecar_target_label`` that
deploy/kubernetes writes for a pod with the sidecar), rules evaluated every 30 s (prometheus-operator's default
``evaluationInterval``):

- ``none``: no rule file (the baseline for series and ingestion);
- ``naive``: the user's four naive alerts (exporter/harness/data/naive.rules.yml);
- ``pack``: the pack (``--rules``);
- one instance per ``--variant NAME=FILE`` (e.g. the pack before a change, in the same run).

The pack reads windows up to 14 days (capacity), 3 days (burn rates) and 1 day (baselines). A run
lasts minutes, so before an instance starts, every series its rules read over a window longer
than the warm-up is backfilled (``promtool tsdb create-blocks-from openmetrics``) up to the
moment it starts: recorded series at the evaluation interval, raw ones (vLLM's and the
sidecar's, with the exact labels the live targets have) at the scrape interval, so every window
is full from the first evaluation (every read longer than the warm-up is backfilled, so a
warm-up of five and a half minutes fills the 5-minute rate windows live and the rest from the
backfill); then ``--measure`` seconds are measured.

Measured, from Prometheus itself: ``/api/v1/rules`` every 5 s (each group's and each rule's
``evaluationTime`` at every distinct ``lastEvaluation``), its ``/metrics`` at the start and end
of the measurement (``prometheus_tsdb_head_series``, samples appended, rule group iterations
and missed iterations, ``prometheus_rule_evaluation_duration_seconds``, evaluation failures,
process CPU and memory), the output series of each recording rule (``count``), and for each
rule the samples its expression reads (an instant query with ``stats=all``: Prometheus'
``totalQueryableSamples``, a count that does not depend on how busy the machine is). Times do;
the report gives the load average beside them.

Then, with the fleet and every Prometheus stopped, the low-noise figures (``--quiet-repeat``
times, 10 by default; ``bench/bench_rule_cost.py``): each rule file's expressions asked of one
quiet Prometheus over the data its instance stored, beside the naive rules over the same data,
and the series each rule's selectors select (what a rule's time follows).

Every process started here is stopped by its process group at the end, also on failure or
Ctrl-C. Not a test: nothing asserts. The fleet is in ``bench/pack_fleet.py``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import phases  # noqa: E402
from bench.pack_fleet import MODELS, Pod, PodSpec, fleet_specs, run_fleet  # noqa: E402,F401 (re-exported)
from bench.pack_report import SECTION, SECTION_INTRO, report  # noqa: E402
from exporter.harness.localstack import free_port  # noqa: E402
from exporter.slo import load_slo  # noqa: E402

NAIVE = ROOT / "exporter/harness/data/naive.rules.yml"
SIDECAR_LABEL = (load_slo(None).get("sidecar_target_label") or "")
PACK = ROOT / "rules/vllm.rules.yml"
EVAL_INTERVAL = 30.0
# -- processes ------------------------------------------------------------------------------------

class Proc:
    """A child in a session of its own, stopped by its process group."""

    def __init__(self, name: str, args: List[str], log: Path, stdin=None, stdout=None) -> None:
        self.name = name
        self.log = open(log, "w")
        self.p = subprocess.Popen(args, stdout=stdout or self.log, stderr=self.log, stdin=stdin,
                                  start_new_session=True, cwd=ROOT)

    def stop(self) -> None:
        if self.p.poll() is None:
            for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
                try:
                    os.killpg(self.p.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.p.wait(wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
        self.log.close()


def get(url: str, timeout: float = 30.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def api(base: str, path: str, **params) -> dict:
    q = ("?" + urllib.parse.urlencode(params)) if params else ""
    data = json.loads(get(base + path + q))
    if data.get("status") != "success":
        raise RuntimeError(f"{path}: {data}")
    return data["data"]


def prom_metrics(base: str) -> Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for fam in text_string_to_metric_families(get(base + "/metrics").decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def pick(metrics, name: str, **labels) -> float:
    """The sum of ``name``'s samples whose labels include ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in metrics.items() if n == name and want <= set(ls))


# -- what the rules read --------------------------------------------------------------------------

def group_intervals(paths: Sequence[Path]) -> Dict[str, float]:
    """Each rule group's evaluation interval in seconds (the global one where it sets none)."""
    from exporter.slo import seconds

    return {g["name"]: seconds(g["interval"]) if g.get("interval") else EVAL_INTERVAL
            for p in paths for g in (yaml.safe_load(Path(p).read_text()) or {}).get("groups", [])}


def time_stats(times: Sequence[float]) -> Dict[str, float]:
    times = sorted(times)
    return {"median": statistics.median(times), "mean": statistics.mean(times),
            "p90": times[int(0.9 * (len(times) - 1))], "max": times[-1], "min": times[0]}


def load_rules(path: Path) -> List[dict]:
    doc = yaml.safe_load(path.read_text()) or {}
    return [dict(r, _group=g["name"]) for g in doc.get("groups", []) for r in g.get("rules", [])]


def rule_id(rule: dict, rules: Sequence[dict]) -> str:
    """The rule's name, with the labels that tell it from others of the same name."""
    name = rule.get("record") or rule.get("alert")
    same = [r for r in rules if (r.get("record") or r.get("alert")) == name]
    if len(same) == 1:
        return name
    labels = rule.get("labels") or {}
    keys = [k for k in sorted(labels) if len({(r.get("labels") or {}).get(k) for r in same}) > 1]
    return name + "{" + ",".join(f'{k}="{labels[k]}"' for k in keys) + "}"


def long_reads(rules: Sequence[dict], longer_than_s: float) -> Dict[str, float]:
    """Metric name -> the furthest back (range + offset, seconds) any rule reads it, for the range
    selectors that reach further back than ``longer_than_s``."""
    from exporter.analysis.promql.ast import MatrixSelector, SubqueryExpr, VectorSelector, walk
    from exporter.analysis.promql.parser import parse

    out: Dict[str, float] = {}
    for r in rules:
        for node in walk(parse(r["expr"])):
            if isinstance(node, MatrixSelector):
                reads = [(node.selector.name, (node.range_ms + max(0, node.selector.offset_ms)) / 1000)]
            elif isinstance(node, SubqueryExpr):
                # a subquery over instant selectors (the pack's reads over days, at an hourly step):
                # each selector back as far as the subquery reaches, plus Prometheus' 5-minute lookback
                if any(isinstance(n, MatrixSelector) for n in walk(node.expr)):
                    raise ValueError(f"{rule_id(r, rules)}: a subquery over range reads is not backfilled")
                reads = [(n.name, (node.range_ms + max(0, node.offset_ms) + max(0, n.offset_ms)) / 1000 + 300)
                         for n in walk(node.expr) if isinstance(n, VectorSelector)]
            else:
                continue
            for name, back in reads:
                if name and back > longer_than_s:
                    out[name] = max(out.get(name, 0.0), back)
    return out


def _series_value(name: str, key: str, t: float) -> float:
    """A plausible value of a backfilled series at ``t``: a daily cycle with noise, per series
    (the values only shape the chunks' compression; the cost is in the samples)."""
    h = (hash(key) % 1000) / 1000
    day = 0.5 + 0.5 * math.sin(2 * math.pi * (t / 86400 + h))
    noise = random.random()
    if "held_back" in name or "waiting" in name or name.endswith(":bool"):
        # a healthy past: nothing held back by the cache, nobody waiting (the fleet's trouble is
        # its live pods': a made-up past of held-back requests kept the KV alert on every pod)
        return 0.0
    if name.startswith("namespace_pod_model:vllm_requests_running") or name == "vllm:num_requests_running":
        return float(round(32 * day * (0.4 + 0.6 * h) + 2 * noise))
    if "availability_errors" in name:
        return 0.002 * (1 + day) * noise
    if "availability_requests" in name or "requests_finished" in name:
        return 60 * (1 + day) + noise
    if "prefix_cache_hit" in name:
        return 0.3 + 0.1 * noise
    if "long_prompt" in name:
        return 0.01 * noise
    if "generation_tokens" in name:
        return 600 * (0.5 + day) + 20 * noise
    if name.endswith("_info"):
        return 1.0
    return day + noise


def backfill_text(reads: Dict[str, float], series: Dict[str, list], recorded: Sequence[str], end: float,
                  scrape_s: float, eval_s: float) -> Tuple[str, int]:
    """OpenMetrics text (``promtool tsdb create-blocks-from openmetrics``) with every series of
    ``series`` (name -> [(labels, value or None)]) whose name is in ``reads``, back as far as it is
    read plus ten minutes, ending at ``end``. Names in ``recorded`` (the rules' own outputs) at the
    evaluation interval, with made-up values (value None: a daily cycle); the others (scraped) at
    the scrape interval, holding their value (a counter neither increases nor resets in its past).
    Returns the text and the number of samples."""
    lines, n = [], 0
    for name, back in sorted(reads.items()):
        sets = series.get(name, [])
        if not sets:
            continue
        step = eval_s if name in recorded else scrape_s
        start = end - back - 600
        lines.append(f"# TYPE {name} gauge")
        for labels, value in sets:
            lab = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
            key = name + lab
            t = start
            while t < end:
                v = _series_value(name, key, t) if value is None else value
                lines.append(f"{name}{{{lab}}} {v:.6g} {t:.3f}")
                t += step
                n += 1
    lines.append("# EOF")
    return "\n".join(lines) + "\n", n


def live_series(pods: Sequence[dict], names: Sequence[str]) -> Dict[str, List[Tuple[dict, float]]]:
    """For each raw metric name, the series the fleet serves now: (labels with the target labels
    added: job, instance, namespace, pod; value), read from every pod's pages."""
    from exporter.runtime.exposition import parse

    out: Dict[str, List[Tuple[dict, float]]] = {}
    wanted = set(names)
    for p in pods:
        for job, port in (("vllm", p["vllm_port"]), ("vllm-sidecar", p["sidecar_port"])):
            text = get(f"http://127.0.0.1:{port}/metrics").decode()
            for s in parse(text).samples:
                if s.name in wanted:
                    out.setdefault(s.name, []).append(({**dict(s.labels), "job": job, "instance": f"127.0.0.1:{port}",
                                                        **target_labels(p, job)}, s.value))
    return out


# -- one run --------------------------------------------------------------------------------------

def target_labels(pod: dict, job: str) -> Dict[str, str]:
    """The labels a PodMonitor gives the pod's targets: namespace and pod, and on vLLM's target the
    SLO's sidecar_target_label (every pod of this fleet runs the sidecar; deploy/kubernetes writes
    it from the pod's annotation), so the pack reads vLLM's raw series only for pods without one."""
    out = {"namespace": pod["namespace"], "pod": pod["pod"]}
    if job == "vllm" and SIDECAR_LABEL:
        out[SIDECAR_LABEL] = "true"
    return out


def prom_config(pods: Sequence[dict], scrape_s: float, rule_files: Sequence[Path]) -> dict:
    def job(name: str, port_key: str) -> dict:
        return {"job_name": name,
                "static_configs": [{"targets": [f"127.0.0.1:{p[port_key]}"],
                                    "labels": target_labels(p, name)} for p in pods]}

    return {"global": {"scrape_interval": f"{scrape_s:g}s", "scrape_timeout": f"{min(scrape_s, 10):g}s",
                       "evaluation_interval": f"{EVAL_INTERVAL:g}s"},
            "rule_files": [str(f) for f in rule_files],
            "scrape_configs": [job("vllm", "vllm_port"), job("vllm-sidecar", "sidecar_port")]}


@dataclass
class Instance:
    name: str
    rule_files: List[Path]
    port: int = 0
    proc: Optional[Proc] = None
    backfilled_samples: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _launch(inst: Instance, d: Path, pods: List[dict], scrape_s: float) -> None:
    (d / "prometheus.yml").write_text(yaml.safe_dump(prom_config(pods, scrape_s, inst.rule_files)))
    inst.port = free_port()
    inst.proc = Proc(f"prometheus-{inst.name}", [
        "prometheus", f"--config.file={d / 'prometheus.yml'}", f"--storage.tsdb.path={d / 'data'}",
        f"--web.listen-address=127.0.0.1:{inst.port}", "--storage.tsdb.retention.time=15d",
        "--log.level=warn"], d / "prometheus.log")


def _ready(instances: List[Instance], work: Path) -> None:
    for inst in instances:
        end = time.monotonic() + 120
        while True:
            try:
                if get(inst.url + "/-/ready", 2):
                    break
            except Exception as exc:  # noqa: BLE001 - not up yet
                if inst.proc.p.poll() is not None or time.monotonic() > end:
                    raise RuntimeError(f"prometheus {inst.name} did not start: see {work} ({inst.name})") from exc
                time.sleep(0.5)


def needs_history(name: str, exprs: Dict[str, str], seen: Optional[set] = None) -> bool:
    """Whether the rule recording ``name`` (or a recorded series it reads) reads the past with
    ``offset``: a probe without history records nothing there, yet a Prometheus that has run for
    long records it for every replica (the capacity family's sustained level)."""
    seen = set() if seen is None else seen
    if name in seen or name not in exprs:
        return False
    seen.add(name)
    expr = exprs[name]
    return " offset " in expr or any(other in expr and needs_history(other, exprs, seen) for other in exprs
                                     if other != name)


def level_label_sets(name: str, pods: Sequence[dict]) -> List[dict]:
    """The label sets a recording level (``namespace_pod_model:...``) has on this fleet: one per
    pod, or per (namespace, model)."""
    keys = ["model_name" if part == "model" else part for part in name.split(":", 1)[0].split("_")]
    field = {"namespace": "namespace", "pod": "pod", "model_name": "model"}
    out: List[dict] = []
    for p in pods:
        labels = {k: p[field[k]] for k in keys}
        if labels not in out:
            out.append(labels)
    return out


def _probed(metrics, since: float) -> bool:
    """Whether every rule group has evaluated since ``since`` (when every rate had two points; the
    slow alerts' and the views' groups run every few minutes, and a first evaluation before then
    records nothing) and the fastest three times: then every recorded series is there."""
    its = [v for (n, _), v in metrics.items() if n == "prometheus_rule_group_iterations_total"]
    last = [v for (n, _), v in metrics.items() if n == "prometheus_rule_group_last_evaluation_timestamp_seconds"]
    return bool(its) and max(its) >= 3 and bool(last) and min(last) >= since


def probe_recorded(instances: List[Instance], pods: List[dict], scrape_s: float, work: Path,
                   names: Dict[str, List[str]], say) -> Dict[str, Dict[str, list]]:
    """The series each instance's rules record under ``names[instance]`` on this fleet: each
    instance runs for three evaluations (with four scrapes or more: every rate has two points),
    every group of a rule file at least once, without history, and is asked; then stopped and its
    data thrown away. Backfilling every pod for a recorded series would be wrong where the rule
    records only some of them."""
    probing = [i for i in instances if names.get(i.name)]
    if not probing:
        return {}
    probes = [Instance(i.name, i.rule_files) for i in probing]
    try:
        for p in probes:
            d = work / f"probe-{p.name}"
            (d / "data").mkdir(parents=True)
            _launch(p, d, pods, scrape_s)
        _ready(probes, work)
        time.sleep(max(4 * scrape_s, 0))
        since = time.time()
        end = time.monotonic() + 300
        while not all(_probed(prom_metrics(p.url), since) for p in probes):
            if time.monotonic() > end:
                raise RuntimeError("the probe's rules did not evaluate (every group once, the alerting "
                                   "group three times) since the rates had two points, in 5 minutes")
            time.sleep(5)
        out: Dict[str, Dict[str, list]] = {}
        for p in probes:
            got = out.setdefault(p.name, {})
            exprs = {r["record"]: r["expr"] for f in p.rule_files for r in load_rules(f) if "record" in r}
            for name in names[p.name]:
                res = api(p.url, "/api/v1/query", query=f'{{__name__="{name}"}}')["result"]
                got[name] = [({k: v for k, v in x["metric"].items() if k != "__name__"}, None) for x in res]
                if not got[name] and needs_history(name, exprs):
                    got[name] = [(labels, None) for labels in level_label_sets(name, pods)]
        say("  probe: recorded series to backfill: " + "; ".join(
            f"{i}: " + ", ".join(f"{n.split(':')[1]} {len(v)}" for n, v in got.items()) for i, got in out.items()))
        return out
    finally:
        for p in probes:
            if p.proc:
                p.proc.stop()
            shutil.rmtree(work / f"probe-{p.name}", ignore_errors=True)


def start_instances(instances: List[Instance], pods: List[dict], scrape_s: float, work: Path, warmup: float,
                    say) -> None:
    reads_all, recorded_all = {}, {}
    for inst in instances:
        rules = [r for f in inst.rule_files for r in load_rules(f)]
        reads_all[inst.name] = long_reads(rules, warmup)
        recorded_all[inst.name] = sorted({r["record"] for r in rules if "record" in r} & set(reads_all[inst.name]))
    raw = sorted({n for inst in instances for n in reads_all[inst.name] if n not in recorded_all[inst.name]})
    live = live_series(pods, raw) if raw else {}
    probed = probe_recorded(instances, pods, scrape_s, work, recorded_all, say)
    for inst in instances:
        d = work / inst.name
        (d / "data").mkdir(parents=True)
        reads = reads_all[inst.name]
        if reads:
            series = {**live, **probed.get(inst.name, {})}
            text, n = backfill_text(reads, series, recorded_all[inst.name], time.time() - 1, scrape_s, EVAL_INTERVAL)
            (d / "backfill.om").write_text(text)
            t0 = time.monotonic()
            subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", "-q", str(d / "backfill.om"),
                            str(d / "data")], check=True, cwd=d, stdout=subprocess.DEVNULL)
            (d / "backfill.om").unlink()
            inst.backfilled_samples = n
            say(f"  {inst.name}: backfilled {n:,} samples of the series its rules read further back than the warm-up "
                f"({', '.join(f'{k} {v / 3600:g}h' for k, v in sorted(reads.items()))}) in {time.monotonic() - t0:.0f} s")
        _launch(inst, d, pods, scrape_s)
    _ready(instances, work)


class RulePoller:
    """Every distinct evaluation of every group, from /api/v1/rules: the group's time and each
    rule's, and the health of each rule."""

    def __init__(self, inst: Instance) -> None:
        self.inst = inst
        self.groups: Dict[str, Dict[str, dict]] = {}  # group -> lastEvaluation -> {"t": s, "rules": [s...]}
        self.errors: Dict[str, str] = {}

    def poll(self) -> None:
        for g in api(self.inst.url, "/api/v1/rules")["groups"]:
            evals = self.groups.setdefault(g["name"], {})
            key = g.get("lastEvaluation")
            if not key or key.startswith("0001") or key in evals:
                continue
            evals[key] = {"t": g["evaluationTime"], "rules": [r.get("evaluationTime", 0.0) for r in g["rules"]]}
            for r in g["rules"]:
                if r.get("health") == "err":
                    self.errors[r.get("name", "?")] = r.get("lastError", "")


def place_groups(instances: List[Instance], work: Path, tick_s: float, say) -> Dict[str, Tuple[str, float]]:
    """Each instance's rule file copied under a name that puts its first group (the alerting
    group) at its own moment of every evaluation interval, spread over the interval in whole fleet
    ticks (``phases``): {instance: (group, predicted offset)}. Without xxhash, nothing moves."""
    ruled = [i for i in instances if i.rule_files]
    if not phases.available():
        say("  (xxhash missing: each group evaluates at the moment Prometheus hashes for it)")
        return {}
    out = {}
    spots = list(zip(ruled, phases.targets(len(ruled), EVAL_INTERVAL, tick_s)))
    taken = [(target, EVAL_INTERVAL) for _, target in spots]  # every alerting group's moment
    for inst, target in spots:
        every = group_intervals([inst.rule_files[0]])
        group = load_rules(inst.rule_files[0])[0]["_group"]
        later = [(g, s) for g, s in every.items() if g != group]  # the slower groups, at whole ticks
        inst.rule_files = [phases.placed_copy(inst.rule_files[0], work / "rules" / inst.name, group, target,
                                              EVAL_INTERVAL, later=later, tick_s=tick_s, taken=taken)] + inst.rule_files[1:]
        taken += [(phases.group_offset_s(str(inst.rule_files[0]), g, s), s) for g, s in later]
        out[inst.name] = (group, phases.group_offset_s(str(inst.rule_files[0]), group, EVAL_INTERVAL))
    return out


def _observed(inst: Instance, group: str) -> str:
    seen = phases.observed(api(inst.url, "/api/v1/rules")["groups"], EVAL_INTERVAL).get(group)
    return "-" if seen is None else f"{seen:.2f}"


def load_average() -> Tuple[float, float, float]:
    return os.getloadavg()


def measure_run(scrape_s: float, args, say) -> dict:
    work = Path(tempfile.mkdtemp(prefix="bench-pack-", dir=args.keep or None))
    procs: List[Proc] = []
    instances = [Instance("none", []), Instance("naive", [NAIVE]), Instance("pack", [Path(args.rules).resolve()])]
    for v in args.variant:
        name, _, path = v.partition("=")
        instances.append(Instance(name, [Path(path).resolve()]))
    try:
        fleet = Proc("fleet", [sys.executable, str(Path(__file__).resolve()), "fleet", "--pods", str(args.pods),
                               "--tick", str(min(args.tick, scrape_s)), "--seed", str(args.seed)],
                     work / "fleet.log", stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        procs.append(fleet)
        pods = json.loads(fleet.p.stdout.readline() or "null") or []
        if len(pods) != args.pods:
            raise RuntimeError(f"the fleet did not start: see {work / 'fleet.log'}")
        say(f"scrape every {scrape_s:g} s: fleet of {len(pods)} pods up; starting {len(instances)} Prometheus")
        placed = place_groups(instances, work, min(args.tick, scrape_s), say)
        start_instances(instances, pods, scrape_s, work, args.warmup, say)
        procs.extend(i.proc for i in instances)
        t_start = time.time()
        say(f"  warm-up {args.warmup:.0f} s (load average {load_average()[0]:.1f})")
        time.sleep(args.warmup)
        phase = {i.name: {"group": placed[i.name][0], "predicted": placed[i.name][1],
                          "observed": _observed(i, placed[i.name][0])} for i in instances if i.name in placed}
        if phase:
            say("  alerting groups evaluated at (seconds into every interval, predicted / observed): " + ", ".join(
                f"{name} {p['predicted']:.2f} / {p['observed']}" for name, p in phase.items()))
        pollers = {i.name: RulePoller(i) for i in instances}
        before = {i.name: prom_metrics(i.url) for i in instances}
        load = [load_average()]
        t0 = time.monotonic()
        say(f"  measuring {args.measure:.0f} s")
        while time.monotonic() - t0 < args.measure:
            for p in pollers.values():
                p.poll()
            load.append(load_average())
            time.sleep(5)
        for p in pollers.values():
            p.poll()
        elapsed = time.monotonic() - t0
        after = {i.name: prom_metrics(i.url) for i in instances}
        load.append(load_average())
        result = {"scrape_s": scrape_s, "eval_s": EVAL_INTERVAL, "pods": pods, "warmup_s": args.warmup,
                  "measure_s": elapsed, "started": t_start, "phases": phase,
                  "load_1m": [la[0] for la in load], "instances": {}}
        for inst in instances:
            result["instances"][inst.name] = instance_result(inst, pollers[inst.name], before[inst.name],
                                                             after[inst.name], elapsed, pods)
        for p in reversed(procs):
            p.stop()
        if args.quiet_repeat:
            result["quiet"] = quiet_figures(work, instances, args.quiet_repeat, say)
        return result
    finally:
        for p in reversed(procs):
            p.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            say(f"  kept {work}")


def quiet_figures(work: Path, instances: List[Instance], repeat: int, say) -> Dict[str, dict]:
    """With everything stopped: each rule file's expressions asked of one quiet Prometheus over
    the data its instance stored, beside the naive rules over the same data
    (``bench/bench_rule_cost.py``): the low-noise figures of the rules' cost."""
    from bench.bench_rule_cost import quiet_costs

    out = {}
    for inst in instances:
        if inst.name in ("none", "naive"):
            continue
        say(f"  quiet: {inst.name}'s and the naive rules over {inst.name}'s data, {repeat} times each")
        out[inst.name] = quiet_costs(work / inst.name / "data", {"naive": NAIVE, inst.name: inst.rule_files[0]}, repeat)
    return out


def instance_result(inst: Instance, poller: RulePoller, before, after, elapsed: float, pods: List[dict]) -> dict:
    rules = [r for f in inst.rule_files for r in load_rules(f)]
    out: dict = {"rule_files": [str(f) for f in inst.rule_files], "backfilled_samples": inst.backfilled_samples}
    d = lambda name, **kw: pick(after, name, **kw) - pick(before, name, **kw)  # noqa: E731
    out["head_series"] = pick(after, "prometheus_tsdb_head_series")
    out["samples_appended_per_s"] = d("prometheus_tsdb_head_samples_appended_total") / elapsed
    out["cpu_s_per_s"] = d("process_cpu_seconds_total") / elapsed
    out["rss_bytes"] = pick(after, "process_resident_memory_bytes")
    out["heap_inuse_bytes"] = pick(after, "go_memstats_heap_inuse_bytes")
    out["scrape_samples"] = None
    out["iterations"] = d("prometheus_rule_group_iterations_total")
    out["iterations_missed"] = pick(after, "prometheus_rule_group_iterations_missed_total")
    out["evaluation_failures"] = pick(after, "prometheus_rule_evaluation_failures_total")
    out["rule_eval_summary"] = {q: pick(after, "prometheus_rule_evaluation_duration_seconds", quantile=q)
                                for q in ("0.5", "0.9", "0.99")}
    out["rule_eval_count"] = d("prometheus_rule_evaluation_duration_seconds_count")
    out["rule_eval_sum_s"] = d("prometheus_rule_evaluation_duration_seconds_sum")
    out["group_last_samples"] = pick(after, "prometheus_rule_group_last_evaluation_samples")
    out["rule_errors"] = poller.errors
    w = f"{int(elapsed)}s"
    # one instant for both counts (two queries a moment apart can see one scrape more in the second)
    now = time.time()
    ok = api(inst.url, "/api/v1/query", query=f"sum(sum_over_time(up[{w}]))", time=now)["result"]
    tried = api(inst.url, "/api/v1/query", query=f"sum(count_over_time(up[{w}]))", time=now)["result"]
    dur = api(inst.url, "/api/v1/query", query=f"quantile(0.99, max_over_time(scrape_duration_seconds[{w}]))")["result"]
    out["scrapes"] = float(tried[0]["value"][1]) if tried else 0.0
    out["scrapes_failed"] = out["scrapes"] - (float(ok[0]["value"][1]) if ok else 0.0)
    out["scrape_duration_p99_of_max_s"] = float(dur[0]["value"][1]) if dur else None
    if not rules:
        return out
    # each group's evaluations, and what they cost per evaluation interval: a group evaluated every
    # 2 minutes (the views) weighs a quarter of one evaluated every 30 s
    weight = {g: EVAL_INTERVAL / s for g, s in group_intervals(inst.rule_files).items()}
    groups = {}
    for g, evals in poller.groups.items():
        times = sorted(e["t"] for e in evals.values())
        if times:
            groups[g] = {"evals": len(times), "weight": weight.get(g, 1.0), **time_stats(times)}
    out["groups"] = groups
    out["group_evals"] = min((g["evals"] for g in groups.values()), default=0)
    out["group_time_s"] = ({k: sum(g[k] * g["weight"] for g in groups.values()) for k in ("median", "mean", "p90", "max", "min")}
                           if groups else {})
    per_rule = []
    for i, r in enumerate(rules):
        at = sum(1 for x in rules[:i] if x["_group"] == r["_group"])  # its place in its group
        ts = [e["rules"][at] for e in poller.groups.get(r["_group"], {}).values() if at < len(e["rules"])]
        stats = api(inst.url, "/api/v1/query", query=r["expr"], stats="all")
        samples = (stats.get("stats") or {}).get("samples", {}).get("totalQueryableSamples")
        row = {"rule": rule_id(r, rules), "kind": "record" if "record" in r else "alert",
               "mean_s": statistics.mean(ts) if ts else None, "median_s": statistics.median(ts) if ts else None,
               "samples_read": samples, "weight": weight.get(r["_group"], 1.0)}
        if "record" in r:
            sel = r["record"] + ("{" + ",".join(f'{k}="{v}"' for k, v in (r.get("labels") or {}).items()) + "}"
                                 if r.get("labels") else "")
            res = api(inst.url, "/api/v1/query", query=f"count({sel})")["result"]
            row["series"] = int(float(res[0]["value"][1])) if res else 0
            row["level"] = r["record"].split(":", 1)[0]
        per_rule.append(row)
    out["rules"] = per_rule
    per_pod = api(inst.url, "/api/v1/query", query='count by (pod) ({__name__=~"namespace_pod_model:.+"})')["result"]
    counts = {x["metric"]["pod"]: int(float(x["value"][1])) for x in per_pod}
    by_load: Dict[str, List[int]] = {}
    for p in pods:
        by_load.setdefault(PodSpec(**{k: p[k] for k in PodSpec.__dataclass_fields__}).load, []).append(counts.get(p["pod"], 0))
    out["recorded_per_pod_by_load"] = {k: {"pods": len(v), "min": min(v), "max": max(v), "mean": statistics.mean(v)}
                                       for k, v in sorted(by_load.items())}
    for name in ("ALERTS", "ALERTS_FOR_STATE"):
        res = api(inst.url, "/api/v1/query", query=f"count({name})")["result"]
        out[name] = int(float(res[0]["value"][1])) if res else 0
    res = api(inst.url, "/api/v1/query", query='count by (alertname, alertstate) (ALERTS)')["result"]
    out["alerts"] = {f'{x["metric"]["alertname"]} {x["metric"]["alertstate"]}': int(float(x["value"][1])) for x in res}
    return out


def environment() -> dict:
    prom = subprocess.run(["prometheus", "--version"], capture_output=True, text=True)
    first = (prom.stdout or prom.stderr).splitlines()[0] if (prom.stdout or prom.stderr) else "?"
    return {"machine": f"{platform.machine()}, {os.cpu_count()} cores, Linux {platform.release()}",
            "python": platform.python_version(), "prometheus": first}


def main(argv=None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["fleet"]:
        ap = argparse.ArgumentParser()
        ap.add_argument("--pods", type=int, default=100)
        ap.add_argument("--tick", type=float, default=5.0)
        ap.add_argument("--seed", type=int, default=1)
        a = ap.parse_args(argv[1:])
        run_fleet(a.pods, a.tick, a.seed)
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pods", type=int, default=100)
    ap.add_argument("--scrape", default="15,5", help="scrape intervals (s), one run each")
    ap.add_argument("--warmup", type=float, default=330.0)
    ap.add_argument("--measure", type=float, default=300.0)
    ap.add_argument("--tick", type=float, default=5.0, help="seconds between simulator steps and sidecar polls")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rules", default=str(PACK))
    ap.add_argument("--variant", action="append", default=[], help="NAME=RULEFILE: one more instance")
    ap.add_argument("--json", default="", help="write every figure to this file")
    ap.add_argument("--quiet-repeat", type=int, default=10, help="after the run, ask each rule of a quiet "
                    "Prometheus over the stored data this many times (bench/bench_rule_cost.py; 0: not)")
    ap.add_argument("--keep", default="", help="keep the working directories under this directory")
    ap.add_argument("--report", default="", help="print the report of a --json file and exit")
    ap.add_argument("--write", default="", help="write the report as the section \"" + SECTION[3:] + "\" of this "
                    "markdown file (docs/performance.md), leaving its other sections as they are")
    args = ap.parse_args(argv)

    def say(s: str = "") -> None:
        print(s, flush=True)

    def write(env: dict, runs: List[dict]) -> None:
        from bench.bench_poll import write_sections

        lines: List[str] = []
        for res in runs:
            report(res, lines.append)
        text = SECTION_INTRO.format(machine=env["machine"], python=env["python"], prometheus=env["prometheus"])
        write_sections(Path(args.write), SECTION + "\n\n" + text + "\n" + "\n".join(lines).strip() + "\n", (SECTION,))
        say(f"wrote {args.write}")

    if args.report:
        saved = json.loads(Path(args.report).read_text())
        env = saved["environment"]
        say(f"{env['machine']}, Python {env['python']}, {env['prometheus']}")
        for res in saved["runs"]:
            report(res, say)
        if args.write:
            write(env, saved["runs"])
        return 0
    if not shutil.which("prometheus") or not shutil.which("promtool"):
        print("prometheus and promtool are needed (make deps)", file=sys.stderr)
        return 2

    def interrupted(*_):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    env = environment()
    say(f"{env['machine']}, Python {env['python']}, {env['prometheus']}")
    results = []
    for s in [float(x) for x in args.scrape.split(",") if x]:
        res = measure_run(s, args, say)
        results.append(res)
        report(res, say)
        if args.json:
            Path(args.json).write_text(json.dumps({"environment": env, "runs": results}, indent=1))
    if args.write:
        write(env, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
