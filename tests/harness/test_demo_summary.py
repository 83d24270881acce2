"""The demo's default run gets to its trouble within 15 s, and its closing summary says what
really happened: stopped before the onset, what the sidecar flagged and when (before or after the
onset), nothing flagged after the onset, the alerts that fired."""

import io
import subprocess
import sys

from conftest import ROOT
from exporter.harness.demo import DEFAULT_ONSET, run_demo, summary


def test_the_default_onset_is_within_15_seconds():
    assert 0 < DEFAULT_ONSET <= 15
    r = subprocess.run([sys.executable, "-m", "exporter", "demo", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert f"(default {DEFAULT_ONSET:.0f})" in " ".join(r.stdout.split())


def test_a_run_stopped_before_the_onset_says_so():
    out = io.StringIO()
    rc = run_demo("long-prompt-storm", duration=4, onset=None, listen="127.0.0.1:0", with_prometheus=False,
                  refresh=1, tty=False, out=out)
    text = out.getvalue()
    assert rc == 0
    assert "phase: normal, long-prompt-storm in" in text
    tail = text.rsplit("\n\n", 1)[-1]
    assert f"before the trouble began (onset {DEFAULT_ONSET:.0f}s)" in tail
    assert "began at" not in tail and "after the onset" not in tail


def test_the_summary_tells_before_from_after_the_onset():
    lines = summary("long-prompt-storm", 15, 60.2, {"KV pressure saturated": 18.0, "long-prompt surge": 22.4,
                                                     "vLLM restart seen": 3.0}, {"VLLMLongPromptSurge": "41s"})
    assert lines[0] == "The trouble (long-prompt-storm) began at 15s; the run lasted 60s (45s of it in trouble)."
    assert lines[1:5] == ["What the sidecar flagged (seconds after start):",
                          "      3s  vLLM restart seen  (before the onset)",
                          "     18s  KV pressure saturated  (3s after the onset)",
                          "     22s  long-prompt surge  (7s after the onset)"]
    assert lines[-1] == "Alerts that fired: VLLMLongPromptSurge at 41s"
    quiet = summary("stall", 15, 40, {"KV pressure elevated": 5.0}, None)
    assert quiet[-1] == "Nothing was flagged after the onset (25s of trouble watched)."
    assert summary("stall", 15, 40, {}, {})[-2:] == ["Nothing was flagged after the onset (25s of trouble watched).",
                                                     "Alerts that fired: none"]
    early = summary("stall", 15, 9.6, {"KV pressure elevated": 5.0}, None)
    assert early == ["Stopped at 10s, before the trouble began (onset 15s): the run saw only normal traffic.",
                     "What the sidecar flagged anyway (seconds after start):", "      5s  KV pressure elevated"]
    assert summary("normal", 15, 30, {}, None) == ["Scenario normal: no trouble was scheduled; the run lasted 30s.",
                                                   "The sidecar flagged nothing."]
