"""The flight record's encoder: closed blocks -> OpenMetrics text (-> gzip), and the child process
that runs it for ``/debug/flight``.

Why a child process: decoding the blocks, formatting every sample as text and gzipping it is
pure-Python work of seconds for a whole record (docs/performance.md, "A scrape during
/debug/flight downloads"); done in the sidecar's interpreter it holds the GIL the threads
answering ``/metrics`` need. So ``flight.FlightService`` hands a child (``python -I -c ...``,
this module, stdlib only, so it starts in tens of milliseconds) the blocks as they are stored,
compressed (``pack``: bytes, the schemas pickled once per schema), and reads the encoded answer
back over a pipe: the parent only copies bytes.

The child lowers its own priority (``nice`` 10 and, on Linux, ``SCHED_IDLE``: on a busy node
the sidecar's poll and scrapes come first; measured better than ``nice`` alone), asks Linux to
kill it if its parent dies (``PR_SET_PDEATHSIG``), reads its whole request from stdin, writes the
answer to stdout in chunks of about ``chunk_chars`` characters, and exits.
The input is trusted (it comes from the parent over a pipe only the two hold), hence pickle.
"""

from __future__ import annotations

import math
import pickle
import sys
import zlib
from array import array
from typing import Dict, Iterator, List, Sequence, Tuple

Labels = Tuple[Tuple[str, str], ...]
Key = Tuple[str, Labels]  # (sample name, labels)

VERSION = 1  # of the request ``pack`` writes and ``unpack`` reads


def unshuffle(data: bytes) -> bytes:
    n = len(data) // 8
    out = bytearray(len(data))
    for i in range(8):
        out[i::8] = data[i * n:(i + 1) * n]
    return bytes(out)


def decode_columns(data: bytes, n: int, width: int) -> List[array]:
    """A block's stored values (zlib over byte-shuffled column-major doubles) -> one array per
    series, ``n`` values each."""
    raw = array("d")
    raw.frombytes(unshuffle(zlib.decompress(data)))
    return [raw[j * n:(j + 1) * n] for j in range(width)]


# -- OpenMetrics ---------------------------------------------------------------------------

def _esc(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _fmt(v: float) -> str:
    if v != v:
        return "NaN"
    if v in (math.inf, -math.inf):
        return "+Inf" if v > 0 else "-Inf"
    return repr(v)


def series_text(key: Key, extra: Labels) -> str:
    name, labels = key
    lab = dict(extra)
    lab.update(labels)
    if not lab:
        return name
    return name + "{" + ",".join(f'{k}="{_esc(v)}"' for k, v in sorted(lab.items())) + "}"


def openmetrics(blocks: Sequence, start: float = -math.inf, end: float = math.inf,
                labels: Labels = (), chunk_chars: int = 1 << 16) -> Iterator[str]:
    """The record between ``start`` and ``end`` (unix seconds, both included) as OpenMetrics
    text in chunks of about ``chunk_chars``: one family per sample name (``unknown``: the
    record keeps samples, not types), each series' samples in time order, a timestamp on
    every sample, ``# EOF`` last. ``labels`` are added to every series (the pod's own).
    A block is anything with ``schema.keys``, ``times``, ``t0``, ``t1`` and ``columns()``."""
    chosen = [b for b in blocks if b.t1 >= start and b.t0 <= end]
    # series -> [(block, column index)], families in the order first seen
    where: Dict[Key, List[Tuple[int, int]]] = {}
    for bi, b in enumerate(chosen):
        for j, k in enumerate(b.schema.keys):
            lst = where.get(k)
            if lst is None:
                where[k] = [(bi, j)]
            else:
                lst.append((bi, j))
    families: Dict[str, List[Key]] = {}
    for k in where:
        families.setdefault(k[0], []).append(k)
    cols: Dict[int, List[array]] = {}
    times: Dict[int, List[str]] = {}

    def columns(bi: int) -> List[array]:
        c = cols.get(bi)
        if c is None:
            c = cols[bi] = chosen[bi].columns()
        return c

    def stamps(bi: int) -> List[str]:
        s = times.get(bi)
        if s is None:
            s = times[bi] = [f"{t:.3f}" for t in chosen[bi].times]
        return s

    out: List[str] = []
    size = 0
    for fam in sorted(families):
        out.append(f"# TYPE {fam} unknown\n")
        for k in sorted(families[fam], key=lambda k: k[1]):
            text = series_text(k, labels) + " "
            for bi, j in where[k]:
                b = chosen[bi]
                col = columns(bi)[j]
                ts = stamps(bi)
                bt = b.times
                if b.t0 >= start and b.t1 <= end:
                    lines = [f"{text}{_fmt(v)} {s}\n" for v, s in zip(col, ts)]
                else:
                    lines = [f"{text}{_fmt(v)} {s}\n" for v, s, t in zip(col, ts, bt) if start <= t <= end]
                out.extend(lines)
                size += len(lines) * (len(text) + 24)
                if size >= chunk_chars:
                    yield "".join(out)
                    out = []
                    size = 0
    out.append("# EOF\n")
    yield "".join(out)


def encoded(blocks: Sequence, start: float, end: float, labels: Labels, gz: bool,
            chunk_chars: int = 1 << 16) -> Iterator[bytes]:
    """``openmetrics`` as bytes, one gzip stream when ``gz``."""
    chunks = openmetrics(blocks, start, end, labels, chunk_chars)
    if not gz:
        for c in chunks:
            yield c.encode()
        return
    comp = zlib.compressobj(5, zlib.DEFLATED, 31)
    for c in chunks:
        out = comp.compress(c.encode())
        if out:
            yield out
    yield comp.flush()


# -- the request a child gets --------------------------------------------------------------

class _Schema:
    __slots__ = ("keys",)

    def __init__(self, keys: Tuple[Key, ...]) -> None:
        self.keys = keys


class PackedBlock:
    """A block as the child gets it: its schema, its timestamps, its values still compressed."""

    __slots__ = ("schema", "times", "data", "n")

    def __init__(self, schema: _Schema, times: array, data: bytes) -> None:
        self.schema = schema
        self.times = times
        self.data = data
        self.n = len(times)

    @property
    def t0(self) -> float:
        return self.times[0]

    @property
    def t1(self) -> float:
        return self.times[-1]

    def columns(self) -> List[array]:
        """The values, one array per series of the schema (in its order)."""
        return decode_columns(self.data, self.n, len(self.schema.keys))


def pack(blocks: Sequence[Tuple[bytes, bytes, bytes]], start: float, end: float, labels: Labels, gz: bool,
         chunk_chars: int = 1 << 16) -> bytes:
    """The child's request: ``blocks`` as (pickled schema keys, timestamps as doubles, stored
    values), each schema's bytes written once however many blocks share it."""
    schemas: List[bytes] = []
    index: Dict[int, int] = {}
    rows = []
    for keys, times, data in blocks:
        i = index.get(id(keys))
        if i is None:
            i = index[id(keys)] = len(schemas)
            schemas.append(keys)
        rows.append((i, times, data))
    return pickle.dumps((VERSION, start, end, tuple(labels), gz, chunk_chars, schemas, rows),
                        protocol=pickle.HIGHEST_PROTOCOL)


def unpack(payload: bytes):
    """``pack``'s bytes -> (blocks, start, end, labels, gz, chunk_chars)."""
    version, start, end, labels, gz, chunk_chars, schemas, rows = pickle.loads(payload)
    if version != VERSION:
        raise ValueError(f"flight encoder request version {version}, this encoder reads {VERSION}")
    sch = [_Schema(pickle.loads(s)) for s in schemas]
    blocks = []
    for i, times, data in rows:
        t = array("d")
        t.frombytes(times)
        blocks.append(PackedBlock(sch[i], t, data))
    return blocks, start, end, labels, gz, chunk_chars


def _die_with_parent() -> None:
    """Linux: SIGKILL when the parent goes, so no encoder outlives a killed sidecar."""
    try:
        import ctypes
        import os
        import signal

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() == 1:  # the parent went before the call
            os._exit(1)
    except Exception:  # noqa: BLE001 - not Linux, or no libc: the broken pipe ends it instead
        pass


def child_main() -> None:
    """The child: one request on stdin, its answer on stdout, then exit."""
    import os

    _die_with_parent()
    try:
        os.nice(10)
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # Linux: runs only when nothing else would
    except (OSError, AttributeError):
        pass
    blocks, start, end, labels, gz, chunk_chars = unpack(sys.stdin.buffer.read())
    out = sys.stdout.buffer
    try:
        for part in encoded(blocks, start, end, labels, gz, chunk_chars):
            out.write(part)
        out.flush()
    except BrokenPipeError:  # the parent gave up on this answer
        os._exit(1)


if __name__ == "__main__":  # pragma: no cover - FlightService runs it with -c
    child_main()
