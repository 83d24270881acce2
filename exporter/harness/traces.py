"""Public LLM-serving request traces: arrival times with prompt and output token counts, to drive
a realistic load (a busy day) against a real or simulated vLLM.

The repository carries one hour each of Azure's public LLM inference traces of 2023
(``tests/fixtures/traces/``, CC-BY 4.0, see the PROVENANCE there): ``conv`` (a chat service) and
``code`` (a coding assistant). Their rows are ``TIMESTAMP,ContextTokens,GeneratedTokens`` with
timestamps like ``2023-11-16 18:15:46.6805900`` (seven fractional digits, no zone).

    for offset_s, prompt_tokens, output_tokens in load_trace(path):
        ...
"""

from __future__ import annotations

import csv
import gzip
import io
from datetime import datetime
from pathlib import Path
from typing import Iterator, Optional, Tuple, Union

TraceRow = Tuple[float, int, int]


def _parse_time(text: str) -> datetime:
    text = text.strip()
    if "." in text:
        head, frac = text.split(".", 1)
        text = f"{head}.{frac[:6]:0<6}"  # datetime takes microseconds: 7 digits -> 6
        return datetime.strptime(text, "%Y-%m-%d %H:%M:%S.%f")
    return datetime.strptime(text, "%Y-%m-%d %H:%M:%S")


def load_trace(path: Union[str, Path], start_s: float = 0.0, duration_s: Optional[float] = None,
               max_prompt_tokens: Optional[int] = None, max_output_tokens: Optional[int] = None) -> Iterator[TraceRow]:
    """Yields ``(arrival_offset_s, prompt_tokens, output_tokens)`` in arrival order.

    Offsets count from the trace's first arrival. ``start_s``/``duration_s`` cut a window out of
    the trace (offsets stay relative to the trace's start; subtract ``start_s`` to replay from
    zero). Rows whose prompt or output exceeds ``max_prompt_tokens``/``max_output_tokens`` are
    skipped (e.g. the 14,050-token prompt of ``conv``, beyond an 8,192-token test model). A
    ``.gz`` path is read compressed."""
    p = Path(path)
    raw = gzip.open(p, "rb") if p.suffix == ".gz" else open(p, "rb")
    with raw, io.TextIOWrapper(raw, encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f)
        header = [h.strip() for h in next(reader)]
        i_t, i_p, i_o = header.index("TIMESTAMP"), header.index("ContextTokens"), header.index("GeneratedTokens")
        first = None
        last = None
        for row in reader:
            if not row:
                continue
            t = _parse_time(row[i_t])
            if first is None:
                first = t
            off = (t - first).total_seconds()
            if last is not None and off < last:
                raise ValueError(f"{p}: arrivals out of order at {row[i_t]}")
            last = off
            if off < start_s:
                continue
            if duration_s is not None and off >= start_s + duration_s:
                break
            prompt, output = int(row[i_p]), int(row[i_o])
            if (max_prompt_tokens is not None and prompt > max_prompt_tokens) or \
                    (max_output_tokens is not None and output > max_output_tokens):
                continue
            yield off, prompt, output
