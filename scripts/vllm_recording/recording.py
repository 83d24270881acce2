"""A scenario's recording from start to files: vLLM, the sidecar and Prometheus started, the load
played while the poller keeps vLLM's pages, the series and alerts exported, and the recording
written (pages, exports, the requests' log, meta.json, PROVENANCE.md); ``reprocess`` recomputes
meta.json and PROVENANCE.md from a recording's own files."""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import os
import random
import shutil
import sys
import tarfile
import time
from pathlib import Path
from typing import Dict, List, NamedTuple, Optional, Tuple

from exporter.harness.localstack import free_port, wait_until

from . import ROOT
from .bench import bench_provenance
from .facts import alert_facts, client_stats, server_facts
from .load import LoadGen, Prompts, Result, load_results, send
from .processes import Group, PagePoller, http_json, log, prometheus_config, start_prometheus, start_vllm, tiny_model, vllm_python
from .promdata import pages_data, parse_om, prom_query, promtool_check, to_openmetrics
from .provenance import dirty, git_head, provenance, provenance_multi
from .scenarios import (
    EXPORT_RE,
    JOB,
    LABELS,
    MODEL,
    POD_IP,
    SCENARIOS,
    SCRAPE,
    SIDECAR_ARGS,
    SIDECAR_PORT_LABEL,
    VLLM_ENV,
    VLLM_PORT_LABEL,
    flag_value,
)


class Started(NamedTuple):
    """What ``start_vllm_and_sidecar`` started: vLLM's URL, the model's folder, vLLM's command line,
    its version, the sidecar's port and the rules file Prometheus evaluates."""
    url: str
    model: Path
    vllm_args: List[str]
    version: str
    sidecar_port: int
    rules: Path


def start_vllm_and_sidecar(server_flags: List[str], sidecar_flags: List[str], workdir: Path, groups: List[Group],
                           began: float) -> Started:
    """The real CPU vLLM with the scenario's flags, then the sidecar reading it; each started group
    goes into ``groups`` at once, so the caller stops it on failure. The rules pack is copied into
    ``workdir`` for Prometheus."""
    py = vllm_python()
    model = tiny_model(py)
    vg, url, vllm_args = start_vllm(py, model, server_flags, workdir)
    groups.append(vg)
    version = http_json(url + "/version").get("version")
    log("vLLM", version, "ready at", url, f"after {time.time() - began:.0f}s")
    sport = free_port()
    groups.append(Group("sidecar", [sys.executable, "-m", "exporter", "--vllm-url", url, "--listen",
                                    f"127.0.0.1:{sport}", *sidecar_flags], workdir))
    rules = workdir / "vllm.rules.yml"
    shutil.copy(ROOT / "rules" / "vllm.rules.yml", rules)
    return Started(url, model, vllm_args, version, sport, rules)


def vllm_port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def warm_up(url: str, prompts: Prompts, phases_spec: List[dict]) -> None:
    """One request of each kind first: the first request of a fresh server is slow."""
    for spec in {p["cls"]: p for ph in phases_spec for p in ph.get("open", []) + ph.get("closed", [])}.values():
        r = Result()
        send(url, prompts.make(random.Random(0), spec["prompt"][0], 0), 8, False, r)


def play_phases(gen: LoadGen, phases_spec: List[dict]) -> List[dict]:
    """Plays the phases one after the other; returns each one's name, start and end (unix seconds)."""
    phases = []
    for ph in phases_spec:
        t0 = time.time()
        log(f"phase {ph['name']} starts ({ph['duration']:.0f}s)")
        gen.play_phase(ph, t0)
        phases.append({"name": ph["name"], "start": round(t0, 3), "end": round(time.time(), 3)})
        log(f"phase {ph['name']} ended; in flight: {gen.in_flight()}")
        log(json.dumps(client_stats(gen.results, phases)[ph["name"]]))
    return phases


def stop_poller(poller: PagePoller) -> None:
    poller.stop_event.set()
    poller.join(10)


def export_range(prom: str, rng_s: int, t_end: float) -> Tuple[list, str, str, str]:
    """Every exported series and the ``ALERTS`` of the last ``rng_s`` seconds before ``t_end``: the
    series' query result, its OpenMetrics text, promtool's verdict on it, the alerts' OpenMetrics."""
    result = prom_query(prom, f'{{__name__=~"{EXPORT_RE}"}}[{rng_s}s]', t_end)
    om = to_openmetrics(result)
    check = promtool_check(om)
    alerts = prom_query(prom, f"ALERTS[{rng_s}s]", t_end)
    alerts_om = to_openmetrics(alerts)
    if alerts:
        promtool_check(alerts_om)
    return result, om, check, alerts_om


def fresh_dir(out: Path) -> None:
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)


def requests_csv(results: List[Result]) -> str:
    """The load generator's log: one row per request, the columns ``Result``'s fields."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(Result.__slots__)
    for r in results:
        w.writerow(r.row())
    return buf.getvalue()


def server_command(vllm_args: List[str], model: Path) -> str:
    return " ".join(f"{k}={v}" for k, v in VLLM_ENV.items()) + " python " + \
        " ".join(vllm_args[1:]).replace(str(model), "$CACHE/tiny-llama")


def target_labels() -> dict:
    return {"vllm": {**LABELS, "job": JOB, "instance": f"{POD_IP}:{VLLM_PORT_LABEL}"},
            "sidecar": {**LABELS, "job": JOB, "instance": f"{POD_IP}:{SIDECAR_PORT_LABEL}"}}


def onset_of(sc: dict, phases: List[dict]) -> Optional[float]:
    return next((p["start"] for p in phases if p["name"] == sc["onset_phase"]), None)


def log_files(out: Path, began: float) -> None:
    log(f"wrote {out} in {time.time() - began:.0f}s")
    for f in sorted(out.iterdir()):
        log(f"  {f.name}: {f.stat().st_size} bytes")


def stop_everything(gen: Optional[LoadGen], poller: Optional[PagePoller], groups: List[Group]) -> None:
    """The load, the poller and every started group (newest first), also on failure or Ctrl-C."""
    if gen is not None:
        gen.stop_all.set()
    if poller is not None:
        poller.stop_event.set()
    for g in reversed(groups):
        g.stop()


# ---------------------------------------------------------------------------------------------
# the recordings at one interval (every 5 s)


def start_one_prometheus(run: Started, workdir: Path, groups: List[Group]) -> str:
    """One Prometheus scraping vLLM and the sidecar every 5 s, evaluating the pack every 5 s; waits
    until both targets are up and returns its URL."""
    cfg = prometheus_config(vllm_port(run.url), run.sidecar_port, run.rules)
    import yaml  # the project's venv has it
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    pport = free_port()
    prom = f"http://127.0.0.1:{pport}"
    pg = Group("prometheus", ["prometheus", f"--config.file={workdir / 'prometheus.yml'}",
                              f"--storage.tsdb.path={workdir / 'prom-data'}",
                              f"--web.listen-address=127.0.0.1:{pport}"], workdir)
    groups.append(pg)
    wait_until(lambda: all(t["health"] == "up" for t in
                           http_json(prom + "/api/v1/targets")["data"]["activeTargets"])
               and len(http_json(prom + "/api/v1/targets")["data"]["activeTargets"]) == 2,
               60, every=1, what="both targets up", diag=pg.tail)
    return prom


def record(name: str, out_root: Path, seed: int, scale: float, workdir: Path) -> None:
    sc = SCENARIOS[name]
    if sc.get("intervals"):
        return record_multi(name, out_root, seed, scale, workdir)
    phases_spec = [dict(p, duration=p["duration"] * scale) for p in sc["phases"]]
    out = out_root / name
    pages_dir = workdir / "pages"
    pages_dir.mkdir(parents=True, exist_ok=True)
    groups: List[Group] = []
    began = time.time()
    gen: Optional[LoadGen] = None
    poller: Optional[PagePoller] = None
    try:
        run = start_vllm_and_sidecar(sc["server"], SIDECAR_ARGS, workdir, groups, began)
        prom = start_one_prometheus(run, workdir, groups)
        prompts = Prompts(run.url)
        gen = LoadGen(run.url, prompts, seed)
        warm_up(run.url, prompts, phases_spec)
        time.sleep(SCRAPE * 2)
        poller = PagePoller(run.url, pages_dir)
        t_start = time.time()
        poller.start()
        time.sleep(SCRAPE * 2)  # two idle-ish pages before the first phase
        phases = play_phases(gen, phases_spec)
        time.sleep(SCRAPE * 2)
        stop_poller(poller)
        t_end = time.time()
        time.sleep(SCRAPE + 2)  # one more scrape lands, so the range is fully stored
        gen.stop_all.set()
        rng_s = math.ceil(t_end - t_start) + 1
        log("exporting", rng_s, "s from Prometheus")
        result, om, check, alerts_om = export_range(prom, rng_s, t_end)
        # write the recording
        fresh_dir(out)
        n_pages = pack_pages(pages_dir, out / "pages.tar.gz")
        write_gz(out / "prometheus.om.gz", om)
        write_gz(out / "alerts.om.gz", alerts_om)
        write_gz(out / "requests.csv.gz", requests_csv(gen.results))
        page_times = sorted(float(p.stem) for p in pages_dir.glob("*.prom"))
        meta = {
            "name": name, "recorded": time.strftime("%Y-%m-%d", time.gmtime(t_start)),
            "vllm_version": run.version, "model_name": MODEL, "scrape_interval_s": SCRAPE,
            "start": round(t_start, 3), "end": round(t_end, 3), "onset": onset_of(sc, phases), "phases": phases,
            "pages": {"file": "pages.tar.gz", "count": n_pages, "first": page_times[0], "last": page_times[-1],
                      "poll_failures": len(poller.failures)},
            "prometheus": {"file": "prometheus.om.gz", "series_regex": EXPORT_RE, "series": len(result),
                           "samples": sum(len(s["values"]) for s in result)},
            "target_labels": target_labels(),
            "server_command": server_command(run.vllm_args, run.model), "sidecar_args": SIDECAR_ARGS, "seed": seed,
            "time_scale": scale, "promtool_check": check, "run_seconds": round(time.time() - began),
            "git_commit": git_head() + dirty(),
        }
        finalize(out, meta)
        log_files(out, began)
    finally:
        stop_everything(gen, poller, groups)


# ---------------------------------------------------------------------------------------------
# the recordings at real intervals (one Prometheus per scrape interval)


def start_prometheus_per_interval(sc: dict, run: Started, workdir: Path, groups: List[Group]) -> Dict[int, str]:
    """One Prometheus per scrape interval of the scenario, same targets, same labels, same rules;
    waits until each has both targets up and returns their URLs by interval."""
    proms = {}
    for iv in sc["intervals"]:
        cfg = prometheus_config(vllm_port(run.url), run.sidecar_port, run.rules, float(iv),
                                float(sc["evaluation_interval"]))
        g, prom = start_prometheus(f"{iv}s", workdir, cfg)
        groups.append(g)
        proms[iv] = prom
    for iv, prom in proms.items():
        def up(prom=prom):
            ts = http_json(prom + "/api/v1/targets")["data"]["activeTargets"]
            return len(ts) == 2 and all(t["health"] == "up" for t in ts)
        wait_until(up, 120, every=1, what=f"both targets up ({iv} s)")
    return proms


def write_exports(out: Path, sc: dict, exports: Dict[int, tuple]) -> Dict[str, dict]:
    """Each Prometheus' series and alerts to their own files; returns meta.json's ``prometheus``."""
    prom_meta = {}
    for iv, (result, om, check, alerts_om) in exports.items():
        write_gz(out / f"prometheus-{iv}s.om.gz", om)
        write_gz(out / f"alerts-{iv}s.om.gz", alerts_om)
        prom_meta[str(iv)] = {"file": f"prometheus-{iv}s.om.gz", "alerts_file": f"alerts-{iv}s.om.gz",
                              "scrape_interval_s": iv, "evaluation_interval_s": sc["evaluation_interval"],
                              "series_regex": EXPORT_RE, "series": len(result),
                              "samples": sum(len(x["values"]) for x in result), "promtool_check": check}
    return prom_meta


def record_multi(name: str, out_root: Path, seed: int, scale: float, workdir: Path) -> None:
    """One run, every interval: the sidecar at its default poll, vLLM's page every ``page_every`` s,
    one Prometheus per scrape interval of ``intervals`` (same targets, same labels, same rules
    evaluated every ``evaluation_interval`` s), each exported to its own files."""
    sc = SCENARIOS[name]
    intervals, every = sc["intervals"], sc["page_every"]
    phases_spec = [dict(p, duration=p["duration"] * scale) for p in sc["phases"]]
    out = out_root / name
    pages_dir = workdir / "pages"
    pages_dir.mkdir(parents=True, exist_ok=True)
    groups: List[Group] = []
    began = time.time()
    gen: Optional[LoadGen] = None
    poller: Optional[PagePoller] = None
    try:
        side = multi_sidecar_args(sc)
        run = start_vllm_and_sidecar(sc["server"], side, workdir, groups, began)
        proms = start_prometheus_per_interval(sc, run, workdir, groups)
        prompts = Prompts(run.url)
        gen = LoadGen(run.url, prompts, seed)
        warm_up(run.url, prompts, phases_spec)
        poller = PagePoller(run.url, pages_dir, every=every, timeout=3.0)
        t_start = time.time()
        poller.start()
        time.sleep(max(intervals) * 2)  # two scrapes of the slowest Prometheus before the first phase
        phases = play_phases(gen, phases_spec)
        time.sleep(max(intervals))
        stop_poller(poller)
        t_end = time.time()
        time.sleep(max(intervals) + 2)  # one more scrape of each lands, so the range is fully stored
        gen.stop_all.set()
        rng_s = math.ceil(t_end - t_start) + 1
        exports = {}
        for iv, prom in proms.items():
            log("exporting", rng_s, f"s from the {iv} s Prometheus")
            exports[iv] = export_range(prom, rng_s, t_end)
        fresh_dir(out)
        n_pages = pack_pages(pages_dir, out / "pages.tar.xz")
        prom_meta = write_exports(out, sc, exports)
        write_gz(out / "requests.csv.gz", requests_csv(gen.results))
        page_times = sorted(float(p.stem) for p in pages_dir.glob("*.prom"))
        meta = {
            "name": name, "recorded": time.strftime("%Y-%m-%d", time.gmtime(t_start)),
            "vllm_version": run.version, "model_name": MODEL, "scrape_intervals_s": intervals,
            "page_interval_s": every, "start": round(t_start, 3), "end": round(t_end, 3),
            "onset": onset_of(sc, phases), "phases": phases,
            "pages": {"file": "pages.tar.xz", "count": n_pages, "first": page_times[0], "last": page_times[-1],
                      "poll_failures": len(poller.failures),
                      "raw_bytes": sum(p.stat().st_size for p in pages_dir.glob("*.prom"))},
            "prometheus": prom_meta,
            "target_labels": target_labels(),
            "server_command": server_command(run.vllm_args, run.model), "sidecar_args": side, "seed": seed,
            "time_scale": scale, "run_seconds": round(time.time() - began), "git_commit": git_head() + dirty(),
            "load_average_during": [round(x, 1) for x in os.getloadavg()],
        }
        (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")  # `reprocess` redoes the rest
        finalize(out, meta)
        log_files(out, began)
    finally:
        stop_everything(gen, poller, groups)


# ---------------------------------------------------------------------------------------------
# the files of a recording


def pack_pages(src: Path, dst: Path) -> int:
    """pages/<t>.prom in a tar, gzip (``.tar.gz``) or xz (``.tar.xz``: 1 s pages differ little from one
    to the next, and xz's window spans many of them where gzip's 32 KB holds less than one page)."""
    files = sorted(src.glob("*.prom"), key=lambda p: float(p.stem))
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for p in files:
            info = tarfile.TarInfo("pages/" + p.name)
            data = p.read_bytes()
            info.size, info.mtime, info.mode = len(data), int(float(p.stem)), 0o644
            tar.addfile(info, io.BytesIO(data))
    if dst.name.endswith(".xz"):
        import lzma
        dst.write_bytes(lzma.compress(raw.getvalue(), preset=6))
        return len(files)
    with open(dst, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", compresslevel=9, mtime=0, filename="") as gz:
        gz.write(raw.getvalue())
    return len(files)


def write_gz(path: Path, text: str) -> None:
    with open(path, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb", compresslevel=9, mtime=0, filename="") as gz:
        gz.write(text.encode())


def multi_sidecar_args(sc: dict) -> List[str]:
    """The sidecar as a deployment runs it: its default poll interval and window, no GPU here, and
    vLLM's --max-num-seqs when the server has one (the operator knows it)."""
    args = ["--gpu", "none"]
    mns = flag_value(sc["server"], "--max-num-seqs")
    return args + (["--max-num-seqs", mns] if mns else [])


def finalize(out: Path, meta: dict) -> None:
    """(Re)computes every derived fact from the recording's own files and writes meta.json and
    PROVENANCE.md. `reprocess NAME` calls it on a committed recording."""
    if "scrape_intervals_s" in meta:
        meta["pages"]["xz_bytes"] = (out / meta["pages"]["file"]).stat().st_size
        return finalize_multi(out, meta)
    sc = SCENARIOS[meta["name"]]
    om = gzip.decompress((out / "prometheus.om.gz").read_bytes()).decode()
    alerts_om = gzip.decompress((out / "alerts.om.gz").read_bytes()).decode()
    data = parse_om(om)
    meta["facts"] = server_facts(data, meta["phases"])
    meta["client"] = client_stats(load_results(out / "requests.csv.gz"), meta["phases"])
    meta["alerts"] = alert_facts(alerts_om)
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    (out / "PROVENANCE.md").write_text(provenance(sc, meta))


def finalize_multi(out: Path, meta: dict) -> None:
    sc = SCENARIOS[meta["name"]]
    meta["facts"] = {"pages": server_facts(pages_data(out / meta["pages"]["file"]), meta["phases"])}
    meta["alerts"] = {}
    for iv, pm in meta["prometheus"].items():
        om = gzip.decompress((out / pm["file"]).read_bytes()).decode()
        meta["facts"][f"{iv}s"] = server_facts(parse_om(om), meta["phases"])
        meta["alerts"][f"{iv}s"] = alert_facts(gzip.decompress((out / pm["alerts_file"]).read_bytes()).decode())
    meta["client"] = client_stats(load_results(out / "requests.csv.gz"), meta["phases"])
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    (out / "PROVENANCE.md").write_text(provenance_multi(sc, meta))


def reprocess(args) -> None:
    if args.name == "bench":
        (Path(args.out_bench) / "PROVENANCE.md").write_text(bench_provenance(Path(args.out_bench)))
        log("rewrote", Path(args.out_bench) / "PROVENANCE.md")
        return
    out = Path(args.out) / args.name
    meta = json.loads((out / "meta.json").read_text())
    for k in ("facts", "client", "alerts"):
        meta.pop(k, None)
    finalize(out, meta)
    log("rewrote", out / "meta.json", "and", out / "PROVENANCE.md")
