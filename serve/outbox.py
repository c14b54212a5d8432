"""What a run's worker thread hands the event loop, taken in batches.

Each wake of the loop is a hand-off of the GIL with the run's thread, which is busy computing the next
step: on the demo a wake per frame cost about 0.3 ms a frame. So a put wakes the loop only when it waits
eagerly; while it writes, or rests between batches, items gather and are taken together. An urgent put
(the run's end) always wakes it, so nothing waits out a rest.
"""

from __future__ import annotations

import asyncio
import collections
import threading


class Outbox:
    """Items put by any thread; `take` on the event loop returns every item waiting."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop, self._items, self._lock = loop, collections.deque(), threading.Lock()
        self._waiter, self._eager, self._urgent = None, False, False

    def put(self, item, urgent: bool = False) -> None:
        with self._lock:
            self._items.append(item)
            self._urgent |= urgent
            waiter = self._waiter if self._waiter is not None and (self._eager or urgent) else None
            if waiter is not None:
                self._waiter = None
        if waiter is not None:
            self._loop.call_soon_threadsafe(_wake, waiter)

    async def take(self, timeout: float | None = None, eager: bool = True) -> list:
        """Every item waiting. Eager: at once if there are any, else after the first put or `timeout` seconds
        (None: no limit). Not eager (a rest): after `timeout` seconds, or at once after an urgent put."""
        with self._lock:
            ready = self._urgent or (eager and self._items)
            if not ready:
                self._waiter, self._eager = self._loop.create_future(), eager
            waiter = self._waiter
        if not ready:
            try:
                await asyncio.wait_for(waiter, timeout)
            except asyncio.TimeoutError:
                pass
        with self._lock:
            self._waiter, self._urgent = None, False
            items = list(self._items)
            self._items.clear()
        return items


def _wake(waiter: asyncio.Future) -> None:
    if not waiter.done():  # a wait that timed out cancelled it
        waiter.set_result(None)
