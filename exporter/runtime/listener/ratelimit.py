"""The web configuration's ``rate_limit``, as exporter-toolkit reads it: one token bucket for
the listener's guarded routes."""

from __future__ import annotations

from typing import Optional


class Bucket:
    """exporter-toolkit's rate_limit: a token bucket of ``burst`` tokens, one every ``interval``."""

    def __init__(self) -> None:
        self.tokens: Optional[float] = None
        self.last = 0.0

    def take(self, interval: float, burst: int, now: float) -> bool:
        if self.tokens is None:
            self.tokens = float(burst)
        self.tokens = min(float(burst), self.tokens + (now - self.last) / interval)
        self.last = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False
