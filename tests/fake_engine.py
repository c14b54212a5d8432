"""A fake OpenAI-style engine on loopback (real aiohttp): /health, /v1/models and a chat stream that
replays given SSE events, for the remote text dialects' tests."""

from __future__ import annotations

import asyncio
import json
import threading
from contextlib import contextmanager

from aiohttp import web


def sse(chunks) -> str:
    """SSE text of JSON chunks (dicts) and literal payloads (str such as "[DONE]")."""
    return "".join(f"data: {c if isinstance(c, str) else json.dumps(c)}\n\n" for c in chunks)


@contextmanager
def engine(models: dict, stream: str):
    """Serve `models` at /v1/models and answer every chat request with the SSE text `stream`; yields the
    URL and the request bodies received."""
    bodies, ready, box = [], threading.Event(), {}

    async def chat(request):
        bodies.append(await request.json())
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for event in stream.split("\n\n"):
            if event.strip():
                await response.write(event.encode() + b"\n\n")
        return response

    async def serve():
        app = web.Application()
        app.router.add_get("/health", lambda r: web.json_response({"status": "ok"}))
        app.router.add_get("/v1/models", lambda r: web.json_response(models))
        app.router.add_post("/v1/chat/completions", chat)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        box["port"], box["stop"] = site._server.sockets[0].getsockname()[1], asyncio.Event()
        ready.set()
        await box["stop"].wait()
        await runner.cleanup()

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    ready.wait(10)
    try:
        yield f"http://127.0.0.1:{box['port']}", bodies
    finally:
        loop.call_soon_threadsafe(box["stop"].set)
        thread.join(10)
