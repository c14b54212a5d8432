"""The MCP tools over the engine: load_model, model_status, generate, encode, cancel_run.

The engine is synchronous torch code, so each call runs in a worker thread; progress goes back
to the event loop per step, and cancel_run flips the run's cancel switch, which the engine checks
before every step.
"""

from __future__ import annotations

from typing import Any

import anyio
import anyio.from_thread
import anyio.to_thread
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool

from ..dgemma.demo import DEMO_NAME
from ..dgemma.knobs import KNOBS
from ..dgemma.load_options import LOAD_OPTIONS
from ..dgemma.loop import Cancelled
from ..dgemma.runlog import pack_version
from .engine import Engine
from .outputs import write_outputs
from .progress import StepMessages
from .schemas import choice_schema, knob_params, param, strict_tool, with_params

HIDDEN_STATE = ("raw_ids", "answer_ids")  # ids are long and the text already says them


async def in_thread(engine: Engine, fn):
    """Run `fn` off the event loop; engine errors become tool errors with the engine's own text."""
    try:
        return await anyio.to_thread.run_sync(fn, abandon_on_cancel=True)
    except anyio.get_cancelled_exc_class():
        engine.cancel()  # the client gave up on the request: stop the run too
        raise
    except (ValueError, OSError) as exc:
        raise ToolError(str(exc)) from exc


def option_schema(option) -> dict:
    """A loader option (dgemma/load_options.py) as a JSON schema."""
    if option.choices is None:
        return {"type": "boolean", "default": option.default, "description": option.tooltip}
    return choice_schema(option.choices, option.default, option.tooltip)


def loader_params() -> list:
    return [
        param("model", {"type": "string", "default": DEMO_NAME, "description":
                        f"'{DEMO_NAME}' (the tiny model shipped with the pack), a checkpoint folder holding "
                        "config.json, or a hub id such as 'google/diffusiongemma-26B-A4B-it'."}, DEMO_NAME),
        *(param(name, option_schema(option), option.default) for name, option in LOAD_OPTIONS.items()),
    ]


def text(description: str) -> dict:
    return {"type": "string", "default": "", "description": description}


def generate_params() -> list:
    return [
        param("prompt", text("The user turn, rendered through the model's chat template. May be empty when a "
                             "context is given (pure injection).")),
        param("context", text("Optional raw CONTEXT text (no chat framing), encoded for this run before the "
                              "turn; with context_handle it continues that context."), ""),
        param("context_handle", text("Optional handle from the encode tool; the encoded context is never "
                                     "modified by the run."), ""),
        *knob_params(),
        param("runlog", {"type": "boolean", "default": False, "description":
                         "Also write the run as a dg-runlog/1 JSON Lines file; its path is returned."}, False),
        param("gif", {"type": "boolean", "default": False, "description":
                      "Also write every step as an animated GIF; its path is returned."}, False),
        param("output_dir", text("Folder for the run log and GIF (default: ./output of the server)."), ""),
    ]


def readout(result) -> dict:
    state = {k: v for k, v in result.state.asdict().items() if k not in HIDDEN_STATE}
    return {"cancelled": False, "text": result.text, "canvas_state": state, "config": result.config.asdict()}


def generate_tool(engine: Engine) -> Tool:
    async def generate(ctx: Context, **args) -> dict[str, Any]:
        """Generate an answer by block diffusion, reporting every step (step, total, committed %, text so far).

        Returns the text and the honesty readout (canvas_state); a run stopped by cancel_run returns
        cancelled=true and the steps it did. Optionally writes a dg-runlog/1 run log and a GIF.
        """
        knobs = {name: args[name] for name in KNOBS}
        messages = None

        def on_start(request):
            nonlocal messages
            messages = StepMessages(request.dm, request.blocks, request.steps)

        def on_frame(frame, done):
            anyio.from_thread.run(ctx.report_progress, done, messages.total, messages.message(frame))

        def work():
            try:
                dm, result = engine.generate(args["prompt"], knobs, args["context"], args["context_handle"],
                                             on_frame=on_frame, on_start=on_start)
            except Cancelled as exc:
                return {"cancelled": True, "steps_done": exc.steps_done, "message": str(exc)}
            return {**readout(result), **write_outputs(dm, result, args["output_dir"], args["runlog"], args["gif"])}

        return await in_thread(engine, work)

    return strict_tool(with_params(generate, generate_params()))


def model_tools(engine: Engine) -> list[Tool]:
    async def load_model(**args) -> dict[str, Any]:
        """Load a DiffusionGemma model (the shipped demo, a checkpoint folder or a hub id), replacing the
        loaded one; contexts encoded with the old model are dropped. Returns model_status."""
        return await in_thread(engine, lambda: engine.load(**args))

    async def model_status() -> dict[str, Any]:
        """What is loaded (source, quant, device, dtype), its memory, the run in progress and the context handles."""
        return engine.status()

    async def cancel_run() -> dict[str, Any]:
        """Stop the generate or encode run in progress before its next step; that call then reports cancelled."""
        return engine.cancel()

    return [strict_tool(with_params(load_model, loader_params())), strict_tool(model_status),
            strict_tool(cancel_run)]


def encode_tool(engine: Engine) -> Tool:
    async def encode(**args) -> dict[str, Any]:
        """Encode raw CONTEXT text (no chat framing) into a KV cache held by the server; returns a handle for
        generate's context_handle. With onto, continues that context into a new handle; none is ever modified."""
        return await in_thread(engine, lambda: engine.encode(args["text"], args["onto"]))

    return strict_tool(with_params(encode, [
        param("text", {"type": "string", "description": "Raw CONTEXT, encoded as is: a document, a prior turn."}),
        param("onto", {"type": "string", "default": "", "description":
                       "Optional handle of a context to continue with this text."}, ""),
    ]))


def build_server(engine: Engine | None = None) -> MCPServer:
    """The MCP server over `engine` (a fresh one on the demo model by default)."""
    engine = engine or Engine()
    srv = MCPServer("diffusiongemma", version=pack_version(), instructions=(
        "DiffusionGemma, a discrete-diffusion text model. generate answers a prompt and reports every denoising "
        "step; encode makes a reusable context handle; one run at a time (a second is refused, not queued)."),
        tools=[*model_tools(engine), encode_tool(engine), generate_tool(engine)])
    srv.engine = engine  # for tests and embedding
    return srv
