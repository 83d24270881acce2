"""The published state, poll by poll, of the sidecar at a git revision and of the working tree on
the same pages: a change to the poll's work that changes no served value passes.

    python bench/poll_equiv.py [REV]      (default: dbbcb20, before the issue 29 item 3 cuts)

Pages: the real vLLM pages of tests/fixtures (and one with two models on two engines), counters
advancing; each also with a bad value on some pages (out of range, NaN, "1_0", text) and with a
restart halfway; two configurations (default caps, and caps that leave models and label values
out). Every poll's ``Published`` compared by ``repr`` (floats exactly).
"""
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
REV = sys.argv[1] if len(sys.argv) > 1 else "dbbcb20"
sys.argv = sys.argv[:1]
import bench.ab_poll as ab  # noqa: E402
import bench.bench_poll as bp  # noqa: E402
from conftest import page as fixture_page  # noqa: E402
from exporter.harness import pagetransform as pt  # noqa: E402

base_cfg, BaseSidecar = ab.load(REV)
cur_cfg, CurSidecar = ab.load(".")

def two(text):
    out = []
    for line in text.split("\n"):
        out.append(line)
        if 'model_name="tiny-llama"' in line:
            out.append(line.replace('model_name="tiny-llama"', 'model_name="other"').replace('engine="0"', 'engine="1"'))
    return "\n".join(out)

rng = random.Random(7)
def spoil(text):
    lines = text.split("\n")
    idx = [i for i, line in enumerate(lines) if line and not line.startswith("#")]
    for _ in range(rng.randint(1, 3)):
        i = rng.choice(idx)
        lines[i] = lines[i].rpartition(" ")[0] + " " + rng.choice(["-1", "NaN", "+Inf", "1_0", "x", "0", "1e309", "5"])
    return "\n".join(lines)

seqs = {}
for name, base in (("pressure", bp.PAGE), ("lora", fixture_page("lora_running.txt")), ("two", two(bp.PAGE)),
                   ("idle", fixture_page("idle.txt")), ("load", fixture_page("after_load.txt"))):
    pages = [pt.scale_counters(base, 1.0 + i * 0.003) for i in range(80)]
    seqs[name] = pages
    seqs[name + "+spoiled"] = [spoil(p) if i % 9 == 5 else p for i, p in enumerate(pages)]
    seqs[name + "+restart"] = pages[:40] + [pt.scale_counters(base, 0.5 + i * 0.003) for i in range(40)]
n = 0
for cfgargs in ({"poll_interval": 2.0, "window": 60.0, "gpu": "none"},
                {"poll_interval": 2.0, "window": 60.0, "gpu": "none", "max_models": 1, "max_label_values": 2}):
    for name, pages in seqs.items():
        subs = []
        for cfgmod, S in ((base_cfg, BaseSidecar), (cur_cfg, CurSidecar)):
            cfg = cfgmod.build(cfgargs, {})
            clock = bp.Clock()
            subs.append((S(cfg, bp.Cycle(pages), None, clock=clock, monotonic=lambda: 0.0), clock))
        for i in range(len(pages) * 2):
            outs = []
            for sc, clock in subs:
                outs.append(repr(sc.poll_once()).replace("exporter_" + REV, "exporter"))
                clock.t += 2.0
            if outs[0] != outs[1]:
                k = next(j for j in range(min(map(len, outs))) if outs[0][j] != outs[1][j])
                raise SystemExit(f"{name} {cfgargs} poll {i}: {outs[0][k-200:k+200]!r}\n VS {outs[1][k-200:k+200]!r}")
            n += 1
print(f"identical published states ({REV} and the working tree): {n}")
