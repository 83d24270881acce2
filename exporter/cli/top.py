"""``vllm-sidecar-exporter top``: the demo's live terminal view, pointed at a real vLLM.

``top --vllm-url URL`` runs the sidecar in this process (the same flags, environment variables
and configuration file as the sidecar itself) and shows its signals every refresh;
``top --sidecar-url URL`` reads a running sidecar's /metrics instead and shows the same view.
On a terminal the screen is redrawn; in a pipe (or with ``--plain``) one block is printed per
refresh, without escape codes; ``--once`` prints one screen and exits (status 1 when what it reads
could not be read).

``top --replay FILE`` shows the same view over a flight record (``/debug/flight``'s or
``postmortem``'s ``record.om.gz``; gzip or plain) at ``--speed`` times real time, from ``--start``
to ``--end`` (RFC 3339, unix seconds, or ``+SECONDS`` from the record's start), every pod of the
record one under the other (``--pod`` picks); ``--once`` prints the screen at ``--end`` with
everything flagged since ``--start`` (``exporter.analysis.replay``).
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Mapping, Sequence

from ..errors import ConfigError
from ..runtime import config as config_mod
from .parsing import PROG, OneLineParser, fail
from .serve import add_config_flags


def parser() -> OneLineParser:
    p = OneLineParser(
        prog=f"{PROG} top",
        description="A live terminal view of a real vLLM, like the demo's: the sidecar runs in this process "
                    "against --vllm-url (every sidecar flag applies), or --sidecar-url reads a running sidecar.")
    p.add_argument("--sidecar-url", metavar="URL", default=None,
                   help="read this running sidecar's /metrics (appended when the URL has no path) instead of "
                        "running one against --vllm-url")
    p.add_argument("--refresh", type=float, default=2.0, help="seconds between screens (default 2)")
    p.add_argument("--once", action="store_true", help="print one screen and exit (for scripts)")
    p.add_argument("--plain", action="store_true", help="print screens one after another instead of redrawing")
    rp = p.add_argument_group("replaying a flight record")
    rp.add_argument("--replay", metavar="FILE", help="replay this flight record (what /debug/flight serves or "
                                                     "postmortem writes, gzip or plain) instead of watching a vLLM")
    rp.add_argument("--speed", type=float, default=10.0,
                    help="record seconds per second of replay (default 10; 1 is real time, 0 as fast as it prints)")
    rp.add_argument("--start", metavar="TIME", help="replay from here: RFC 3339, unix seconds, or +SECONDS from the "
                                                    "record's start")
    rp.add_argument("--end", metavar="TIME", help="replay up to here (same forms)")
    rp.add_argument("--pod", metavar="NAME", action="append", default=[],
                    help="only this pod of a merged record (namespace/pod or pod; repeatable)")
    add_config_flags(p)
    return p


def _when(text: str, first: float, what: str) -> float:
    from .parsing import parse_time

    t = text.strip()
    if t.startswith("+"):
        try:
            return first + float(t[1:])
        except ValueError:
            raise ValueError(f"{what}: {text!r} is not +SECONDS") from None
    return parse_time(t, what) / 1000.0


def replay(ns) -> int:
    """``top --replay FILE``."""
    from pathlib import Path

    from ..analysis import replay as rp
    from ..analysis.sources import SourceError
    from ..view.playback import run_replay

    if ns.speed < 0:
        return fail("top", "--speed must be >= 0")
    try:
        frames = rp.load_record(Path(ns.replay).read_bytes(), ns.replay)
    except OSError as exc:
        return fail("top", f"--replay {ns.replay}: {exc.strerror}")
    except SourceError as exc:
        return fail("top", f"--replay: {exc}")
    if not frames:
        return fail("top", f"--replay {ns.replay}: no vllm_sidecar_ series in the record (not a flight record?)")
    frames, missing = rp.pods_matching(frames, ns.pod)
    if missing:
        return fail("top", f"--pod {missing[0]}: not in the record")
    first = min(f[0].t for f in frames.values())
    try:
        start = _when(ns.start, first, "--start") if ns.start else None
        end = _when(ns.end, first, "--end") if ns.end else None
    except ValueError as exc:
        return fail("top", str(exc))
    if start is not None and end is not None and end < start:
        return fail("top", "--end is before --start")
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    run_replay(frames, sys.stdout, tty=sys.stdout.isatty() and not ns.plain, speed=ns.speed, refresh=ns.refresh,
               once=ns.once, start=start, end=end, source=Path(ns.replay).name, stop=stop)
    return 0


def main(argv: Sequence[str], env: Mapping[str, str]) -> int:
    from ..view.console import InProcessSidecar, ScrapedSidecar, StartFailed, run_top

    ns = parser().parse_args(list(argv))
    if ns.refresh <= 0:
        return fail("top", "--refresh must be > 0")
    keys = {f.key for f in config_mod.FIELDS} | {"config"}
    flags = {k: v for k, v in vars(ns).items() if k in keys and v is not None}
    if ns.replay:
        if flags or ns.sidecar_url:
            given = ", ".join(["--sidecar-url"] * bool(ns.sidecar_url) + [config_mod.flag_name(k) for k in sorted(flags)])
            return fail("top", f"--replay reads a record: {given} apply to a live view only")
        return replay(ns)
    if ns.start or ns.end or ns.pod:
        return fail("top", "--start, --end and --pod apply to --replay only")
    if ns.sidecar_url:
        if set(flags) - {"config"}:
            given = ", ".join(config_mod.flag_name(k) for k in sorted(set(flags) - {"config"}))
            return fail("top", f"--sidecar-url reads a running sidecar: {given} apply to the in-process sidecar only")
        try:
            source = ScrapedSidecar(ns.sidecar_url)
        except Exception as exc:  # noqa: BLE001 - a URL requests cannot use
            return fail("top", f"--sidecar-url: {exc}")
    else:
        # top's own sidecar serves on a free loopback port and logs only errors, unless told otherwise
        flags.setdefault("listen", "127.0.0.1:0")
        flags.setdefault("log_level", "error")
        try:
            cfg = config_mod.build(flags, env)
        except ConfigError as exc:
            return fail("top", str(exc))
        try:
            source = InProcessSidecar(cfg, env)
        except ConfigError as exc:
            return fail("top", str(exc))
        except StartFailed as exc:  # run_sidecar has said why, or the message does
            return fail("top", exc.message) if exc.message else exc.rc
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    try:
        err = run_top(source, sys.stdout, tty=sys.stdout.isatty() and not ns.plain, refresh=ns.refresh,
                      once=ns.once, stop=stop)
    finally:
        source.close()
    if err:
        sys.stderr.write(f"{PROG} top: error: {err}\n")
        return 1
    return 0
