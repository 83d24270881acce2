"""Prefill/decode disaggregation, speculative decoding, sleep and a wedged engine: the sidecar's
values on vLLM 0.33 pages made by vLLM's own PrometheusStatLogger (tests/fixtures/vllm-0.33, see
its PROVENANCE.md: real names, labels and buckets, synthetic values), checked by hand against the
pages' own samples; and the role given with --role."""

import logging
import subprocess
import sys

import pytest

from conftest import FIXTURES, ROOT
from exporter.errors import ConfigError
from exporter.harness import pagetransform as pt
from exporter.runtime import config
from exporter.runtime.collectors.readback import published_from_exposition
from exporter.runtime.signals import derive
from exporter.view.console import Screen
from helpers import cfg, names, sample_value, scraped, sidecar_with, snap, value

PAGES = FIXTURES / "vllm-0.33"
M = "llama-3-70b"
T0 = 1_800_000_000.0
KV_SERIES = {"kv_transfer_failure_ratio", "kv_transfer_failures_per_second", "kv_transfer_seconds",
             "kv_transfer_post_seconds", "kv_transfer_bytes_per_second", "kv_transfers_per_second",
             "kv_expired_requests_per_second", "kv_notifications_after_expiry_per_second",
             "requests_waiting_kv_fetch", "prompt_tokens_transferred_ratio", "external_prefix_cache_hit_ratio"}


def shape(name, poll):
    return (PAGES / name / f"poll-{poll}.txt").read_text()


def over(name, role="both", polls=(1, 3), **kw):
    """Signals over the shape's pages, 5 s apart as they were made."""
    c = cfg(window=60, poll_interval=5, role=role, **kw)
    snaps = [snap(shape(name, p), T0 + 5 * (p - 1)) for p in polls]
    return derive(snaps, snaps, snaps[-1].t, c)


def inc(name, metric, **labels):
    return sample_value(shape(name, 3), metric, **labels) - sample_value(shape(name, 1), metric, **labels)


# -- KV transfer ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["kv_consumer", "kv_consumer_failing", "kv_both"])
def test_kv_transfer_values_on_a_consumers_page(name):
    sig = over(name)
    failed = inc(name, "vllm:nixl_num_failed_transfers_total")
    done = inc(name, "vllm:nixl_xfer_time_seconds_count")
    assert done > 0
    assert value(sig, "kv_transfer_failure_ratio", model_name=M) == pytest.approx(failed / (failed + done))
    assert value(sig, "kv_transfers_per_second", model_name=M) == pytest.approx(done / 10)
    assert value(sig, "kv_transfer_bytes_per_second", model_name=M) == pytest.approx(
        inc(name, "vllm:nixl_bytes_transferred_sum") / 10)
    assert value(sig, "kv_transfer_failures_per_second", model_name=M, kind="transfer") == pytest.approx(failed / 10)
    assert value(sig, "kv_transfer_failures_per_second", model_name=M, kind="notification") == pytest.approx(
        inc(name, "vllm:nixl_num_failed_notifications_total") / 10)
    by = {s: inc(name, "vllm:prompt_tokens_by_source_total", source=s)
          for s in ("local_compute", "local_cache_hit", "external_kv_transfer")}
    assert value(sig, "prompt_tokens_transferred_ratio", model_name=M) == pytest.approx(
        by["external_kv_transfer"] / sum(by.values()))
    assert value(sig, "external_prefix_cache_hit_ratio", model_name=M) == pytest.approx(
        inc(name, "vllm:external_prefix_cache_hits_total") / inc(name, "vllm:external_prefix_cache_queries_total"))
    for stage in ("waiting_to_start", "in_progress", "completed_waiting"):
        assert value(sig, "requests_waiting_kv_fetch", model_name=M, stage=stage) == sample_value(
            shape(name, 3), "vllm:num_requests_kv_fetch_by_stage", stage=stage)
    p95 = value(sig, "kv_transfer_seconds", model_name=M, quantile="0.95")
    assert 0.005 < p95 <= 0.05  # the pages' transfers take ~20 ms
    assert value(sig, "kv_transfer_post_seconds", model_name=M, quantile="0.5") is not None


def test_failing_transfers_read_as_a_high_failure_ratio_healthy_ones_low():
    assert value(over("kv_consumer_failing"), "kv_transfer_failure_ratio", model_name=M) > 0.3
    assert value(over("kv_consumer"), "kv_transfer_failure_ratio", model_name=M) < 0.05


def test_a_decode_instance_that_recomputes_shows_no_prompt_token_by_transfer_and_no_ratio_of_nothing():
    sig = over("kv_consumer_recomputing")
    assert value(sig, "prompt_tokens_transferred_ratio", model_name=M) == 0.0
    assert value(sig, "kv_transfers_per_second", model_name=M) == 0.0
    # no transfer completed and none failed: no failure ratio (0 of 0 is not 0 %)
    assert value(sig, "kv_transfer_failure_ratio", model_name=M) is None
    assert value(sig, "kv_transfer_seconds", model_name=M, quantile="0.5") is None


def test_a_producer_counts_expired_leases():
    sig = over("kv_producer", role="prefill")
    expired = inc("kv_producer", "vllm:nixl_num_kv_expired_reqs_total")
    late = inc("kv_producer", "vllm:nixl_num_notifications_after_expiry_total")
    assert expired > 0 and late > 0
    assert value(sig, "kv_expired_requests_per_second", model_name=M) == pytest.approx(expired / 10)
    assert value(sig, "kv_notifications_after_expiry_per_second", model_name=M) == pytest.approx(late / 10)
    assert value(sig, "requests_waiting_kv_fetch", model_name=M, stage="in_progress") is None  # not a consumer


@pytest.mark.parametrize("page", ["spec_eagle3", "sleeping", "0.32"])
def test_no_connector_no_kv_series_at_all(page, after_load, idle):
    if page == "0.32":  # a real vLLM 0.32 page: prompt_tokens_by_source is there, no connector
        sig = derive([snap(idle, T0), snap(after_load, T0 + 60)], [], T0 + 60, cfg(window=120, poll_interval=5))
        model = "tiny-llama"
    else:
        sig, model = over(page), M
    assert not names(sig) & KV_SERIES, names(sig) & KV_SERIES
    assert model in {m.model for m in sig.models}


def test_mooncake_series_are_read_as_the_same_inputs():
    """Mooncake's connector series have NIXL's shape under its own names: read as aliases."""
    text = {p: shape("kv_consumer", p).replace("vllm:nixl_xfer_time_seconds", "vllm:mooncake_xfer_time_seconds")
            .replace("vllm:nixl_num_failed_transfers", "vllm:mooncake_num_failed_transfers")
            .replace("vllm:nixl_bytes_transferred", "vllm:mooncake_bytes_transferred") for p in (1, 3)}
    c = cfg(window=60, poll_interval=5)
    snaps = [snap(text[1], T0), snap(text[3], T0 + 10)]
    assert snaps[1].resolved["kv_xfer_time"] == "vllm:mooncake_xfer_time_seconds"
    sig = derive(snaps, snaps, T0 + 10, c)
    assert value(sig, "kv_transfer_failure_ratio", model_name=M) == value(over("kv_consumer"),
                                                                          "kv_transfer_failure_ratio", model_name=M)


# -- speculative decoding ----------------------------------------------------------------------------

def test_speculative_mean_accepted_length_and_acceptance_by_position():
    sig = over("spec_eagle3")
    drafts = inc("spec_eagle3", "vllm:spec_decode_num_drafts_total")
    accepted = inc("spec_eagle3", "vllm:spec_decode_num_accepted_tokens_total")
    assert drafts > 0
    assert value(sig, "spec_decode_mean_accepted_length", model_name=M) == pytest.approx(1 + accepted / drafts)
    assert value(sig, "spec_decode_acceptance_ratio", model_name=M) == pytest.approx(
        accepted / inc("spec_eagle3", "vllm:spec_decode_num_draft_tokens_total"))
    ratios = []
    for pos in ("0", "1", "2"):
        r = value(sig, "spec_decode_position_acceptance_ratio", model_name=M, position=pos)
        assert r == pytest.approx(inc("spec_eagle3", "vllm:spec_decode_num_accepted_tokens_per_pos_total",
                                      position=pos) / drafts)
        ratios.append(r)
    assert ratios == sorted(ratios, reverse=True)  # a later position is accepted only after the earlier
    # the per-position acceptances add up to the accepted tokens per draft
    assert sum(ratios) == pytest.approx(accepted / drafts)
    assert value(over("kv_consumer"), "spec_decode_mean_accepted_length", model_name=M) is None


# -- sleep -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,level", [("sleeping", 1), ("sleeping_level2", 2), ("kv_consumer", 0)])
def test_sleep_level(name, level):
    sig = over(name, stall_seconds=5)
    assert value(sig, "engine_sleep_level", model_name=M) == level
    assert value(sig, "engine_stalled", model_name=M) == 0.0


def test_a_sleeping_engine_with_requests_waiting_is_not_stalled_and_not_busy_low(clock):
    """Requests queued on a sleeping engine and GPUs reported busy: it sleeps, nothing more."""
    from exporter.harness.fakenvml import FakeNvml, make_gpus
    from exporter.runtime.nvml import NvmlSource

    gpus = make_gpus(2)
    for g in gpus:
        g.utilization_percent = 99
    text = pt.set_values(shape("sleeping", 3), {"vllm:num_requests_waiting": 5})
    sc, _seq = sidecar_with(clock, cfg(poll_interval=1, window=10, stall_seconds=5), text,
                            gpu=NvmlSource(FakeNvml(gpus)))
    for _ in range(12):
        pub = sc.poll_once()
        clock.advance(1)
    m = pub.signals.model(M)
    assert m.sleep_level == 1 and m.stalled is False
    assert m.busy_low is not None and m.busy_low.flagged is False
    screen = Screen(None, False).render(published_from_exposition(_page(pub), pub.t))
    assert "SLEEPING (level 1: weights offloaded" in screen
    assert "GPU busy + tokens low: — (sleeping)" in screen


def _page(pub):
    from prometheus_client import generate_latest

    from exporter.runtime.server import make_registry
    return generate_latest(make_registry(lambda: pub)).decode()


# -- a wedged engine ----------------------------------------------------------------------------------

def test_a_wedged_engine_is_stalled_with_nothing_running():
    sig = over("wedged", polls=(1, 2, 3), stall_seconds=8)
    assert sample_value(shape("wedged", 3), "vllm:num_requests_running") == 0
    assert sample_value(shape("wedged", 3), "vllm:num_requests_waiting") > 0
    assert value(sig, "engine_stalled", model_name=M) == 1.0
    # shorter history than the stall time: not known yet
    assert value(over("wedged", polls=(1, 2), stall_seconds=8), "engine_stalled", model_name=M) is None


def test_a_waiting_queue_with_iterations_or_tokens_is_not_a_wedge():
    base = [shape("wedged", p) for p in (1, 2, 3)]
    c = cfg(window=60, poll_interval=5, stall_seconds=8)

    def stalled(pages):
        snaps = [snap(t, T0 + 5 * i) for i, t in enumerate(pages)]
        return value(derive(snaps, snaps, snaps[-1].t, c), "engine_stalled", model_name=M)

    assert stalled(base) == 1.0
    # the engine iterates (a step with no output token yet, e.g. a long prefill in chunks)
    stepping = base[:2] + [_steps(base[2], 3, 2048)]
    assert stalled(stepping) == 0.0
    # nothing waits: an idle engine
    idle = [pt.set_values(t, {"vllm:num_requests_waiting": 0}) for t in base]
    assert stalled(idle) == 0.0
    # a token came out
    token = base[:2] + [pt.scale_counters(base[2], 1.01)]
    assert stalled(token) == 0.0


def _steps(text, n, tokens):
    """``text`` with ``n`` more engine steps of ``tokens`` tokens in vllm:iteration_tokens_total."""
    out = []
    for line in text.splitlines():
        if line.startswith("vllm:iteration_tokens_total_"):
            head, v = line.rsplit(" ", 1)
            le = head.split('le="')[1].split('"')[0] if 'le="' in head else None
            add = {"_count": n, "_sum": n * tokens}.get(head.split("{")[0][len("vllm:iteration_tokens_total"):], 0)
            if le is not None and float(le) >= tokens:
                add = n
            line = f"{head} {float(v) + add!r}"
        out.append(line)
    return "\n".join(out) + "\n"


# -- the role ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,role,why", [
    ("kv_producer", "decode", ("no_kv_consumer",)),
    ("spec_eagle3", "decode", ("no_kv_consumer",)),
    ("kv_consumer", "decode", ()),
    ("kv_both", "decode", ()),        # a kv_both page looks like a consumer's: never a conflict
    ("kv_consumer", "prefill", ("receives_kv",)),
    ("kv_both", "prefill", ("receives_kv",)),
    ("kv_producer", "prefill", ()),
    ("kv_consumer_recomputing", "prefill", ()),
    ("kv_producer", "both", ()),
    ("kv_consumer", "both", ()),
    ("kv_both", "both", ()),
])
def test_role_conflicts(name, role, why):
    sig = over(name, role=role)
    assert sig.role == role and sig.role_conflicts == why
    assert value(sig, "role_info", role=role) == 1.0
    for reason in why:
        assert value(sig, "role_conflict", role=role, reason=reason) == 1.0
    if not why:
        assert "role_conflict" not in names(sig)


def test_role_from_flag_env_and_file(tmp_path):
    assert config.build({}, {}).role == "both"
    assert config.build({}, {"VLLM_SIDECAR_ROLE": "decode"}).role == "decode"
    # the downward API gives an empty value for a pod without the label: the default
    assert config.build({}, {"VLLM_SIDECAR_ROLE": ""}).role == "both"
    f = tmp_path / "c.yaml"
    f.write_text("role: prefill\n")
    assert config.build({"config": str(f)}, {}).role == "prefill"
    assert config.build({"role": "Decode", "config": str(f)}, {}).role == "decode"
    with pytest.raises(ConfigError) as e:
        config.build({}, {"VLLM_SIDECAR_ROLE": "router"})
    assert str(e.value).startswith("role") and "\n" not in str(e.value)


def test_cli_bad_role_exits_2_with_one_line():
    r = subprocess.run([sys.executable, "-m", "exporter", "--role", "encoder"], capture_output=True, text=True,
                       timeout=60, cwd=ROOT)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "role" in lines[0] and "prefill, decode, both" in lines[0], r.stderr


def test_the_conflict_is_said_once_in_the_log_and_served_while_it_lasts(clock, caplog):
    sc, seq = sidecar_with(clock, cfg(poll_interval=1, window=10, role="decode"), shape("kv_producer", 1))
    with caplog.at_level(logging.INFO, logger="vllm_sidecar"):
        for p in (1, 2, 3, 3, 3):
            seq.text = shape("kv_producer", p)
            pub = sc.poll_once()
            clock.advance(1)
    said = [r for r in caplog.records if "contradicts role decode" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    assert "no_kv_consumer" not in said[0].getMessage() or "kv_fetch_by_stage" in said[0].getMessage()
    got = scraped(pub)
    assert got[("vllm_sidecar_role_conflict", (("reason", "no_kv_consumer"), ("role", "decode")))] == 1.0
    assert got[("vllm_sidecar_role_info", (("role", "decode"),))] == 1.0
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="vllm_sidecar"):
        seq.text = shape("kv_consumer", 1)  # the pod now serves a consumer: the conflict ends, said once
        for _ in range(3):
            pub = sc.poll_once()
            clock.advance(1)
    assert [r.getMessage() for r in caplog.records if "role decode" in r.getMessage()] == [
        "vLLM's page agrees with role decode"]
    assert not any(k[0] == "vllm_sidecar_role_conflict" for k in scraped(pub))


# -- real P/D pages: a prefill and a decode CPU vLLM 0.32 with ExampleConnector (tests/fixtures/vllm-cpu-pd) --

REAL = FIXTURES / "vllm-cpu-pd"


def real(*files, role="both"):
    """Signals over real pages of one server, 60 s apart."""
    c = cfg(window=600, poll_interval=5, role=role)
    snaps = [snap((REAL / f).read_text(), T0 + 60 * i) for i, f in enumerate(files)]
    return derive(snaps, snaps, snaps[-1].t, c)


def test_real_decode_instance_gets_its_prompt_tokens_by_transfer_then_recomputes_when_bypassed():
    before, after, bypass = ((REAL / f).read_text() for f in ("decode-before.txt", "decode-after.txt",
                                                                "decode-after-bypass.txt"))

    def grew(a, b, source):
        return (sample_value(b, "vllm:prompt_tokens_by_source_total", source=source)
                - sample_value(a, "vllm:prompt_tokens_by_source_total", source=source))

    flood = real("decode-before.txt", "decode-after.txt", role="decode")
    ext = grew(before, after, "external_kv_transfer")
    total = ext + grew(before, after, "local_compute") + grew(before, after, "local_cache_hit")
    assert value(flood, "prompt_tokens_transferred_ratio", model_name="tiny-llama") == pytest.approx(ext / total)
    assert ext / total > 0.95  # 98.8 % by transfer (PROVENANCE.md)
    assert value(flood, "external_prefix_cache_hit_ratio", model_name="tiny-llama") > 0.95
    assert flood.role_conflicts == ()  # a real consumer: what role decode says
    # ExampleConnector loads synchronously: every fetch stage 0; it defines no transfer series
    assert value(flood, "requests_waiting_kv_fetch", model_name="tiny-llama", stage="in_progress") == 0.0
    assert value(flood, "kv_transfer_failure_ratio", model_name="tiny-llama") is None
    # prompts sent straight to the decode instance: recomputed, none by transfer
    bypassed = real("decode-after.txt", "decode-after-bypass.txt", role="decode")
    assert grew(after, bypass, "local_compute") > 0 and grew(after, bypass, "external_kv_transfer") == 0
    assert value(bypassed, "prompt_tokens_transferred_ratio", model_name="tiny-llama") == 0.0


def test_real_prefill_instance_and_the_roles_its_page_contradicts():
    pre = real("prefill-before.txt", "prefill-after.txt", role="prefill")
    assert pre.role_conflicts == ()
    # no consumer series on a producer's page: no share of prompt tokens by transfer to serve
    assert value(pre, "prompt_tokens_transferred_ratio", model_name="tiny-llama") is None
    assert real("prefill-before.txt", "prefill-after.txt", role="decode").role_conflicts == ("no_kv_consumer",)
    assert real("decode-before.txt", "decode-after.txt", role="prefill").role_conflicts == ("receives_kv",)
    assert real("decode-before.txt", "decode-after.txt", role="both").role_conflicts == ()



def test_like_every_derived_series_the_role_is_left_out_while_vllm_cannot_be_read(clock):
    """No derived series while vLLM is not read (tests/runtime/test_hostile.py): the role neither; the
    pack counts a pod without it as role both, and a pod that is not read has no signal to judge."""
    from exporter.runtime.fetch import FetchError

    sc, seq = sidecar_with(clock, cfg(poll_interval=1, window=10, role="prefill"), shape("kv_producer", 1))
    assert scraped(sc.poll_once())[("vllm_sidecar_role_info", (("role", "prefill"),))] == 1.0
    seq.error = FetchError("refused", "connection refused")
    got = scraped(sc.poll_once())
    assert got[("vllm_sidecar_target_up", (("target", "vllm"),))] == 0.0
    assert not any(k[0].startswith("vllm_sidecar_role_") for k in got)


def test_top_shows_the_role_its_conflict_kv_transfer_and_speculation():
    from exporter.runtime.state import Published

    screen = Screen(None, False).render(Published(t=T0, up=(("vllm", True),), signals=over("kv_consumer", role="prefill")))
    assert "role prefill (the page contradicts it: receives_kv)" in screen
    assert "KV transfer failed 3%" in screen and "prompt tokens by transfer 88%" in screen
    spec = Screen(None, False).render(Published(t=T0, up=(("vllm", True),), signals=over("spec_eagle3")))
    assert "speculative acceptance 51%   mean accepted length 2.53" in spec
    assert "role" not in spec.split("\n")[0]  # role both: as before roles, not shown
