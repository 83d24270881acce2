"""Prefill and decode sized apart (``capacity_sides``): every figure against a hand-worked answer.

- the arithmetic: instances per side, the most a GPU budget carries at its best split, prices from
  the SLO file or from OpenCost's series;
- the user's own plan (../shared/user-notes/end-to-end-deployment.zh.txt, sections 2.1-2.3, 3.1,
  3.3 and 4.2), worked out as the notes work it, with the per-instance rates derived from the
  notes (each derivation beside its number): 60 QPS of a 70B on 8 H100s is impossible, 30 is not;
- the command line's ``--plan`` (no history): the verdict first, exit 1 with ``--fail-when-short``;
- a disaggregated fleet's history on a real Prometheus (a TSDB backfilled with promtool) holding
  OpenCost-shaped series too: the roles joined from ``vllm_sidecar_role_info``, each side's rate
  from its own instances, the measured prefix-cache hit ratio and mean accepted length, OpenCost's
  price used and said; the server path gives what the local path gives.
"""

from __future__ import annotations

import json
import shutil

import pytest

from exporter.analysis import capacity_sides as sides
from exporter.slo import load_slo
from loadgen import Phase, history
from promtsdb import prometheus_over
from shared import main_for
from test_capacity import START_S, TEST_SLO

# -- the user's plan, derived from the notes --------------------------------------------------------------
# prefill, computed prompt tokens/s of one TP2 INT8 prefill instance: the notes' 2N rule (2.1): 2 GPUs x
# 989 TFLOPS x 0.35 utilisation / (2 x 70e9 FLOP per token) = 4,945, doubled for INT8 ("算力需求减半") = 9,890.
# The notes' own check (2.3) agrees: "2 卡 prefill ... 实需 9k token/s ✓".
PREFILL_RATE = 2 * 989e12 * 0.35 / (2 * 70e9) * 2
# decode: "每实例 ~800 token/s" per TP2 decode instance before speculative decoding (2.3).
DECODE_RATE = 800
# prefix-cache hits: planned 70 %+ (1.2, 2.3); measured 78 % after cache-aware routing (3.3, 4.2).
HIT_PLANNED, HIT_MEASURED = 0.70, 0.78
# speculative decoding: the notes' arithmetic uses 1.5 (2.3); measured: EAGLE-3 with
# num_speculative_tokens 3 (3.1) accepted 0.68 of its drafts (3.3), a mean accepted length of
# 1 + 3 x 0.68 = 3.04 tokens per decode step (vLLM's 1 + accepted / drafts).
SPEEDUP_PLANNED, SPEEDUP_MEASURED = 1.5, 1 + 3 * 0.68


def _slo(tmp_path, hit, speedup, gpus=8, extra=""):
    f = tmp_path / f"slo-{hit}-{speedup}.yaml"
    f.write_text(f"speculative:\n  planned_speedup: {speedup!r}\ncapacity:\n"
                 f"  prefill_tokens_per_second: {PREFILL_RATE!r}\n  decode_tokens_per_second: {DECODE_RATE}\n"
                 f"  prefix_hit_ratio: {hit}\n  prefill_gpus_per_instance: 2\n"
                 f"  decode_gpus_per_instance: 2\n  gpus: {gpus}\n{extra}")
    return f


def _plan(tmp_path, qps, prompt, output, hit, speedup, **kw):
    return sides.plan(load_slo(str(_slo(tmp_path, hit, speedup))), sides.Asked(qps, prompt, output, **kw))


def test_the_arithmetic_by_hand():
    assert sides.instances_for(9000, PREFILL_RATE) == 1
    assert sides.instances_for(2 * 2432, 2432) == 2          # a whole number is not rounded up for float noise
    assert sides.instances_for(1, 2432) == 1
    # 8 GPUs, TP2 both sides, 110 computed prompt tokens a request at 9,890 per prefill instance, 250 output
    # tokens at 2,432 per decode instance: P=1 D=3 -> min(9890/110 = 89.9, 3 x 2432/250 = 29.18) = 29.18;
    # P=2 D=2 -> min(179.8, 19.5); P=3 D=1 -> 9.7
    best = sides.max_qps(8, 2, 2, 9890, 2432, 110, 250)
    assert best[1:] == (1, 3) and best[0] == pytest.approx(3 * 2432 / 250)
    # prefill-heavy: prefill needs more instances than decode; the split follows
    best = sides.max_qps(8, 1, 2, 1000, 200, 500, 200)   # P=2,D=3 -> min(4, 3) = 3 is the best
    assert best == (3.0, 2, 3)
    assert sides.max_qps(3, 2, 2, 1, 1, 1, 1) is None    # not even one instance of each fits


def test_prices_from_the_slo_file_or_opencost():
    slo = load_slo(None)   # reserved 2.50 per GPU-hour
    p = sides.price(slo, 2, 2)
    assert (p.source, p.per_gpu_hour, p.prefill_instance_hour, p.decode_instance_hour) == ("slo", 2.5, 5.0, 5.0)
    # OpenCost: the GPU nodes' whole price over their GPUs is used, the GPUs' own price said beside it
    p = sides.price(slo, 1, 2, {"gpu_hour": 32 / 12, "node_total_per_gpu_hour": 40 / 12})
    assert (p.source, p.prefill_instance_hour, p.decode_instance_hour) == ("opencost", pytest.approx(40 / 12),
                                                                           pytest.approx(80 / 12))
    assert "node_total_hourly_cost" in p.detail and "node_gpu_hourly_cost" in p.detail
    p = sides.price(slo, 2, 2, {"gpu_hour": 3.0, "node_total_per_gpu_hour": None})
    assert (p.source, p.decode_instance_hour) == ("opencost", 6.0)
    assert sides.price(slo, 2, 2, {"gpu_hour": None, "node_total_per_gpu_hour": None}).source == "slo"


@pytest.mark.parametrize("hit,speedup", [(HIT_PLANNED, SPEEDUP_PLANNED), (HIT_MEASURED, SPEEDUP_MEASURED)])
def test_sixty_qps_of_a_70b_on_8_h100s_is_impossible(tmp_path, hit, speedup):
    # 60 QPS x (500 in, 250 out), the notes' design target (1.2, 2.1): decode alone needs 60 x 250 = 15,000
    # output tokens/s; planned 800 x 1.5 = 1,200 per instance -> 13 instances (26 GPUs); measured 800 x 3.04
    # = 2,432 -> 7 (14 GPUs). Prefill: 60 x 500 x 0.3 = 9,000 (0.22: 6,600) computed tokens/s -> 1 instance.
    sp = _plan(tmp_path, 60, 500, 250, hit, speedup)
    assert sp.prefill.needed_tokens_per_second == pytest.approx(60 * 500 * (1 - hit))
    assert (sp.prefill.instances, sp.prefill.gpus) == (1, 2)
    assert sp.decode.per_instance.value == pytest.approx(800 * speedup)
    assert sp.decode.instances == (13 if speedup == SPEEDUP_PLANNED else 7)
    assert sp.fits is False and sp.gpus_needed > 8
    text = sides.verdict(sp)
    assert text.startswith("IMPOSSIBLE: 60 req/s of (500 in, 250 out) needs")
    assert "the budget is 8 GPUs" in text


def test_thirty_qps_fits_on_the_measured_rates(tmp_path):
    # The notes' conclusion (2.3): lower the target to 30 QPS, design B (1 prefill instance of 2 GPUs, 3 TP2
    # decode instances). On the rates measured after launch (3.3: hit 78 %, acceptance 0.68 of 3 draft tokens)
    # and the output the traffic has (1.2: mean 200 tokens; the 3.2 load profile and the 4.3 gate: 200 out):
    # prefill 30 x 500 x 0.22 = 3,300 of 9,890 -> 1 instance; decode 30 x 200 = 6,000 / 2,432 = 2.47 -> 3.
    sp = _plan(tmp_path, 30, 500, 200, HIT_MEASURED, SPEEDUP_MEASURED)
    assert (sp.prefill.instances, sp.decode.instances, sp.gpus_needed, sp.fits) == (1, 3, 8, True)
    assert sp.decode.load == pytest.approx(6000 / (3 * 2432))
    assert sides.verdict(sp).startswith("FITS: 30 req/s of (500 in, 200 out) needs 8 GPUs")
    # the same 8 GPUs carry at most 3 x 2,432 / 200 = 36.5 QPS at that mix: the 28 QPS peak of 4.2 fits
    best = sp.best_split()
    assert best[1:] == (1, 3) and best[0] == pytest.approx(3 * 2432 / 200)


def test_thirty_qps_where_the_notes_plan_with_less(tmp_path):
    # With 250 output tokens (2.1's rounding) 30 QPS needs 7,500 output tokens/s: on the measured rates the
    # best split of 8 GPUs carries 3 x 2,432 / 250 = 29.2 QPS, 2.7 % short (4 decode instances: 10 GPUs), and
    # the tool says so; on the notes' planned 800 x 1.5 (2.3: "3 实例 × 800 × 1.5 ≈ 3.6k") far short.
    sp = _plan(tmp_path, 30, 500, 250, HIT_MEASURED, SPEEDUP_MEASURED)
    assert (sp.decode.instances, sp.gpus_needed, sp.fits) == (4, 10, False)
    assert sp.best_split()[0] == pytest.approx(29.184)
    assert "8 GPUs carry at most 29.2 req/s (1 prefill + 3 decode)" in sides.verdict(sp)
    sp = _plan(tmp_path, 30, 500, 200, HIT_PLANNED, SPEEDUP_PLANNED)
    assert (sp.decode.instances, sp.fits) == (5, False)      # 6,000 / 1,200


def test_missing_figures_make_no_plan(tmp_path):
    sp = sides.plan(load_slo(str(_slo(tmp_path, 0.5, 1.0))), sides.Asked(30, None, 200))
    assert sp.prefill is None and sp.fits is None and sides.verdict(sp).startswith("NO PLAN: unknown --prompt-tokens")


_cli = main_for("capacity")


def test_cli_plan_says_impossible_first_and_fails_when_short(capsys, tmp_path):
    s = _slo(tmp_path, HIT_MEASURED, SPEEDUP_MEASURED)
    rc, out, err = _cli(capsys, "--plan", "--slo", str(s), "--target-qps", "60", "--prompt-tokens", "500",
                        "--output-tokens", "250", "--fail-when-short")
    assert rc == 1
    assert "IMPOSSIBLE: 60 req/s of (500 in, 250 out) needs 16 GPUs" in err
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert lines[0] == "# Capacity plan: prefill and decode apart"
    assert lines[3].startswith("**IMPOSSIBLE")          # the verdict before any detail
    assert "| decode: instances | 7 × 2 GPUs = 14 GPUs |" in out
    rc, out, err = _cli(capsys, "--plan", "--slo", str(s), "--target-qps", "30", "--prompt-tokens", "500",
                        "--output-tokens", "200", "--fail-when-short", "--json", "-")
    assert rc == 0, err
    doc = json.loads(out)["plan"]
    assert (doc["fits"], doc["gpus_needed"], doc["prefill"]["instances"], doc["decode"]["instances"]) == \
        (True, 8, 1, 3)
    assert doc["price"]["source"] == "slo" and doc["monthly"] == pytest.approx(8 * 2.5 * 730 + 400)
    # the budget and the TP sizes from flags: 16 GPUs carry 60 QPS at 250 out? 1 + 7 decode = 16: yes
    rc, out, err = _cli(capsys, "--plan", "--slo", str(s), "--target-qps", "60", "--prompt-tokens", "500",
                        "--output-tokens", "250", "--gpus", "16", "--json", "-")
    assert rc == 0 and json.loads(out)["plan"]["fits"] is True


@pytest.mark.parametrize("args,needle", [
    (["--plan", "--target-qps", "30"], "--plan needs --target-qps, --prompt-tokens and --output-tokens"),
    (["--plan", "--file", "x", "--target-qps", "1", "--prompt-tokens", "1", "--output-tokens", "1"],
     "--plan reads no history"),
    (["--plan", "--target-qps", "30", "--prompt-tokens", "0", "--output-tokens", "1"], "--prompt-tokens must be"),
    (["--plan", "--target-qps", "30", "--prompt-tokens", "1", "--output-tokens", "1", "--gpus", "-1"],
     "--gpus must be at least 0"),
    ([], "give exactly one source"),
    (["--plan", "--target-qps", "1", "--prompt-tokens", "1", "--output-tokens", "1", "--png", "x.png"],
     "--plan reads none"),
])
def test_cli_plan_errors_are_one_line(capsys, args, needle):
    rc, out, err = _cli(capsys, *args)
    assert rc == 2 and needle in err and err.count("\n") == 1


# -- a disaggregated fleet's history on a real Prometheus, with OpenCost's series ------------------------

# p0, prefill: 2 req/s of 1,000-token prompts, half of them cached: 1,000 computed tokens/s within the
# TTFT objectives (0.3 s), then 3 req/s (1,500) at 4 s TTFT: the limit is 1,000, observed.
# d0, d1, decode: 1 req/s of 200 output tokens each at 20 ms ITL (200 tokens/s), then 1.5 req/s at 50 ms,
# over the 33 ms objective: the limit is 200, observed. EAGLE-like drafts of 3 tokens, half accepted:
# a mean accepted length of 1 + 3 x 0.5 = 2.5.
PREFILL = [Phase(1200, 2, 0.3, prompt_tokens=1000, output_tokens=1, role="prefill"),
           Phase(1200, 3, 4.0, prompt_tokens=1000, output_tokens=1, role="prefill")]
DECODE = [Phase(1200, 1, 0.5, itl=0.02, output_tokens=200, spec_accepted_ratio=0.5, spec_draft_tokens=3,
                prefix_hit_ratio=0.0, role="decode"),
          Phase(1200, 1.5, 0.5, itl=0.05, output_tokens=200, spec_accepted_ratio=0.5, spec_draft_tokens=3,
                prefix_hit_ratio=0.0, role="decode")]
NODES = [  # (node, GPUs, per-GPU price, whole node per hour): a CPU node's price must not count
    ("gpu-a", 8, 3.0, 30.0), ("gpu-b", 4, 2.0, 10.0), ("cpu-a", 0, 0.0, 1.0)]


def _opencost_lines(start: float, seconds: int, scrape: float = 15.0):
    out = []
    for node, gpus, gpu_price, total in NODES:
        lab = f'instance="{node}",instance_type="p5",node="{node}",provider_id="aws:///{node}",region="us-east-1"'
        for name, v in (("node_gpu_count", gpus), ("node_gpu_hourly_cost", gpu_price), ("node_total_hourly_cost", total),
                        ("node_cpu_hourly_cost", 0.03)):
            out += [f"{name}{{{lab}}} {float(v)!r} {start + k * scrape:.3f}" for k in range(int(seconds / scrape) + 1)]
    return out


def _pd_file(tmp, with_opencost: bool):
    text = history({"p0": PREFILL, "d0": DECODE, "d1": DECODE}, START_S)
    if with_opencost:
        text = text.replace("# EOF\n", "\n".join(_opencost_lines(START_S, 2400)) + "\n# EOF\n")
    f = tmp / ("pd-opencost.om" if with_opencost else "pd.om")
    f.write_text(text)
    return f


RANGE = ["--start", str(START_S + 300), "--end", str(START_S + 2400), "--prefill-gpus-per-instance", "1",
         "--decode-gpus-per-instance", "2", "--gpus", "8", "--json", "-"]


def _sides_doc(capsys, *argv):
    rc, out, err = _cli(capsys, *argv, *RANGE)
    doc = json.loads(out)
    assert len(doc["models"]) == 1, doc["notes"]
    return rc, doc["models"][0]["sides"], err


def _check_history(sd):
    h = sd["history"]
    assert (h["prefill"]["instances"], h["decode"]["instances"]) == (1, 2)
    assert h["prefill"]["tokens_per_second"] == pytest.approx(1000) and h["prefill"]["bound"] == "observed"
    assert h["decode"]["tokens_per_second"] == pytest.approx(200) and h["decode"]["bound"] == "observed"
    assert sd["prefix_hit_ratio"]["source"] == "history" and sd["prefix_hit_ratio"]["value"] == pytest.approx(0.5)
    assert sd["speculative_speedup"]["value"] == pytest.approx(2.5)
    assert (sd["prompt_tokens"]["value"], sd["output_tokens"]["value"]) == (pytest.approx(1000), pytest.approx(200))
    assert h["decode"]["peak_qps"] == pytest.approx(3)           # the decode side's requests, not prefill's too


@pytest.mark.prometheus
@pytest.mark.skipif(not shutil.which("promtool"), reason="promtool not installed")
def test_a_disaggregated_fleet_on_prometheus_with_opencost(capsys, tmp_path):
    f = _pd_file(tmp_path, True)
    s = tmp_path / "slo.yaml"
    s.write_text(TEST_SLO)
    with prometheus_over(f, tmp_path) as url:
        # 4 req/s: prefill 4 x 1000 x 0.5 = 2,000 -> 2 instances of 1 GPU; decode 4 x 200 = 800 -> 4 of 2 GPUs:
        # 10 GPUs. The best split of 8: 2 prefill + 3 decode carry min(2 x 1000 / 500, 3 x 200 / 200) = 3 req/s.
        rc, sd, err = _sides_doc(capsys, "--prometheus-url", url, "--slo", str(s), "--target-qps", "4",
                                 "--engine", "server", "--fail-when-short")
        assert rc == 1 and "IMPOSSIBLE: 4 req/s of (1000 in, 200 out) needs 10 GPUs" in err
        _check_history(sd)
        assert (sd["prefill"]["instances"], sd["decode"]["instances"], sd["gpus_needed"]) == (2, 4, 10)
        assert sd["max_qps_in_budget"] == pytest.approx(3) and sd["best_split"] == {"prefill": 2, "decode": 3}
        # OpenCost's price: (30 + 10) / 12 GPUs per GPU-hour, the CPU node left out; the GPUs alone (3x8 + 2x4)/12
        assert sd["price"]["source"] == "opencost"
        assert sd["price"]["per_gpu_hour"] == pytest.approx(40 / 12)
        assert "2.667" in sd["price"]["detail"]
        assert sd["prefill"]["monthly"] == pytest.approx(2 * 40 / 12 * 730)
        # 3 req/s fits in the 8 GPUs (2 + 3 x 2); the local path (raw samples read here) says the same
        rc, served, err = _sides_doc(capsys, "--prometheus-url", url, "--slo", str(s), "--target-qps", "3",
                                     "--engine", "server")
        assert rc == 0 and served["fits"] is True and served["gpus_needed"] == 8
        rc, local, err = _sides_doc(capsys, "--prometheus-url", url, "--slo", str(s), "--target-qps", "3",
                                    "--engine", "local")
        assert rc == 0 and local == served


def test_without_opencost_the_slo_prices_are_used_and_said(capsys, tmp_path):
    f = _pd_file(tmp_path, False)
    s = tmp_path / "slo.yaml"
    s.write_text(TEST_SLO)
    rc, sd, err = _sides_doc(capsys, "--file", str(f), "--slo", str(s), "--target-qps", "3")
    assert rc == 0, err
    _check_history(sd)
    assert sd["price"]["source"] == "slo" and sd["price"]["per_gpu_hour"] == 2.5
    assert sd["decode"]["per_instance"]["source"] == "history"
    # the peak plus headroom when no target is given: the decode side's 3 req/s + 20 %
    rc, sd, err = _sides_doc(capsys, "--file", str(f), "--slo", str(s))
    assert sd["qps"]["source"] == "history" and sd["qps"]["value"] == pytest.approx(3.6)


def test_the_sidecars_mean_accepted_length_where_vllm_counts_no_drafts(capsys, tmp_path):
    # an older vLLM without vllm:spec_decode_num_drafts: the sidecar's own mean accepted length (2.2) is read
    decode = [Phase(2400, 1, 0.5, itl=0.02, output_tokens=200, spec_accepted_ratio=0.5, role="decode")]
    text = history({"p0": PREFILL, "d0": decode}, START_S)
    extra = [f'vllm_sidecar_spec_decode_mean_accepted_length{{model_name="m",namespace="llm",pod="d0"}} 2.2 '
             f'{START_S + k * 15:.3f}' for k in range(161)]
    f = tmp_path / "sidecar.om"
    f.write_text(text.replace("# EOF\n", "\n".join(extra) + "\n# EOF\n"))
    s = tmp_path / "slo.yaml"
    s.write_text(TEST_SLO)
    rc, sd, err = _sides_doc(capsys, "--file", str(f), "--slo", str(s), "--target-qps", "1")
    assert rc == 0, err
    assert sd["speculative_speedup"]["source"] == "history" and sd["speculative_speedup"]["value"] == pytest.approx(2.2)


def test_a_fleet_without_roles_has_no_sides(capsys, tmp_path):
    f = tmp_path / "both.om"
    f.write_text(history({"p0": [Phase(1200, 1, 0.3)] * 2}, START_S))
    s = tmp_path / "slo.yaml"
    s.write_text(TEST_SLO)
    rc, out, err = _cli(capsys, "--file", str(f), "--slo", str(s), *RANGE)
    assert rc == 0 and json.loads(out)["models"][0]["sides"] is None
