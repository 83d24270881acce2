"""The sidecar's own health: build, targets up, read errors by reason, inputs missing or
resolved, malformed lines, restarts seen, poll durations, and each collector's success."""

from __future__ import annotations

from typing import List

from prometheus_client.core import Metric

from ..state import Published
from .base import counter as _counter
from .base import gauge as _gauge


def families(pub: Published) -> List[Metric]:
    out: List[Metric] = []
    info = _gauge("build_info", "Build of the sidecar; always 1.", ["version"])
    info.add_metric([pub.version], 1)
    out.append(info)
    up = _gauge("target_up", "1 when the last read of the target (vllm, gpu) succeeded.", ["target"])
    for target, ok in pub.up:
        up.add_metric([target], 1 if ok else 0)
    out.append(up)
    success = _gauge("collector_success", "1 when the collector's source (vllm, nvml, dcgm) was read successfully "
                     "on the last poll, per collector as node_exporter reports its collectors.", ["collector"])
    duration = _gauge("collector_duration_seconds", "How long the collector's last read took.", ["collector"])
    for target, ok in pub.up:
        name = pub.collector_name(target)
        success.add_metric([name], 1 if ok else 0)
        secs = dict(pub.poll_seconds).get(target)
        if secs is not None:
            duration.add_metric([name], secs)
    out += [success, duration]
    last = _gauge("last_success_timestamp_seconds", "When the target was last read successfully (unix seconds).", ["target"])
    for target, ts in pub.last_success:
        last.add_metric([target], ts)
    out.append(last)
    errs = _counter("poll_errors", "Failed reads of a target, by short reason.", ["target", "reason"])
    for (target, reason), n in pub.errors_total:
        errs.add_metric([target, reason], n)
    out.append(errs)
    missing = _gauge("input_missing", "1 for each vLLM input the derivations need that the page lacks under every "
                     "known name; 0 when present.", ["metric"])
    for name, is_missing in pub.input_missing:
        missing.add_metric([name], 1 if is_missing else 0)
    out.append(missing)
    n_missing = pub.inputs_missing_count()
    if n_missing is not None:  # known only while vLLM answers, as the family above
        count = _gauge("inputs_missing", "How many of the vLLM inputs the derivations need the page lacks under "
                       "every known name (the input_missing series at 1): one series for the alert to read.")
        count.add_metric([], n_missing)
        out.append(count)
    resolved = _gauge("input_resolved", "1 for the vLLM metric name each input was read from on the last page.",
                      ["input", "metric"])
    for key, name in pub.input_resolved:
        resolved.add_metric([key, name], 1)
    out.append(resolved)
    malformed = _counter("parse_malformed_lines", "Lines of vLLM pages left out, by reason: syntax (unreadable), "
                         "too_long (line, name or label value over the limits), duplicate (a series twice; the "
                         "first kept), invalid_value (a counter negative, infinite or NaN, a gauge out of range).",
                         ["reason"])
    for reason, n in pub.malformed_by_reason:
        malformed.add_metric([reason], n)
    out.append(malformed)
    dropped = _counter("input_dropped_samples", "Samples of vLLM pages left out because the page went over a cap "
                       "(max_models, max_engines, max_label_values); which ones is logged.", ["reason"])
    for reason, n in pub.dropped_by_reason:
        dropped.add_metric([reason], n)
    out.append(dropped)
    capped = _gauge("input_over_cap", "How many models, engines or label values of the last vLLM page were over "
                    "the cap and left out.", ["reason"])
    for reason, n in pub.capped_now:
        capped.add_metric([reason], n)
    out.append(capped)
    restarts = _counter("vllm_restarts", "vLLM restarts seen (its process start time changed to a later one).")
    restarts.add_metric([], pub.vllm_restarts_total)
    out.append(restarts)
    if pub.vllm_multiple_processes is not None:
        multi = _gauge("vllm_multiple_processes", "1 while pages come from more than one vLLM process (two servers "
                       "behind one URL, e.g. a Service): point the sidecar at the pod's own port.")
        multi.add_metric([], 1 if pub.vllm_multiple_processes else 0)
        out.append(multi)
    if pub.flight_events_total:
        fl = _counter("flight_events", "Incidents the flight recorder pinned (its window kept beyond the ring), by kind "
                      "(kv_thrashing, engine_stalled, vllm_unreachable, vllm_restarted, gpu_xid); /debug/flight/events "
                      "lists them.", ["kind"])
        for kind, n in pub.flight_events_total:
            fl.add_metric([kind], n)
        out.append(fl)
    dur = _gauge("poll_duration_seconds", "How long the last read of the target took.", ["target"])
    for target, secs in pub.poll_seconds:
        dur.add_metric([target], secs)
    out.append(dur)
    if pub.page_bytes:
        pb = _gauge("vllm_page_bytes", "Size of the last vLLM page read (after decompression).")
        pb.add_metric([], pub.page_bytes)
        out.append(pb)
    return out
