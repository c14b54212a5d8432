"""The server's outbox: a worker's frames wake the event loop once per batch, never during a rest, and the
run's end always at once."""

from __future__ import annotations

import asyncio
import threading
import time

from diffusiongemma.serve.outbox import Outbox


def on_thread(work, delay: float = 0.0) -> threading.Thread:
    def run():
        time.sleep(delay)
        work()
    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_an_eager_take_wakes_at_a_put_from_another_thread_and_takes_everything_waiting():
    async def main():
        box = Outbox(asyncio.get_running_loop())
        box.put(b"a")
        box.put(b"b")
        assert await box.take() == [b"a", b"b"]  # waiting items: at once
        thread = on_thread(lambda: box.put(b"c"), 0.05)
        start = time.perf_counter()
        assert await box.take(5.0) == [b"c"]
        assert time.perf_counter() - start < 1.0
        thread.join()
        assert await box.take(0.05) == []  # nothing came
    asyncio.run(main())


def test_a_rest_gathers_puts_without_waking_and_an_urgent_put_ends_it_at_once():
    async def main():
        loop = asyncio.get_running_loop()
        box = Outbox(loop)
        woken = []
        real = loop.call_soon_threadsafe
        loop.call_soon_threadsafe = lambda *a: (woken.append(a), real(*a))[1]
        puts = on_thread(lambda: [box.put(bytes([i])) for i in range(5)], 0.02)
        start = time.perf_counter()
        assert await box.take(0.3, eager=False) == [bytes([i]) for i in range(5)]
        assert time.perf_counter() - start >= 0.29 and woken == []  # five puts, no wake: one batch
        puts.join()
        box.put(b"x")
        end = on_thread(lambda: box.put(None, urgent=True), 0.05)
        start = time.perf_counter()
        assert await box.take(30.0, eager=False) == [b"x", None]
        assert time.perf_counter() - start < 1.0 and len(woken) == 1
        end.join()
    asyncio.run(main())
