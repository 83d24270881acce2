"""The live terminal view of one sidecar's signals: what the demo shows and what ``top`` shows
for a real vLLM. It reads the typed ``Published`` state, never metric names.

``View.render(pub, header, footer)`` returns the text of one screen; ``View.show`` redraws it on
a terminal or, in a plain pipe, prints one block after another. ``View.note`` keeps the first
time each kind of trouble was seen, for the summary at the end.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, TextIO

from .signals import Distribution, Lora, ModelSignals
from .state import Published

LEVELS = {0: "ok", 1: "elevated", 2: "saturated", 3: "thrashing"}


def fmt(v: Optional[float], unit: str = "", digits: int = 2) -> str:
    if v is None:
        return "—"
    if unit == "s":
        return f"{v * 1000:.0f}ms" if v < 1 else f"{v:.{digits}f}s"
    if unit == "%":
        return f"{v * 100:.0f}%"
    if abs(v) >= 100:
        return f"{v:,.0f}{unit}"
    return f"{v:.{digits}f}{unit}"


def _q(d: Optional[Distribution], q: float) -> Optional[float]:
    return d.at(q) if d is not None else None


def _yes(flag: Optional[bool]) -> str:
    return "—" if flag is None else ("YES" if flag else "no")


class View:
    """What the terminal shows, built from the sidecar's latest published state."""

    def __init__(self, out: TextIO, tty: bool) -> None:
        self.out = out
        self.tty = tty
        self.first_seen: Dict[str, float] = {}

    def note(self, what: str, elapsed: float) -> None:
        self.first_seen.setdefault(what, elapsed)

    def trouble(self, pub: Published, elapsed: float, long_prompt_rate: float = 0.05) -> None:
        """Remember when each kind of trouble was first seen."""
        up = dict(pub.up)
        for m in pub.signals.models:
            if m.busy_low is not None and m.busy_low.flagged:
                self.note("GPU busy, tokens low", elapsed)
            if m.stalled:
                self.note("engine stalled", elapsed)
            if m.kv.pressure_level is not None and m.kv.pressure_level >= 2:
                self.note(f"KV pressure {LEVELS[m.kv.pressure_level]}", elapsed)
            if (m.prompts.long_per_second or 0) > long_prompt_rate:
                self.note("long-prompt surge", elapsed)
        if up.get("vllm") is False:
            self.note("vLLM unreachable", elapsed)
        if pub.vllm_restarts_total:
            self.note("vLLM restart seen", elapsed)

    def model_lines(self, m: ModelSignals) -> List[str]:
        tp, kv, lat, pr = m.throughput, m.kv, m.latency, m.prompts
        level = kv.pressure_level
        bl = m.busy_low
        return [
            f"  model       {m.model}",
            f"  throughput  {fmt(tp.generation_tokens_per_second, ' tok/s', 0)} out   "
            f"{fmt(tp.prompt_tokens_per_second, ' tok/s', 0)} in   baseline {fmt(bl.baseline if bl else None, ' tok/s', 0)}"
            f"   GPU busy + tokens low: {_yes(bl.flagged if bl else None)}",
            f"  latency     TTFT p50 {fmt(_q(lat.ttft, 0.5), 's')} p95 {fmt(_q(lat.ttft, 0.95), 's')} "
            f"p99 {fmt(_q(lat.ttft, 0.99), 's')}   ITL p95 {fmt(_q(lat.itl, 0.95), 's')}"
            f"   e2e p95 {fmt(_q(lat.e2e, 0.95), 's')}",
            f"  KV cache    usage {fmt(kv.usage, '%')}   pressure {LEVELS.get(level, '?') if level is not None else '—'}"
            f"   waiting {fmt(kv.waiting, '', 0)} (for capacity {fmt(kv.waiting_for_capacity, '', 0)})"
            f"   preemptions {fmt(tp.preemptions_per_second, '/s')}   full in {fmt(kv.seconds_to_full, 's', 0)}",
            f"  prompts     long {fmt(pr.long_per_second, '/s')} ({fmt(pr.long_ratio, '%')})"
            f"   length p95 {fmt(_q(pr.length, 0.95), ' tokens', 0)}   prefix-cache hits {fmt(m.caches.prefix_cache_hit_ratio, '%')}",
            f"  SLO         TTFT within objective {fmt(lat.ttft_slo_attainment, '%')}   speed within objective "
            f"{fmt(lat.itl_slo_attainment, '%')}   errors {fmt(tp.error_ratio, '%')}",
            f"  engine      stalled: {_yes(m.stalled)}",
        ]

    @staticmethod
    def lora_lines(lo: Lora) -> List[str]:
        """The adapters with requests now (vLLM says which, not how many), known and max_lora."""
        def names(flag: str) -> str:
            got = [a.name for a in lo.adapters if getattr(a, flag)]
            return ", ".join(got) if got else "none"

        slots = lo.max_adapters if lo.max_adapters is not None else "?"
        line = (f"  LoRA        {lo.active} of {lo.known} known adapters with requests (max {slots} per batch): "
                f"{names('active')}")
        if lo.distinguished:
            line += f"   running: {names('running')}   waiting: {names('waiting')}"
        return [line]

    def render(self, pub: Published, header: Sequence[str] = (), footer: Sequence[str] = ()) -> str:
        up = dict(pub.up)
        lines = list(header)
        lines.append(f"  vLLM        {'up' if up.get('vllm') else 'DOWN'}   restarts seen {pub.vllm_restarts_total}")
        if not pub.signals.models:
            lines.append("  (no signals yet: rates and quantiles need two reads)")
        for m in pub.signals.models:
            lines += self.model_lines(m)
        if pub.signals.lora is not None:
            lines += self.lora_lines(pub.signals.lora)
        gpu = pub.gpu
        if gpu is not None and gpu.gpus:
            utils = " ".join(fmt(x.utilization, "%") for x in gpu.gpus)
            power = sum(x.power_watts or 0 for x in gpu.gpus)
            temps = max(x.temperature_celsius or 0 for x in gpu.gpus)
            thr = any((x.throttle_reasons or 0) & 0x60 for x in gpu.gpus)
            lines.append(f"  GPUs        {len(gpu.gpus)} × util {utils}   power {power:.0f} W   hottest {temps:.0f}°C"
                         f"   thermal throttling {'YES' if thr else 'no'}")
        lines += footer
        return "\n".join(lines)

    def show(self, text: str) -> None:
        if self.tty:
            self.out.write("\x1b[H\x1b[2J" + text + "\n")
        else:
            self.out.write(text + "\n\n")
        self.out.flush()
