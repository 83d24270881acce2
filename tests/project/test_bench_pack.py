"""The pack-cost benchmark's own parts (bench/bench_pack.py), so that it keeps running as the code
changes: its fleet, its Prometheus configuration, a pod's pages, the backfill and the probe's
fill-ins. No timing here; the figures are in docs/performance.md ("The pack on Prometheus")."""

import pytest

from bench import bench_pack as bp


def test_the_fleet_has_distinct_pods_over_three_models_and_varied_load():
    specs = bp.fleet_specs(100)
    assert len({s.pod for s in specs}) == 100
    assert len({(s.namespace, s.model) for s in specs}) == 3
    loads = [s.load for s in specs]
    assert loads.count("idle") == 10 and loads.count("busy") == 10
    assert loads.count("kv-thrashing") == 1 and loads.count("long-prompt-storm") == 1


def test_each_pod_is_its_own_target_with_its_own_labels():
    pods = [dict(vars(s), vllm_port=20000 + 2 * s.index, sidecar_port=20001 + 2 * s.index) for s in bp.fleet_specs(12)]
    cfg = bp.prom_config(pods, 15, [])
    for job in cfg["scrape_configs"]:
        targets = [sc["targets"][0] for sc in job["static_configs"]]
        labels = [(sc["labels"]["namespace"], sc["labels"]["pod"]) for sc in job["static_configs"]]
        assert len(set(targets)) == len(set(labels)) == 12
        # vLLM's targets carry the sidecar label the deploy monitors write (every pod here has a sidecar)
        marked = {sc["labels"].get(bp.SIDECAR_LABEL) for sc in job["static_configs"]}
        assert marked == ({"true"} if job["job_name"] == "vllm" else {None})


def test_a_pods_pages_parse_and_advance():
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_families
    from prometheus_client.parser import text_string_to_metric_families

    pod = bp.Pod(bp.fleet_specs(5)[4], tick=5)  # pod 4: 2 % of its HTTP answers are 5xx
    for _ in range(30):
        pod.sim.step(1.0)
    pod.text = pod._page()
    pod.sidecar.poll_once()
    pod.version += 1
    vllm, _ = pod.body("vllm", "", gz=False)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in text_string_to_metric_families(vllm.decode()) for s in f.samples}
    ok = samples[("http_requests_total", (("handler", "/v1/completions"), ("method", "POST"), ("status", "2xx")))]
    bad = samples[("http_requests_total", (("handler", "/v1/completions"), ("method", "POST"), ("status", "5xx")))]
    assert ok + bad == pytest.approx(pod.sim.c["stop"] + pod.sim.c["length"], abs=0.2) and ok + bad > 0
    assert {s.labels["model_name"] for f in text_string_to_metric_families(vllm.decode()) for s in f.samples
            if s.name == "vllm:num_requests_running"} == {pod.spec.model}
    om, ctype = pod.body("sidecar", "application/openmetrics-text; version=1.0.0", gz=False)
    assert ctype.startswith("application/openmetrics-text")
    names = {f.name for f in om_families(om.decode())}
    assert "vllm_sidecar_build_info" in names and "vllm_sidecar_gpu_mean_utilization_ratio" in names


def test_backfill_is_openmetrics_the_loader_reads():
    from exporter.analysis.sources import load_openmetrics

    series = {"namespace_model:x:rate5m": [({"namespace": "a", "model_name": "m"}, None)],
              "vllm:num_requests_running": [({"job": "vllm", "instance": "i:1", "pod": "p"}, 3.0)]}
    text, n = bp.backfill_text({"namespace_model:x:rate5m": 3600, "vllm:num_requests_running": 600}, series,
                               ["namespace_model:x:rate5m"], end=1_800_000_000, scrape_s=15, eval_s=30)
    assert n == (3600 + 600) // 30 + (600 + 600) // 15
    store = load_openmetrics(text.encode()).store
    assert len(list(store)) == 2


def test_a_recorded_series_that_needs_history_is_filled_in_per_level():
    exprs = {"a:x:rate": "sum by (pod) (x)",
             "ns_pod_model:held:min10m": "min_over_time(a:x:rate[10m]) and (a:x:rate offset 10m)",
             "ns_model:best:max": "max by (ns) (ns_pod_model:held:min10m)",
             "ns_model:best:max14d": "max_over_time(ns_model:best:max[14d])"}
    assert [n for n in exprs if bp.needs_history(n, exprs)] == list(exprs)[1:]
    pods = [{"namespace": "a", "pod": f"p{i}", "model": "m" if i < 3 else "n"} for i in range(5)]
    assert bp.level_label_sets("namespace_model:x:y", pods) == [{"namespace": "a", "model_name": "m"},
                                                                {"namespace": "a", "model_name": "n"}]
    assert len(bp.level_label_sets("namespace_pod_model:x:y", pods)) == 5


def test_the_backfilled_past_holds_nothing_back():
    """The made-up past of a recorded series: no request held back, nobody waiting, every boolean
    signal off, so the alerts that read a long window fire on the live fleet's trouble only."""
    for name in ("namespace_pod_model:vllm_requests_held_back:avg_over_time2m",
                 "namespace_pod_model:vllm_requests_held_back_firm:bool",
                 "namespace_pod_model:vllm_requests_waiting:sum"):
        assert {bp._series_value(name, name + "{pod=\"a\"}", t) for t in range(0, 86400, 3600)} == {0.0}
    assert bp._series_value("namespace_model:vllm_generation_tokens:rate5m", "k", 0.0) > 0
