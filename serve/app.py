"""The HTTP side of the server (aiohttp): OpenAI routes, the pack's extensions, and the safety rules.

`/health` and `/v1/models` answer at once; `/v1/chat/completions` runs the engine on its worker
thread and streams one `diffusion_frame` chunk per step. A client that goes away cancels its run
at the next step; a full queue answers 429 with Retry-After; bad bodies get 4xx with a reason.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import threading
import time
import uuid

from aiohttp import web

from ..dgemma.errors import InputError
from ..dgemma.loop import Cancelled
from ..dgemma.wire import step_json
from .decide import decide
from .requests import image_tensor, job_of
from .runs import Engine, sse, timings

ENGINE = web.AppKey("engine", Engine)
TOKEN = web.AppKey("token", str)


def error(status: int, message: str, param: str | None = None, headers=None) -> web.Response:
    body = {"error": {"message": message, "type": "invalid_request_error" if status < 500 else "server_error",
                      "param": param, "code": status}}
    return web.json_response(body, status=status, headers=headers)


@web.middleware
async def guard(request, handler):
    """Bearer token on everything but /health; any refusal or surprise becomes a JSON error."""
    token = request.app[TOKEN]
    if token and request.path != "/health":
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
            return error(401, "missing or wrong bearer token: send 'Authorization: Bearer <token>'",
                         headers={"WWW-Authenticate": "Bearer"})
    try:
        return await handler(request)
    except web.HTTPException as err:
        if err.status >= 400:
            return error(err.status, err.reason if err.text is None else err.text)
        raise
    except InputError as err:
        return error(400, str(err), err.name)
    except Cancelled:
        return error(499, "cancelled: the client went away")
    except Exception as err:  # a bug or a broken model must not take the server down
        return error(500, f"{type(err).__name__}: {err}")


async def body_of(request) -> dict:
    raw = await request.read()  # over the size limit: aiohttp's 413 says the limit and the size
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError("body", f"the body is not JSON ({err}); send a JSON object") from None


async def health(request):
    engine = request.app[ENGINE]
    return web.json_response({"status": "ok", "model": engine.model_id, "busy": engine.jobs})


async def models(request):
    engine = request.app[ENGINE]
    return web.json_response({"object": "list", "data": [
        {"id": engine.model_id, "object": "model", "created": 0, "owned_by": "comfyui-diffusiongemma",
         "max_model_len": engine.dm.max_positions, "dgemma": engine.info()}]})


async def tokens(request):
    return web.json_response({"token_strings": list(request.app[ENGINE].dm.token_strings)})


def busy(engine) -> web.Response:
    return error(429, f"the server is busy: one run and {engine.max_queue} waiting; retry shortly",
                 headers={"Retry-After": "1"})


class Cancel:
    """The run's cancel check: the client went away (its transport closed, or a write failed)."""

    def __init__(self, request):
        self.request, self.event = request, threading.Event()

    def __call__(self) -> bool:
        transport = self.request.transport
        return self.event.is_set() or transport is None or transport.is_closing()


async def contexts(request):
    engine = request.app[ENGINE]
    body = await body_of(request)
    if not isinstance(body, dict) or not isinstance(body.get("text", ""), str):
        raise InputError("text", "send {'text': str, 'onto': handle or null, 'image': optional}")
    onto = engine.contexts.get("context", body["onto"]) if body.get("onto") is not None else None
    image = image_tensor(body["image"]) if body.get("image") is not None else None
    if not engine.admit():
        return busy(engine)
    try:
        loop = asyncio.get_running_loop()
        made = await loop.run_in_executor(engine.worker, engine.encode, body.get("text", ""), onto, image,
                                          Cancel(request))
    finally:
        engine.release()
    return web.json_response(made)


async def chat(request):
    engine = request.app[ENGINE]
    body = await body_of(request)
    job = job_of(body, engine.contexts, engine.resumes)
    if not engine.admit():
        return busy(engine)
    try:
        if body.get("stream"):
            return await stream(request, engine, job)
        return await complete(request, engine, job)
    finally:
        engine.release()


def head() -> dict:
    return {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion.chunk", "created": int(time.time())}


async def complete(request, engine, job):
    loop, steps = asyncio.get_running_loop(), []
    result, meta, wall = await loop.run_in_executor(engine.worker, engine.run, job,
                                                    lambda f: steps.append(step_json(f)), Cancel(request))
    state = result.state
    message = {"role": "assistant", "content": result.text, "reasoning_content": state.thought}
    return web.json_response({
        "id": head()["id"], "object": "chat.completion", "created": int(time.time()), "model": engine.model_id,
        "choices": [{"index": 0, "message": message, "finish_reason": "stop" if state.turn_closed else "length"}],
        "usage": {"completion_tokens": len(state.raw_ids), "total_tokens": len(state.raw_ids)},
        "timings": timings(state, engine.dm.canvas_length, wall), "dgemma": {**meta, "steps": steps}})


async def stream(request, engine, job):
    """SSE: role, one diffusion_frame per step, reasoning, content, usage + timings, finish, [DONE]."""
    loop, queue, cancel = asyncio.get_running_loop(), asyncio.Queue(), Cancel(request)
    top = {**head(), "model": engine.model_id}
    chunk = engine.frame_chunk(top, job.knobs.num_inference_steps)
    on_frame = lambda frame: loop.call_soon_threadsafe(queue.put_nowait, chunk(frame))
    run = loop.run_in_executor(engine.worker, engine.run, job, on_frame, cancel)
    run.add_done_callback(lambda _: loop.call_soon_threadsafe(queue.put_nowait, None))
    first = await queue.get()
    if first is None and run.exception() is not None:
        raise run.exception()  # refused before any step: a plain 4xx (an InputError) or a 500
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    try:
        await response.prepare(request)
        await response.write(sse({**top, "choices": [{"index": 0, "delta": {"role": "assistant"},
                                                      "finish_reason": None}]}))
        item = first
        while item is not None:
            await response.write(item)
            item = await queue.get()
        await response.write(ending(top, engine, run))
    except ConnectionError:
        cancel.event.set()  # the client went away: the run stops at its next step; nobody reads an answer
    except asyncio.CancelledError:
        cancel.event.set()
        raise
    return response


def ending(top: dict, engine, run) -> bytes:
    """The stream's tail after the last step: the answer and readings, or the error that ended it."""
    if run.exception() is not None:
        err = run.exception()
        param = err.name if isinstance(err, InputError) else None
        return sse({**top, "error": {"message": str(err), "type": type(err).__name__, "param": param}}) + \
            b"data: [DONE]\n\n"
    result, meta, wall = run.result()
    state, pieces = result.state, []
    delta = lambda d, finish=None: {**top, "choices": [{"index": 0, "delta": d, "finish_reason": finish}]}
    if state.thought:
        pieces.append(sse(delta({"reasoning_content": state.thought})))
    if result.text:
        pieces.append(sse(delta({"content": result.text})))
    pieces.append(sse({**top, "choices": [], "usage": {"completion_tokens": len(state.raw_ids),
                                                       "total_tokens": len(state.raw_ids)},
                       "timings": timings(state, engine.dm.canvas_length, wall)}))
    final = delta({}, "stop" if state.turn_closed else "length")
    pieces.append(sse({**final, "dgemma": meta}))
    return b"".join(pieces) + b"data: [DONE]\n\n"


def build_app(engine: Engine, token: str = "", max_body: int = 64 * 2**20) -> web.Application:
    app = web.Application(middlewares=[guard], client_max_size=max_body)
    app[ENGINE], app[TOKEN] = engine, token
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/dgemma/tokens", tokens)
    app.router.add_post("/v1/dgemma/contexts", contexts)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/v1/dgemma/decide", decide)
    return app
