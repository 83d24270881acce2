"""End to end against a real vLLM server (the CPU build, pinned, in its own cached virtualenv),
serving a tiny model the test builds locally, with the real sidecar and a real Prometheus
evaluating the rules pack (a test SLO file with short windows and `for` values).

1. normal traffic: the sidecar's throughput, TTFT quantiles and KV usage agree with vLLM's own
   counters and with PromQL over the same data;
2. the user's incident (one client sends many very long prompts while the batch is full): the
   sidecar's long-prompt rate and KV pressure rise, preemptions or capacity waits appear, and
   the matching alerts go pending and fire in Prometheus;
3. the traffic stops: the alerts resolve;
4. vLLM is killed: the sidecar keeps serving and VLLMTargetDown fires; vLLM restarts: the sidecar
   recovers, with no negative or spiked rates.

Everything the test starts is stopped at the end, also when it fails; failures carry vLLM's log
tail and Prometheus' alert states.
"""

import time
import urllib.request

import pytest
from realvllm import MODEL, real_stack, sample, value

from exporter.harness.localstack import wait_until

pytestmark = [pytest.mark.vllm, pytest.mark.prometheus]

WINDOW = 20  # the sidecar's window (TEST_SLO's windows.sidecar); phase 1 compares over the same span


def test_real_vllm_end_to_end(tmp_path):
    labels = {"namespace": "e2e", "pod": "vllm-0"}
    with real_stack(tmp_path, {"poll_interval": 1, "gpu": "none"}, labels) as rs:
        vllm, sidecar, stack, diag = rs.vllm, rs.sidecar, rs.stack, rs.diag
        assert sidecar.sidecar.cfg.window == WINDOW and sidecar.sidecar.cfg.kv_warn_threshold == 0.85

        # 1. normal traffic: the sidecar agrees with vLLM's counters and with PromQL
        load = rs.load().add(4, 100, 32)
        time.sleep(15)  # steady traffic
        # vLLM's own counter over the same span as the sidecar's window and PromQL's range
        m1, t1 = vllm.metrics(), time.time()
        time.sleep(WINDOW)
        m2, t2 = vllm.metrics(), time.time()
        # its window ends at its last good poll, at most a few seconds ago: a read of the busy CPU vLLM
        # that times out (0.8 s) publishes no derived series for that poll, as it should
        pub = wait_until(lambda: (p if value(p := sidecar.sidecar.published, "generation_tokens_per_second",
                                             model_name=MODEL) is not None else None), 15, every=0.2,
                         what="a poll with the sidecar's rates", diag=diag)
        counter_rate = (sample(m2, "vllm:generation_tokens_total") - sample(m1, "vllm:generation_tokens_total")) / (t2 - t1)
        side_rate = value(pub, "generation_tokens_per_second", model_name=MODEL)
        # What Prometheus stored over the same window, as a slope from its first to its last sample: what
        # rate() computes before it extrapolates to the window's edges. On two busy cores some 1 s scrapes
        # of the CPU vLLM time out, and rate()'s extrapolation over the gaps then reads up to a third low
        # (seen in CI: 652 against 871 and a counter of 859), which says nothing about the sidecar.
        stored = stack.query(f'vllm:generation_tokens_total{{pod="vllm-0"}}[{WINDOW}s]', at=pub.t)
        prom_rate = sum((float(s["values"][-1][1]) - float(s["values"][0][1]))
                        / (float(s["values"][-1][0]) - float(s["values"][0][0]))
                        for s in stored if len(s["values"]) >= 2)
        info = dict(sidecar=side_rate, counter=counter_rate, promql=prom_rate, lag=round(t2 - pub.t, 2),
                    stored_samples=[len(s["values"]) for s in stored],
                    requests=load.done, errors=load.errors)
        assert counter_rate > 0 and side_rate is not None, info
        assert side_rate == pytest.approx(counter_rate, rel=0.3), info
        assert side_rate == pytest.approx(prom_rate, rel=0.3), info
        side_p95 = value(pub, "ttft_seconds", model_name=MODEL, quantile="0.95")
        prom_p95 = float(stack.query('histogram_quantile(0.95, sum by (le) (rate(vllm:time_to_first_token_seconds_bucket'
                                     f'{{pod="vllm-0"}}[{WINDOW}s])))', at=pub.t)[0]["value"][1])
        assert side_p95 is not None and side_p95 == pytest.approx(prom_p95, rel=0.5), (side_p95, prom_p95)
        side_kv = value(pub, "kv_cache_usage_ratio", model_name=MODEL)
        assert side_kv is not None and abs(side_kv - sample(vllm.metrics(), "vllm:kv_cache_usage_perc")) < 0.3
        assert stack.alert_state("VLLMKVCacheExhausted") is None
        assert stack.alert_state("VLLMLongPromptSurge") is None
        load.stop()

        # 2. the incident: a full batch of long generations, and a client sending ~6,000-token prompts
        storm = rs.load().add(18, 300, 1200).add(3, 6000, 64)
        for alert in ("VLLMLongPromptSurge", "VLLMKVCacheExhausted"):
            wait_until(lambda alert=alert: stack.alert_state(alert) in ("pending", "firing"), 120, every=0.5,
                       what=f"{alert} pending", diag=diag)
            wait_until(lambda alert=alert: stack.alert_state(alert) == "firing", 120, every=0.5,
                       what=f"{alert} firing", diag=diag)
        pub = sidecar.sidecar.published
        assert value(pub, "long_prompt_requests_per_second", model_name=MODEL) > 0
        levels = []
        wait_until(lambda: levels.append(value(sidecar.sidecar.published, "kv_cache_pressure_level", model_name=MODEL))
                   or (levels[-1] or 0) >= 2, 60, what="KV pressure saturated or thrashing", diag=diag)
        m = vllm.metrics()
        assert sample(m, "vllm:num_preemptions_total") > 0 or \
            max(levels) >= 2, "neither preemptions nor capacity waits appeared"
        storm.stop()

        # 3. traffic stops: the alerts resolve
        for alert in ("VLLMLongPromptSurge", "VLLMKVCacheExhausted"):
            wait_until(lambda alert=alert: stack.alert_state(alert) is None, 120, every=1, what=f"{alert} resolved", diag=diag)

        # 4. vLLM dies: the sidecar keeps serving; vLLM restarts: the sidecar recovers cleanly
        before = value(sidecar.sidecar.published, "generation_tokens_per_second", model_name=MODEL) or 0.0
        peak = max(before, counter_rate)
        vllm.kill()
        wait_until(lambda: dict(sidecar.sidecar.published.up).get("vllm") is False, 20, what="sidecar sees vLLM down")
        with urllib.request.urlopen(f"http://{sidecar.address}/healthz", timeout=2) as r:
            assert r.status == 200
        wait_until(lambda: stack.alert_state("VLLMTargetDown") == "firing", 60, every=0.5, what="VLLMTargetDown firing",
                   diag=diag)
        vllm.start()
        rs.load().add(4, 100, 32)
        wait_until(lambda: dict(sidecar.sidecar.published.up).get("vllm") is True, 30, what="sidecar recovers")
        wait_until(lambda: stack.alert_state("VLLMTargetDown") is None, 60, every=1, what="VLLMTargetDown resolved",
                   diag=diag)
        for _ in range(12):
            pub = sidecar.sidecar.published
            from exporter.runtime.collectors import signal_points

            rates = [p.value for p in signal_points(pub.signals) if p.name.endswith("_per_second")]
            assert all(r >= 0 for r in rates), rates
            gen = value(pub, "generation_tokens_per_second", model_name=MODEL) or 0.0
            assert gen <= 3 * peak + 100, f"spike after restart: {gen} tokens/s against {peak} before"
            time.sleep(1)
        assert sidecar.sidecar.published.vllm_restarts_total >= 1
        prom_min = stack.query('min_over_time((sum(rate(vllm:generation_tokens_total{pod="vllm-0"}[10s])))[2m:1s])')
        assert not prom_min or float(prom_min[0]["value"][1]) >= 0
