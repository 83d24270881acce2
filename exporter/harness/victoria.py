"""Real VictoriaMetrics and vmalert (Debian's ``victoria-metrics`` package) on free loopback ports,
for the tests and the benchmarks: a second engine for the pack next to Prometheus.

``VictoriaMetrics(workdir)`` starts a single-node server with its own data directory (stopped by
``close()``; use it as a context manager). ``import_store(store)`` sends series with their
timestamps (``/api/v1/import/prometheus``), ``export(match)`` reads raw samples back, and
``replay(rule_file, start_ms, end_ms)`` runs vmalert's replay mode over the stored data: every
rule of the file evaluated over the range, recording rules' results and the ``ALERTS`` series
written back into this server, where ``alert_timeline()`` reads them.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import re
import shutil
import subprocess
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Set, Tuple

import yaml

from .localstack import StackError, free_port, wait_until


def binary(name: str) -> Optional[str]:
    return shutil.which(name)


def _rfc3339(ms: int) -> str:
    return _dt.datetime.fromtimestamp(ms / 1000, tz=_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# VictoriaMetrics serves no query over samples near unix time 0 (and reads small import timestamps as
# seconds): scenarios that start at 0, as promtool's do, are stored from this instant on (a day
# boundary, 2023-11-14T00:00:00Z), and timestamp-valued gauges move with them
BASE_MS = 1_699_920_000_000
_QUERY_TEMPLATE = re.compile(r"\{\{ with printf .*? \| query \}\}.*?\{\{ end \}\}")


def without_query_templates(rule_text: str) -> str:
    """A rule file with each annotation's ``query`` template (``Ctx.show``) replaced by "none", what
    it shows when the query has no result: for vmalert's replay mode, which runs no query."""
    doc = yaml.safe_load(rule_text)
    for g in doc["groups"]:
        for r in g["rules"]:
            for k, v in r.get("annotations", {}).items():
                r["annotations"][k] = _QUERY_TEMPLATE.sub("none", v)
    return yaml.safe_dump(doc, sort_keys=False, width=10_000)


TIMESTAMP_SUFFIXES = ("_timestamp_seconds", "_start_time_seconds")


def json_lines(store, shift_ms: int = 0) -> Iterable[str]:
    """Every non-stale sample of a Store as VictoriaMetrics' JSON import lines (one per series,
    timestamps in milliseconds: the text format's importer would read small ones as seconds). Stale
    markers are left out: the import has no way to send them, so VictoriaMetrics sees a series
    end as a gap (its staleness rule, not Prometheus' marker)."""
    for s in store:
        t, v = s.without_stale()
        if not len(t):
            continue
        labels = dict(s.labels)
        add = shift_ms / 1000 if labels["__name__"].endswith(TIMESTAMP_SUFFIXES) else 0.0
        vals = [None if math.isnan(x) else float(x) + add for x in v.tolist()]
        yield json.dumps({"metric": labels, "values": vals, "timestamps": [int(x) + shift_ms for x in t.tolist()]})


def dependency_stages(rules: List[dict]) -> List[List[dict]]:
    """Rules in stages: each rule after the stage of every recording rule its expression names."""
    recorded = {r["record"] for r in rules if "record" in r}
    stage_of: Dict[str, int] = {}
    stages: List[List[dict]] = []
    for r in rules:
        reads = {m for m in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", r["expr"]) if m in recorded}
        k = max((stage_of[m] + 1 for m in reads if m in stage_of), default=0)
        if "record" in r:
            stage_of[r["record"]] = max(k, stage_of.get(r["record"], 0))
        while len(stages) <= k:
            stages.append([])
        stages[k].append(r)
    return stages


class VictoriaMetrics:
    def __init__(self, workdir: Path, ready_seconds: float = 60) -> None:
        exe = binary("victoria-metrics")
        if not exe:
            raise StackError("victoria-metrics not found (apt-get install victoria-metrics)")
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(self.workdir / "victoria-metrics.log", "wb")
        self.proc = subprocess.Popen(
            [exe, f"-httpListenAddr=127.0.0.1:{self.port}", f"-storageDataPath={self.workdir / 'vm-data'}",
             "-retentionPeriod=100y", "-search.disableCache", "-search.latencyOffset=0s",
             # backtest --engine server inlines recorded series: the KV alert's query is about 30 KB
             "-search.maxQueryLen=262144",
             "-loggerLevel=ERROR"],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_until(lambda: self._get("/health", raw=True) == "OK", ready_seconds, what="victoria-metrics /health",
                       diag=self.diag)
        except Exception:
            self.close()
            raise

    # -- http ------------------------------------------------------------------------------------
    def _get(self, path: str, params: Optional[Dict[str, str]] = None, raw: bool = False, timeout: float = 60):
        url = self.url + path + ("?" + urllib.parse.urlencode(params) if params else "")
        with urllib.request.urlopen(url, timeout=timeout) as r:
            body = r.read().decode()
        return body.strip() if raw else json.loads(body)

    def _post(self, path: str, data: bytes, timeout: float = 120) -> None:
        req = urllib.request.Request(self.url + path, data=data, method="POST")
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()

    def diag(self) -> str:
        try:
            return (self.workdir / "victoria-metrics.log").read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    # -- data ------------------------------------------------------------------------------------
    def import_lines(self, lines: Iterable[str], path: str = "/api/v1/import", batch: int = 2_000) -> int:
        """POST lines to an import endpoint in batches; returns how many lines were sent."""
        n, buf = 0, []
        for line in lines:
            buf.append(line)
            if len(buf) >= batch:
                self._post(path, ("\n".join(buf) + "\n").encode())
                n, buf = n + len(buf), []
        if buf:
            self._post(path, ("\n".join(buf) + "\n").encode())
            n += len(buf)
        self.flush()
        return n

    def import_store(self, store, shift_ms: int = 0) -> int:
        """Every series of a Store with its timestamps (moved by ``shift_ms``); returns the number
        of series."""
        return self.import_lines(json_lines(store, shift_ms))

    def flush(self) -> None:
        self._get("/internal/force_flush", raw=True)

    def export(self, match: str, start_ms: Optional[int] = None, end_ms: Optional[int] = None) -> List[dict]:
        params = {"match[]": match}
        if start_ms is not None:
            params["start"] = str(start_ms / 1000)
        if end_ms is not None:
            params["end"] = str(end_ms / 1000)
        body = self._get("/api/v1/export", params, raw=True)
        return [json.loads(line) for line in body.splitlines() if line.strip()]

    def query_range(self, expr: str, start_ms: int, end_ms: int, step_ms: int) -> List[dict]:
        out = self._get("/api/v1/query_range", {"query": expr, "start": str(start_ms / 1000),
                                                 "end": str(end_ms / 1000), "step": f"{step_ms / 1000}s"})
        return out["data"]["result"]

    # -- vmalert ---------------------------------------------------------------------------------
    def replay(self, rule_file: Path, start_ms: int, end_ms: int, timeout: float = 600, rules_delay: str = "1s") -> str:
        """vmalert -replay over [start, end]; returns its log. Its results land in this server.
        Replay mode runs no ``query`` template (the evidence the pack's annotations show): a copy
        of the rule file with each such template's "none" in its place is replayed instead."""
        exe = binary("vmalert")
        if not exe:
            raise StackError("vmalert not found (apt-get install victoria-metrics)")
        text = Path(rule_file).read_text()
        if "| query }}" in text:
            rule_file = Path(rule_file).with_name("replayable-" + Path(rule_file).name)
            rule_file.write_text(without_query_templates(text))
        cmd = [exe, f"-rule={rule_file}", f"-datasource.url={self.url}", f"-remoteWrite.url={self.url}",
               f"-replay.timeFrom={_rfc3339(start_ms)}", f"-replay.timeTo={_rfc3339(end_ms)}",
               "-replay.disableProgressBar", "-datasource.queryStep=0s", f"-replay.rulesDelay={rules_delay}",
               "-remoteWrite.flushInterval=100ms",
               f"-httpListenAddr=127.0.0.1:{free_port()}", "-loggerLevel=INFO"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, start_new_session=True)
        log = r.stdout + r.stderr
        if r.returncode != 0:
            raise StackError(f"vmalert replay failed ({r.returncode}):\n{log[-3000:]}")
        self.flush()
        return log

    def replay_staged(self, groups: List[dict], workdir: Path, start_ms: int, end_ms: int, timeout: float = 600) -> int:
        """vmalert -replay of rule ``groups`` one dependency stage at a time: a rule runs in the
        first replay after every rule it reads (VictoriaMetrics makes written samples searchable
        about a second after they arrive, so within one replay a rule would need vmalert's
        -replay.rulesDelay of a second or more before each rule that reads another; a stage
        needs none, and a flush between stages). Returns the number of stages."""
        stages = dependency_stages([r for g in groups for r in g["rules"]])
        interval = groups[0].get("interval", "1m") if groups else "1m"
        for k, rules in enumerate(stages):
            f = Path(workdir) / f"stage-{k}.rules.yml"
            f.write_text(yaml.safe_dump({"groups": [{"name": groups[0]["name"], "interval": interval, "rules": rules}]},
                                        sort_keys=False, width=10_000))
            self.replay(f, start_ms, end_ms, timeout=timeout, rules_delay="0s")
        return len(stages)

    def alert_timeline(self, start_ms: int, end_ms: int, state: str = "firing",
                       shift_ms: int = 0) -> Dict[Tuple[int, str], Set[str]]:
        """(seconds less ``shift_ms``, alertname) -> the label sets of the alerts in ``state``, from
        the ALERTS series vmalert wrote (its alertstate/alertgroup labels left out, the rule's kept)."""
        out: Dict[Tuple[int, str], Set[str]] = {}
        for row in self.export(f'ALERTS{{alertstate="{state}"}}', start_ms, end_ms):
            labels = {k: v for k, v in row["metric"].items() if k not in ("__name__", "alertstate", "alertgroup")}
            name = labels["alertname"]
            text = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
            for t in row["timestamps"]:
                out.setdefault(((int(t) - shift_ms) // 1000, name), set()).add(text)
        return out

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.log.close()

    def __enter__(self) -> "VictoriaMetrics":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
