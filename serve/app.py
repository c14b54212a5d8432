"""The HTTP side of the server (aiohttp): OpenAI routes, the pack's extensions, and the safety rules.

`/health` and `/v1/models` answer at once; `/v1/chat/completions` runs the engine on its worker
thread and streams one `diffusion_frame` chunk per step. A client that goes away cancels its run
at the next step; a full queue answers 429 with Retry-After; bad bodies get 4xx with a reason.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid

from aiohttp import web

from ..dgemma.denoising.decide import prepare_decision, run_decision
from ..dgemma.errors import Cancelled, InputError
from ..dgemma.inputs.tokens import decoding_table
from ..dgemma.paths import scrub
from ..dgemma.readouts.wire import EXTENSION, MAX_LEN, OWNER, TIMINGS, step_json
from .answers import answer_of, usage
from .connections import BODY_TIMEOUT, Connections
from .decide import job_of as decide_job
from .outbox import Outbox
from .requests import UnknownModel, context_of, job_of
from .runs import Engine, sse, timings
from .safety import PREFLIGHT_HEADERS, Policy, json_content

ENGINE = web.AppKey("engine", Engine)
POLICY = web.AppKey("policy", Policy)
CONNECTIONS = web.AppKey("connections", Connections)
LENIENT = web.AppKey("lenient", bool)
MAX_MESSAGE = 600  # characters of an error message: a client's huge value is never echoed whole
COMPILING = object()  # the outbox's marker: the run's constraint compiles
COMPILING_COMMENT = b": compiling the constraint\n\n"  # an SSE comment: clients skip it, their timeouts reset
GRACE_S, HEARTBEAT_S = 1.0, 5.0
SPACING_S = 0.02  # a live view needs no more than 50 writes a second; each write costs the run a GIL hand-off


def clip(text: str) -> str:
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE - 150] + " ... " + text[-140:]


def error(status: int, message: str, param: str | None = None, headers=None, code=None) -> web.Response:
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = {"error": {"message": clip(scrub(message)), "type": kind, "param": param, "code": code or status}}
    return web.json_response(body, status=status, headers=headers)


def refusal(request) -> web.Response | None:
    """The safety rules, before any routing work: Host, Origin (and CORS preflight), token, content type."""
    policy, headers = request.app[POLICY], request.headers
    why = policy.host_refusal(headers.get("Host"))
    if why is None:
        why = policy.origin_refusal(headers.get("Origin"), headers.get("Host"), request.scheme)
    if why is not None:
        return error(403, why)
    if request.method == "OPTIONS" and policy.allowed_origin(headers.get("Origin")):
        return web.Response(status=204, headers=PREFLIGHT_HEADERS)
    if request.path != "/health" and not policy.token_accepted(headers.get("Authorization", "")):
        return error(401, "missing or wrong bearer token: send 'Authorization: Bearer <token>'",
                     headers={"WWW-Authenticate": "Bearer"})
    routed = request.match_info.http_exception is None
    if routed and request.method == "POST" and not json_content(headers.get("Content-Type")):
        return error(415, "the Content-Type header must be application/json (the body is a JSON object); got "
                          f"{headers.get('Content-Type', 'none')[:60]!r}", "Content-Type")
    return None


@web.middleware
async def guard(request, handler):
    """The safety rules first; then any refusal or surprise becomes a short JSON error."""
    refused = refusal(request)
    if refused is not None:
        return refused
    try:
        with request.app[CONNECTIONS].answering(request.transport):
            return await handler(request)
    except web.HTTPException as err:
        if err.status >= 400:
            return error(err.status, err.reason if err.text is None else err.text)
        raise
    except UnknownModel as err:
        return error(404, str(err), err.name, code="model_not_found")
    except InputError as err:
        return error(400, str(err), err.name)
    except Cancelled:
        return error(499, "cancelled: the client went away")
    except Exception as err:  # a bug or a broken model must not take the server down
        return error(500, f"{type(err).__name__}: {err}")


async def cors(request, response) -> None:
    """Responses to a page at an origin given with --allow-origin say so; no other page gets CORS headers."""
    origin = request.headers.get("Origin")
    if request.app[POLICY].allowed_origin(origin):
        response.headers["Access-Control-Allow-Origin"] = origin
        response.headers["Vary"] = "Origin"


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


async def body_of(request) -> object:
    """The JSON body, read within BODY_TIMEOUT; over the size limit, aiohttp's 413 says the limit and the size."""
    try:
        raw = await asyncio.wait_for(request.read(), BODY_TIMEOUT)
    except asyncio.TimeoutError:
        raise web.HTTPRequestTimeout(text=f"the body did not arrive within {BODY_TIMEOUT:g} s") from None
    try:
        return json.loads(raw, parse_constant=_no_constant)
    except RecursionError:
        raise InputError("body", "the body nests too deeply; send a flatter JSON object") from None
    except (UnicodeDecodeError, ValueError) as err:
        raise InputError("body", f"the body is not JSON ({str(err)[:120]}); send a JSON object") from None


async def health(request):
    engine = request.app[ENGINE]
    return web.json_response({"status": "ok", "model": engine.model_id, "busy": engine.jobs, "started": engine.started,
                              "contexts": len(engine.contexts)})


async def models(request):
    engine = request.app[ENGINE]
    return web.json_response({"object": "list", "data": [
        {"id": engine.model_id, "object": "model", "created": 0, OWNER: "comfyui-diffusiongemma",
         MAX_LEN: engine.dm.max_positions, EXTENSION: engine.info()}]})


async def tokens(request):
    dm = request.app[ENGINE].dm
    return web.json_response({"token_strings": list(dm.token_strings),
                              "decoding": decoding_table(dm.tokenizer, len(dm.token_strings))})


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


async def decide(request):
    engine = request.app[ENGINE]
    job = decide_job(await body_of(request), engine.contexts)
    req = prepare_decision(engine.dm, job.prompt, job.options, job.samples, job.knobs, context=job.context,
                           image=job.image)  # refused here, before the queue
    if not engine.admit():
        return busy(engine)
    loop, queue, cancel = asyncio.get_running_loop(), asyncio.Queue(), Cancel(request)
    report = None
    if job.stream:
        report = lambda done, total, frame: loop.call_soon_threadsafe(queue.put_nowait, sse(
            {"object": "dgemma.decide.progress", "done": done, "total": total,
             "step": None if frame is None else step_json(frame)}))
    try:
        run = loop.run_in_executor(engine.worker, lambda: run_decision(
            req, trace=job.trace, should_cancel=cancel, on_progress=report))
        if job.stream:
            return await decide_stream(request, run, queue, cancel)
        decision = await run
    finally:
        engine.release()
    return web.json_response(decided(decision))


def decided(decision) -> dict:
    return {**decision.asdict(), "run_id": decision.run.config.run_id if decision.run is not None else None}


async def decide_stream(request, run, queue, cancel):
    """The decision's progress as server-sent events, then the decision (or the error that ended it)."""
    run.add_done_callback(lambda _: queue.put_nowait(None))
    retrieved(run)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    try:
        await response.prepare(request)
        item = await queue.get()
        while item is not None:
            await response.write(item)
            item = await queue.get()
        if run.exception() is not None:
            err = run.exception()
            await response.write(sse({"error": {"message": clip(str(err)), "type": type(err).__name__}}))
        else:
            await response.write(sse({"object": "dgemma.decide", **decided(run.result())}))
        await response.write(b"data: [DONE]\n\n")
    except ConnectionError:
        cancel.event.set()
    except asyncio.CancelledError:
        cancel.event.set()
        raise
    return response


def retrieved(future) -> None:
    """Mark the run's exception as seen once it ends: a client that went away (a cancelled run) never reads
    it, and asyncio would print "Future exception was never retrieved" with its traceback."""
    future.add_done_callback(lambda f: f.cancelled() or f.exception())


async def contexts(request):
    engine = request.app[ENGINE]
    text, onto, image = context_of(await body_of(request), engine.contexts)
    if not engine.admit():
        return busy(engine)
    try:
        loop = asyncio.get_running_loop()
        made = await loop.run_in_executor(engine.worker, engine.encode, text, onto, image, Cancel(request))
    finally:
        engine.release()
    return web.json_response(made)


async def chat(request):
    engine = request.app[ENGINE]
    job = job_of(await body_of(request), engine.contexts, engine.resumes, engine.model_id, request.app[LENIENT])
    ids = engine.render(job)
    if not engine.admit():
        return busy(engine)
    try:
        if job.stream:
            return await stream(request, engine, job, ids)
        return await complete(request, engine, job, ids)
    finally:
        engine.release()


def head() -> dict:
    return {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion.chunk", "created": int(time.time())}


def warned(job) -> dict:
    """The --lenient warning header: the fields ignored, each with the reason."""
    if not job.warnings:
        return {}
    text = "; ".join(job.warnings).encode("ascii", "replace").decode()
    return {"X-DGemma-Warning": text[:MAX_MESSAGE]}


def answers_of(engine, job, results) -> list:
    return [answer_of(engine.dm, result, job.stop, job.logprobs) for result in results]


async def complete(request, engine, job, ids):
    loop, steps = asyncio.get_running_loop(), [[] for _ in range(job.n)]
    results, metas, wall, prompt_tokens = await loop.run_in_executor(
        engine.worker, engine.run, job, ids, lambda i, f: steps[i].append(step_json(f)), Cancel(request))
    choices, answers = [], answers_of(engine, job, results)
    for i, answer in enumerate(answers):
        message = {"role": "assistant", "content": answer.text, "reasoning_content": answer.thought}
        choice = {"index": i, "message": message, "logprobs": answer.logprobs, "finish_reason": answer.finish}
        if job.n > 1:
            choice[EXTENSION] = {**metas[i], "steps": steps[i]}
        choices.append(choice)
    body = {"id": head()["id"], "object": "chat.completion", "created": int(time.time()), "model": engine.model_id,
            "choices": choices, "usage": usage(prompt_tokens, answers, [r.state for r in results]),
            TIMINGS: timings(results[0].state, engine.dm.canvas_length, wall)}
    if job.n == 1:
        body[EXTENSION] = {**metas[0], "steps": steps[0]}
    return web.json_response(body, headers=warned(job))


async def stream(request, engine, job, ids):
    """SSE: role, one diffusion_frame per step (its choice's index), reasoning, content, finish, usage +
    timings, [DONE]."""
    loop, cancel = asyncio.get_running_loop(), Cancel(request)
    outbox = Outbox(loop)
    top = {**head(), "model": engine.model_id}
    chunk = engine.frame_chunk(top, job.knobs.num_inference_steps)
    on_frame = lambda index, frame: outbox.put(chunk(index, frame))
    run = loop.run_in_executor(engine.worker, engine.run, job, ids, on_frame, cancel, lambda: outbox.put(COMPILING))
    run.add_done_callback(lambda _: outbox.put(None, urgent=True))
    retrieved(run)
    batch, compiling = await first_batch(outbox)
    if batch and batch[0] is None and run.exception() is not None:
        raise run.exception()  # refused before any step: a plain 4xx (an InputError) or a 500
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                           **warned(job)})
    try:
        await response.prepare(request)
        await response.write(b"".join(sse({**top, "choices": [{"index": i, "delta": {"role": "assistant"},
                                                                "finish_reason": None}]}) for i in range(job.n)))
        await write_frames(response, outbox, batch, compiling)
        await response.write(ending(top, engine, job, run))
    except ConnectionError:
        cancel.event.set()  # the client went away: the run stops at its next step; nobody reads an answer
    except asyncio.CancelledError:
        cancel.event.set()
        raise
    return response


async def first_batch(outbox) -> tuple[list, bool]:
    """The run's first items, and whether its constraint compiles (then up to GRACE_S more for a step, so a
    quick refusal still answers a plain 4xx)."""
    batch = await outbox.take()
    compiling = batch[0] is COMPILING
    if compiling:
        batch = batch[1:] or await outbox.take(GRACE_S)
    return batch, compiling


async def write_frames(response, outbox, batch: list, compiling: bool) -> None:
    """The run's frames as they come, those within SPACING_S of a write in the next one, until the run ends;
    while the constraint compiles, a comment every HEARTBEAT_S (a client with a 30-60 s timeout hears)."""
    while True:
        frames = [item for item in batch if isinstance(item, bytes)]
        compiling = compiling and not frames
        if frames or compiling and not batch:
            await response.write(b"".join(frames) or COMPILING_COMMENT)
        if None in batch:
            return
        batch = await outbox.take(SPACING_S, eager=False) if frames else []
        batch = batch or await outbox.take(HEARTBEAT_S if compiling else None)


def ending(top: dict, engine, job, run) -> bytes:
    """The stream's tail after the last step: each choice's answer and readings, or the error that ended it."""
    if run.exception() is not None:
        err = run.exception()
        param = err.name if isinstance(err, InputError) else None
        return sse({**top, "error": {"message": clip(str(err)), "type": type(err).__name__, "param": param}}) + \
            b"data: [DONE]\n\n"
    results, metas, wall, prompt_tokens = run.result()
    answers, pieces = answers_of(engine, job, results), []
    delta = lambda i, d, finish=None, **more: {**top, "choices": [{"index": i, "delta": d, **more,
                                                                   "finish_reason": finish}]}
    for i, answer in enumerate(answers):
        if answer.thought:
            pieces.append(sse(delta(i, {"reasoning_content": answer.thought})))
        if answer.text or answer.logprobs is not None:
            pieces.append(sse(delta(i, {"content": answer.text}, logprobs=answer.logprobs)))
    for i, answer in enumerate(answers):
        pieces.append(sse({**delta(i, {}, answer.finish), EXTENSION: metas[i]}))
    pieces.append(sse({**top, "choices": [], "usage": usage(prompt_tokens, answers, [r.state for r in results]),
                       TIMINGS: timings(results[0].state, engine.dm.canvas_length, wall)}))
    return b"".join(pieces) + b"data: [DONE]\n\n"


def build_app(engine: Engine, policy: Policy | None = None, max_body: int = 64 * 2**20,
              connections: Connections | None = None, lenient: bool = False) -> web.Application:
    """The server's routes; `lenient` turns refusals of unimplemented fields into a warning header."""
    app = web.Application(middlewares=[guard], client_max_size=max_body)
    app[ENGINE], app[POLICY], app[LENIENT] = engine, policy or Policy(), lenient
    app[CONNECTIONS] = connections or Connections()
    app.on_response_prepare.append(cors)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/dgemma/tokens", tokens)
    app.router.add_post("/v1/dgemma/contexts", contexts)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_post("/v1/dgemma/decide", decide)
    return app
