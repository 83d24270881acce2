"""Runbooks rendered from the SLO file, so their queries and numbers never go stale.

The templates (``runbook_templates/<Alert>.md``, shipped in the package) are Markdown with
``{{ ... }}`` placeholders filled from the same context the rules read:

    {{ rec METRIC OP [WINDOW] }}    a per-replica recording rule's name (rate window by default)
    {{ mrec METRIC OP [WINDOW] }}   a per-model recording rule's name
    {{ slo PATH }}                  an SLO value (windows.rate, kv_cache.critical, burn_rates.page.0.long)
    {{ human PATH }}                an SLO duration in words (5 minutes)
    {{ percent PATH }}              an SLO ratio as a percentage
    {{ for RULE }} / {{ severity RULE }} / {{ stays RULE }}
                                    an alert rule's `for` in words, its severity, and how long it
                                    stays firing after its condition clears (keep_firing_for)
    {{ lifecycle RULE [RULE...] }}  the sentence every runbook carries: when it fires and how long
                                    it stays after recovery
    {{ le_long }} {{ itl_ms }} {{ budget }}
                                    the long-prompt bucket bound, the inter-token latency
                                    objective in ms, the error budget in percent

A WINDOW may be ``@PATH`` (an SLO duration). An unknown placeholder is an error, not left in.
"""

from __future__ import annotations

import re
from importlib import resources
from typing import Any, Callable, Dict, List, Mapping

from .alerts import all_alerts
from .context import Ctx, human_duration, le_for

TEMPLATES = "runbook_templates"
OUT_DIR = "docs/runbooks"
_PLACEHOLDER = re.compile(r"\{\{\s*(.*?)\s*\}\}")


def _path(slo: Mapping[str, Any], path: str) -> Any:
    cur: Any = slo
    for part in path.split("."):
        cur = cur[int(part)] if isinstance(cur, list) else cur[part]
    return cur


def _fmt(v: Any) -> str:
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, (int, float)):
        return f"{v:g}"
    if isinstance(v, list):
        return ", ".join(_fmt(x) for x in v)
    return str(v)


class _Renderer:
    def __init__(self, slo: Mapping[str, Any]) -> None:
        self.slo = slo
        self.c = Ctx(slo)
        o = slo["objectives"]
        self.words: Dict[str, Callable[..., str]] = {
            "rec": lambda m, op, w="": self.c.rec(m, op, self._window(w)),
            "mrec": lambda m, op, w="": self.c.mrec(m, op, self._window(w)),
            "slo": lambda p: _fmt(_path(slo, p)),
            "human": lambda p: human_duration(_path(slo, p)),
            "percent": lambda p: f"{_path(slo, p) * 100:g}%",
            "for": lambda rule: human_duration(slo["alerts"][rule]["for"]),
            "severity": lambda rule: slo["alerts"][rule].get("severity", self._default_severity(rule)),
            "stays": lambda rule: human_duration(slo["alerts"][rule].get("keep_firing_for", "0s")),
            "lifecycle": self._lifecycle,
            "le_long": lambda: le_for(slo["long_prompt"]["tokens"]),
            "itl_ms": lambda: f"{1000.0 / o['output_tokens_per_second']:.1f}",
            "budget": lambda: f"{(1 - o['availability']) * 100:.3g}%",
        }
        self._severities = None

    def _lifecycle(self, *rules: str) -> str:
        """One sentence: when the alert fires and how long it stays after recovery."""
        parts = []
        for rule in rules:
            s = self.slo["alerts"][rule]
            fire = "as soon as its condition holds" if s["for"] in ("0s", "0m") else \
                f"once its condition has held for {human_duration(s['for'])}"
            keep = s.get("keep_firing_for")
            stay = (f"stays firing {human_duration(keep)} after the condition clears (so a condition that "
                    f"comes and goes is one alert, not a page each time)") if keep else \
                "resolves at the first evaluation without its condition"
            who = f"`{rule}`: " if len(rules) > 1 else ""
            parts.append(f"{who}fires {fire}, and {stay}.")
        return "**When:** " + " ".join(parts)

    def _window(self, w: str) -> str:
        return human_window(self.slo, w)

    def _default_severity(self, rule: str) -> str:
        if self._severities is None:
            self._severities = {a.key: a.severity for a in all_alerts(self.c)}
        return self._severities[rule]

    def render(self, name: str, text: str) -> str:
        def one(m: "re.Match[str]") -> str:
            word, *args = m.group(1).split()
            fn = self.words.get(word)
            if fn is None:
                raise ValueError(f"runbook {name}: unknown placeholder {{{{ {m.group(1)} }}}}")
            try:
                return fn(*args)
            except (KeyError, IndexError, TypeError) as exc:
                raise ValueError(f"runbook {name}: placeholder {{{{ {m.group(1)} }}}} failed: {exc}") from None
        return _PLACEHOLDER.sub(one, text)


def human_window(slo: Mapping[str, Any], w: str) -> str:
    """A WINDOW argument: empty (the rate window), ``@path`` (an SLO duration) or a duration."""
    if not w:
        return ""
    return _path(slo, w[1:]) if w.startswith("@") else w


def template_names() -> List[str]:
    root = resources.files("exporter.pack").joinpath(TEMPLATES)
    return sorted(p.name[:-3] for p in root.iterdir() if p.name.endswith(".md"))


def template(name: str) -> str:
    return resources.files("exporter.pack").joinpath(TEMPLATES, name + ".md").read_text(encoding="utf-8")


def act_steps(slo: Mapping[str, Any]) -> Dict[str, str]:
    """Per alert, its runbook's "Act" section as plain lines: what an alert carries in its
    ``runbook`` annotation when there is no runbook URL to link to."""
    out = {}
    for rel, text in render_runbooks(slo).items():
        name = rel.rsplit("/", 1)[-1][:-3]
        section = text.split("## Act", 1)[1] if "## Act" in text else ""
        section = section.split("\n## ", 1)[0]
        lines = [ln.strip() for ln in section.strip().splitlines() if ln.strip()]
        out[name] = "\n".join(lines)
    return out


def render_runbooks(slo: Mapping[str, Any]) -> Dict[str, str]:
    """``docs/runbooks/<Alert>.md`` -> text, for every alert."""
    key = id(slo), repr(slo)
    got = _CACHE.get(key)
    if got is None:
        r = _Renderer(slo)
        got = _CACHE[key] = {f"{OUT_DIR}/{name}.md": r.render(name, template(name)) for name in template_names()}
        while len(_CACHE) > 8:
            _CACHE.pop(next(iter(_CACHE)))
    return dict(got)


_CACHE: Dict[Any, Dict[str, str]] = {}
