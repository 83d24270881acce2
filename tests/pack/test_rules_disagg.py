"""`promtool test rules` for the prefill/decode and speculative-decoding alerts, in the style of
test_rules_promtool.py: each fires on its bad case and stays silent on a busy healthy prefill
instance, a healthy decode instance, a sleeping engine and a replica of role "both".

Input series are shaped like real vLLM 0.33 (``vllm:nixl_*`` with ``_total`` on counters, the
NIXL transfer-time buckets as vLLM writes them, ``vllm:prompt_tokens_by_source_total{source}``,
``vllm:spec_decode_*_total``, ``vllm:engine_sleep_state{sleep_state}``) and like the sidecar's
series (``vllm_sidecar_role_info{role}`` per pod, the derived ones per ``model_name``)."""

import pytest

from promseries import (
    counter,
    expect,
    fmt_series,
    gauge,
    rules_by_alert,
    run_promtool,
    series,
    sidecar_labels,
    values,
    vllm_labels,
)

pytestmark = pytest.mark.prometheus

N = 40
DAY = 24 * 60
NS = "llm"
MODEL = "llama-70b"
# vLLM 0.33's NIXL transfer-time buckets (nixl/stats.py), as prometheus_client writes them
XFER_BOUNDS = ("0.005", "0.01", "0.025", "0.05", "0.075", "0.1", "0.2", "0.3", "0.5", "0.75", "1.0", "5.0", "+Inf")


def case(series_list, evals, interval="1m"):
    return {"interval": interval, "input_series": series_list, "alert_rule_test": evals}


def at(minute, alert, *alerts):
    return {"eval_time": f"{minute}m", "alertname": alert, "exp_alerts": list(alerts)}


def quiet(minute, alert):
    return at(minute, alert)


def W(pod):
    return {"namespace": NS, "pod": pod, "model_name": MODEL}


def fail(alert, pod, signal, value):
    return expect_signal(alert, {**W(pod), "signal": signal}, value)


def expect_signal(alert, labels, value):
    """``expect`` for the rule of ``alert`` whose ``signal`` label is the one in ``labels`` (an
    alert with one rule per signal, each its own description)."""
    rules = [r for r in rules_by_alert()[alert] if r["labels"].get("signal") == labels["signal"]]
    assert len(rules) == 1, (alert, labels)
    return expect(alert, {k: v for k, v in labels.items() if k != "signal"}, value, rules={alert: rules})


def pct(v):
    """Prometheus' humanizePercentage (%.4g of the percentage)."""
    return f"{v * 100:.4g}%"


def role(pod, r, minutes=N):
    """The sidecar of ``pod`` says its role."""
    return [series("vllm_sidecar_role_info", sidecar_labels(pod=pod, role=r), gauge(lambda m: 1, minutes))]


def alive(pod, running=8, minutes=N, sleeping=lambda m: False):
    """What every vLLM serves: the running requests and (0.33) its sleep state."""
    v = vllm_labels(pod=pod)
    return [series("vllm:num_requests_running", v, gauge(lambda m: 0 if sleeping(m) else running, minutes)),
            series("vllm:engine_sleep_state", {**v, "sleep_state": "awake"}, gauge(lambda m: 0 if sleeping(m) else 1, minutes)),
            series("vllm:engine_sleep_state", {**v, "sleep_state": "weights_offloaded"},
                   gauge(lambda m: 1 if sleeping(m) else 0, minutes)),
            series("vllm:engine_sleep_state", {**v, "sleep_state": "discard_all"}, gauge(lambda m: 0, minutes))]


def nixl(pod, done_per_min, failed_per_min=lambda m: 0, minutes=N):
    """NIXL's counters: transfers done (the transfer-time histogram's count) and failed."""
    v = vllm_labels(pod=pod)
    return [series("vllm:nixl_xfer_time_seconds_count", v, counter(done_per_min, minutes)),
            series("vllm:nixl_num_failed_transfers_total", v, counter(failed_per_min, minutes))]


def xfer_histogram(pod, seconds, per_min=60, minutes=N):
    v = vllm_labels(pod=pod)
    out = []
    for b in XFER_BOUNDS:
        ub = float("inf") if b == "+Inf" else float(b)
        out.append({"series": fmt_series("vllm:nixl_xfer_time_seconds_bucket", {**v, "le": b}),
                    "values": values(counter(lambda m, ub=ub: per_min if seconds <= ub else 0, minutes))})
    out.append(series("vllm:nixl_xfer_time_seconds_count", v, counter(lambda m: per_min, minutes)))
    out.append(series("vllm:nixl_xfer_time_seconds_sum", v, counter(lambda m: per_min * seconds, minutes)))
    return out


def by_source(pod, local, external, cached, minutes=N):
    """vLLM's prompt tokens by source per minute (``local(m)`` computed, ``external(m)`` by KV transfer)."""
    v = vllm_labels(pod=pod)
    return [series("vllm:prompt_tokens_by_source_total", {**v, "source": "local_compute"}, counter(local, minutes)),
            series("vllm:prompt_tokens_by_source_total", {**v, "source": "external_kv_transfer"}, counter(external, minutes)),
            series("vllm:prompt_tokens_by_source_total", {**v, "source": "local_cache_hit"},
                   counter(lambda m: cached, minutes))]


def healthy_decode(pod="vllm-d0", minutes=N):
    """A decode instance: its prompts arrive by transfer (a warm prefix cache holds most of them),
    it computes one token each, transfers never fail."""
    return (role(pod, "decode", minutes) + alive(pod, minutes=minutes) + nixl(pod, lambda m: 60, minutes=minutes)
            + by_source(pod, lambda m: 60, lambda m: 6000, 24000, minutes))


def busy_prefill(pod="vllm-p0", minutes=N):
    """A prefill instance at work: every prompt token computed here, none arrives by transfer."""
    return role(pod, "prefill", minutes) + alive(pod, running=32, minutes=minutes) + by_source(
        pod, lambda m: 60000, lambda m: 0, 30000, minutes)


def role_both(pod="vllm-0", minutes=N):
    """A replica without a sidecar (role "both"): no connector, every uncached token computed."""
    return alive(pod, minutes=minutes) + by_source(pod, lambda m: 20000, lambda m: 0, 10000, minutes)


def sleeping(pod="vllm-d0", minutes=N, since=0):
    """A decode instance asleep (level 1) from minute ``since``; the bad signals these cases give
    it while asleep must not fire."""
    return role(pod, "decode", minutes) + alive(pod, minutes=minutes, sleeping=lambda m: m >= since)


QUIET_SHAPES = {"busy prefill": busy_prefill, "healthy decode": healthy_decode, "role both": role_both}


def quiet_cases(alert, extra=(), minutes=(10, 20, 35)):
    out = [case(shape(), [quiet(m, alert) for m in minutes]) for shape in QUIET_SHAPES.values()]
    return out + [case(list(e), [quiet(m, alert) for m in minutes]) for e in extra]


CASES = {}

CASES["VLLMKVTransferFailing"] = [
    # a decode instance's transfers fail from minute 10 (half of them): pages within 5 minutes
    case(role("vllm-d0", "decode") + alive("vllm-d0") + nixl("vllm-d0", lambda m: 60, lambda m: 60 if m > 10 else 0),
         [quiet(10, "VLLMKVTransferFailing"),
          at(15, "VLLMKVTransferFailing", fail("VLLMKVTransferFailing", "vllm-d0", "failed", pct(0.5)))]),
    # ... a pod without a sidecar (role both) whose transfers fail: explicit failures count for any role
    case(alive("vllm-0") + nixl("vllm-0", lambda m: 60, lambda m: 60 if m > 10 else 0),
         [at(15, "VLLMKVTransferFailing", fail("VLLMKVTransferFailing", "vllm-0", "failed", pct(0.5)))]),
    # ... the sidecar's ratio where it serves one
    case(role("vllm-d0", "decode") + alive("vllm-d0")
         + [series("vllm_sidecar_kv_transfer_failure_ratio", sidecar_labels(pod="vllm-d0", model_name=MODEL),
                   gauge(lambda m: 0.4 if m >= 10 else 0, N)),
            series("vllm_sidecar_kv_transfer_failures_per_second",
                   sidecar_labels(pod="vllm-d0", model_name=MODEL, kind="transfer"), gauge(lambda m: 0.5 if m >= 10 else 0, N))],
         [quiet(9, "VLLMKVTransferFailing"),
          at(12, "VLLMKVTransferFailing", fail("VLLMKVTransferFailing", "vllm-d0", "failed", pct(0.4)))]),
    # silent failure: from minute 10 the decode instance's prompts stop arriving by transfer and it
    # computes them itself (no failure counted anywhere)
    case(role("vllm-d0", "decode") + alive("vllm-d0") + nixl("vllm-d0", lambda m: 60 if m <= 10 else 0)
         + by_source("vllm-d0", lambda m: 60 if m <= 10 else 6060, lambda m: 6000 if m <= 10 else 0, 24000),
         [quiet(10, "VLLMKVTransferFailing"),
          at(15, "VLLMKVTransferFailing", fail("VLLMKVTransferFailing", "vllm-d0", "recomputed", pct(1)))]),
    # one failure among a few transfers is no page
    case(role("vllm-d0", "decode") + alive("vllm-d0") + nixl("vllm-d0", lambda m: 1, lambda m: 1 if m == 12 else 0),
         [quiet(m, "VLLMKVTransferFailing") for m in (13, 15, 20)]),
] + quiet_cases("VLLMKVTransferFailing", extra=[
    # asleep: the transfers it tried before it slept failed; it sleeps now
    sleeping() + nixl("vllm-d0", lambda m: 60, lambda m: 60),
])

CASES["VLLMKVTransferSlow"] = [
    # every transfer takes 2 s: p95 in NIXL's (1.0, 5.0] bucket, 1 + 4 x 0.95 = 4.8 s, over half the 3 s objective
    case(role("vllm-d0", "decode") + alive("vllm-d0") + xfer_histogram("vllm-d0", 2.0),
         [at(20, "VLLMKVTransferSlow", expect("VLLMKVTransferSlow", {**W("vllm-d0"), "quantile": "0.95"}, "4.8s"))]),
    # the sidecar's quantile
    case(role("vllm-d0", "decode") + alive("vllm-d0")
         + [series("vllm_sidecar_kv_transfer_seconds", sidecar_labels(pod="vllm-d0", model_name=MODEL, quantile="0.95"),
                   gauge(lambda m: 2, N)),
            series("vllm_sidecar_kv_transfers_per_second", sidecar_labels(pod="vllm-d0", model_name=MODEL),
                   gauge(lambda m: 1, N))],
         [at(20, "VLLMKVTransferSlow", expect("VLLMKVTransferSlow", {**W("vllm-d0"), "quantile": "0.95"}, "2s"))]),
] + quiet_cases("VLLMKVTransferSlow", extra=[
    role("vllm-d0", "decode") + alive("vllm-d0") + xfer_histogram("vllm-d0", 0.04),  # 40 ms transfers
    sleeping() + xfer_histogram("vllm-d0", 2.0),
])


def expired(pod, per_min, finished_per_min=480, minutes=N):
    """A prefill instance's expired KV leases per minute, and the requests it finishes (each at its
    prefill: the prompt-length histogram's count)."""
    v = vllm_labels(pod=pod)
    return [series("vllm:nixl_num_kv_expired_reqs_total", v, counter(per_min, minutes)),
            series("vllm:request_prompt_tokens_count", v, counter(lambda m: finished_per_min, minutes))]


CASES["VLLMKVLeasesExpiring"] = [
    # the decode side reads late: a quarter of the prefill instance's leases expire
    case(busy_prefill() + expired("vllm-p0", lambda m: 120),
         [at(20, "VLLMKVLeasesExpiring", expect("VLLMKVLeasesExpiring", W("vllm-p0"), pct(0.25)))]),
    # a few % expire on a healthy prefill instance (clients gone before decode read): quiet
    case(busy_prefill() + expired("vllm-p0", lambda m: 18), [quiet(m, "VLLMKVLeasesExpiring") for m in (12, 20, 35)]),
    # one expiry is not sustained
    case(busy_prefill() + expired("vllm-p0", lambda m: 1 if m == 10 else 0, finished_per_min=2),
         [quiet(m, "VLLMKVLeasesExpiring") for m in (12, 20)]),
] + quiet_cases("VLLMKVLeasesExpiring", extra=[sleeping("vllm-p0") + expired("vllm-p0", lambda m: 120)])


def side_fleet(prefill_waiting, decode_waiting, decode_kv=0.3, roles=("prefill", "decode", "decode"), minutes=N):
    """One model on one prefill and two decode instances (``roles``), with requests waiting for
    capacity per instance of each side."""
    out = []
    for i, r in enumerate(roles):
        pod = f"vllm-{r[0]}{i}"
        v = vllm_labels(pod=pod)
        waiting = prefill_waiting if r == "prefill" else decode_waiting
        out += role(pod, r, minutes) + alive(pod, minutes=minutes) + [
            series("vllm:num_requests_waiting_by_reason", {**v, "reason": "capacity"},
                   gauge(lambda m, w=waiting: w(m), minutes)),
            series("vllm:kv_cache_usage_perc", v, gauge(lambda m, r=r: decode_kv if r == "decode" else 0.2, minutes)),
            series("vllm:prompt_tokens_total", v, counter(lambda m, r=r: 60000 if r == "prefill" else 0, minutes)),
            series("vllm:generation_tokens_total", v, counter(lambda m, r=r: 6000 if r == "decode" else 60, minutes))]
    return out


MS = {"namespace": NS, "model_name": MODEL}
CASES["VLLMDisaggregationImbalance"] = [
    # long prompts flood the prefill side from minute 5: 8 waiting there, none on decode
    case(side_fleet(lambda m: 8 if m >= 5 else 0, lambda m: 0),
         [quiet(10, "VLLMDisaggregationImbalance"),
          at(20, "VLLMDisaggregationImbalance", expect("VLLMDisaggregationImbalance", {**MS, "scale_side": "prefill"}, "8"))]),
    # the decode side saturated (cache full, 6 waiting each), prefill keeps up
    case(side_fleet(lambda m: 0, lambda m: 6, decode_kv=0.97),
         [at(20, "VLLMDisaggregationImbalance", expect("VLLMDisaggregationImbalance", {**MS, "scale_side": "decode"}, "6"))]),
    # the decode side ran saturated for 20 minutes at 6,000 output tokens a minute per instance (what
    # one carries, learned); later the prefill side queues while decode runs at that same rate with
    # no queue: decode has no room either, quiet (with no such history it names prefill, above)
    case(side_fleet(lambda m: 8 if m >= 25 else 0, lambda m: 6 if m < 20 else 0, minutes=70),
         [quiet(m, "VLLMDisaggregationImbalance") for m in (45, 55, 65)]),
    # both sides saturated: scaling one side does not help, not this alert's business
    case(side_fleet(lambda m: 8, lambda m: 6, decode_kv=0.97), [quiet(20, "VLLMDisaggregationImbalance")]),
    # a fleet of role both (no sidecar says otherwise) with a queue: no sides to compare
    case(side_fleet(lambda m: 8, lambda m: 0, roles=("both", "both", "both")), [quiet(20, "VLLMDisaggregationImbalance")]),
    # the busy prefill instance has two requests waiting for its next step at every scrape (as
    # vLLM 0.33's prefill page shows), decode keeps up: balanced
    case(side_fleet(lambda m: 2, lambda m: 0), [quiet(m, "VLLMDisaggregationImbalance") for m in (10, 20, 35)]),
    # a decode instance asleep with requests queued at it is not a saturated side
    case(side_fleet(lambda m: 0, lambda m: 6, decode_kv=0.97, roles=("prefill", "decode"))
         + [series("vllm:engine_sleep_state", {**vllm_labels(pod="vllm-d1"), "sleep_state": "awake"}, gauge(lambda m: 0, N))],
         [quiet(20, "VLLMDisaggregationImbalance")]),
]


def spec(pod, drafts, draft_tokens, accepted, minutes=N):
    v = vllm_labels(pod=pod)
    return [series("vllm:spec_decode_num_drafts_total", v, counter(drafts, minutes)),
            series("vllm:spec_decode_num_draft_tokens_total", v, counter(draft_tokens, minutes)),
            series("vllm:spec_decode_num_accepted_tokens_total", v, counter(accepted, minutes))]


CASES["VLLMSpecDecodeAcceptanceLow"] = [
    # 3 draft tokens a step, 0.5 accepted per draft: 1.5 tokens per verify step, under the planned 1.7x
    case(healthy_decode() + spec("vllm-d0", lambda m: 600, lambda m: 1800, lambda m: 300),
         [at(20, "VLLMSpecDecodeAcceptanceLow",
             expect_signal("VLLMSpecDecodeAcceptanceLow", {**W("vllm-d0"), "signal": "accepted_length"}, "1.5"))]),
    # a day at 70 % acceptance, then 30 % (1.9 tokens a step: the plan still holds, the model's normal does not)
    case(alive("vllm-0", minutes=DAY + 40)
         + spec("vllm-0", lambda m: 600, lambda m: 1800, lambda m: 1260 if m <= DAY else 540, minutes=DAY + 40),
         [quiet(DAY, "VLLMSpecDecodeAcceptanceLow"),
          at(DAY + 30, "VLLMSpecDecodeAcceptanceLow",
             expect_signal("VLLMSpecDecodeAcceptanceLow", {**W("vllm-0"), "signal": "acceptance"}, pct(0.3)))]),
    # the same day and a steady acceptance: quiet
    case(alive("vllm-0", minutes=DAY + 40) + spec("vllm-0", lambda m: 600, lambda m: 1800, lambda m: 1260, minutes=DAY + 40),
         [quiet(DAY + 30, "VLLMSpecDecodeAcceptanceLow")]),
] + quiet_cases("VLLMSpecDecodeAcceptanceLow", extra=[
    healthy_decode() + spec("vllm-d0", lambda m: 600, lambda m: 1800, lambda m: 1260),
    busy_prefill() + spec("vllm-p0", lambda m: 600, lambda m: 1800, lambda m: 1260),
    sleeping() + spec("vllm-d0", lambda m: 600, lambda m: 1800, lambda m: 300),
])

# a sleeping engine fires nothing the sleep explains: neither stalled (requests queued at it,
# none running) nor down
CASES["VLLMEngineStalled"] = [
    case(sleeping() + [series("vllm_sidecar_engine_stalled", sidecar_labels(pod="vllm-d0", model_name=MODEL),
                              gauge(lambda m: 1 if m >= 5 else 0, N))],
         [quiet(m, "VLLMEngineStalled") for m in (10, 20, 30)]),
]


# ... nor down while it says it sleeps, whatever the sidecar's read of vLLM says
CASES["VLLMTargetDown"] = [
    case(sleeping() + [series("vllm_sidecar_target_up", sidecar_labels(pod="vllm-d0", target="vllm"),
                              gauge(lambda m: 0 if m >= 5 else 1, N)),
                       series("vllm_sidecar_last_success_timestamp_seconds", sidecar_labels(pod="vllm-d0", target="vllm"),
                              gauge(lambda m: 60 * min(m, 4), N)),
                       series("up", sidecar_labels(pod="vllm-d0"), gauge(lambda m: 1, N))],
         [quiet(m, "VLLMTargetDown") for m in (8, 20)]),
]


@pytest.mark.parametrize("alert", sorted(CASES))
def test_alert_fires_and_stays_quiet(alert, tmp_path):
    tests = CASES[alert]
    if alert not in ("VLLMEngineStalled", "VLLMTargetDown"):  # test_rules_promtool.py has their firing cases
        assert any(e["exp_alerts"] for t in tests for e in t["alert_rule_test"]), "needs a firing case"
    assert any(not e["exp_alerts"] for t in tests for e in t["alert_rule_test"]), "needs a quiet case"
    r = run_promtool(tmp_path, tests, alerts=[alert])
    assert r.returncode == 0, r.stdout + r.stderr


def test_role_defaults_to_both_and_follows_the_sidecar(tmp_path):
    """The role series every rule joins on: the sidecar's role, ``both`` for a pod without one."""
    from promseries import RULES

    tests = [{"interval": "1m", "input_series": healthy_decode() + busy_prefill() + role_both(),
              "promql_expr_test": [{"expr": "namespace_pod_model:vllm_role:info", "eval_time": "10m", "exp_samples": [
                  {"labels": fmt_series("namespace_pod_model:vllm_role:info", {**W(p), "role": r}), "value": 1}
                  for p, r in (("vllm-d0", "decode"), ("vllm-p0", "prefill"), ("vllm-0", "both"))]}]}]
    r = run_promtool(tmp_path, tests, rules_path=RULES)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("planned, fires", [(1000, True), (110, False)])
def test_a_planned_decode_capacity_decides_whether_decode_has_room(tmp_path, planned, fires):
    """With capacity.decode_tokens_per_second planned, a decode instance making 100 output tokens/s
    has room under a plan of 1,000 (the prefill flood names prefill) and none under a plan of 110
    (91 %, above disaggregation.room_load: scaling prefill alone would not help)."""
    import yaml

    from exporter.pack.rules import render_plain
    from exporter.slo import load_slo

    f = tmp_path / "slo.yaml"
    f.write_text(yaml.safe_dump({"capacity": {"decode_tokens_per_second": planned}}))
    rules = tmp_path / "planned.rules.yml"
    rules.write_text(render_plain(load_slo(str(f))))
    alert = "VLLMDisaggregationImbalance"
    want = [expect(alert, {**MS, "scale_side": "prefill"}, "8", rules=rules_by_alert(rules))] if fires else []
    tests = [case(side_fleet(lambda m: 8 if m >= 5 else 0, lambda m: 0), [at(25, alert, *want)])]
    r = run_promtool(tmp_path, tests, rules_path=rules, alerts=[alert])
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_recomputed_share_is_local_over_local_and_transferred(tmp_path):
    """``namespace_pod_model:vllm_prompt_tokens_recomputed:ratio_rate5m``, written to read each
    source once (1 / (1 + transferred / local)): 30 local tokens a minute beside 90 transferred is
    0.25; none local beside some transferred is 0 (1 / +Inf); all local is 1; a pod whose prompts
    came from neither (no tokens at all) has no share (NaN is dropped). Decode instances only: a
    prefill instance (e), which computes its prompts by design, has none."""
    from promseries import RULES

    name = "namespace_pod_model:vllm_prompt_tokens_recomputed:ratio_rate5m"
    per_minute = {"vllm-a": (30, 90), "vllm-b": (0, 60), "vllm-c": (50, 0), "vllm-d": (0, 0), "vllm-e": (50, 0)}
    inputs = [series("vllm:prompt_tokens_by_source_total", {**vllm_labels(pod=pod, model_name=MODEL), "source": src},
                     counter(lambda m, r=rate: r, N))
              for pod, rates in per_minute.items()
              for src, rate in zip(("local_compute", "external_kv_transfer"), rates)]
    inputs += [x for pod in per_minute for x in role(pod, "prefill" if pod == "vllm-e" else "decode") + alive(pod)]
    want = {"vllm-a": 0.25, "vllm-b": 0, "vllm-c": 1}
    tests = [{"interval": "1m", "input_series": inputs, "promql_expr_test": [{
        "expr": name, "eval_time": "20m",
        "exp_samples": [{"labels": fmt_series(name, W(pod)), "value": v} for pod, v in want.items()]}]}]
    r = run_promtool(tmp_path, tests, rules_path=RULES)
    assert r.returncode == 0, r.stdout + r.stderr
