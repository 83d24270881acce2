"""The availability SLI's counters, kept poll by poll: the requests it counts and the ones that
failed, per model, as the alerting pack's raw path counts them from vLLM's series.

The SLO file says what counts (``availability_sli``, ``http_handlers``), and this follows it:

    requests  the HTTP answers of the counted handlers except 4xx (a client's own mistake is not
              the service's), at a poll where the page has such answers and had them at the poll
              before; otherwise (no such answer yet, or ``availability_sli: engine``) vLLM's
              finished requests except client aborts, all engines summed
    errors    by ``source``: ``engine``, vLLM's requests finished with reason error; ``http``,
              the 5xx answers. ``availability_sli: engine`` serves the first, ``http`` the
              second, ``combined`` both: the pack takes the larger of their rates, so a request
              vLLM records twice (a non-streamed error answered 500) counts once, and an error
              inside an HTTP-200 stream (only vLLM's counter sees it) counts too.

The HTTP answers carry no model_name: on a page with several models they cannot be told apart,
and each model's requests and errors are vLLM's own (its ``engine`` source).

What grew is the windows' (``rolling.Windows``): their running totals per input, model and label
value, restarts, other processes behind the URL, series missing from a page or created lazily
all handled there. Each poll adds what the totals grew by since the poll before (the windows
starting again, after a failure inside the sidecar, is a new base). The totals served are the
sidecar's own counters, from its first page at 0, so that Prometheus takes the rate of one series
per pod and source instead of joining and adding up vLLM's (a sidecar restart is a counter reset,
as ``rate()`` expects).
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

from ..inputs import HTTP_KEY
from ..rolling import Windows
from .results import Availability

SLIS = ("engine", "http", "combined")
SOURCES = {"engine": ("engine",), "http": ("http",), "combined": ("engine", "http")}

# (requests by source, failed by source) of one model at one poll, from the windows' totals
_Totals = Tuple[Dict[str, float], Dict[str, float]]


def _read(w: Windows, model: str) -> _Totals:
    """The windows' totals now: vLLM's finished requests but aborts and its errors, the counted
    handlers' answers but 4xx and the 5xx ones (the pack's ``status!~"4xx"``, ``status="5xx"``)."""
    finished = w.totals("request_success", model)
    answers = w.totals(HTTP_KEY, "")
    requests = {"engine": sum(v for r, v in finished.items() if r != "abort")}
    failed = {"engine": finished.get("error", 0.0)}
    valid = [v for status, v in answers.items() if status != "4xx"]
    if valid:
        requests["http"] = sum(valid)
        failed["http"] = answers.get("5xx", 0.0)
    return requests, failed


def _grew(now: float, before: Optional[float]) -> float:
    """What a total grew by (the windows starting again: a new base, nothing)."""
    return 0.0 if before is None or now < before else now - before


class AvailabilityCounter:
    """Per model, the SLI's requests and errors since the sidecar's first page: ``observe`` the
    windows after each poll's page went in, ``totals`` what is served."""

    def __init__(self, sli: str = "combined") -> None:
        if sli not in SLIS:
            raise ValueError(f"availability_sli must be one of {', '.join(SLIS)}, not {sli!r}")
        self.sli = sli
        self._before: Dict[str, _Totals] = {}  # each model's totals at the poll before
        self._requests: Dict[str, float] = {}
        self._errors: Dict[str, Dict[str, float]] = {}

    def observe(self, w: Windows, models) -> None:
        """One poll: ``models`` are the models on its page."""
        models = sorted(models)
        use = SOURCES[self.sli] if len(models) == 1 else ("engine",)  # HTTP answers: the only model's
        before = self._before
        now: Dict[str, _Totals] = {}
        requests, errors = dict(self._requests), {m: dict(e) for m, e in self._errors.items()}
        for model in models:
            req, failed = now[model] = _read(w, model)
            errs = errors[model] = errors.get(model, {})
            for s in use:
                errs.setdefault(s, 0.0)
            old = before.get(model)
            if old is None:  # the model's first poll: its base
                requests.setdefault(model, 0.0)
                continue
            source = "http" if "http" in use and "http" in req and "http" in old[0] else "engine"
            requests[model] += _grew(req[source], old[0][source])
            for s in use:
                if s in failed:  # (no HTTP answer but 4xx before: none of them failed either)
                    errs[s] += _grew(failed[s], old[1].get(s, 0.0))
        # whole, after every sum above: never half an update
        # (a model away from a page keeps its base: its growth meanwhile counts when it is back)
        self._before, self._requests, self._errors = {**before, **now}, requests, errors

    def totals(self, model: str) -> Availability:
        if model not in self._requests:
            return Availability()
        return Availability(requests_total=self._requests[model], errors_total=dict(self._errors[model]))
