"""Open connections, bounded: a flood of half-sent requests cannot lock the server out.

aiohttp closes a connection whose request headers are not complete within HEADER_TIMEOUT (its
keep-alive timer runs from the connection's start) and `body_of` gives a body BODY_TIMEOUT. That
still lets a flood hold a file descriptor each until its timer fires, so the open connections
are also capped: past the cap, each new one closes the oldest connection that is not being
answered (unfinished headers, or idle between requests), else the oldest of all.
"""

from __future__ import annotations

import asyncio
import resource
import time
from contextlib import contextmanager

HEADER_TIMEOUT = 10.0  # seconds to send a request's headers, and an idle keep-alive connection's life
BODY_TIMEOUT = 60.0    # seconds to send a request's body once its headers are in
MAX_CONNECTIONS = 512


def connection_cap() -> int:
    """MAX_CONNECTIONS, or half the file descriptors this process may open when that is fewer."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return MAX_CONNECTIONS if soft == resource.RLIM_INFINITY else max(8, min(MAX_CONNECTIONS, soft // 2))


class Connections:
    """The open connections (transport -> [opened at, requests being answered]), oldest first."""

    def __init__(self, cap: int | None = None):
        self.cap = cap or connection_cap()
        self.open: dict = {}
        self.dropped = 0

    def opened(self, transport) -> None:
        self.open[transport] = [time.monotonic(), 0]
        while len(self.open) > self.cap:
            idle = [t for t, (_, busy) in self.open.items() if not busy and t is not transport]
            oldest = idle[0] if idle else next(iter(self.open))
            self.open.pop(oldest)
            oldest.abort()
            self.dropped += 1

    def closed(self, transport) -> None:
        self.open.pop(transport, None)

    @contextmanager
    def answering(self, transport):
        """Marks a connection busy while its request is answered (a run streams inside this)."""
        entry = self.open.get(transport)
        if entry is not None:
            entry[1] += 1
        try:
            yield
        finally:
            if entry is not None:
                entry[1] -= 1


class Watched(asyncio.Protocol):
    """aiohttp's protocol for one connection, seen by `Connections` as it opens and closes."""

    def __init__(self, inner, connections: Connections):
        self.inner, self.connections, self.transport = inner, connections, None

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.connections.opened(transport)
        self.inner.connection_made(transport)

    def connection_lost(self, exc) -> None:
        self.connections.closed(self.transport)
        self.inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        self.inner.data_received(data)

    def eof_received(self):
        return self.inner.eof_received()

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()


async def serve_on(runner, sock, connections: Connections):
    """Serve the set-up aiohttp `runner` on an already bound socket, each connection watched."""
    loop = asyncio.get_running_loop()
    return await loop.create_server(lambda: Watched(runner.server(), connections), sock=sock)
