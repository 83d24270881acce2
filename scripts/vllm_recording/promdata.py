"""Series in and out: Prometheus' HTTP API to OpenMetrics text (checked by promtool), that text and
the recorded pages back to ``{name: [(labels, [(t, v)])]}``, and the counter, gauge and
histogram reads the facts are made of."""

from __future__ import annotations

import math
import subprocess
import tarfile
import tempfile
import urllib.parse
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from exporter.runtime.buckets import histogram_quantile

from .processes import http_json


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
