"""Loading recorded history into a ``Store``: a promtool unit-test file, an OpenMetrics file
with timestamps, or a Prometheus server over its HTTP API.

- promtool's ``input_series`` (``series`` and ``values`` in the expanding notation: ``1+2x3``,
  ``5x4``, ``_``, ``_x3``, ``stale``, signed numbers, ``Inf``/``NaN``) with the test group's
  ``interval``; samples start at unix time 0, as promtool loads them. A whole unit-test file
  (``tests:``) or a bare mapping with ``input_series`` is accepted.
- OpenMetrics text as ``promtool tsdb create-blocks-from openmetrics`` takes it: every sample
  with a timestamp (seconds), ending in ``# EOF``; gzip-compressed files are read too.
- A Prometheus server: each selector fetched as ``/api/v1/query`` of ``sel[chunk]`` at the end of
  each chunk, so the raw samples come back (a range query would resample them).

Errors name the file and line (or the URL and query) in one line: ``SourceError`` (a server's:
``promapi.ServerError``, one of them; ``promapi`` reads every API answer).
"""

from __future__ import annotations

import gzip
import math
import re
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
import yaml

from .promapi import SourceError
from .promapi import query as api_query
from .promql.durations import DurationError, parse_duration
from .promql.labels import NAME, Labels, make
from .promql.lexer import PromQLSyntaxError, tokenize, unquote
from .series import Store


@dataclass
class Loaded:
    store: Store
    interval_ms: Optional[int] = None  # the evaluation interval the source suggests, if any
    description: str = ""


# -- promtool's series notation -----------------------------------------------------------

_NUM = r"(?:(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?|[iI][nN][fF]|[nN][aA][nN])"
_ITEM = re.compile(rf"(?P<a>[+-]?{_NUM})(?:(?P<op>[+-])(?P<b>{_NUM})x(?P<n>\d+)|x(?P<m>\d+))?")
_BLANK = re.compile(r"_(?:x(\d+))?")


def _num(text: str) -> float:
    low = text.lower().lstrip("+")
    if low in ("inf", "-inf"):
        return -math.inf if low.startswith("-") else math.inf
    if low.lstrip("-") == "nan":
        return math.nan
    return float(text)


def expand_values(text: str) -> List[Optional[float]]:
    """promtool's ``values`` notation to one entry per interval: a float, ``None`` for ``_``, or
    the string ``"stale"``. Raises ``ValueError`` on a bad item."""
    out: List = []
    for item in text.split():
        m = _BLANK.fullmatch(item)
        if m:
            out.extend([None] * (int(m.group(1)) if m.group(1) else 1))
            continue
        if item == "stale":
            out.append("stale")
            continue
        m = _ITEM.fullmatch(item)
        if not m:
            raise ValueError(f"bad value {item!r} (expected a number, _, stale, a+bxn or axn)")
        a = _num(m.group("a"))
        if m.group("n") is not None:
            b = _num(m.group("b"))
            if m.group("op") == "-":
                b = -b
            for _ in range(int(m.group("n")) + 1):
                out.append(a)
                a += b
        elif m.group("m") is not None:
            out.extend([a] * (int(m.group("m")) + 1))
        else:
            out.append(a)
    return out


def parse_series_labels(text: str) -> Labels:
    """``name{a="b", ...}`` or ``{__name__="name", ...}`` to a label set."""
    text = text.strip()
    brace = text.find("{")
    name = text if brace < 0 else text[:brace].strip()
    labels: Dict[str, str] = {}
    if brace >= 0:
        if not text.endswith("}"):
            raise ValueError(f"bad series {text!r}: no closing brace")
        toks = tokenize(text[brace:])
        i = 1
        while toks[i].kind != "}":
            if toks[i].kind != "IDENT" or toks[i + 1].text != "=" or toks[i + 2].kind != "STRING":
                raise ValueError(f"bad label in {text!r} near character {toks[i].pos + brace + 1}")
            labels[toks[i].text] = unquote(toks[i + 2].text)
            i += 3
            if toks[i].kind == ",":
                i += 1
        if toks[i + 1].kind != "EOF":
            raise ValueError(f"bad series {text!r}: text after the labels")
    if name:
        if not re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", name):
            raise ValueError(f"bad metric name {name!r}")
        labels[NAME] = name
    if not labels:
        raise ValueError(f"series {text!r} has no name and no labels")
    return make(labels)


_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _item_line(text: str, group_index: Optional[int], item: int) -> int:
    """The line of input_series item ``item`` (found again only when reporting an error)."""
    try:
        node = yaml.compose(text, Loader=_Loader)
        if group_index is not None:
            node = _child(node, "tests").value[group_index]
        return _child(node, "input_series").value[item].start_mark.line + 1
    except Exception:  # noqa: BLE001 - best effort, for a message
        return 0


def _child(node, key: str):
    return next(v for k, v in node.value if k.value == key)


def input_series_store(items, interval_ms: int, where=lambda i: f"input_series item {i + 1}") -> Store:
    """A store from promtool ``input_series`` items (mappings with ``series`` and ``values``);
    sample ``k`` of a series is at ``k * interval_ms`` from unix time 0."""
    store = Store()
    for i, item in enumerate(items or []):
        if not isinstance(item, dict) or "series" not in item:
            raise SourceError(f"{where(i)}: an input_series item needs 'series' and 'values'")
        try:
            labels = parse_series_labels(str(item["series"]))
            vals = expand_values(str(item.get("values", "") or ""))
        except (ValueError, PromQLSyntaxError) as exc:
            raise SourceError(f"{where(i)}: {exc}") from None
        ts, vs, st = [], [], []
        for k, v in enumerate(vals):
            if v is None:
                continue
            ts.append(k * interval_ms)
            stale = v == "stale"
            vs.append(math.nan if stale else v)
            st.append(stale)
        store.add(labels, ts, vs, st)
    return store


def load_promtool(text: str, path: str = "<input>", test_name: Optional[str] = None) -> Loaded:
    """A promtool unit-test file (its one test group, or the one named ``test_name``) or a
    mapping with ``interval`` and ``input_series``."""
    try:
        doc = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        raise SourceError(f"{path}: not YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(doc, dict):
        raise SourceError(f"{path}: expected a mapping with 'tests' or 'input_series'")
    eval_interval = None
    gi: Optional[int] = None
    if "tests" in doc:
        tests = doc["tests"] or []
        if "evaluation_interval" in doc:
            eval_interval = _duration(doc["evaluation_interval"], f"{path}: evaluation_interval")
        pick = [i for i, t in enumerate(tests) if test_name is None or (t or {}).get("name") == test_name]
        if not pick:
            raise SourceError(f"{path}: no test group named {test_name!r}" if test_name else f"{path}: no test group")
        if len(pick) > 1:
            raise SourceError(f"{path}: {len(pick)} test groups; name one with --test-name")
        gi = pick[0]
        group = tests[gi]
    else:
        group = doc
    if not isinstance(group, dict) or "input_series" not in group:
        raise SourceError(f"{path}: the test group has no input_series")
    interval = eval_interval or 60_000
    if group.get("interval") is not None:
        interval = _duration(group["interval"], f"{path}: interval")
    store = input_series_store(group["input_series"], interval,
                               lambda i: f"{path}:{_item_line(text, gi, i)}")
    return Loaded(store, eval_interval or interval, f"promtool input series from {path}")


def _duration(v, where: str) -> int:
    try:
        ms = parse_duration(str(v))
    except DurationError as exc:
        raise SourceError(f"{where}: {exc}") from None
    if ms <= 0:
        raise SourceError(f"{where}: must be positive")
    return ms


# -- OpenMetrics --------------------------------------------------------------------------

_OM_LINE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?\s+(\S+)(?:\s+(\S+))?\s*(?:#.*)?")
_OM_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"\s*(,|$)')


def _om_labels(text: str) -> Dict[str, str]:
    inner = text[1:-1]
    out: Dict[str, str] = {}
    pos = 0
    while pos < len(inner):
        m = _OM_LABEL.match(inner, pos)
        if not m:
            raise ValueError(f"bad label set {text[:80]!r}")
        out[m.group(1)] = re.sub(r"\\(.)", lambda e: "\n" if e.group(1) == "n" else e.group(1), m.group(2))
        pos = m.end()
    return out


def _split_labels(line: str) -> Tuple[str, str]:
    """Split off an exemplar (``# {...}``) that follows the sample, quotes respected."""
    if "#" not in line:  # nearly every line: no character scan (it was most of a week's read)
        return line, ""
    in_q = esc = False
    depth = 0
    for i, c in enumerate(line):
        if esc:
            esc = False
        elif c == "\\" and in_q:
            esc = True
        elif c == '"':
            in_q = not in_q
        elif not in_q and c == "{":
            depth += 1
        elif not in_q and c == "}":
            depth -= 1
        elif not in_q and depth == 0 and c == "#":
            return line[:i].rstrip(), line[i:]
    return line, ""


def load_openmetrics(data: bytes, path: str = "<input>") -> Loaded:
    if data[:2] == b"\x1f\x8b":
        try:
            data = gzip.decompress(data)
        except OSError as exc:
            raise SourceError(f"{path}: bad gzip data: {exc}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SourceError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    acc: Dict[Labels, Tuple[List[int], List[float]]] = {}
    label_cache: Dict[str, Labels] = {}
    eof = False
    for lineno, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        if eof:
            raise SourceError(f"{path}:{lineno}: content after '# EOF'")
        if line.startswith("#"):
            if line.strip() == "# EOF":
                eof = True
            continue
        body, _ = _split_labels(line)
        m = _OM_LINE.fullmatch(body)
        if not m:
            raise SourceError(f"{path}:{lineno}: not an OpenMetrics sample line: {line[:80]!r}")
        name, ltext, vtext, ttext = m.groups()
        if ttext is None:
            raise SourceError(f"{path}:{lineno}: sample without a timestamp (each sample needs one): {line[:80]!r}")
        key = (name + ltext) if ltext else name
        labels = label_cache.get(key)
        try:
            if labels is None:
                d = _om_labels(ltext) if ltext else {}
                d[NAME] = name
                labels = label_cache[key] = make(d)
            value = float(vtext)
            ts = float(ttext)
        except ValueError as exc:
            raise SourceError(f"{path}:{lineno}: {exc}") from None
        if math.isnan(ts) or math.isinf(ts):
            raise SourceError(f"{path}:{lineno}: invalid timestamp {ttext!r}")
        tv = acc.setdefault(labels, ([], []))
        tv[0].append(int(ts * 1000))
        tv[1].append(value)
    if not eof:
        raise SourceError(f"{path}: no '# EOF' line: not OpenMetrics (promtool's backfill needs one too)")
    store = Store()
    for labels, (ts_list, vs_list) in acc.items():
        store.add(labels, ts_list, vs_list)
    return Loaded(store, None, f"OpenMetrics samples from {path}")


def load_file(path: str, test_name: Optional[str] = None) -> Loaded:
    """A recorded-series file: OpenMetrics text (it ends in ``# EOF``; gzip allowed) or
    promtool's YAML (a mapping), told apart by content."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise SourceError(f"{path}: {exc.strerror}") from None
    if data[:2] == b"\x1f\x8b":
        return load_openmetrics(data, path)
    tail = data.rstrip().rsplit(b"\n", 1)[-1].strip()
    if tail == b"# EOF":
        return load_openmetrics(data, path)
    for line in data.splitlines():
        line = line.strip()
        if not line or line.startswith(b"#"):
            continue
        if re.match(rb"[A-Za-z_][A-Za-z0-9_]*:(\s|$)", line) or line == b"---":
            return load_promtool(data.decode("utf-8", errors="replace"), path, test_name)
        break
    return load_openmetrics(data, path)


# -- Prometheus over HTTP -----------------------------------------------------------------

def fetch_prometheus(url: str, selectors: Sequence[Tuple[str, int]], end_ms: int, chunk_ms: int = 2 * 3600_000,
                     timeout_s: float = 60.0, session=None, drop_names: Iterable[str] = ()) -> Loaded:
    """Raw samples of each ``(selector, from_ms)`` up to ``end_ms``, read with instant queries of
    ``selector[chunk]`` (chunks end at ``from + chunk``, ``from + 2 chunk`` ...). Series named in
    ``drop_names`` (what the rules themselves record) are left out."""
    import requests

    sess = session or requests.Session()
    drop = set(drop_names)
    acc: Dict[Labels, Tuple[List[np.ndarray], List[np.ndarray]]] = {}
    for sel, from_ms in selectors:
        t = from_ms
        while True:
            t_end = min(t + chunk_ms, max(end_ms, from_ms))
            rng = max(t_end - t, 1)
            query = f"{sel}[{rng}ms]"
            result = api_query(sess, url, query, t_end, timeout_s, expect="matrix")
            for item in result:
                labels = make(item.get("metric") or {})
                if dict(labels).get(NAME) in drop:
                    continue
                vals = item.get("values") or []
                if not vals:
                    continue
                ts = np.array([round(float(p[0]) * 1000) for p in vals], dtype=np.int64)
                vs = np.array([float(p[1]) for p in vals], dtype=np.float64)
                got = acc.setdefault(labels, ([], []))
                got[0].append(ts)
                got[1].append(vs)
            if t_end >= end_ms:
                break
            t = t_end
    store = Store()
    for labels, (tl, vl) in acc.items():
        store.add(labels, np.concatenate(tl), np.concatenate(vl))
    return Loaded(store, None, f"raw series from {url}")
