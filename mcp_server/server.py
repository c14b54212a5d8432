"""The MCP tools over the engine: load_model, model_status, generate, encode, cancel_run, free_handle.

The engine is synchronous torch code, so each call runs in a worker thread; progress goes back
to the event loop per step, and cancel_run flips the run's cancel switch, which the engine checks
before every step. Each run's log is a resource (`dgemma://runs/{run_id}/runlog.jsonl`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import anyio
import anyio.from_thread
import anyio.to_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError
from mcp.server.mcpserver.tools import Tool
from mcp_types import CallToolResult, Resource, ToolAnnotations

from ..dgemma.errors import Cancelled
from ..dgemma.readouts.runlog import pack_version
from .args import MAX_HANDLE, encode_args, generate_args, loader_args
from .decide import decide_tool
from .engine import Engine
from .inputs import folder, image
from .outputs import runlog_text, write_outputs
from .progress import BatchMessages
from .readout import RUNLOG_URI, batch_out, content, generate_out, progress_of, refusals, request
from .results import CancelOut, EncodeOut, FreeOut, GenerateOut, StatusOut
from .schemas import Arg, given, in_thread, make_tool

READ_ONLY = ToolAnnotations(read_only_hint=True, idempotent_hint=True)


def generate_tool(engine: Engine) -> Tool:
    args = generate_args()

    async def generate(ctx: Context, **values) -> Annotated[CallToolResult, GenerateOut]:
        """Generate an answer by block diffusion, reporting every step (step, total, committed %, text so far).

        Takes an image, a scheduler and its knobs, pins, and a window [start_step, end_step): a run
        that pauses returns paused_handle, kept by the server, which resume continues exactly.
        Returns the text and the honesty readout (canvas_state); the run log is a resource; gif
        adds the frames as image content. A run stopped by cancel_run returns cancelled=true.
        """
        v = given(args, values)
        with refusals():
            req = request(engine, v, values, image(v["image"], engine.image_dirs) if v["image"] else None)
            out_dir = folder(v["output_dir"])  # refused before the run, not after it
        if req.prompts:
            return await in_thread(engine, lambda: batch_result(engine, req, ctx, out_dir, v))
        messages = None

        def on_frame(frame, done):
            nonlocal messages
            if messages is None:  # the inputs are valid and the model loaded once frames arrive
                messages = progress_of(engine, req)
            total, text = messages.update(frame, done)
            anyio.from_thread.run(ctx.report_progress, done, total, text)

        def work():
            try:
                dm, result, handle = engine.generate(req, on_frame=on_frame)
            except Cancelled as exc:
                return cancelled_result(exc)
            return content_result(dm, result, handle, out_dir, v)

        return await in_thread(engine, work)

    return make_tool(generate, args, Annotated[CallToolResult, GenerateOut],
                     ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False,
                                     open_world_hint=False))


def cancelled_result(exc: Cancelled) -> CallToolResult:
    out = GenerateOut(cancelled=True, steps_done=exc.steps_done, message=str(exc))
    return CallToolResult(content=content(out), structured_content=out.model_dump(mode="json"))


def batch_result(engine: Engine, req, ctx: Context, out_dir: Path, v: dict) -> CallToolResult:
    """Several prompts as one batch, with one progress notification per item step."""
    messages = None

    def on_frame(index, frame, done):
        nonlocal messages
        if messages is None:  # the inputs are valid and the model loaded once frames arrive
            messages = BatchMessages([progress_of(engine, req) for _ in req.prompts])
        total, text = messages.update(index, frame)
        anyio.from_thread.run(ctx.report_progress, done, total, text)

    def on_settled(index):
        if messages is not None:
            messages.settle(index)

    try:
        dm, results = engine.generate_many(req, on_frame=on_frame, on_settled=on_settled)
    except Cancelled as exc:
        return cancelled_result(exc)
    out = batch_out(results, [write_outputs(dm, r, out_dir, v["runlog"], v["gif"]) for r, _ in results])
    return CallToolResult(content=content(out), structured_content=out.model_dump(mode="json"))


def content_result(dm, result, handle, out_dir: Path, v: dict) -> CallToolResult:
    files = write_outputs(dm, result, out_dir, v["runlog"], v["gif"])
    out = generate_out(result, handle, files)
    return CallToolResult(content=content(out, files["gif"]), structured_content=out.model_dump(mode="json"))


def model_tools(engine: Engine) -> list[Tool]:
    largs = loader_args()

    async def load_model(**values) -> StatusOut:
        """Load a DiffusionGemma model (the shipped demo, a checkpoint folder or a hub id), replacing the loaded
        one; contexts and paused runs of the old model are dropped. Returns model_status."""
        v = given(largs, values)
        return await in_thread(engine, lambda: engine.load(**v))

    async def model_status() -> StatusOut:
        """What is loaded (source, quant, device, dtype), its memory, the run in progress, the context handles and
        the paused runs the server holds."""
        return engine.status()

    async def cancel_run() -> CancelOut:
        """Stop the generate or encode run in progress before its next step; that call then reports cancelled."""
        return engine.cancel()

    fargs = [Arg("handle", {"type": "string", "maxLength": MAX_HANDLE, "description": "A context handle (ctx-...) "
                                                                                    "or a paused run's handle "
                                                                                    "(run-...)."}, required=True)]

    async def free_handle(**values) -> FreeOut:
        """Free a context handle or a paused run the server holds, releasing its memory."""
        return engine.free(values["handle"])

    destructive = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True,
                                  open_world_hint=False)
    return [make_tool(load_model, largs, StatusOut, ToolAnnotations(
                read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=True)),
            make_tool(model_status, [], StatusOut, READ_ONLY),
            make_tool(cancel_run, [], CancelOut, destructive),
            make_tool(free_handle, fargs, FreeOut, destructive)]


def encode_tool(engine: Engine) -> Tool:
    args = encode_args()

    async def encode(**values) -> EncodeOut:
        """Encode raw CONTEXT text (no chat framing), and optionally an image, into a KV cache held by the
        server; returns a handle for generate's context_handle. With onto, continues that context into a new
        handle; none is ever modified."""
        v = given(args, values)
        with refusals():
            picture = image(v["image"], engine.image_dirs) if v["image"] else None
        return await in_thread(engine, lambda: engine.encode(v["text"], v["onto"], picture))

    return make_tool(encode, args, EncodeOut, ToolAnnotations(read_only_hint=False, destructive_hint=False,
                                                              idempotent_hint=False, open_world_hint=False))


def add_runlogs(srv: MCPServer, engine: Engine) -> None:
    @srv.resource(RUNLOG_URI, name="runlog", mime_type="application/jsonl",
                  description="The dg-runlog/1 log (JSON Lines) of one of the last runs this server made.")
    def runlog(run_id: str) -> str:
        if run_id not in engine.runs:
            raise ResourceError(f"run {run_id!r} is not held: the server keeps the last runs only; write the log "
                                "to a file with generate's runlog=true")
        return runlog_text(*engine.runs[run_id])

    async def held_runlogs():  # resources/list names the logs held now, not only the template
        return [Resource(uri=RUNLOG_URI.format(run_id=run_id), name=f"runlog {run_id}",
                         mime_type="application/jsonl", description=f"dg-runlog/1 log of run {run_id}")
                for run_id in list(engine.runs)]

    srv.list_resources = held_runlogs


def build_server(engine: Engine | None = None) -> MCPServer:
    """The MCP server over `engine` (a fresh one on the demo model by default)."""
    engine = engine or Engine()
    srv = MCPServer("diffusiongemma", version=pack_version(), instructions=(
        "DiffusionGemma, a discrete-diffusion text model. generate answers a prompt and reports every denoising "
        "step; encode makes a reusable context handle; one run at a time (a second is refused, not queued)."),
        tools=[*model_tools(engine), encode_tool(engine), generate_tool(engine), decide_tool(engine)])
    add_runlogs(srv, engine)
    for method in ("prompts/list", "prompts/get"):  # no prompts to serve: do not advertise the capability
        srv._lowlevel_server._request_handlers.pop(method, None)
    srv.engine = engine  # for tests and embedding
    return srv

