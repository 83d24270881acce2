"""The prefill/decode dashboard and alerts on a real Prometheus scraping vLLM 0.33's own pages.

The pages (tests/fixtures/vllm-0.33, PROVENANCE.md there) are what vLLM 0.33.0's
``PrometheusStatLogger`` writes for a NIXL prefill instance, a healthy decode instance, one whose
transfers fail, one whose transfers stopped silently (its prompts computed again), an EAGLE-3
speculative replica and a sleeping engine; their counters advance at every scrape. Each pod's role
is what its sidecar serves as ``vllm_sidecar_role_info`` (the series is served here from a page
of its own: one line). The committed rule file runs on that Prometheus; every panel of the P/D
dashboard must answer but those that need history, and the alerts' conditions must hold exactly
on the replicas that are in trouble, never on the sleeping one.
"""

import json
import time

import pytest

from conftest import FIXTURES, ROOT
from exporter.harness import pagetransform as pt
from exporter.harness.localstack import Stack, wait_until
from exporter.harness.pageserver import PageServer
from promseries import pack_in_one_group

pytestmark = pytest.mark.prometheus

PAGES = FIXTURES / "vllm-0.33"
# pod -> (page shape, role its sidecar says; None: no sidecar, role both)
FLEET = {
    "vllm-p0": ("kv_producer", "prefill"),
    "vllm-d0": ("kv_consumer", "decode"),
    "vllm-d1": ("kv_consumer_recomputing", "decode"),
    "vllm-d2": ("kv_consumer_failing", "decode"),
    "vllm-s0": ("spec_eagle3", None),
    "vllm-z0": ("sleeping", "decode"),
}
# the panels that need more history than a test has: what one instance of a side carries is
# planned or learned over windows.baseline ending windows.baseline_offset ago, as is the
# model's normal acceptance
NEEDS_HISTORY = {("Load per side", "A"), ("Tokens/s per instance, per side", "B"), ("Draft acceptance", "B")}


class Advancing:
    """A vLLM page whose counters advance at every scrape (a sleeping engine's stay frozen)."""

    def __init__(self, shape):
        self.base = (PAGES / shape / "poll-3.txt").read_text()
        self.frozen = shape == "sleeping"
        self.n = 0

    def __call__(self):
        self.n += 1
        return self.base if self.frozen else pt.scale_counters(self.base, 1 + self.n * 0.03)


def fill(expr):
    return (expr.replace("$cluster", ".*").replace("$namespace", "llm").replace("$model_name", ".*")
            .replace("$pod", ".*").replace("$__rate_interval", "1m"))


def test_the_pd_panels_and_alerts_on_vllm_033_pages(tmp_path):
    servers = {}
    try:
        targets = []
        for pod, (shape, role) in FLEET.items():
            labels = {"namespace": "llm", "pod": pod}
            servers[pod] = PageServer(Advancing(shape)).start()
            targets.append({"job": f"vllm-{pod}", "address": f"127.0.0.1:{servers[pod].port}", "labels": labels})
            if role:
                line = f'vllm_sidecar_role_info{{role="{role}"}} 1\n'
                servers[pod + "-sidecar"] = PageServer(lambda line=line: line).start()
                targets.append({"job": f"vllm-sidecar-{pod}", "labels": labels,
                                "address": f"127.0.0.1:{servers[pod + '-sidecar'].port}"})
        dash = json.loads((ROOT / "dashboards" / "vllm-disaggregation.json").read_text())
        queries = {(p["title"], t["refId"]): fill(t["expr"]) for p in dash["panels"] for t in p.get("targets", [])}
        with Stack(tmp_path) as st:
            st.start_prometheus(targets, [pack_in_one_group(tmp_path)])
            wait_until(st.targets_up, 30, what="targets up", diag=st.diag)
            pending = {k: q for k, q in queries.items() if k not in NEEDS_HISTORY}

            def answered():
                for key in [k for k, q in pending.items() if st.query(q)]:
                    del pending[key]
                return not pending

            try:
                wait_until(answered, 60, every=1, what="every P/D panel")
            except TimeoutError:
                pass
            assert not pending, "panels without data:\n" + "\n".join(f"{k}: {q}" for k, q in pending.items())

            # every pod's role once the rules have evaluated over its first scrapes (a panel can answer
            # before the last target's page is in an evaluation)
            want = {pod: role or "both" for pod, (_, role) in FLEET.items()}

            def roles():
                return {r["metric"]["pod"]: r["metric"]["role"] for r in st.query("namespace_pod_model:vllm_role:info")}
            try:
                wait_until(lambda: roles() == want, 30, every=1, what="every pod's role")
            except TimeoutError:
                pass
            assert roles() == want
            asleep = {r["metric"]["pod"] for r in st.query("namespace_pod_model:vllm_engine_asleep:max_over_time5m")}
            assert asleep == {"vllm-z0"}
            # the alerts' conditions (pending or firing) on exactly the replicas in trouble
            expected = {("VLLMKVTransferFailing", "vllm-d1", "recomputed"), ("VLLMKVTransferFailing", "vllm-d2", "failed")}
            ours = {"VLLMKVTransferFailing", "VLLMKVTransferSlow", "VLLMKVLeasesExpiring", "VLLMDisaggregationImbalance",
                    "VLLMSpecDecodeAcceptanceLow", "VLLMEngineStalled", "VLLMTargetDown"}

            def active():
                # a target whose scrape did fail (a scrape timing out on a busy machine: every second
                # here), or whose page the sidecar failed to read (its own read timing out), is rightly
                # down to TargetDown; every other TargetDown (a sleeping engine's above all) is a wrong one.
                # The alerts are read first: a scrape failing between the two reads would otherwise make
                # an alert the failures read before it do not know
                alerts = st.alerts()
                failed = {r["metric"].get("pod") for r in st.query(
                    'min_over_time(up[2m]) == 0 or min_over_time(vllm_sidecar_target_up{target="vllm"}[2m]) == 0')}
                return {(a["labels"]["alertname"], a["labels"].get("pod", ""), a["labels"].get("signal", ""))
                        for a in alerts if a["labels"]["alertname"] in ours
                        and not (a["labels"]["alertname"] == "VLLMTargetDown" and a["labels"].get("pod") in failed)}

            wait_until(lambda: active() >= expected, 30, every=1, what="the transfer alerts", diag=st.diag)
            for _ in range(5):  # and nothing else, over several evaluations
                time.sleep(1)
                assert active() == expected
                recomputed = {r["metric"]["pod"]: float(r["value"][1])
                              for r in st.query("namespace_pod_model:vllm_prompt_tokens_recomputed:ratio_rate5m")}
                assert recomputed["vllm-d0"] < 0.05 < 0.9 < recomputed["vllm-d1"], recomputed
    finally:
        for s in servers.values():
            s.stop()
