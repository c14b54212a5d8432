"""The decide tool: each option's probability as the answer, over noise draws (dgemma/denoising/decide.py)."""

from __future__ import annotations

from typing import Any

import anyio.from_thread
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from mcp_types import ToolAnnotations
from pydantic import BaseModel, Field

from ..dgemma.denoising.context import encode_context
from ..dgemma.denoising.decide import KNOB_NAMES, MAX_OPTIONS, MAX_SAMPLES, decide
from ..dgemma.errors import Cancelled
from ..dgemma.inputs.knobs import KNOBS, Knobs
from ..dgemma.readings import percent
from ..dgemma.readouts.caption import Caption
from . import inputs
from .args import IMAGE_HELP, seed_arg
from .readout import RUNLOG_URI, refusals
from .schemas import Arg, given, in_thread, knob_arg, make_tool, text_arg

OPTIONS_HELP = ("The answers to choose among, each the whole answer (e.g. [\"red\", \"green\", \"blue\"]); no option "
                f"twice, at most {MAX_OPTIONS}, each short enough to fit on one canvas with the end of the turn.")


def _f(description: str, default=...):
    return Field(default, description=description)


class DecideOut(BaseModel):
    """What decide returns."""

    choice: str = _f("The option with the highest mean probability (a tie: the one listed first).")
    probabilities: dict[str, dict[str, float]] = _f("Per option: mean and standard_error of its probability over "
                                                    "the noise draws; the means sum to 1.")
    options: list[str] = _f("The options, in the order given (the order of per_sample and trace columns).")
    samples: int = _f("Noise draws N; draw i used seed + i.")
    seed: int = _f("Seed of the first draw.")
    forwards_per_sample: int = _f("Canvases the model read per draw (1 for options of one token each).")
    per_sample: list[list[float]] = _f("Per draw, each option's probability.")
    trace: list[list[float]] | None = _f("Per step of the answer block's denoising run, each option's probability "
                                         "before that step; null when trace was false.", None)
    run_id: str | None = _f("Id of the answer block's run (its run log is a resource); null without trace.", None)
    runlog_uri: str | None = _f("Resource URI of that run's dg-runlog/1 log, which keeps the decision.", None)
    message: str = _f("One line: the choice and the probabilities.")


def decide_args() -> list[Arg]:
    schedule = [knob_arg(name, KNOBS[name]) for name in KNOB_NAMES[1:]]
    return [
        text_arg("prompt", "The question, as the user turn (through the model's chat template). May be empty when a "
                           "context or image is given."),
        Arg("options", {"type": "array", "items": {"type": "string"}, "maxItems": MAX_OPTIONS,
                        "description": OPTIONS_HELP}, required=True),
        Arg("samples", {"type": "integer", "minimum": 1, "maximum": MAX_SAMPLES, "default": 8, "description":
                        "Noise draws N: more draws, a smaller standard error."}),
        seed_arg(), *schedule,
        text_arg("context", "Optional raw CONTEXT text (no chat framing), encoded before the turn; with "
                            "context_handle it continues that context."),
        text_arg("context_handle", "Optional handle from the encode tool; the encoded context is never modified."),
        Arg("image", {"type": "string", "description": IMAGE_HELP}),
        Arg("trace", {"type": "boolean", "default": True, "description":
                      "Also run the answer block as a normal denoising run (the schedule knobs) and read the "
                      "options' probabilities before each of its steps."}),
    ]


def decide_tool(engine) -> Tool:
    args = decide_args()

    async def decide_options(ctx: Context, **values) -> DecideOut:
        """Which option the model answers, and how sure it is: each option's probability as the whole answer, read at
        the start of the answer from the model's logits and normalized over the options, averaged over N noise
        draws (seeds seed, seed+1, ...) with its standard error; the trace follows it over the answer block's steps.
        """
        v = given(args, values)
        with refusals():
            picture = inputs.image(v["image"], engine.image_dirs) if v["image"] else None
            knobs = Knobs(**{name: v[name] for name in KNOB_NAMES[1:]}, seed=inputs.seed(v["seed"]))
        return await in_thread(engine, lambda: _decide(engine, v, knobs, picture, progress(ctx)))

    decide_options.__name__ = "decide"
    return make_tool(decide_options, args, DecideOut, ToolAnnotations(
        read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False))


def progress(ctx: Context):
    """One notification per chunk of the draws' reads and per step of the answer block (as generate's)."""
    def report(done: int, total: int, frame) -> None:
        what = "reading the options on the noise draws" if frame is None else \
            Caption.live(frame, 1, total - done + frame.step + 1).text()
        anyio.from_thread.run(ctx.report_progress, done, total, what)
    return report


def _decide(engine, v: dict, knobs: Knobs, picture, on_progress) -> DecideOut:
    with engine.claim("decide") as run:
        dm = engine.model()
        context = engine.context(v["context_handle"]) if v["context_handle"] else None
        try:
            if v["context"]:
                context = encode_context(dm, v["context"], onto=context, should_cancel=run.cancel.is_set)
            decision = decide(dm, v["prompt"], v["options"], v["samples"], knobs, context=context, image=picture,
                              trace=v["trace"], should_cancel=run.cancel.is_set, on_progress=on_progress)
        except Cancelled:
            raise ToolError("the decide call was cancelled (cancel_run) before it finished") from None
        if decision.run is not None:
            engine.keep(dm, decision.run)
    return decide_out(decision)


def decide_out(decision) -> DecideOut:
    run_id = decision.run.config.run_id if decision.run is not None else None
    values: dict[str, Any] = decision.asdict()
    read = " · ".join(f"{o} {percent(p['mean'])} ± {percent(p['standard_error'])}"
                      for o, p in values["probabilities"].items())
    return DecideOut(**values, run_id=run_id, runlog_uri=RUNLOG_URI.format(run_id=run_id) if run_id else None,
                     message=f"choice {decision.choice!r} over {values['samples']} draw(s): {read}")
