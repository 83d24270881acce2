"""The sidecar's series of a fleet scenario, measured rather than written: a pod's states become
vLLM pages at the sidecar's poll interval (2 s by default), and the runtime's own reader,
windows, capacity tracker, learned baseline and derivations (``exporter.runtime``) turn them into
every ``vllm_sidecar_*`` series, sampled at the scrape grid. A new sidecar signal therefore shows
up in the scenarios as the runtime computes it.

Pages: the real vLLM 0.32.0 names, labels and histogram bounds (``fleet.real_bounds``), with only
the series the sidecar reads (what its parser keeps anyway); counters grow at the state's rates,
histogram observations spread over the real buckets by the same lognormal CDFs as the scraped
series. The state of scrape step ``i`` holds for the polls in ``(t[i-1], t[i]]``; the KV usage
gauge follows ``fleet.kv_at`` at every poll, so a saw-tooth the scrape samples at 15-60 s the sidecar
samples every 2 s.

Cost: pages are read at every poll, the derivations run at every scrape (the poll loop derives
at every poll, but between two scrapes only the last derivation is ever served). Before
``full_from`` (a time), the sidecar polls at the scrape step instead of 2 s: the
history a day-long scenario needs for its baselines, at a cost the test suite can pay; and there
the derivations run at most every ``HISTORY_DERIVE`` seconds, their values held between (a 5 s
scrape of the history reads each derivation up to three times, as it would read a sidecar polling
every 15 s). The history feeds day-long baselines only; from ``full_from`` on, every scrape gets
its own derivation. Documented in docs/detection.md.
"""

from __future__ import annotations

import math
import re
from collections import deque
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from ...runtime.collectors.vllm import signal_points
from ...runtime.config import Config, build
from ...runtime.inputs import HTTP_KEY, Reader, Snapshot
from ...runtime.rolling import Windows
from ...runtime.signals import Baseline, counter_for, derive_view, learnable, mean_utilization, tracker_for
from .shapes import HTTP_LABELS, http_answers

POLL_INTERVAL = 2.0
HISTORY_DERIVE = 15.0  # s: before ``full_from``, derive at most this often (see the docstring)


def sidecar_config(window: float = 60.0, poll_interval: float = POLL_INTERVAL, **kw) -> Config:
    return build({"window": window, "poll_interval": poll_interval, "gpu": "none", **kw}, {})


def _num(v: float) -> str:
    return repr(float(v))


# the vLLM name of each counter or gauge the writer sets -> the runtime's input key
_KEYS = {
    "vllm:generation_tokens_total": "generation_tokens", "vllm:prompt_tokens_total": "prompt_tokens",
    "vllm:num_preemptions_total": "preemptions", "vllm:request_success_total": "request_success",
    "vllm:admission_rejections_total": "admission_rejections",
    "vllm:prefix_cache_queries_total": "prefix_cache_queries", "vllm:prefix_cache_hits_total": "prefix_cache_hits",
    "vllm:gpu_prefix_cache_queries_total": "prefix_cache_queries", "vllm:gpu_prefix_cache_hits_total": "prefix_cache_hits",
    "vllm:kv_cache_usage_perc": "kv_usage", "vllm:gpu_cache_usage_perc": "kv_usage",
    "vllm:num_requests_running": "running", "vllm:num_requests_waiting": "waiting",
    "vllm:num_requests_waiting_by_reason": "waiting_by_reason",
    "vllm:time_to_first_token_seconds": "ttft", "vllm:inter_token_latency_seconds": "itl",
    "vllm:time_per_output_token_seconds": "itl", "vllm:e2e_request_latency_seconds": "e2e",
    "vllm:request_queue_time_seconds": "queue_time", "vllm:request_prompt_tokens": "prompt_length",
    "vllm:request_generation_tokens": "generation_length",
}


def routed(name: str, extra: str = "", model: str = "m", engine: str = "0"):
    """The runtime reader's route of a vLLM series (labels as the writer writes them), or None
    when the runtime does not read it."""
    from ...runtime.inputs import Route, route

    labels = [("engine", engine), ("model_name", model)] if engine else [("model_name", model)]
    if extra:
        k, v = extra.split("=", 1)
        labels.append((k, v.strip('"')))
    r = route(name, tuple(labels))
    return r if isinstance(r, Route) and r.input is not None else None


class PageWriter:
    """vLLM pages of one pod, counters carried from poll to poll.

    ``page`` writes the page as text (what the sidecar fetches); ``snapshot`` builds the
    ``Snapshot`` the runtime's reader makes of that same page, directly (reading 140 lines of text
    at every poll of a day-long fleet costs more than the rest of a scenario). ``check`` reads
    the text page with the runtime's ``Reader`` and asserts both are the same, so the shortcut can
    never drift from what the reader does: every pod's first poll is checked."""

    HTTP = tuple(sorted(HTTP_LABELS.items()))  # the OpenAI server's, as ``fleet`` writes it

    def __init__(self, model: str, old: bool, http_handlers: str = "") -> None:
        from .shapes import HISTOGRAMS, real_bounds

        self.old = old
        self.model = model
        self.http_handlers = http_handlers  # the reader's (checked pages): "" when it does not read them
        self.http: Dict[str, float] = {}  # HTTP answers by status
        self.engine = "" if old else "0"
        self.lab = f'model_name="{model}"' if old else f'engine="0",model_name="{model}"'
        self.hists = []
        self._les: Dict[str, Tuple[float, ...]] = {}
        for name, old_name in HISTOGRAMS.items():
            bounds = real_bounds(name)
            shown = old_name if (old and old_name) else name
            self.hists.append((shown, bounds))
            self._les[shown] = tuple(x for _le, x in bounds)
        self.ctr: Dict[Tuple[str, str], float] = {}  # (vLLM name, extra label text) -> total
        self.gauges: Dict[Tuple[str, str], float] = {}
        self.hist_tot: Dict[str, np.ndarray] = {}
        self.hist_sum: Dict[str, float] = {}
        self.hist_cnt: Dict[str, float] = {}
        self.start = 0.0
        self._routes: Dict[Tuple[str, str], Tuple[str, str]] = {}

    def _key(self, name: str, extra: str) -> Tuple[str, str]:
        """The runtime's (input, extra label value) of a series, as its reader routes it."""
        if name in _KEYS:
            return _KEYS[name], (extra.split('"')[1] if extra else "")
        got = self._routes.get((name, extra))
        if got is None:
            r = routed(name, extra, self.model, self.engine)
            got = self._routes[(name, extra)] = (r.input.key, r.extra)
        return got

    def _counted(self, name: str) -> bool:
        """Whether the reader takes only this histogram's count, as a counter input."""
        from ...runtime.inputs import COUNTER

        r = routed(name + "_count", "", self.model, self.engine)
        return r is not None and r.input.kind == COUNTER

    def add_hist_kind(self, name: str, bounds: Sequence[float]) -> None:
        """One more histogram on the page (its bounds, +Inf last)."""
        les = tuple(bounds) + (math.inf,)
        from .pd import le_text

        self.hists.append((name, tuple((le_text(x), x) for x in les)))
        self._les[name] = les

    def add(self, name: str, inc: float, extra: str = "") -> None:
        key = (name, extra)
        self.ctr[key] = self.ctr.get(key, 0.0) + max(inc, 0.0)

    def add_http(self, status: str, inc: float) -> None:
        self.http[status] = self.http.get(status, 0.0) + max(inc, 0.0)

    def _http_labels(self, status: str) -> Tuple[Tuple[str, str], ...]:
        return tuple(sorted((*self.HTTP, ("status", status))))

    def set(self, name: str, v: float, extra: str = "") -> None:
        self.gauges[(name, extra)] = float(v)

    def add_hist(self, name: str, counts: np.ndarray, total: float, mean: float) -> None:
        t = self.hist_tot.get(name)
        self.hist_tot[name] = counts.copy() if t is None else t + counts
        self.hist_sum[name] = self.hist_sum.get(name, 0.0) + total * mean
        self.hist_cnt[name] = self.hist_cnt.get(name, 0.0) + total

    def page(self) -> str:
        lab = self.lab
        out = []
        for (name, extra), v in sorted({**self.ctr, **self.gauges}.items()):
            inner = f'{lab},{extra}' if extra else lab
            out.append(f"{name}{{{inner}}} {_num(v)}")
        for name, bounds in self.hists:
            tot = self.hist_tot.get(name)
            if tot is None:
                continue
            for (le, _x), c in zip(bounds, tot):
                out.append(f'{name}_bucket{{{lab},le="{le}"}} {_num(c)}')
            out.append(f"{name}_sum{{{lab}}} {_num(self.hist_sum[name])}")
            out.append(f"{name}_count{{{lab}}} {_num(self.hist_cnt[name])}")
        for status, v in sorted(self.http.items()):
            inner = ",".join(f'{k}="{x}"' for k, x in self._http_labels(status))
            out.append(f"http_requests_total{{{inner}}} {_num(v)}")
        out.append(f"process_start_time_seconds {_num(self.start)}")
        return "\n".join(out) + "\n"

    def snapshot(self, t: float) -> Snapshot:
        from ...runtime.inputs import Hist

        m, e = self.model, self.engine
        snap = Snapshot(t=t)
        resolved = {}
        for (name, extra), v in {**self.ctr, **self.gauges}.items():
            key, x = self._key(name, extra)
            snap.values[(key, m, e, x)] = snap.values.get((key, m, e, x), 0.0) + v
            resolved[key] = name
        for (k, mm, ee, x), v in snap.values.items():
            snap.by_model.setdefault((k, mm), []).append((ee, x, v))
        for name, _bounds in self.hists:
            tot = self.hist_tot.get(name)
            if tot is None:
                continue
            key = self._key(name + "_count", "")[0] if name not in _KEYS else _KEYS[name]
            if name not in _KEYS and self._counted(name):  # only the count is read (``iterations``)
                snap.values[(key, m, e, "")] = snap.values.get((key, m, e, ""), 0.0) + self.hist_cnt[name]
                snap.by_model.setdefault((key, m), []).append((e, "", self.hist_cnt[name]))
                resolved[key] = name + "_count"
                continue
            buckets = tuple(zip(self._les[name], tot.tolist()))
            h = Hist(buckets=buckets, sum=self.hist_sum[name], count=self.hist_cnt[name])
            snap.hists[(key, m, e)] = h
            snap.hists_by_model.setdefault((key, m), []).append(h)
            resolved[key] = name
        snap.resolved = resolved
        snap.models = frozenset([m])
        snap.process_start = self.start
        snap.vllm_samples = len(snap.values) + sum(len(b) + 2 for _n, b in self.hists if _n in self.hist_tot)
        if self.http_handlers and re.fullmatch(self.http_handlers, dict(self.HTTP)["handler"]):
            for status, v in self.http.items():  # the reader adds them up by status, the pod's
                snap.values[(HTTP_KEY, "", "", status)] = v
                snap.by_model.setdefault((HTTP_KEY, ""), []).append(("", status, v))
        return snap

    def check(self, t: float) -> Snapshot:
        """The snapshot of the text page through the runtime's Reader, asserted equal to
        ``snapshot``; returns it."""
        _page, read = Reader(http_handlers=self.http_handlers).read(self.page(), t)
        mine = self.snapshot(t)
        for f in ("values", "hists", "resolved", "models", "process_start", "by_model", "hists_by_model"):
            a, b = getattr(read, f), getattr(mine, f)
            if f in ("by_model",):
                a = {k: sorted(v) for k, v in a.items()}
                b = {k: sorted(v) for k, v in b.items()}
            if a != b:
                raise AssertionError(f"simulated snapshot differs from the reader's in {f}: {a!r} != {b!r}")
        return read


class SidecarSim:
    """Derived sidecar series of one pod over the grid ``times`` (scrape steps)."""

    def __init__(self, cfg: Optional[Config] = None) -> None:
        self.cfg = cfg or sidecar_config()

    @staticmethod
    def _role_series(pod, S, writer: PageWriter, frl) -> list:
        """A role pod's vLLM 0.33 series (``pd``) that the runtime reads, onto its pages: the
        counters and gauges returned (name, extra label text, counter?, values per step), the
        histograms registered with the writer and added to ``frl``."""
        from . import pd

        out = []
        for name, labels, kind, v in pd.series(pod, S):
            extra = _extra_text(labels)
            if routed(name, extra, pod.model, writer.engine) is not None:
                out.append((name, extra, kind == "c", v.tolist()))
        for name, bounds, rate, cdf, mean in pd.histograms(pod, S):
            if routed(name + "_count", "", pod.model, writer.engine) is not None:
                writer.add_hist_kind(name, bounds)
                frl[name] = (rate.tolist(), mean.tolist(), cdf(np.array([*bounds, math.inf])))
        return out

    def run(self, pod, S: Dict[str, np.ndarray], times: np.ndarray, on: np.ndarray,
            full_from: float = -math.inf) -> Dict[Tuple[str, Tuple[Tuple[str, str], ...]], np.ndarray]:
        """``S``: the pod's state columns per step (``fleet``); ``on``: steps at which vLLM
        answers and the sidecar runs. Returns {(name, labels): values per step (NaN: absent)}."""
        cfg = self.cfg
        n = len(times)
        step = float(times[1] - times[0]) if n > 1 else POLL_INTERVAL
        sidecar = _SidecarState(cfg, step)
        pages = _PodPages(pod, S, times, cfg.http_handlers)
        out: Dict[Tuple[str, Tuple[Tuple[str, str], ...]], np.ndarray] = {}
        was_on = False
        stride = max(1, int(round(HISTORY_DERIVE / step)))
        last: List[Tuple[np.ndarray, float]] = []  # the last derivation's rows and values, held in history
        for i in range(n):
            t_i = float(times[i])
            if not on[i]:
                if was_on:  # vLLM gone (or the sidecar): its windows start again when it is back
                    sidecar.reset()
                was_on = False
                continue
            dt_poll = cfg.poll_interval if t_i >= full_from else step
            k = max(1, int(round(step / dt_poll)))
            dt = step / k
            pages.begin_step(i)
            util_i = pages.gpu_util[i]
            for j in range(k):
                t = t_i - step + (j + 1) * dt
                sidecar.observe(pages.poll(i, t, dt), t, util_i)
            resumed = not was_on
            was_on = True
            if t_i < full_from and stride > 1 and i % stride and not resumed and last:
                for row, v in last:
                    row[i] = v
                continue
            last = _serve(out, sidecar.derive(t_i), i, n)
        return out


class _SidecarState:
    """What the sidecar keeps from poll to poll: the rolling windows, the capacity tracker, the
    learned baseline and the recent GPU utilization, fed by ``observe`` and read by ``derive``."""

    def __init__(self, cfg: Config, step: float) -> None:
        self.cfg = cfg
        retention = max(cfg.window, cfg.stall_seconds) + 3 * max(cfg.poll_interval, step)
        self.windows = Windows(cfg.window, retention, cfg.poll_interval)
        self.tracker = tracker_for(cfg)
        self.counted = counter_for(cfg)  # kept while vLLM is gone, as the sidecar keeps it
        self.baseline = Baseline(horizon=cfg.baseline_horizon, spacing=max(cfg.poll_interval, 10.0))
        self.util_hist: deque = deque()

    def reset(self) -> None:
        """vLLM (or the sidecar) gone: the windows start again when it is back."""
        self.windows.reset()
        self.tracker.reset()
        self.util_hist.clear()

    def observe(self, snap: Snapshot, t: float, gpu_util: float) -> None:
        """One poll: the page's snapshot and the GPU utilization at ``t``."""
        self.windows.add(snap)
        self.tracker.observe(snap)
        self.counted.observe(self.windows, snap.models)
        self.util_hist.append((t, gpu_util))
        while self.util_hist and self.util_hist[0][0] < t - self.cfg.window:
            self.util_hist.popleft()

    def derive(self, t: float):
        """The signals the sidecar serves at ``t``. The baseline learns from them as the sidecar
        learns (never from degraded time); it keeps one sample per 10 s at most, so learning at each
        scrape instead of each poll changes nothing at 5-10 s scrapes and thins it at longer ones."""
        cfg = self.cfg
        util = mean_utilization(list(self.util_hist), t, cfg.window)
        signals = derive_view(self.windows.view(t), cfg, util, self.baseline, self.tracker, self.counted)
        for m in signals.models:
            rate = learnable(m, util, cfg.busy_utilization, cfg.role, cfg.long_prompt_surge_per_second)
            if rate is not None:
                self.baseline.record(m.model, t, rate)
        return signals


def _serve(out: Dict[Tuple[str, Tuple[Tuple[str, str], ...]], np.ndarray], signals, i: int,
           n: int) -> List[Tuple[np.ndarray, float]]:
    """The derived signals as served at scrape step ``i`` of ``n``, into ``out`` (a row per series,
    NaN where absent); returns the rows and values written, for the steps that hold them."""
    last = []
    for p in signal_points(signals):
        key = ("vllm_sidecar_" + p.name, tuple(sorted(p.labels.items())))
        row = out.get(key)
        if row is None:
            row = out[key] = np.full(n, np.nan)
        row[i] = p.value
        last.append((row, p.value))
    return last


class _PodPages:
    """One pod's vLLM pages poll by poll: its state columns turned into what the counters grow by
    per second and what the gauges read at each scrape step (lists, read once a step), and
    ``poll`` writing them onto the ``PageWriter``. A role pod (P/D) adds its vLLM 0.33 series."""

    def __init__(self, pod, S: Dict[str, np.ndarray], times: np.ndarray, http_handlers: str = "") -> None:
        self.old = old = pod.old_release
        self.writer = writer = PageWriter(pod.model, old, http_handlers)
        req, share, ptok, ltok = S["requests"], S["long_share"], S["prompt_tokens"], S["long_tokens"]
        prompt_mean = (1 - share) * ptok * math.exp(0.18) + share * ltok
        gen = req * S["output_tokens"]
        err = np.minimum(S["engine_errors"], req)
        fr = _histogram_rates(pod, S, req, gen, prompt_mean)
        self.pre = "vllm:prefix_cache" if not old else "vllm:gpu_prefix_cache"
        self.kv_name = "vllm:kv_cache_usage_perc" if not old else "vllm:gpu_cache_usage_perc"
        writer.start = float(times[0]) - 90.0
        self.checked = False
        self.L = L = {k: v.tolist() for k, v in S.items()}
        self.gpu_util = L["gpu_util"]
        self.gen_l, self.req_l, self.pm_l, self.err_l = gen.tolist(), req.tolist(), prompt_mean.tolist(), err.tolist()
        answered, failed = http_answers(S, req, err)  # the OpenAI server's, as ``fleet`` writes them
        self.http_l = (answered.tolist(), failed.tolist())
        self.frl = {name: (rate.tolist(), mean.tolist(), cdf) for name, (rate, mean, cdf) in fr.items()}
        self.extras = SidecarSim._role_series(pod, S, writer, self.frl) if pod.role else []
        self._step: tuple = ()

    def begin_step(self, i: int) -> None:
        """Reads scrape step ``i``'s rates and levels once, for its polls."""
        L = self.L
        rq, er = self.req_l[i], self.err_l[i]
        self._step = (
            self.gen_l[i], rq, self.pm_l[i], er, rq - er,
            L["preemptions"][i], L["rejections"][i], L["prefix_hit"][i],
            [(name, cdf[i], rate[i], mean[i]) for name, (rate, mean, cdf) in self.frl.items()],
            L["kv_usage"][i], L["kv_saw"][i], L["running"][i], L["waiting_capacity"][i], L["waiting_deferred"][i],
            self.http_l[0][i], self.http_l[1][i],
        )

    def poll(self, i: int, t: float, dt: float) -> Snapshot:
        """The page at ``t``, ``dt`` seconds of step ``i``'s rates after the last one, as the
        runtime's reader reads it (the pod's first page checked against the real reader)."""
        from .shapes import kv_at

        g, rq, pm, er, ok, pre_i, rej_i, hit_i, hist_i, kv_i, saw_i, run_i, wc_i, wd_i, h2_i, h5_i = self._step
        writer, old, pre = self.writer, self.old, self.pre
        writer.add("vllm:generation_tokens_total", g * dt)
        writer.add("vllm:prompt_tokens_total", rq * pm * dt)
        for reason, r in (("stop", ok * 0.8), ("length", ok * 0.2), ("abort", 0.0), ("error", er)):
            writer.add("vllm:request_success_total", r * dt, f'finished_reason="{reason}"')
        if not old:
            writer.add("vllm:num_preemptions_total", pre_i * dt)
            writer.add("vllm:admission_rejections_total", rej_i * dt, 'reason="max_num_queued_reqs"')
        writer.add_http("2xx", h2_i * dt)
        writer.add_http("5xx", h5_i * dt)
        writer.add(f"{pre}_queries_total", rq * pm * dt)
        writer.add(f"{pre}_hits_total", rq * pm * hit_i * dt)
        for name, cdf_i, rate_i, mean_i in hist_i:
            writer.add_hist(name, cdf_i * (rate_i * dt), rate_i * dt, mean_i)
        for name, extra, counter, vals in self.extras:
            if counter:
                writer.add(name, vals[i] * dt, extra)
            else:
                writer.set(name, vals[i], extra)
        writer.set(self.kv_name, kv_at(t, kv_i, saw_i))
        writer.set("vllm:num_requests_running", run_i)
        writer.set("vllm:num_requests_waiting", wc_i + wd_i)
        if not old:
            writer.set("vllm:num_requests_waiting_by_reason", wc_i, 'reason="capacity"')
            writer.set("vllm:num_requests_waiting_by_reason", wd_i, 'reason="deferred"')
        if not self.checked:
            self.checked = True
            return writer.check(t)
        return writer.snapshot(t)


def _histogram_rates(pod, S: Dict[str, np.ndarray], req: np.ndarray, gen: np.ndarray,
                     prompt_mean: np.ndarray) -> Dict[str, Tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per histogram of the page: observations per second and their mean per step, and per step
    and bucket the share of observations at or below each bound (the scraped series' lognormal
    CDFs over vLLM's real bounds)."""
    from .shapes import lognormal_cdf, real_bounds

    share, ptok, ltok = S["long_share"], S["prompt_tokens"], S["long_tokens"]
    ttft, itl, q, outt = S["ttft"], S["itl"], S["queue"], S["output_tokens"]
    e2e = ttft + itl * outt
    fr: Dict[str, Tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    def put(name, rate, mean, cdf, bounds_name):
        xs = np.array([x for _le, x in real_bounds(bounds_name)])
        fr[name] = (rate, mean, cdf(xs))

    put("vllm:time_to_first_token_seconds", req, ttft * math.exp(0.125),
        lambda x: lognormal_cdf(x[None, :], ttft[:, None], 0.5), "vllm:time_to_first_token_seconds")
    itl_name = "vllm:inter_token_latency_seconds" if not pod.old_release else "vllm:time_per_output_token_seconds"
    gaps = gen if not pod.role else req * np.maximum(outt - 1.0, 0.0)  # as ``fleet`` counts them
    put(itl_name, gaps, itl * math.exp(0.045), lambda x: lognormal_cdf(x[None, :], itl[:, None], 0.3),
        "vllm:inter_token_latency_seconds")
    put("vllm:e2e_request_latency_seconds", req, e2e * math.exp(0.125),
        lambda x: lognormal_cdf(x[None, :], e2e[:, None], 0.5), "vllm:e2e_request_latency_seconds")
    put("vllm:request_queue_time_seconds", req, q * math.exp(0.32),
        lambda x: lognormal_cdf(x[None, :], q[:, None], 0.8), "vllm:request_queue_time_seconds")
    put("vllm:request_prompt_tokens", req, prompt_mean,
        lambda x: (1 - share[:, None]) * lognormal_cdf(x[None, :], ptok[:, None], 0.6)
        + share[:, None] * lognormal_cdf(x[None, :], ltok[:, None], 0.05), "vllm:request_prompt_tokens")
    put("vllm:request_generation_tokens", req, outt,
        lambda x: lognormal_cdf(x[None, :], outt[:, None], 0.5), "vllm:request_generation_tokens")
    return fr


def _extra_text(labels: Dict[str, str]) -> str:
    return ",".join(f'{k}="{v}"' for k, v in labels.items())
