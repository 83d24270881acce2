"""A real Prometheus scrapes a scripted vLLM stand-in serving real vLLM pages and the real sidecar,
evaluates the rendered rules, and a real Alertmanager (the example config) delivers to a webhook."""

import re
import time

import pytest

from conftest import ROOT
from exporter.harness.fakenvml import FakeNvml, make_gpus
from exporter.harness.localstack import SidecarThread, Stack, wait_until
from exporter.harness.pageserver import PageServer
from exporter.pack import rules as rules_mod
from exporter.slo import load_slo
from shared import PressureScript

pytestmark = pytest.mark.prometheus

POD = {"namespace": "llm", "pod": "vllm-0"}


def test_alert_goes_pending_firing_and_reaches_alertmanager(tmp_path):
    slo = tmp_path / "slo.yaml"
    # windows scaled to the test's seconds: held back at 3 of 4 evaluations of 10 s, not of 2 minutes
    slo.write_text("for: {VLLMKVCacheExhausted: 4s, VLLMTargetDown: 3s}\nwindows: {held_back: 10s}\n")
    rules_file = tmp_path / "vllm.rules.yml"
    rules_file.write_text(rules_mod.render_plain(load_slo(str(slo))))
    script = PressureScript()
    vllm = PageServer(script).start()
    gpus = make_gpus(2)
    sidecar = SidecarThread({"vllm_url": vllm.url, "poll_interval": 0.5, "window": 5, "gpu": "nvml"},
                            nvml=FakeNvml(gpus))
    try:
        with Stack(tmp_path) as st:
            st.start_alertmanager(ROOT / "deploy" / "alertmanager" / "alertmanager.yml")
            st.start_prometheus(
                [{"job": "vllm", "address": f"127.0.0.1:{vllm.port}", "labels": POD},
                 {"job": "vllm-sidecar", "address": sidecar.address, "labels": POD}],
                [rules_file])
            wait_until(st.targets_up, 30, what="both targets up", diag=st.diag)
            # real pages arrive under their real names, the sidecar's derived series beside them
            wait_until(lambda: st.query('vllm:kv_cache_usage_perc{pod="vllm-0"}'), 20, what="vLLM series", diag=st.diag)
            wait_until(lambda: st.query('vllm_sidecar_generation_tokens_per_second{model_name="tiny-llama"}'), 20,
                       what="sidecar series", diag=st.diag)
            # asked at a settled moment: a scrape that timed out on a busy machine leaves a gap
            assert st.query('vllm_sidecar_gpu_utilization_ratio{gpu="1"}', at=st.settled_at(after=time.time()))
            assert st.alert_state("VLLMKVCacheExhausted") is None  # a cache at 0.5: quiet

            # the cache fills and requests wait for capacity
            script.kv, script.capacity = 0.97, 3
            wait_until(lambda: st.alert_state("VLLMKVCacheExhausted") == "pending", 20, every=0.2,
                       what="KV alert pending", diag=st.diag)
            wait_until(lambda: st.alert_state("VLLMKVCacheExhausted") == "firing", 20, every=0.2,
                       what="KV alert firing", diag=st.diag)
            got = wait_until(lambda: [a for a in st.webhook.alerts() if a["labels"]["alertname"] == "VLLMKVCacheExhausted"],
                             20, what="KV alert at the webhook", diag=st.diag)
            a = got[0]
            assert a["_receiver"] == "pager" and a["labels"]["severity"] == "critical"
            assert a["labels"]["pod"] == "vllm-0" and a["labels"]["model_name"] == "tiny-llama"
            # the share of the window's evaluations that held requests back, as Prometheus formats it
            assert "held back by the KV cache" in a["annotations"]["description"]
            assert re.search(r"at [0-9.]+% of the last 10 seconds", a["annotations"]["description"])
            assert a["annotations"]["runbook_url"].endswith("/VLLMKVCacheExhausted.md")

            # vLLM starts answering 503: the sidecar says so and VLLMTargetDown reaches the pager
            vllm.mode = "status:503"
            # (the alert for target=vllm: on a busy machine a 1 s scrape of the sidecar thread can time
            # out three times running, and VLLMTargetDown for target=sidecar is then as true)
            wait_until(lambda: any(a["state"] == "firing" and a["labels"].get("target") == "vllm"
                                   for a in st.alerts() if a["labels"]["alertname"] == "VLLMTargetDown"),
                       30, every=0.2, what="target-down firing for vLLM", diag=st.diag)
            down = wait_until(lambda: [a for a in st.webhook.alerts("/pager")
                                       if a["labels"]["alertname"] == "VLLMTargetDown"
                                       and a["labels"].get("target") == "vllm"], 20,
                              what="target-down for vLLM at the webhook", diag=st.diag)
            assert down[0]["labels"]["severity"] == "critical" and down[0]["labels"]["pod"] == "vllm-0"
            # a page for the sidecar only where its scrapes really failed (never from vLLM's 503s)
            if any(a["labels"]["alertname"] == "VLLMTargetDown" and a["labels"].get("target") == "sidecar"
                   for a in st.webhook.alerts("/pager")):
                failed = st.query('min_over_time(up{job="vllm-sidecar"}[5m]) == 0')
                assert failed, "VLLMTargetDown for the sidecar, whose scrapes all succeeded"
    finally:
        sidecar.close()
        vllm.stop()
