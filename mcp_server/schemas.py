"""Tool parameters built from the engine's tables, so agents see the node widgets' ranges.

Every parameter is typed `Any` with its JSON schema attached: the schema advertises the type,
default, range and tooltip, while the values reach the engine unchanged, so `Knobs` and the
loader refuse bad input with the same messages the nodes show.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Annotated, Any

from mcp.server.mcpserver.tools import Tool
from pydantic import ConfigDict, Field, WithJsonSchema

from ..dgemma.knobs import KNOBS

_JSON_TYPES = {int: "integer", float: "number", bool: "boolean", str: "string"}


def knob_schema(name: str) -> dict:
    """JSON schema of one knob: type, default, range and the widget's tooltip."""
    spec = KNOBS[name]
    schema = {"type": _JSON_TYPES[spec.kind], "default": spec.default, "description": spec.tooltip}
    if spec.kind is not bool:
        schema.update(minimum=spec.lo, maximum=spec.hi)
    return schema


def param(name: str, schema: dict, default=inspect.Parameter.empty) -> inspect.Parameter:
    """A keyword parameter whose advertised schema is `schema` and whose value passes unvalidated."""
    annotation = Annotated[Any, WithJsonSchema({"title": name, **schema}), Field(description=schema.get("description"))]
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)


def knob_params() -> list[inspect.Parameter]:
    return [param(name, knob_schema(name), spec.default) for name, spec in KNOBS.items()]


def choice_schema(choices, default: str, description: str) -> dict:
    return {"type": "string", "enum": list(choices), "default": default, "description": description}


def with_params(fn: Callable, params: list[inspect.Parameter]) -> Callable:
    """Give `fn` (which takes **kwargs) the signature the SDK reads to build the tool's schema."""
    ctx = [p for p in inspect.signature(fn).parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    fn.__signature__ = inspect.Signature(ctx + params, return_annotation=dict[str, Any])
    return fn


def strict_tool(fn: Callable) -> Tool:
    """The SDK's Tool for `fn`, refusing arguments it does not know: a misspelled knob is an error,
    not a silent default."""
    tool = Tool.from_function(fn)
    loose = tool.fn_metadata.arg_model
    strict = type(loose.__name__, (loose,), {"model_config": ConfigDict(**loose.model_config, extra="forbid")})
    tool.fn_metadata.arg_model = strict
    tool.parameters = strict.model_json_schema(by_alias=True)
    return tool
