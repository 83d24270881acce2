"""Building `promtool test rules` input series shaped exactly like real vLLM output.

Names carry ``_total``; histogram ``le`` bounds are the strings vLLM writes (``"2.5"``,
``"5000.0"``), taken from the real pages in tests/fixtures; every vLLM series has ``engine`` and
``model_name``; target labels (``namespace``, ``pod``, ``job``, ``instance``) are what a
PodMonitor adds.
"""

import math
import re
import shutil
import subprocess
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

import yaml

from exporter.runtime.exposition import parse

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "rules" / "vllm.rules.yml"


def pack_in_one_group(tmp: Path) -> Path:
    """The committed pack with its views, steady and slow alerts in the alerting group
    (``views_interval``, ``steady_interval``, ``slow_interval``: 0s): the same rules, the same
    expressions, in one group. For a Prometheus that evaluates every second and is asked within a
    minute, where the views' and the slower alerts' own groups (every 1 or 2 minutes) may not have
    run yet. (promtool runs
    take the committed file, its groups in file order: ``in_file_order``.)"""
    from exporter.pack.rules import render_plain
    from exporter.slo import load_slo

    slo = load_slo(str(ROOT / "rules" / "slo.yaml"))
    slo["views_interval"] = slo["steady_interval"] = slo["slow_interval"] = "0s"
    path = tmp / "vllm.one-group.rules.yml"
    path.write_text(render_plain(slo))
    return path
PAGE = (ROOT / "tests" / "fixtures" / "vllm" / "after_pressure.txt").read_text()


# older names whose buckets were the same as today's histogram
LEGACY_BOUNDS = {"vllm:time_per_output_token_seconds": "vllm:inter_token_latency_seconds"}


def real_bounds(metric: str) -> List[str]:
    """The ``le`` strings of a vLLM histogram as the real page writes them."""
    metric = LEGACY_BOUNDS.get(metric, metric)
    out = []
    for s in parse(PAGE).samples:
        if s.name == metric + "_bucket":
            le = dict(s.labels)["le"]
            if le not in out:
                out.append(le)
    assert out, metric
    return out


def vllm_labels(pod: str = "vllm-0", model: str = "llama-70b", namespace: str = "llm", engine: Optional[str] = "0",
                **extra) -> Dict[str, str]:
    lab = {"namespace": namespace, "pod": pod, "job": "llm/vllm", "instance": f"{pod}:8000", "model_name": model}
    if engine is not None:
        lab["engine"] = engine
    lab.update(extra)
    return lab


def sidecar_labels(pod: str = "vllm-0", namespace: str = "llm", **extra) -> Dict[str, str]:
    lab = {"namespace": namespace, "pod": pod, "job": "llm/vllm-sidecar", "instance": f"{pod}:9181"}
    lab.update(extra)
    return lab


def fmt_series(name: str, labels: Dict[str, str]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
    return f"{name}{{{inner}}}"


def values(seq: Sequence[Optional[float]]) -> str:
    out = []
    for v in seq:
        if v is None:
            out.append("_")
        elif isinstance(v, float) and math.isinf(v):
            out.append("Inf")
        else:
            out.append(repr(float(v)) if not float(v).is_integer() else str(int(v)))
    return " ".join(out)


def counter(per_minute: Callable[[int], float], minutes: int, start: float = 0.0) -> List[float]:
    """Cumulative values at minutes 0..minutes for increments ``per_minute(m)`` (m = 1..)."""
    out, v = [start], start
    for m in range(1, minutes + 1):
        v += per_minute(m)
        out.append(v)
    return out


def gauge(fn: Callable[[int], Optional[float]], minutes: int) -> List[Optional[float]]:
    return [fn(m) for m in range(minutes + 1)]


def histogram(metric: str, labels: Dict[str, str], minutes: int,
              observations: Callable[[int], Sequence[float]]) -> List[Dict[str, str]]:
    """Cumulative bucket, _sum and _count series for observations made in each minute."""
    bounds = real_bounds(metric)
    nums = [math.inf if b == "+Inf" else float(b) for b in bounds]
    buckets = [[0.0] for _ in bounds]
    total_sum, total_count = [0.0], [0.0]
    for m in range(1, minutes + 1):
        obs = observations(m)
        for i, ub in enumerate(nums):
            buckets[i].append(buckets[i][-1] + sum(1 for o in obs if o <= ub))
        total_sum.append(total_sum[-1] + sum(obs))
        total_count.append(total_count[-1] + len(obs))
    out = [{"series": fmt_series(metric + "_bucket", {**labels, "le": b}), "values": values(buckets[i])}
           for i, b in enumerate(bounds)]
    out.append({"series": fmt_series(metric + "_sum", labels), "values": values([round(x, 6) for x in total_sum])})
    out.append({"series": fmt_series(metric + "_count", labels), "values": values(total_count)})
    return out


def series(name: str, labels: Dict[str, str], vals: Sequence[Optional[float]]) -> Dict[str, str]:
    return {"series": fmt_series(name, labels), "values": values(vals)}


def prompts_series(minutes: int, total_per_min: Callable[[int], float], long_per_min: Callable[[int], float],
                   labels: Dict[str, str]) -> List[Dict[str, str]]:
    """vLLM's prompt-length histogram (_count and the le="5000.0" bucket the rules read)."""
    return [
        series("vllm:request_prompt_tokens_bucket", {**labels, "le": "5000.0"},
               counter(lambda m: total_per_min(m) - long_per_min(m), minutes)),
        series("vllm:request_prompt_tokens_count", labels, counter(total_per_min, minutes)),
    ]


# -- alert expectations -----------------------------------------------------------------------

def rules_by_alert(rules_path: Path = RULES) -> Dict[str, List[dict]]:
    data = yaml.safe_load(rules_path.read_text())
    out: Dict[str, List[dict]] = {}
    for g in data["groups"]:
        for r in g["rules"]:
            if "alert" in r:
                out.setdefault(r["alert"], []).append(r)
    return out


_TPL = re.compile(r"\{\{\s*\$labels\.(\w+)\s*\}\}")
_VAL = re.compile(r'\{\{\s*\$value(?:\s*\|\s*(?:\w+|printf "[^"]*"))?\s*\}\}')


_QUERY = re.compile(r"\{\{ (?:with|range) printf .*? \| query(?: \| sortByLabel \"\w+\")? \}\}.*?\{\{ end \}\}")


_IF = re.compile(r'\{\{ if eq \$labels\.(\w+) "([^"]*)" \}\}(.*?)\{\{ else \}\}(.*?)\{\{ end \}\}', re.S)
_ASKED = "\x00query\x00"


def render(template: str, labels: Dict[str, str], value: str, evidence: Sequence[str] = ()) -> str:
    """Fill the four kinds of template the pack uses: a label, the value (given already
    formatted by the test, as Prometheus' humanize functions would write it), the evidence an
    annotation queries (``Ctx.show``: given in order by the test, as Prometheus would write it,
    for the queries of the branches taken only), and a branch on a label's value."""
    shown = iter(evidence)
    out = _QUERY.sub(_ASKED, template)
    out = _IF.sub(lambda m: m.group(3) if labels.get(m.group(1), "") == m.group(2) else m.group(4), out)
    out = re.sub(_ASKED, lambda m: next(shown, "?"), out)
    # an annotation that asks queries (the description) asks for every piece of evidence given
    assert not _QUERY.search(template) or next(shown, None) is None, \
        f"evidence given for a query the annotation does not ask: {template[:80]}"
    out = _TPL.sub(lambda m: labels.get(m.group(1), ""), out)
    return _VAL.sub(value, out)


def expect(alert: str, labels: Dict[str, str], value: str, severity: Optional[str] = None,
           rules: Optional[Dict[str, List[dict]]] = None, evidence: Sequence[str] = ()) -> dict:
    """What ``alert`` fires with: its labels and annotations, ``value`` and the ``evidence`` its
    annotations query (in order, each as Prometheus writes it) filled in."""
    rules = rules or rules_by_alert()
    candidates = rules[alert]
    if severity is not None:
        candidates = [r for r in candidates if r["labels"]["severity"] == severity]
    assert len(candidates) == 1 or all(c["labels"] == candidates[0]["labels"] for c in candidates), alert
    rule = candidates[0]
    all_labels = {**labels, **rule["labels"]}
    ann = {k: render(v, all_labels, value, evidence) for k, v in rule["annotations"].items()}
    return {"exp_labels": all_labels, "exp_annotations": ann}


_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def rules_for(alerts: Sequence[str], rules_path: Path = RULES) -> dict:
    """The rule file cut to what ``alerts`` read: their alerting rules and every recording rule
    their expressions reach, directly or through other recording rules, each rule as written in
    the file, in the file's groups and order (a rule's value depends only on its inputs and on the
    recording rules it reads, before it or, a baseline of a later group, at the evaluation before,
    all of them kept, so the cut evaluates every kept rule exactly as the whole file does). A
    promtool case over a day of history then evaluates a handful of rules per step, not all."""
    data = yaml.safe_load(rules_path.read_text())
    rules = [r for g in data["groups"] for r in g["rules"]]
    by_record = {}
    for r in rules:
        if "record" in r:
            by_record.setdefault(r["record"], []).append(r)
    missing = set(alerts) - {r["alert"] for r in rules if "alert" in r}
    assert not missing, f"no such alert in {rules_path.name}: {sorted(missing)}"
    need = set()
    todo = [r["expr"] for r in rules if r.get("alert") in alerts]
    while todo:
        for name in _NAME.findall(todo.pop()):
            if name in by_record and name not in need:
                need.add(name)
                todo.extend(r["expr"] for r in by_record[name])
    keep = lambda r: r.get("alert") in alerts or r.get("record") in need  # noqa: E731
    return {"groups": [{**g, "rules": [r for r in g["rules"] if keep(r)]}
                       for g in data["groups"] if any(keep(r) for r in g["rules"])]}


def in_file_order(rules_path: Path) -> Dict[str, List[str]]:
    """promtool's ``group_eval_order`` for a file of several groups: its groups in file order at each
    evaluation (the alerting group, then the steady and slow alerts' and the views' groups that read
    it). Without it promtool runs the groups in no fixed order, and a view reads this evaluation's
    figures or the last's."""
    names = [g["name"] for g in (yaml.safe_load(Path(rules_path).read_text()) or {}).get("groups", [])]
    return {"group_eval_order": names} if len(names) > 1 else {}


def run_promtool(tmp: Path, tests: List[dict], rules_path: Path = RULES,
                 evaluation_interval: str = "1m", alerts: Optional[Sequence[str]] = None) -> subprocess.CompletedProcess:
    """``promtool test rules`` of ``tests`` over the rule file, or over the file cut to what
    ``alerts`` read (``rules_for``) when they are named."""
    if alerts:
        cut = tmp / f"cut-{rules_path.name}"
        cut.write_text(yaml.safe_dump(rules_for(alerts, rules_path), sort_keys=False, width=10_000))
        rules_path = cut
    doc = {"rule_files": [str(rules_path)], "evaluation_interval": evaluation_interval,
           **in_file_order(rules_path), "tests": tests}
    f = tmp / "test.yml"
    f.write_text(yaml.safe_dump(doc, sort_keys=False, width=10_000))
    return subprocess.run([promtool(), "test", "rules", str(f)], capture_output=True, text=True, timeout=300)


def promtool() -> str:
    p = shutil.which("promtool")
    assert p, "promtool not installed (make test installs it)"
    return p
