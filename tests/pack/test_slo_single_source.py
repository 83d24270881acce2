"""The SLO file is the one place a threshold or a window is written.

Render the whole pack (rules, runbooks) and build the sidecar's configuration from an SLO file in
which every value differs from the defaults, then look for the defaults: none may survive
anywhere. A value that survives is text some module wrote itself instead of reading the SLO.
"""

import re

import yaml

from conftest import ROOT
from exporter.pack.rules import rendered_files
from exporter.runtime import config
from exporter.slo import defaults, load_slo, seconds

# every leaf changed, to values that occur nowhere among the defaults
CHANGED = """
selector: 'namespace="prod"'
replica_labels: [cluster, namespace, pod]
runbook_base_url: https://runbooks.example.org/llm
evaluation_interval: 40s
views_interval: 170s
steady_interval: 85s
steady_for: 57m
slow_interval: 190s
slow_for: 59m
windows: {rate: 4m, sustain: 90s, sidecar: 45s, queue_growth: 7m, hardware_errors: 13m, target_seen: 2h,
          startup: 19m, held_back: 100s, held_back_sparse: 11m, batch_peak: 20h, baseline: 36h, baseline_offset: 25m,
          baseline_edge: 50m, episode: 35m, episode_recent: 12m, preemptions: 6m,
          history_from: 30h, history_step: 90m, quantile_step: 7m}
labels: {team: llm-serving}
objectives: {ttft_mean_seconds: 1.25, ttft_p95_seconds: 2.25, output_tokens_per_second: 40, availability: 0.9975}
availability_sli: engine
burn_rates:
  page: [{long: 2h, short: 7m, factor: 13}, {long: 8h, short: 40m, factor: 4.5}]
  ticket: [{long: 4d, short: 9h, factor: 1.5}]
kv_cache: {warn: 0.87, critical: 0.93, held_back_share: 0.8, held_back_scrapes: 7, batch_room: 0.85, max_num_seqs: 24,
          episode_share: 0.17, episode_gate: 0.04}
preemptions: {min_events: 7, episode_events: 9}
long_prompt: {tokens: 7000, surge_factor: 3.5, min_per_second: 0.07, min_count: 11, baseline_quantile: 0.92, floor_share: 0.18}
queue: {min_waiting: 12}
prefix_cache: {min_hit_ratio: 0.35, fleet_factor: 0.55, warmup: 50m}
error_ratio: {max: 0.04, page: 0.27, page_min_per_second: 0.06}
outlier: {throughput_factor: 0.45, ttft_factor: 2.5, min_replicas: 7}
gpu_busy_low: {busy_utilization: 0.85, low_throughput_fraction: 0.35, throughput_floor: 12,
               baseline_horizon: 4h, baseline_quantile: 0.85, baseline_min_busy: 20m}
stall: {after: 45s}
gpu: {fatal_xids: [31, 43]}
capacity: {sustain: 7m, history: 9d, peak_window: 5h, headroom: 0.35, prefill_weight: 0.15,
           prefill_tokens_per_second: 9100, decode_tokens_per_second: 810}
disaggregation: {transfer_failure_ratio: 0.07, min_failures_per_second: 0.02, recompute_share: 0.65,
                 transfer_ttft_share: 0.44, expired_share: 0.13, expired_per_second: 0.03, saturated_waiting: 3.5,
                 room_waiting: 0.35, room_load: 0.65}
speculative: {planned_speedup: 1.85, low_factor: 0.55}
cost: {unit: replica_hour, prices: {reserved: 7.5, on_demand: 11.5, spot: 4.5}, fleet: on_demand, gpus_per_replica: 4,
       spot_share: 0.45, monthly_fixed: 650, monthly_budget: 21000, hours_per_month: 720}
gate: {max_regression: 0.15, min_effect_ms: 3}
"""

# constants that are not SLO values: quantile labels and the median of the outlier rule
# constants that are not SLO values: quantile labels, the outlier rule's median, the 30-day SLO
# period the burn factors assume, Prometheus' lookback (the targets seen since the slow group's
# last evaluation: slo.LOOKBACK_S), and lines recounting the user's own incident and tuning
NOT_SLO = re.compile(r'quantile="[0-9.]+"|quantile: \'[0-9.]+\'|histogram_quantile\((0\.5|0\.95|0\.99)|'
                     r'\(0\.5, |quantile[ =]0\.\d+|p95|p50|p99|le="\+Inf"|30-day|[^\n]*user\'s[^\n]*|'
                     r'vllm_scrape_target:present\[5m\]')


def _changed_slo(tmp_path):
    text = CHANGED + "alerts:\n" + "".join(
        f"  {name}: {{for: {41 + i}m, keep_firing_for: {71 + i}m}}\n" for i, name in enumerate(defaults()["alerts"]))
    f = tmp_path / "slo.yaml"
    f.write_text(text)
    return f


def _default_forms():
    """How each default value would read if a module had written it itself."""
    d = defaults()
    forms = {}

    def number(path, v):
        if v < 1:
            forms[path] = {f"{v:g}", f"{v * 100:g}%"}
        elif v != int(v):
            forms[path] = {f"{v:g}"}
        elif v >= 100:
            forms[path] = {f"{v:g}", f"{v:,.0f}"}
        else:  # a small whole number is only a default where it reads as a threshold
            n = f"{v:g}"
            forms[path] = {f"> {n}", f">= {n}", f"{n} *", f"({n})", f"{n}x", f"{n} s", f"{n} tokens"}

    def duration(path, v):
        n, unit = int(v[:-1]), v[-1]
        words = {"s": "second", "m": "minute", "h": "hour", "d": "day"}
        forms[path] = {v, f"{n} {words[unit]}{'' if n == 1 else 's'}", f"rate{v}"}

    for sec, body in d.items():
        if not isinstance(body, dict) or sec == "alerts":
            continue
        for k, v in body.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                if v == 0:  # 0 is "not given" (kv_cache.max_num_seqs), not a threshold
                    continue
                number(f"{sec}.{k}", v)
            elif isinstance(v, str) and re.fullmatch(r"\d+[smhd]", v):
                duration(f"{sec}.{k}", v)
    for name, s in d["alerts"].items():
        for key in ("for", "keep_firing_for"):
            if s.get(key, "0m") not in ("0m", "0s"):
                duration(f"alerts.{name}.{key}", s[key])
    for kind in ("page", "ticket"):
        for i, pair in enumerate(d["burn_rates"][kind]):
            duration(f"burn_rates.{kind}.{i}.long", pair["long"])
            duration(f"burn_rates.{kind}.{i}.short", pair["short"])
            forms[f"burn_rates.{kind}.{i}.factor"] = {f"{pair['factor']:g}x", f"{pair['factor']:g} times"}
    forms["gpu.fatal_xids"] = {"|".join(str(x) for x in d["gpu"]["fatal_xids"])}
    forms["replica_labels"] = {"namespace_pod_model", "by (namespace, pod,"}
    if d["runbook_base_url"]:
        forms["runbook_base_url"] = {d["runbook_base_url"]}
    forms["long_prompt.tokens"] |= {'le="5000.0"', "4,000"}
    return forms


def test_no_default_survives_a_changed_slo_file(tmp_path):
    slo = load_slo(str(_changed_slo(tmp_path)))
    files = rendered_files(slo)
    survivors = []
    for path, forms in _default_forms().items():
        for rel, text in files.items():
            body = NOT_SLO.sub(" ", text)
            for form in forms:
                pattern = r"(?<![\w.])" + re.escape(form) + (r"(?![\w]|\.\d)" if form[-1].isalnum() else "")
                if re.search(pattern, body):
                    line = next(ln for ln in body.splitlines() if re.search(pattern, ln))
                    survivors.append(f"{rel}: default {path} as {form!r}: {line.strip()[:140]}")
    assert not survivors, "defaults written outside the SLO file:\n" + "\n".join(sorted(set(survivors))[:40])


def test_the_changed_values_reach_every_file(tmp_path):
    slo = load_slo(str(_changed_slo(tmp_path)))
    files = rendered_files(slo)
    rules = files["rules/vllm.rules.yml"]
    assert "cluster_namespace_pod_model:vllm_generation_tokens:rate4m" in rules
    assert "cluster_namespace_model:vllm_availability_errors:ratio_rate2h" in rules
    assert 'xid=~"31|43"' in rules and "[13m]" in rules and "[2h]" in rules
    assert "[36h:90m] offset 25m" in rules and "[36h:7m] offset 25m" in rules
    assert "https://runbooks.example.org/llm/VLLMTTFTHigh.md" in rules
    books = "".join(t for rel, t in files.items() if rel.startswith("docs/runbooks/"))
    for needle in ("rate4m", "90s", "2.25 s", "0.93", "7 minutes", "13x", "99.75%"):
        assert needle in books, needle
    data = yaml.safe_load(rules)
    fors = {r["alert"]: r["for"] for r in data["groups"][0]["rules"] if "alert" in r}
    assert fors["VLLMKVCacheExhausted"] == "41m"
    # the alerts that wait slow_for (59m) or longer run in the slow group, every slow_interval
    slow = next(g for g in data["groups"] if g["name"].endswith("-slow"))
    assert slow["interval"] == "190s" and all(seconds(r["for"]) >= 59 * 60 for r in slow["rules"] if "alert" in r)
    # ... and those that wait steady_for (57m) or longer, but less, in the steady group, every steady_interval
    steady = next(g for g in data["groups"] if g["name"].endswith("-steady"))
    waits = [seconds(r["for"]) for r in steady["rules"] if "alert" in r]
    assert steady["interval"] == "85s" and waits and all(57 * 60 <= w < 59 * 60 for w in waits)
    assert "interval: 85s" in files["rules/vllm.vmalert.rules.yml"]
    assert "interval: 85s" in files["deploy/kubernetes/base/prometheusrule.yaml"]
    assert "interval: 190s" in files["rules/vllm.vmalert.rules.yml"]
    assert "interval: 190s" in files["deploy/kubernetes/base/prometheusrule.yaml"]


def test_the_sidecar_reads_the_same_file(tmp_path):
    f = _changed_slo(tmp_path)
    c = config.build({"slo": str(f)}, {})
    assert (c.window, c.kv_warn_threshold, c.stall_seconds, c.busy_utilization, c.low_throughput_fraction,
            c.throughput_floor, c.baseline_horizon, c.baseline_quantile, c.baseline_min_seconds,
            c.long_prompt_tokens, c.slo_ttft_p95_seconds, c.slo_output_tokens_per_second) == (
        45.0, 0.87, 45.0, 0.85, 0.35, 12, 4 * 3600.0, 0.85, 1200.0, 7000, 2.25, 40)


def _keys_written_twice(node) -> list:
    """Every key written twice in one mapping of a composed YAML document, with where."""
    out = []
    if isinstance(node, yaml.MappingNode):
        keys = [k.value for k, _ in node.value]
        out += [f"line {node.start_mark.line + 1}: {k}" for k in sorted({k for k in keys if keys.count(k) > 1})]
        out += [x for _, v in node.value for x in _keys_written_twice(v)]
    elif isinstance(node, yaml.SequenceNode):
        out += [x for v in node.value for x in _keys_written_twice(v)]
    return out


def test_the_slo_file_writes_each_key_once():
    """PyYAML keeps the last of a key written twice; yamllint and Go's yaml.v3 (a ConfigMap's
    reader) reject the file. The built-in SLO file and the rendered rule files write each once."""
    for rel in ("exporter/slo.yaml", "rules/vllm.rules.yml", "rules/vllm.vmalert.rules.yml"):
        assert not _keys_written_twice(yaml.compose((ROOT / rel).read_text())), rel
    assert _keys_written_twice(yaml.compose("a: 1\nb: {c: 1, c: 2}\n")) == ["line 2: c"]
