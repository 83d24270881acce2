"""Every value of the SLO file is checked at load: any SLO file the loader accepts renders a rule
file that ``promtool check rules`` (Prometheus 2.42) accepts, and a vmalert file (``rules --target
vmalert``) that ``vmalert -dryRun`` (VictoriaMetrics 1.79) accepts. A property test over generated SLO
files (valid values and near misses for every key the pack writes into rules), several rendered
files checked per promtool call; plus the refusals it found, each one line naming the key."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.errors import ConfigError
from exporter.pack.rules import render_plain
from exporter.pack.vmalert import render_vmalert
from exporter.slo import SCHEMA, _defaults_text, is_duration, load_slo

pytestmark = pytest.mark.prometheus

BATCH = 4          # rendered rule files per promtool call
EXAMPLES = 20      # batches: 80 SLO files a run (about a third accepted), a few seconds of promtool
DEFAULTS = yaml.safe_load(_defaults_text())
ALERTS = sorted(DEFAULTS["alerts"])
UNITS = ("y", "w", "d", "h", "m", "s", "ms")

# -- values: mostly what Prometheus takes, often what it does not ----------------------------

good_duration = st.lists(st.tuples(st.sampled_from(UNITS), st.integers(0, 400)), min_size=1, max_size=3).map(
    lambda parts: "".join(f"{n}{u}" for u, n in sorted(dict(parts).items(), key=lambda p: UNITS.index(p[0]))))
bad_duration = st.one_of(
    st.sampled_from(["30s30s", "1h30m1h", "5", "1.5h", "5M", "-5m", " 5m", "", "0", "0s", "1ms1s", "293y",
                     "\u0665m", "5m\n"]),
    st.text(alphabet="0123456789ywdhms.", min_size=1, max_size=6),
    st.integers(-5, 500), st.booleans())
duration = st.one_of(good_duration, good_duration, good_duration, bad_duration)

number = st.one_of(st.floats(0, 1, exclude_min=True), st.floats(0, 1, exclude_min=True), st.floats(0.001, 1e6),
                   st.integers(1, 20), st.integers(-3, 20), st.floats(allow_nan=True, allow_infinity=True),
                   st.sampled_from([True, "0.5", None]))

label_name = st.one_of(st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True),
                       st.sampled_from(["__name__", "le", "model_name", "__x", "1a", "a-b", "pod", "namespace"]))
template_bit = st.sampled_from(["{{ $labels.pod }}", "{{ $value | humanize }}", "{{ .Labels.x }}", "{{",
                                "{{ $nope }}", "{{ printf \"%s\" }}", "}}", "{{- $value -}}", "\\", '"', "\n"])
label_value = st.one_of(st.text(max_size=12), st.lists(st.one_of(template_bit, st.text(max_size=4)),
                                                       max_size=3).map("".join), st.integers(), st.booleans())
label_map = st.dictionaries(label_name, label_value, max_size=3)

quote = st.sampled_from(['"', "'", "`"])
matcher_value = st.one_of(st.from_regex(r"[a-z.*|()\\-]{0,6}", fullmatch=True),
                          st.text(alphabet='ab\\"\'`.*(|)\n', max_size=5))
matcher = st.tuples(label_name, st.sampled_from(["=", "!=", "=~", "!~", "==", "~"]), quote, matcher_value).map(
    lambda m: f"{m[0]}{m[1]}{m[2]}{m[3]}{m[2]}")
selector = st.one_of(st.lists(matcher, max_size=3).map(", ".join), st.text(max_size=10),
                     st.sampled_from(['namespace="llm"', "namespace=llm", "{a=\"b\"}", 'a=~"x",', ""]))
regex_text = st.one_of(st.from_regex(r"[/a-z0-9.*|()\[\]+?-]{0,10}", fullmatch=True),
                       st.text(alphabet='/v1.*()[]\\"?+', max_size=8))

burn_pair = st.fixed_dictionaries({"long": duration, "short": duration, "factor": number})


def value_for(path: str):
    if is_duration(path):
        return duration
    if path == "selector":
        return selector
    if path == "http_handlers":
        return regex_text
    if path in ("labels",):
        return label_map
    if path == "replica_labels":
        return st.lists(label_name, max_size=3)
    if path == "runbook_base_url":
        return st.one_of(st.sampled_from(["https://example.com/runbooks", "https://x/{{ $labels.pod }}", "{{", ""]),
                         st.text(max_size=10))
    if path.startswith("burn_rates."):
        return st.lists(burn_pair, max_size=2)
    if path == "availability_sli":
        return st.sampled_from(["combined", "http", "engine", "both"])
    if path == "gpu.fatal_xids":
        return st.lists(st.integers(-1, 200), max_size=3)
    if path == "dashboards.cluster_label":
        return st.one_of(label_name, st.just(""))
    return number


def _nest(path: str, value):
    out = value
    for part in reversed(path.split(".")):
        out = {part: out}
    return out


def _merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(out.get(k), dict) and isinstance(v, dict) else v
    return out


@st.composite
def slo_file(draw) -> dict:
    doc: dict = {}
    for path in draw(st.lists(st.sampled_from(sorted(SCHEMA)), max_size=4, unique=True)):
        doc = _merge(doc, _nest(path, draw(value_for(path))))
    for name in draw(st.lists(st.sampled_from(ALERTS), max_size=2, unique=True)):
        settings_ = draw(st.fixed_dictionaries({}, optional={
            "for": duration, "keep_firing_for": duration, "severity": st.sampled_from(["critical", "warning", "page"]),
            "enabled": st.one_of(st.booleans(), st.just("yes")), "labels": label_map, "annotations": label_map}))
        doc.setdefault("alerts", {})[name] = settings_
    return doc


def _promtool() -> str:
    p = shutil.which("promtool")
    assert p, "promtool not installed (make test installs it)"
    return p


def check_batch(tmp: Path, docs) -> None:
    accepted = []
    for i, doc in enumerate(docs):
        f = tmp / f"slo-{i}.yaml"
        f.write_text(yaml.safe_dump(doc, allow_unicode=True))
        try:
            slo = load_slo(str(f))
        except ConfigError as exc:
            assert "\n" not in str(exc), str(exc)
            continue
        out = tmp / f"rules-{i}.yml"
        out.write_text(render_plain(slo))
        (tmp / f"rules-{i}.vmalert.yml").write_text(render_vmalert(slo))
        accepted.append((out, doc))
    if not accepted:
        return
    res = subprocess.run([_promtool(), "check", "rules", *(str(o) for o, _ in accepted)],
                         capture_output=True, text=True, timeout=120)
    if res.returncode != 0:
        bad = [doc for out, doc in accepted if f"Checking {out}\n  SUCCESS" not in res.stdout]
        raise AssertionError(f"the loader accepted SLO files promtool refuses the rules of: {bad}\n"
                             f"{res.stdout[-3000:]}{res.stderr[-3000:]}")
    # the same SLO files for vmalert (rules --target vmalert): VictoriaMetrics' own parser takes them
    vmalert = shutil.which("vmalert")
    assert vmalert, "vmalert not installed (make test installs victoria-metrics)"
    vm = [str(o).replace(".yml", ".vmalert.yml") for o, _ in accepted]
    res = subprocess.run([vmalert, "-dryRun", *(f"-rule={f}" for f in vm)], capture_output=True, text=True, timeout=120)
    if res.returncode != 0:
        raise AssertionError(f"the loader accepted SLO files whose vmalert rules vmalert refuses: "
                             f"{[doc for _, doc in accepted]}\n{res.stdout[-3000:]}{res.stderr[-3000:]}")


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large])
@given(st.lists(slo_file(), min_size=BATCH, max_size=BATCH))
def test_any_slo_file_the_loader_accepts_renders_rules_promtool_accepts(tmp_path_factory, docs):
    check_batch(tmp_path_factory.mktemp("slo"), docs)


# -- near misses the loader accepts, and refusals that name the key ---------------------------

ACCEPTED = [
    {"selector": 'namespace="llm", pod=~"vllm-.*",'},
    {"selector": "namespace='llm', team!=`x\\d`"},
    {"http_handlers": "/v1/(chat/)?completions|/v1/[a-z]+"},
    {"windows": {"rate": "1h30m", "sustain": "90s", "held_back": "1500ms"}},
    {"alerts": {"VLLMKVCacheExhausted": {"for": "0", "keep_firing_for": "1y2w"}}},
    {"labels": {"team": "llm-serving", "tier": 1}},
    {"alerts": {"VLLMTTFTHigh": {"annotations": {"summary": "{{ $labels.pod }} at {{ $value | humanize }}"}}}},
    {"runbook_base_url": "https://github.com/org/repo/blob/main/docs/runbooks"},
]


def test_near_misses_that_are_fine_render_rules_promtool_accepts(tmp_path):
    check_batch(tmp_path, ACCEPTED)
    for i, doc in enumerate(ACCEPTED):  # each one really was accepted
        f = tmp_path / f"one-{i}.yaml"
        f.write_text(yaml.safe_dump(doc))
        load_slo(str(f))


@pytest.mark.parametrize("doc,message", [
    ({"alerts": {"VLLMKVCacheExhausted": {"for": "30s30s"}}},
     'alerts.VLLMKVCacheExhausted.for: "30s30s" is not a Prometheus duration'),
    ({"windows": {"rate": "5m\n"}}, 'windows.rate: "5m\\n" is not a Prometheus duration'),
    ({"windows": {"rate": 5}}, "windows.rate: 5 is not a Prometheus duration"),
    ({"windows": {"sustain": "0s"}}, 'windows.sustain: "0s" must be longer than 0'),
    ({"selector": "namespace=llm"}, 'selector: "namespace=llm": a quoted value expected'),
    ({"selector": 'pod=~"vllm-(.*"'}, 'selector: "vllm-(.*" is not a regular expression Prometheus takes'),
    ({"selector": 'pod=~"(?=x)"'}, 'selector: "(?=x)" is not a regular expression Prometheus takes'),
    ({"selector": 'a="\\q"'}, 'selector: "a=\\"\\\\q\\"": unknown escape sequence'),
    ({"selector": '__name__="x"'}, "selector: __name__ cannot be matched here"),
    ({"http_handlers": "/v1/\\w+"}, 'http_handlers: "/v1/\\\\w+": "\\\\" cannot be written inside'),
    ({"http_handlers": "/v1/(.*"}, "http_handlers: \"/v1/(.*\" is not a regular expression Prometheus takes"),
    ({"labels": {"__name__": "x"}}, "labels.__name__: a rule cannot set __name__"),
    ({"labels": {"team": "{{ oops"}}, 'labels.team: "{{ oops": a template action other than'),
    ({"alerts": {"VLLMTTFTHigh": {"annotations": {"summary": "{{ $nope }}"}}}},
     "alerts.VLLMTTFTHigh.annotations.summary: "),
    ({"runbook_base_url": "https://x/{{"}, 'runbook_base_url: "https://x/{{": a template action'),
    ({"replica_labels": ["pod", "pod"]}, "replica_labels: a label is listed twice"),
    ({"replica_labels": ["le"]}, "replica_labels: le cannot identify a replica"),
    ({"sidecar_target_label": "pod"}, "sidecar_target_label: pod already names targets or replicas"),
    ({"sidecar_target_label": "instance"}, "sidecar_target_label: instance already names targets or replicas"),
    ({"sidecar_target_label": "has-dash"}, "sidecar_target_label: expected a label name"),
    ({"steady_interval": "5m"}, "steady_interval: 5m must be under 5m"),
    ({"views_interval": "10m"}, "views_interval: 10m must be under 5m"),
    ({"steady_for": "15m"}, "steady_for: 15m must be shorter than slow_for (15m)"),
])
def test_a_bad_value_is_refused_in_one_line_naming_the_key(tmp_path, doc, message):
    f = tmp_path / "slo.yaml"
    f.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError) as info:
        load_slo(str(f))
    assert "\n" not in str(info.value) and str(info.value).startswith(message.split(": ")[0] + ":")
    assert message in str(info.value), str(info.value)


def test_a_baseline_window_of_centuries_renders_durations_promtool_reads(tmp_path):
    """Found by the property above: ``windows.baseline: 256y`` made the baseline's far-end offset
    ``8.07321e+09s``, which PromQL refuses; offsets are written in whole seconds."""
    check_batch(tmp_path, [{"windows": {"baseline": "256y"}}, {"windows": {"baseline": "1d", "baseline_offset": "90s"}}])
