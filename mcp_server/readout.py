"""From generate's arguments to an engine request, and from a run to the tool's result and content."""

from __future__ import annotations

import base64
import json
from contextlib import contextmanager

from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ImageContent, ResourceLink, TextContent

from ..dgemma.constraints.constraint import Constraint
from ..dgemma.errors import InputError
from ..dgemma.inputs.knobs import KNOBS, Knobs
from ..dgemma.steps.schedulers import SCHEDULER_KNOBS, Scheduling
from . import inputs
from .engine import Request
from .progress import StepMessages
from .results import CanvasStateOut, GenerateOut, ItemOut
from .schemas import brief

RUNLOG_URI = "dgemma://runs/{run_id}/runlog.jsonl"
HIDDEN_STATE = ("raw_ids", "answer_ids")  # ids are long and the text already says them
WITH_RESUME = ("context", "context_handle", "image")


@contextmanager
def refusals():
    """An input refusal raised in a tool body reaches the client as the tool's error, with its text."""
    try:
        yield
    except ValueError as err:
        raise ToolError(brief(str(err))) from err


def request(engine, v: dict, raw: dict, picture) -> Request:
    """The engine request; on resume, what is not given defaults to the paused run's settings."""
    resume = engine.resumed(v["resume"]) if v["resume"] else None
    base = resume.recorded.knob_sets[-1] if resume is not None else {}
    if resume is not None:
        check_with_resume(resume, raw)

    def pick(name):
        return raw[name] if raw.get(name) is not None else base.get(name, v[name])

    knobs = {name: pick(name) for name in KNOBS}
    knobs["seed"] = inputs.seed(knobs["seed"])
    scheduling = {"name": pick("scheduler"), **{name: pick(name) for name in SCHEDULER_KNOBS}}
    prompt = v["prompt"] if raw.get("prompt") is not None or resume is None else resume.prompt
    constraint = Constraint(v["constraint_type"], constraint_text(v["constraint"], v["constraint_type"]))
    prompts = tuple(v["prompts"] or ())
    if prompts and (resume is not None or raw.get("prompt")):
        raise InputError("prompts", "prompts cannot be given with prompt or resume: a batch answers its own list "
                                    "of turns; give prompts alone, or prompt alone")
    return Request(prompt, knobs, v["context"], v["context_handle"], picture, scheduling,
                   inputs.start_step(v["start_step"], resume), v["end_step"], pick("pins"), v["resume"], constraint,
                   prompts)


def constraint_text(rule, kind: str = "json_schema") -> str:
    """The constraint as text: the SDK hands a JSON Schema over as an object; only a schema may be one."""
    if isinstance(rule, dict) and kind != "json_schema":
        raise InputError("constraint", f"constraint is an object, but constraint_type is {str(kind)[:40]!r}, "
                                       "which takes text (a regex, or one option per line for choice); give it as "
                                       "text, or set constraint_type to json_schema")
    if not isinstance(rule, dict):
        return rule
    try:
        return json.dumps(rule)
    except (RecursionError, ValueError):
        raise InputError("constraint", "constraint is a JSON Schema nested too deep to read; flatten it") from None


def check_with_resume(resume, raw: dict) -> None:
    """A resumed run continues its own turn: refuse a different one, with this tool's fix."""
    for name in WITH_RESUME:
        if raw.get(name):
            raise InputError(name, f"{name} cannot be given with resume: a resumed run continues the paused run's "
                                   f"own context and image; leave {name} out")
    if raw.get("prompt") is not None and raw["prompt"] != resume.prompt:
        raise InputError("prompt", f"prompt {raw['prompt'][:60]!r} differs from the paused run's "
                                   f"({resume.prompt[:60]!r}); a resumed run continues its own prompt: leave prompt "
                                   "out, or give the same")
    step = raw.get("start_step")
    if resume.paused and isinstance(step, int) and step != resume.paused.step:
        raise InputError("start_step", f"the paused run stopped at step {resume.paused.step} of block "
                                       f"{resume.paused.block + 1}, but start_step is {step}; leave start_step "
                                       f"out (auto) or set it to {resume.paused.step}")


def progress_of(engine, req: Request) -> StepMessages:
    """The progress reporter for this request (made once the inputs are valid and frames arrive)."""
    knobs = Knobs(**req.knobs)
    steps = Scheduling(**req.scheduling).steps(knobs)
    resume = engine.paused.get(req.resume) if req.resume else None
    first = resume.paused.block if resume is not None and resume.paused else 0
    return StepMessages(engine.dm, knobs, steps, req.start_step, req.end_step, first)


def generate_out(result, handle, files: dict) -> GenerateOut:
    state = {k: v for k, v in result.state.asdict().items() if k not in HIDDEN_STATE}
    lines = str(result.state).splitlines()[:2]
    if handle:
        lines.append(f"paused: continue with resume={handle!r}")
    return GenerateOut(cancelled=False, steps_done=result.state.steps_used, message=" · ".join(lines),
                       text=result.text, canvas_state=CanvasStateOut(**state), config=result.config.asdict(),
                       paused_handle=handle, runlog_uri=RUNLOG_URI.format(run_id=result.config.run_id), **files)


def batch_out(results, files: list[dict]) -> GenerateOut:
    """What generate returns for several prompts: one item per prompt, and a one-line summary."""
    items = [ItemOut(prompt=r.config.prompt, **generate_out(r, handle, f).model_dump(
        include={"text", "canvas_state", "config", "paused_handle", "runlog_uri", "runlog", "gif"}))
        for (r, handle), f in zip(results, files)]
    answers = " | ".join(i.text.replace("\n", " ")[:60] for i in items)
    return GenerateOut(cancelled=False, steps_done=sum(r.state.steps_used for r, _ in results),
                       message=f"{len(items)} answers: {answers}", items=items)


def content(out: GenerateOut, gif_path: str | None = None) -> list:
    """What a model reads: the result as JSON text, the GIF as an image, the run log as a resource link."""
    blocks = [TextContent(type="text", text=out.model_dump_json(exclude_none=True))]
    if gif_path:
        with open(gif_path, "rb") as fh:
            blocks.append(ImageContent(type="image", data=base64.b64encode(fh.read()).decode(), mime_type="image/gif"))
    links = [out.runlog_uri] if out.runlog_uri else [item.runlog_uri for item in out.items or ()]
    for uri in links:
        blocks.append(ResourceLink(type="resource_link", uri=uri, name="runlog",
                                   mime_type="application/jsonl", description="the run's dg-runlog/1 log"))
    return blocks
