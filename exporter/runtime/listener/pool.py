"""The threads the listener's event loop hands blocking work to (encoding /metrics bodies,
bcrypt): a fixed number of daemon threads whose results come back as futures of the loop."""

from __future__ import annotations

import asyncio
import threading
from queue import SimpleQueue
from typing import Callable


class Pool:
    """A fixed number of daemon threads running blocking calls; results come back as futures of
    the loop. Daemon threads, so a collector stuck forever cannot keep the process from exiting."""

    def __init__(self, name: str, size: int) -> None:
        self._q: SimpleQueue = SimpleQueue()
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{i}" if size > 1 else name,
                                          daemon=True) for i in range(size)]
        for t in self._threads:
            t.start()

    def _work(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            loop, fut, fn, args = item
            try:
                result, ok = fn(*args), True
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting request
                result, ok = exc, False
            try:
                loop.call_soon_threadsafe(_settle, fut, ok, result)
            except RuntimeError:  # the loop is closed: the server is stopping
                pass

    def submit(self, loop: asyncio.AbstractEventLoop, fn: Callable, *args) -> asyncio.Future:
        fut = loop.create_future()
        self._q.put((loop, fut, fn, args))
        return fut

    def close(self, timeout: float = 2.0) -> None:
        for _ in self._threads:
            self._q.put(None)
        for t in self._threads:
            t.join(timeout)


def _settle(fut: asyncio.Future, ok: bool, result) -> None:
    if fut.cancelled():
        return
    if ok:
        fut.set_result(result)
    else:
        fut.set_exception(result)


