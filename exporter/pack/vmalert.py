"""The rule file for vmalert (VictoriaMetrics), ``rules --target vmalert``.

vmalert 1.79 (Debian 12's ``victoria-metrics`` package) refuses a rule file with
``keep_firing_for`` (``unknown fields in rule``). This target renders the same pack without it and
keeps the same alert episodes another way, with two recording rules per alert that has a
``keep_firing_for`` of K and a ``for`` of F, evaluated every ``interval`` (i):

    alert:<Rule>:condition  1 wherever the alert's condition has a result (its labels, no name)
    alert:<Rule>:held       the condition has held at every evaluation of the last F (the
                            evaluations Prometheus needs before the alert fires: ceil(F/i) + 1,
                            counted with count_over_time: an instant read of a helper would find
                            its last sample for VictoriaMetrics' lookback after it ended, since
                            vmalert 1.79 writes no stale markers)
    alert:<Rule>:active     the condition, where it held (the held helper) within the last K + i/2:
                            the evaluations at which Prometheus' alert would be firing with its
                            condition true, a return of the condition inside the keep period
                            included
    the alert               its condition, or the active helper seen in the last K + i/2

so once the alert has fired it stays active until its condition has been gone for K, as with
``keep_firing_for``, and a blip shorter than F never makes the held helper, so it never fires.
One difference remains: a condition that comes back for less than F inside the keep period keeps
the alert for K after it leaves again only when it came back within K of a stretch that held F
(Prometheus: within K of any evaluation the alert was firing with its condition); a second such
return later than that resolves the alert earlier than Prometheus would.
The windows end half an interval past the last evaluation they must hold, so Prometheus'
closed and VictoriaMetrics' left-open range windows count the same samples. The group's
``interval`` is written into the file (the helpers' windows are counted in it). What still differs
from Prometheus is in docs/deployment.md (global rulers); tests/pack/test_vmalert.py replays the
pack on VictoriaMetrics and compares its alert timelines with promtool's.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional

from ..slo import seconds
from . import cadence
from .ruleyaml import GROUP, dump

VMALERT_PATH = "rules/vllm.vmalert.rules.yml"


def _dur(s: float) -> str:
    return f"{int(s)}s" if s == int(s) else f"{int(s * 1000)}ms"


def keep_helpers(key: str, rule: Dict[str, Any], interval_s: float) -> List[Dict[str, Any]]:
    """The recording rules that stand in for ``rule``'s keep_firing_for, and the alert itself
    (changed in place: its expression also reads the held helper; keep_firing_for removed)."""
    keep = seconds(rule.pop("keep_firing_for", "0s"))
    if keep <= 0:
        return [rule]
    cond, held, active = (f"alert:{key}:{x}" for x in ("condition", "held", "active"))
    n = math.ceil(seconds(rule["for"]) / interval_s)
    keep_w = _dur(keep + interval_s / 2)
    # counted over a window, also when for is 0: an instant read of the helper would find its last
    # sample for VictoriaMetrics' lookback after the condition ended (vmalert writes no stale markers)
    held_expr = f"count_over_time({cond}[{_dur(n * interval_s + interval_s / 2)}]) >= {n + 1}"
    now = f"max_over_time({cond}[{_dur(interval_s / 2)}])"  # the condition at this evaluation only
    expr = rule["expr"]
    rule["expr"] = f"(\n{expr}\n)\nor\nmax_over_time({active}[{keep_w}])"
    return [{"record": cond, "expr": f"(\n{expr}\n) * 0 + 1"},
            {"record": held, "expr": held_expr},
            {"record": active, "expr": f"{now}\nand\nmax_over_time({held}[{keep_w}])"},
            rule]


def to_vmalert(groups: List[Dict[str, Any]], interval: str = "1m") -> List[Dict[str, Any]]:
    """Any plain Prometheus rule groups as vmalert takes them: each group evaluated every
    ``interval``, keep_firing_for replaced by the helpers (named after the alert, numbered where
    one name has several rules)."""
    i = seconds(interval)
    out = []
    for g in groups:
        names = [r["alert"] for r in g["rules"] if "alert" in r]
        seen: Dict[str, int] = {}
        rules: List[Dict[str, Any]] = []
        for r in g["rules"]:
            r = dict(r)
            if "alert" in r:
                n = seen[r["alert"]] = seen.get(r["alert"], 0) + 1
                key = r["alert"] if names.count(r["alert"]) == 1 else f"{r['alert']}{n}"
                rules += keep_helpers(key, r, i)
            else:
                rules.append(r)
        out.append({**{k: v for k, v in g.items() if k != "rules"}, "interval": interval, "rules": rules})
    return out


def render_vmalert_groups(slo: Dict[str, Any], interval: Optional[str] = None) -> List[Dict[str, Any]]:
    """The pack for vmalert, its alerting group evaluated every ``interval`` (default: the SLO's
    evaluation_interval), the steady and the slow alerts' groups every ``steady_interval`` and
    ``slow_interval``, and the views' group every
    ``views_interval`` (as ``rules.render_groups``); each alert's helpers count its own group's
    evaluations."""
    interval = interval or slo["evaluation_interval"]
    groups = cadence.of_slo(slo)
    common = slo["labels"]

    def rules_of(recordings, keyed, every: str) -> List[Dict[str, Any]]:
        out: List[Dict[str, Any]] = [r.as_rule(common) for r in recordings]
        for key, rule in keyed:
            out += keep_helpers(key, rule, seconds(every))
        return out

    out = [{"name": GROUP, "interval": interval, "rules": rules_of(groups.recordings, groups.alerts, interval)}]
    return out + [{"name": name, "interval": every, "rules": rules_of(recordings, alerts, every)}
                  for name, every, recordings, alerts in groups.later(slo)]


VM_HEADER = ("# Rendered by `vllm-sidecar-exporter rules --slo rules/slo.yaml --out-dir .` from the SLO file,\n"
             "# for vmalert (VictoriaMetrics): keep_firing_for is kept by the alert:<Rule>:* helper rules.\n"
             "# Do not edit by hand: change the SLO file and render again.\n")


def render_vmalert(slo: Dict[str, Any], interval: Optional[str] = None) -> str:
    return VM_HEADER + dump({"groups": render_vmalert_groups(slo, interval)})
