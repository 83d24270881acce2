"""Parsing the Prometheus text exposition format, as vLLM serves it, at a constant cost per line.

vLLM answers ``/metrics`` in the plain text format (version 0.0.4). The parser also reads what
other servers put on the same kind of page: OpenMetrics-style float timestamps and exemplars,
and Prometheus 3's quoted UTF-8 names (``{"vllm:name", "a.b"="x"}``). It yields the same samples
as ``prometheus_client``'s text parser (golden tests on real vLLM pages, property tests on
generated ones).

How it stays cheap: consecutive pages of one server carry the same series text in the same
order; only values change. A line ``<series> <value>`` is split once at its last space and the
series text looked up in a cache of series already parsed and validated; the whole label work of
every poll after the first is one dictionary look-up and one ``float()``. A line that misses the
cache (first sight, odd spacing, a timestamp, an exemplar, a syntax error) goes down the careful
path, which parses it completely and caches its series text when that is safe.

``Parser(select=...)``: the caller says which series it wants (``select(name, labels)`` returns a
note, or None for a valid series it does not read). Unwanted series are still read far enough to
count a malformed line honestly (the cached series text was validated; the value is checked with
``float``), but no sample is built for them. A selected series that occurs twice on one page is
rejected (reason ``duplicate``; the first is kept, as Prometheus keeps the first).

The same page again: a poll loop reads one server's page over and over, and it keeps its shape
(the same lines in the same order, only the values differ). With ``select``, after a page read
without a bad line and without the careful path, the parser keeps that page's shape (``_Plan``:
where the sample lines are, their series text, the notes of the selected ones). The next page is
first held against it with whole-list operations (the comment lines equal, each sample line
starts with its series text and a space, the values have no space, no ``_``, at most 40
characters, and ``float`` takes every one); when all of that holds, the page is read as the loop
would read it, without a step per line in Python. Anything else (a line more or less, a series
renamed, one odd value) and the page is read line by line as described above; nothing else
differs. The shape is kept only for pages of at most ``_PLAN_MAX_CHARS`` characters and is
dropped with the series cache.

Limits (``Limits``): a line, a metric name or a label value over its limit, or more labels than
allowed, is rejected with reason ``too_long``; the series cache is bounded in bytes (estimated
from the text it holds) and is emptied, releasing its memory, when a page would push it over.

A line that cannot be read is skipped and counted in ``Page.malformed`` by reason; it never
aborts the page and nothing but this module's own ``ParseError`` is raised inside it (and that
one never escapes ``parse``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

Labels = Tuple[Tuple[str, str], ...]

# Reasons a line (or a value read from it) is rejected: ``vllm_sidecar_parse_malformed_lines_total{reason}``.
# ``invalid_value`` and ``duplicate`` are decided by the reader of the inputs (``inputs``), the
# others here.
MALFORMED_REASONS = ("syntax", "too_long", "duplicate", "invalid_value")

_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*\Z")
_LABEL_NAME_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")


class Sample(NamedTuple):
    name: str
    labels: Labels
    value: float

    def label(self, key: str, default: Optional[str] = None) -> Optional[str]:
        for k, v in self.labels:
            if k == key:
                return v
        return default


@dataclass(frozen=True)
class Limits:
    """What one page may hold before a line is rejected as ``too_long``."""

    max_line_chars: int = 16_384
    max_name_chars: int = 256
    max_label_value_chars: int = 4_096
    max_labels: int = 128
    cache_bytes: int = 8 << 20  # the series cache, estimated from the text it holds


DEFAULT_LIMITS = Limits()


@dataclass
class Page:
    samples: List[Sample] = field(default_factory=list)  # every sample (no ``select``)
    selected: List[Tuple[Any, float]] = field(default_factory=list)  # (note, value) with ``select``
    types: Dict[str, str] = field(default_factory=dict)
    malformed: int = 0
    reasons: Dict[str, int] = field(default_factory=dict)  # malformed lines by reason
    first_error: Optional[str] = None
    lines: int = 0  # sample lines read (well-formed or not)
    counted: int = 0  # series ``select`` answered ``COUNT`` for
    shape: Any = None  # read through a kept shape: that shape (the same object, the same notes in ``selected``)

    def names(self) -> set:
        return {s.name for s in self.samples}

    def reject(self, reason: str, message: str) -> None:
        self.malformed += 1
        self.reasons[reason] = self.reasons.get(reason, 0) + 1
        if self.first_error is None:
            self.first_error = f"{reason}: {message[:160]}"


class ParseError(ValueError):
    """A line that is not valid exposition text."""

    def __init__(self, message: str, reason: str = "syntax") -> None:
        super().__init__(message)
        self.reason = reason


# -- the careful path: one line, completely --------------------------------------------------

def _quoted(text: str, i: int, limit: int) -> Tuple[str, int]:
    """The string quoted at ``text[i] == '"'``, unescaped, and the index after its closing quote."""
    n = len(text)
    i += 1
    start = i
    j = text.find('"', i)
    k = text.find("\\", i)
    if j >= 0 and (k < 0 or k > j):  # no escape inside: one slice
        if j - start > limit:
            raise ParseError("label value too long", "too_long")
        return text[start:j], j + 1
    buf = []
    while True:
        if i >= n:
            raise ParseError("unterminated quoted string")
        c = text[i]
        if c == "\\":
            if i + 1 >= n:
                raise ParseError("dangling escape")
            e = text[i + 1]
            if e == "n":
                buf.append("\n")
            elif e in '\\"':
                buf.append(e)
            else:  # Prometheus keeps unknown escapes as written
                buf.append("\\" + e)
            i += 2
        elif c == '"':
            i += 1
            break
        else:
            buf.append(c)
            i += 1
        if len(buf) > limit:
            raise ParseError("label value too long", "too_long")
    return "".join(buf), i


def _skip_ws(text: str, i: int) -> int:
    n = len(text)
    while i < n and text[i] in " \t":
        i += 1
    return i


def _parse_braces(text: str, i: int, limits: Limits, name: Optional[str]) -> Tuple[Optional[str], Labels, int]:
    """Parse ``{...}`` starting at ``text[i] == '{'``. A bare quoted string (no ``=``) is the
    metric name (Prometheus 3's UTF-8 syntax). Returns (name, labels, index after '}')."""
    n = len(text)
    i += 1
    out: List[Tuple[str, str]] = []
    seen = set()
    while True:
        i = _skip_ws(text, i)
        if i >= n:
            raise ParseError("unterminated label set")
        c = text[i]
        if c == "}":
            return name, tuple(out), i + 1
        if c == '"':
            key, i = _quoted(text, i, limits.max_name_chars)
            i = _skip_ws(text, i)
            if i < n and text[i] in ",}":  # a quoted name on its own: the metric name
                if name is not None:
                    raise ParseError("two metric names")
                if not key:
                    raise ParseError("empty metric name")
                name = key
                if text[i] == ",":
                    i += 1
                continue
        else:
            j = i
            while j < n and (text[j].isalnum() or text[j] == "_") and text[j].isascii():
                j += 1
            key = text[i:j]
            if not _LABEL_NAME_RE.match(key):
                raise ParseError(f"bad label name {text[i:i + 20]!r}")
            i = _skip_ws(text, j)
        if len(key) > limits.max_name_chars:
            raise ParseError("label name too long", "too_long")
        if i >= n or text[i] != "=":
            raise ParseError("label without '='")
        i = _skip_ws(text, i + 1)
        if i >= n or text[i] != '"':
            raise ParseError("label value not quoted")
        value, i = _quoted(text, i, limits.max_label_value_chars)
        if key in seen:
            raise ParseError(f"label {key!r} twice")
        seen.add(key)
        out.append((key, value))
        if len(out) > limits.max_labels:
            raise ParseError("too many labels", "too_long")
        i = _skip_ws(text, i)
        if i < n and text[i] == ",":
            i += 1
        elif i < n and text[i] != "}":
            raise ParseError("expected ',' between labels")


def _number(text: str) -> float:
    t = text.strip()
    if not t or "_" in t:
        raise ParseError(f"not a number: {text[:30]!r}")
    try:
        return float(t)  # NaN, +Inf, -Inf, 1e+06
    except ValueError:
        raise ParseError(f"not a number: {text[:30]!r}") from None


def parse_line(line: str, limits: Limits = DEFAULT_LIMITS) -> Tuple[str, Labels, float, int]:
    """One sample line: (name, labels, value, end of the series text). Raises ParseError."""
    n = len(line)
    if n > limits.max_line_chars:
        raise ParseError("line too long", "too_long")
    i = _skip_ws(line, 0)
    name: Optional[str] = None
    if i < n and line[i] != "{":
        j = i
        while j < n and line[j] not in " \t{":
            j += 1
        name = line[i:j]
        if len(name) > limits.max_name_chars:
            raise ParseError("metric name too long", "too_long")
        if not _NAME_RE.match(name):
            raise ParseError(f"bad metric name {name[:40]!r}")
        i = j
    labels: Labels = ()
    if i < n and line[i] == "{":
        name, labels, i = _parse_braces(line, i, limits, name)
    if not name:
        raise ParseError("no metric name")
    end = i
    rest = line[i:]
    if rest and rest[0] not in " \t":
        raise ParseError("no space before the value")
    hash_at = rest.find(" # ")
    if hash_at >= 0:  # an OpenMetrics exemplar: "value [ts] # {labels} value [ts]"
        rest = rest[:hash_at]
    parts = rest.split()
    if not parts or len(parts) > 2:
        raise ParseError("expected a value and an optional timestamp")
    value = _number(parts[0])
    if len(parts) == 2:
        ts = _number(parts[1])  # integer milliseconds (text format) or float seconds (OpenMetrics)
        if not math.isfinite(ts):
            raise ParseError("timestamp not finite")
    return name, labels, value, end


def _entry_bytes(key: str, labels: Labels) -> int:
    return 120 + 2 * len(key) + sum(80 + len(k) + len(v) for k, v in labels)


_SKIP = object()  # a valid series the caller does not read
_PLAN_MAX_CHARS = 1 << 20  # a page's shape is kept for pages up to this long (vLLM's: 50-500 KB)


def _getter(idx: Sequence[int]) -> Callable[[Sequence], tuple]:
    """``itemgetter`` that always answers a tuple (``itemgetter(i)`` answers the item alone)."""
    if len(idx) >= 2:
        return itemgetter(*idx)
    if len(idx) == 1:
        i = idx[0]
        return lambda seq: (seq[i],)
    return lambda seq: ()


class _Plan:
    """The shape of a page read cleanly with ``select``: its lines that are not samples (kept
    as they were) and, per sample line, its series text followed by a space and where its value
    starts; the selected lines' notes; how many lines ``select`` counted."""

    __slots__ = ("n", "get_other", "other", "get_samples", "heads", "values", "notes", "get_selected",
                 "counted", "clears")

    def __init__(self, lines: List[str], cache: Dict[str, Any], clears: int) -> None:
        self.n = len(lines)
        self.clears = clears
        other: List[int] = []
        samples: List[int] = []
        self.heads: List[str] = []
        self.values: List[slice] = []
        self.notes: List[Any] = []
        selected: List[int] = []
        self.counted = 0
        for i, line in enumerate(lines):
            if not line or line[0] == "#":
                other.append(i)
                continue
            head = line.rpartition(" ")[0]
            e = cache[head]  # a clean page: every sample line's series text is cached
            samples.append(i)
            self.heads.append(head + " ")
            self.values.append(slice(len(head) + 1, None))
            if e is _SKIP:
                continue
            if e is COUNT:
                self.counted += 1
                continue
            selected.append(len(samples) - 1)
            self.notes.append(e[0])
        self.get_other = _getter(other)
        self.other = self.get_other(lines)
        self.get_samples = _getter(samples)
        self.get_selected = _getter(selected)

    def read(self, lines: List[str]) -> Optional[Page]:
        """The page of ``lines`` as the loop reads it, when it has this shape; else None."""
        if len(lines) != self.n or self.get_other(lines) != self.other:
            return None
        sl = self.get_samples(lines)
        if not all(map(str.startswith, sl, self.heads)):
            return None
        vals = list(map(str.__getitem__, sl, self.values))
        joined = "".join(vals)
        # the loop's conditions for a cached series: its value text is what follows the last
        # space (none in it), at most 40 characters, no "_", read by float
        if " " in joined or "_" in joined or (vals and max(map(len, vals)) > 40):
            return None
        try:
            floats = list(map(float, vals))
        except ValueError:
            return None
        page = Page()
        page.selected = list(zip(self.notes, self.get_selected(floats)))
        page.counted = self.counted
        page.lines = len(vals)
        page.shape = self
        return page


class _Count:
    """``select`` may return ``COUNT``: a valid series not read, only counted (``Page.counted``)."""

    def __repr__(self) -> str:
        return "COUNT"


COUNT = _Count()


class Parser:
    """A parser that remembers the series text it has read (bounded in bytes, per instance)."""

    def __init__(self, select: Optional[Callable[[str, Labels], Any]] = None,
                 limits: Limits = DEFAULT_LIMITS) -> None:
        self._select = select
        self.limits = limits
        self._cache: Dict[str, Any] = {}
        self._ids: Dict[Tuple[str, Labels], int] = {}
        self._next_id = 0  # never reset: ids from before a clear never collide with new ones
        self.cache_bytes = 0
        self.cache_clears = 0
        self._plan: Optional[_Plan] = None  # the shape of the last clean page (``select`` only)
        self.plan_reads = 0  # pages read through it

    def clear(self) -> None:
        self._cache = {}  # a new dict: the old table's memory goes back at once
        self._ids = {}
        self._plan = None
        self.cache_bytes = 0
        self.cache_clears += 1

    def parse(self, text: str) -> Page:
        """Parse one exposition page. Never raises on bad lines: they are counted."""
        lines = text.split("\n")
        plan = self._plan
        if plan is not None and plan.clears == self.cache_clears:
            page = plan.read(lines)
            if page is not None:
                self.plan_reads += 1
                return page
        page = Page()
        cache = self._cache
        get = cache.get
        max_line = self.limits.max_line_chars
        types = page.types
        selected = page.selected
        select = self._select is not None
        seen: set = set()
        samples = page.samples
        nlines = 0
        careful = 0
        for line in lines:
            if not line:
                continue
            if line[0] == "#":
                if not select and line.startswith("# TYPE "):
                    bits = line.split(None, 3)
                    if len(bits) == 4 and len(line) <= max_line:
                        types[bits[2]] = bits[3].strip()
                continue
            nlines += 1
            head, _, val = line.rpartition(" ")
            e = get(head)
            if e is not None:
                # a cached series text is valid and within the limits: only the value is new
                if len(val) > 40 or "_" in val:
                    e = None  # no float is written that long; "1_0" is Python's, not Prometheus'
                else:
                    try:
                        v = float(val)
                    except ValueError:
                        e = None  # odd value text: the careful path decides
            if e is None:
                careful += 1
                if len(line) > max_line:
                    page.reject("too_long", f"line of {len(line)} characters")
                else:
                    self._careful(line, head, val, page, seen)
                continue
            if e is _SKIP:
                continue
            if select:
                if e is COUNT:
                    page.counted += 1
                    continue
                note, ident = e
                if ident in seen:
                    page.reject("duplicate", f"series seen twice on the page: {head[:120]}")
                    continue
                seen.add(ident)
                selected.append((note, v))
            else:
                samples.append(Sample(e[0], e[1], v))
        page.lines += nlines
        if select and not careful and not page.malformed and len(text) <= _PLAN_MAX_CHARS:
            self._plan = _Plan(lines, cache, self.cache_clears)  # this shape, for the next page
        return page

    def _careful(self, line: str, head: str, val: str, page: Page, seen: set) -> None:
        stripped = line.strip()
        if not stripped:
            page.lines -= 1
            return
        if stripped[0] == "#":  # an indented comment
            page.lines -= 1
            if stripped.startswith("# TYPE "):
                bits = stripped.split(None, 3)
                if len(bits) == 4:
                    page.types[bits[2]] = bits[3].strip()
            return
        # a known series followed by a timestamp: "<series> <value> <ts>"
        head2, sep, mid = head.rpartition(" ")
        e = self._cache.get(head2) if sep else None
        if e is not None:
            try:
                v = _number(mid)
                ts = _number(val)
                if not math.isfinite(ts):
                    raise ParseError("timestamp not finite")
            except ParseError as exc:
                page.reject(exc.reason, f"{exc}: {line[:120]!r}")
                return
            self._emit(e, v, head2, page, seen)
            return
        try:
            name, labels, v, end = parse_line(line, self.limits)
        except ParseError as exc:
            page.reject(exc.reason, f"{exc}: {line[:120]!r}")
            return
        key = line[:end]
        e = self._remember(key, name, labels)
        self._emit(e, v, key, page, seen)

    def _remember(self, key: str, name: str, labels: Labels) -> Any:
        e = self._cache.get(key)
        if e is not None:
            return e
        if self._select is not None:
            note = self._select(name, labels)
            if note is None:
                e = _SKIP
            elif note is COUNT:
                e = COUNT
            else:
                e = (note, self._ident(name, labels))
        else:
            e = (name, labels)
        size = _entry_bytes(key, labels)
        if self.cache_bytes + size > self.limits.cache_bytes:
            self.clear()
            if self._select is not None and e is not _SKIP and e is not COUNT:
                e = (e[0], self._ident(name, labels))
        if size <= self.limits.cache_bytes:
            self._cache[key] = e
            self.cache_bytes += size
        return e

    def _ident(self, name: str, labels: Labels) -> int:
        """One number per series (name and label set, in any label order)."""
        key = (name, tuple(sorted(labels)))
        ident = self._ids.get(key)
        if ident is None:
            ident = self._ids[key] = self._next_id
            self._next_id += 1
        return ident

    def _emit(self, e: Any, v: float, key: str, page: Page, seen: set) -> None:
        if e is _SKIP:
            return
        if e is COUNT:
            page.counted += 1
            return
        if self._select is not None:
            note, ident = e
            if ident in seen:
                page.reject("duplicate", f"series seen twice on the page: {key[:120]}")
                return
            seen.add(ident)
            page.selected.append((note, v))
        else:
            page.samples.append(Sample(e[0], e[1], v))


def parse(text: str) -> Page:
    """Parse one page with a fresh parser (no memory of earlier pages), every sample kept."""
    return Parser().parse(text)


def format_float(v: float) -> str:
    """How Python's prometheus_client (and so vLLM) writes a float: ``120.0``, ``+Inf``."""
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    if math.isnan(v):
        return "NaN"
    return repr(float(v))
