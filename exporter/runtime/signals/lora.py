"""LoRA adapters: which have requests now, which vLLM has served since it started, and its
``max_lora``, from ``vllm:lora_requests_info`` as ``inputs`` keeps it (``Snapshot.lora``).

How vLLM 0.32 writes it (vllm/v1/metrics/loggers.py and stats.py): at each stats update it joins
the names of the adapters with unfinished requests into the labels ``running_lora_adapters`` and
``waiting_lora_adapters`` and sets that label combination's series to the current unix time;
series of earlier combinations stay. So:

- the state now is the newest series (highest value), wherever it stands on the page;
- the adapters known are the ones named in any series: every adapter that had a request since
  vLLM started (one loaded but never asked for is not named anywhere);
- ``max_lora`` is ``--max-loras``, the most adapters one batch can hold.

What it does not say: how many requests each adapter has. vLLM counts them (``LoRARequestStates``)
and writes only the names. Worse, both labels are filled from the same table, so both list every
adapter with a request running *or* waiting: on vLLM 0.32 pages they are always equal and tell
running from waiting apart for no adapter. The sidecar serves what is true: ``active`` (a request
running or waiting) per adapter and their count; running and waiting separately only when the
page shows that vLLM tells them apart (some series lists different adapters in the two labels).
"""

from __future__ import annotations

from typing import Optional

from ..inputs import Snapshot, lora_newest
from .results import Lora, LoraAdapter


def _max_lora(value: str) -> Optional[int]:
    try:
        n = int(value)
    except ValueError:
        return None
    return n if n > 0 else None


def lora(snap: Snapshot) -> Optional[Lora]:
    """The LoRA state of the page; None when it has no ``vllm:lora_requests_info`` sample (LoRA
    off, an older vLLM, or no LoRA request since vLLM started)."""
    page = snap.lora
    if page is None or not page.series:
        return None
    newest = lora_newest(page.series)
    running = {a for s in newest for a in s.running}
    waiting = {a for s in newest for a in s.waiting}
    active = running | waiting
    apart = any(set(s.running) != set(s.waiting) for s in page.series)
    slots = [n for n in (_max_lora(s.max_lora) for s in newest) if n is not None]
    return Lora(
        max_adapters=max(slots) if slots else None,
        adapters=tuple(LoraAdapter(name=a, active=a in active,
                                   running=(a in running) if apart else None,
                                   waiting=(a in waiting) if apart else None) for a in page.adapters),
        known=page.adapters_total,
        active=len(active),
        running=len(running) if apart else None,
        waiting=len(waiting) if apart else None,
        distinguished=apart,
    )
