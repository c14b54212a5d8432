"""A JSON Schema that asks for one value from a list: the canvas holds the value, the answer is its JSON.

An object with exactly one property, required, no other (the compiler never writes one), whose
value is an enum, a const, a boolean or a bounded integer has one fixed skeleton around one choice.
The model writes the value where it writes any answer, at the start of the canvas, constrained as a
choice among the values (a string without its quotes); the answer text is the skeleton around it
(decision 0027).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..errors import InputError
from .constraint import Constraint, check_schema

# Keywords that say nothing about the answer's form; any other keyword keeps the schema on the general path.
NOTES = {"title", "description", "$schema", "$id", "$comment", "default", "examples"}
SCALARS = (str, int, float, bool, type(None))


@dataclass(frozen=True)
class OneValue:
    """The one property's name and its values, keyed by the text the model writes for each."""

    key: str
    values: tuple[tuple[str, object], ...]

    @property
    def choice(self) -> Constraint:
        return Constraint("choice", "\n".join(text for text, _ in self.values))

    def answer(self, text: str) -> str:
        """The JSON answer of a value the model wrote; any other text unchanged (its verdict says why)."""
        values = dict(self.values)
        if text not in values:
            return text
        return json.dumps({self.key: values[text]}, separators=(",", ":"), ensure_ascii=False)

    def written(self, answer: str) -> str:
        """The text the model wrote for a JSON answer of one of the values (the inverse of `answer`)."""
        return next((text for text, _ in self.values if self.answer(text) == answer), answer)


def _values(schema: dict) -> list | None:
    if not isinstance(schema, dict) or set(schema) - NOTES - {"type", "enum", "const"}:
        return None
    if "enum" in schema:
        values = schema["enum"] if isinstance(schema["enum"], list) else None
    elif "const" in schema:
        values = [schema["const"]]
    else:
        values = [True, False] if schema.get("type") == "boolean" else None
    if not values or not all(isinstance(v, SCALARS) for v in values):
        return None
    kind = schema.get("type")
    return values if kind is None or all(_is(v, kind) for v in values) else None


def _is(value, kind: str) -> bool:
    types = {"string": str, "boolean": bool, "null": type(None), "integer": int, "number": (int, float)}
    if kind not in types or (isinstance(value, bool) and kind in ("integer", "number")):
        return False
    return isinstance(value, types[kind])


def _text(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def one_value(constraint) -> OneValue | None:
    """The schema's one value and its key, or None when the schema is not one value from a list."""
    schema = _schema(constraint)
    key = None if schema is None else _only_key(schema)
    values = None if key is None else _values(schema["properties"][key])
    if values is None:
        return None
    texts = [_text(v) for v in values]
    clean = all(t and t == t.strip() and "\n" not in t and "\r" not in t for t in texts)
    if not clean or len(set(texts)) != len(texts):
        return None
    return OneValue(key, tuple(zip(texts, values)))


def _schema(constraint) -> dict | None:
    """A JSON Schema constraint's checked schema; None for any other constraint, or one that fails to check."""
    if constraint is None or constraint.kind != "json_schema" or not constraint.active:
        return None
    try:
        schema = check_schema(json.loads(constraint.text))
    except (ValueError, InputError):
        return None  # the constraint's own compile names what is wrong
    return schema if isinstance(schema, dict) else None


def _only_key(schema: dict) -> str | None:
    """The name of an object's one property, required, and no other allowed; else None."""
    if set(schema) - NOTES - {"type", "properties", "required", "additionalProperties"}:
        return None
    props = schema.get("properties")
    if schema.get("type", "object") != "object" or not isinstance(props, dict) or len(props) != 1:
        return None
    key = next(iter(props))
    if schema.get("required") != [key] or schema.get("additionalProperties", False) is not False:
        return None  # the compiled automaton writes no property it was not given, whether or not it is forbidden
    return key
