"""Tool parameters built from the engine's tables, and the argument check every tool runs first.

The advertised input schema is written here by hand from `Arg`s (type, default, range, tooltip).
The SDK's own argument model takes every value as `Any` with None for "not given", so the
values reach `check_args` and then the engine unchanged: a bad argument is refused with the
name, the value and the fix, like the nodes' refusals, never with raw pydantic text.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.to_thread
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from mcp_types import ToolAnnotations

from ..dgemma.errors import InputError, short
from ..dgemma.inputs.knobs import KnobSpec
from ..dgemma.paths import scrub

_JSON_TYPES = {int: "integer", float: "number", bool: "boolean", str: "string"}
JSON_INT_MAX = 2**53 - 1  # the largest integer every JSON client holds exactly
MAX_MESSAGE = 1000  # characters of a tool's error text: what a client shows, never a flood


@dataclass(frozen=True)
class Arg:
    """One tool argument: its name, advertised JSON schema, and whether it must be given."""

    name: str
    schema: dict = field(default_factory=dict)
    required: bool = False

    @property
    def default(self):
        return self.schema.get("default")


def knob_arg(name: str, spec: KnobSpec) -> Arg:
    """A knob as an argument: type, default, range and the widget's tooltip."""
    schema = {"type": _JSON_TYPES[spec.kind], "default": spec.default, "description": spec.tooltip}
    if spec.kind is not bool:
        schema.update(minimum=spec.lo, maximum=min(spec.hi, JSON_INT_MAX) if spec.kind is int else spec.hi)
    return Arg(name, schema)


def text_arg(name: str, description: str, default: str = "", most: int | None = None) -> Arg:
    """A string argument; `most` is its length limit, enforced."""
    return Arg(name, {"type": "string", "default": default, "description": description,
                      **({"maxLength": most} if most is not None else {})})


def flag_arg(name: str, description: str) -> Arg:
    return Arg(name, {"type": "boolean", "default": False, "description": description})


def choice_arg(name: str, choices, default: str, description: str) -> Arg:
    return Arg(name, {"type": "string", "enum": list(choices), "default": default, "description": description})


def input_schema(args: list[Arg]) -> dict:
    return {"type": "object", "properties": {a.name: {"title": a.name, **a.schema} for a in args},
            "required": [a.name for a in args if a.required], "additionalProperties": False}


def _kind(value) -> str:
    return {bool: "a boolean", str: "a string", int: "an integer", float: "a number", list: "a list",
            dict: "an object", type(None): "null"}.get(type(value), type(value).__name__)


def check_value(name: str, value, schema: dict) -> None:
    """Refuse a value whose JSON type, choice or size is not the advertised one; numbers go to the engine."""
    kind = schema.get("type")
    if kind == "boolean" and not isinstance(value, bool):
        raise InputError(name, f"{name} must be true or false (a JSON boolean), got {short(value)} "
                               f"({_kind(value)}); pass true or false without quotes")
    if kind == "string" and not isinstance(value, str):
        raise InputError(name, f"{name} must be a string, got {short(value)} ({_kind(value)}); pass it as text")
    if kind == "array" and not (isinstance(value, list) and all(isinstance(x, str) for x in value)):
        raise InputError(name, f"{name} must be a list of strings, got {short(value)} ({_kind(value)}); pass a "
                               'JSON array such as ["What is 2+2?", "What is 3+4?"]')
    if "enum" in schema and value not in schema["enum"]:
        raise InputError(name, f"{name} must be one of {', '.join(map(str, schema['enum']))}, got {short(value)}")
    if kind in ("integer", "number") and (isinstance(value, (bool, str, list, dict)) or value is None):
        raise InputError(name, f"{name} must be a number, got {short(value)} ({_kind(value)}); pass a number such "
                               f"as the default {schema.get('default')}")
    check_size(name, value, schema)


def check_size(name: str, value, schema: dict) -> None:
    """The advertised maxItems, minItems and maxLength, which the SDK does not enforce."""
    if isinstance(value, list) and len(value) > schema.get("maxItems", len(value)):
        raise InputError(name, f"{name} has {len(value)} items, over the limit of {schema['maxItems']}; split them "
                               f"over calls of at most {schema['maxItems']}")
    if isinstance(value, list) and len(value) < schema.get("minItems", 0):
        raise InputError(name, f"{name} is an empty list; give at least one item, or leave {name} out")
    if isinstance(value, str) and len(value) > schema.get("maxLength", len(value)):
        raise InputError(name, f"{name} is {len(value)} characters, over {schema['maxLength']}; no valid {name} "
                               "is that long")


def brief(message: str) -> str:
    """A tool's error text, no absolute path in it, cut so that no value can flood the client."""
    message = scrub(message)
    return message if len(message) <= MAX_MESSAGE else message[:MAX_MESSAGE] + "… (cut)"


def check_args(tool: str, args: list[Arg], given: dict) -> None:
    """Unknown names, missing required arguments and wrong JSON types, each named with its fix."""
    known = {a.name: a for a in args}
    for name, value in given.items():
        if name not in known:
            raise InputError(name, f"{short(name)[1:-1]} is not an argument of {tool} (got {short(value)}); its "
                                   f"arguments are {', '.join(known) or 'none'}")
    for a in args:
        if a.required and a.name not in given:
            raise InputError(a.name, f"{a.name} is required by {tool}; {a.schema.get('description', '')}")
        if a.name in given and "type" in a.schema:
            check_value(a.name, given[a.name], a.schema)


class CheckedTool(Tool):
    """A Tool that checks the raw arguments against its own `Arg`s before the SDK sees them."""

    args: list[Arg] = []

    async def run(self, arguments, context, convert_result: bool = False):
        try:
            check_args(self.name, self.args, arguments)
        except InputError as err:
            raise ToolError(brief(f"Error executing tool {self.name}: {err}")) from err
        return await super().run(arguments, context, convert_result)


def make_tool(fn: Callable, args: list[Arg], output, annotations: ToolAnnotations) -> CheckedTool:
    """The tool for `fn` (which takes **kwargs): every argument passed as given, None when absent.

    `output` is the pydantic model of the structured result (the tool's output schema), or
    `Annotated[CallToolResult, Model]` for a tool that also returns content blocks.
    """
    ctx = [p for p in inspect.signature(fn).parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    params = [inspect.Parameter(a.name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=Any) for a in args]
    fn.__signature__ = inspect.Signature(ctx + params, return_annotation=output)
    tool = CheckedTool.from_function(fn, description=description(fn.__doc__ or ""), annotations=annotations,
                                     structured_output=True)
    tool.args = list(args)
    tool.parameters = input_schema(args)
    return tool


def given(args: list[Arg], values: dict) -> dict:
    """The arguments with defaults filled in for those not given (None)."""
    return {a.name: a.default if values.get(a.name) is None else values[a.name] for a in args}


def description(text: str) -> str:
    """A docstring as one paragraph: no runs of spaces from its indentation."""
    return " ".join(inspect.cleandoc(text).split())


async def in_thread(engine, fn):
    """Run `fn` off the event loop; engine errors become tool errors with the engine's own text."""
    try:
        return await anyio.to_thread.run_sync(fn, abandon_on_cancel=True)
    except anyio.get_cancelled_exc_class():
        engine.cancel()  # the client gave up on the request: stop the run too
        raise
    except (ValueError, OSError) as exc:
        raise ToolError(brief(str(exc))) from exc
