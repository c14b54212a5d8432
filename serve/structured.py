"""Structured output fields into the engine's `Constraint`: OpenAI's `response_format`, vLLM's
`structured_outputs` and its older `guided_*` fields, and the pack's own `dgemma.constraint`.

At most one of them per request. What the constraint compiler refuses comes back naming the field
and, in the message, the schema keyword.
"""

from __future__ import annotations

import json

from ..dgemma.constraints.constraint import KINDS, Constraint
from ..dgemma.errors import InputError

# Any JSON object, as a schema the compiler takes: any keys; strings, numbers, true/false/null,
# arrays and objects as values, objects nested at most three deep (outlines-core's limit).
JSON_OBJECT = '{"type": "object"}'
MAX_CHOICES = 256
VLLM_KINDS = {"choice": "choice", "regex": "regex", "json": "json_schema"}
VLLM_REFUSED = ("grammar", "structural_tag")
RESPONSE_KEYS = {"text": ("type",), "json_object": ("type", "schema"), "json_schema": ("type", "json_schema")}


def _need(cond: bool, name: str, msg: str) -> None:
    if not cond:
        raise InputError(name, msg)


def _schema_text(value, name: str) -> str:
    _need(isinstance(value, (dict, bool, str)), name, f"{name} must be a JSON Schema (an object), got "
                                                      f"{type(value).__name__}")
    return value if isinstance(value, str) else json.dumps(value)


def _choice_text(value, name: str) -> str:
    _need(isinstance(value, list) and 0 < len(value) <= MAX_CHOICES, name,
          f"{name} must be a list of 1 to {MAX_CHOICES} strings")
    for option in value:
        _need(isinstance(option, str) and option != "", name, f"{name} holds {str(option)[:40]!r}; each choice "
                                                             "must be a non-empty string")
        _need("\n" not in option and option == option.strip(), name,
              f"{name} holds {option[:40]!r}; a choice may not hold a line break or start or end with a space")
    return "\n".join(value)


def _regex_text(value, name: str) -> str:
    _need(isinstance(value, str) and value.strip() != "", name, f"{name} must be a non-empty regular expression")
    return value


def _known(spec: dict, keys: tuple, where: str) -> None:
    unknown = sorted(str(k)[:40] for k in spec if k not in keys)
    _need(not unknown, "response_format", f"{where}.{unknown[0] if unknown else ''} is not a field here ("
                                          f"{', '.join(keys)} are); remove it")


def _response_format(spec) -> tuple[str, str] | None:
    """A `json_object` with a `schema` (instructor's older JSON_SCHEMA mode) is honoured as json_schema."""
    _need(isinstance(spec, dict), "response_format", "response_format must be an object with a type")
    kind = spec.get("type")
    _known(spec, RESPONSE_KEYS.get(kind, ("type",)), "response_format")
    if kind == "text":
        return None
    if kind == "json_object":
        return "json_schema", _schema_text(spec["schema"], "response_format.schema") if "schema" in spec \
            else JSON_OBJECT
    _need(kind == "json_schema", "response_format", f"response_format.type must be text, json_object or "
                                                    f"json_schema, got {str(kind)[:40]!r}")
    inner = spec.get("json_schema")
    _need(isinstance(inner, dict) and "schema" in inner, "response_format",
          "response_format.json_schema must be an object with a schema (and a name)")
    _known(inner, ("name", "schema", "strict", "description"), "response_format.json_schema")
    _need(isinstance(inner.get("strict", False), bool), "response_format", "response_format.json_schema.strict "
                                                                           "must be true or false")
    return "json_schema", _schema_text(inner["schema"], "response_format.json_schema.schema")


def _structured_outputs(spec) -> tuple[str, str]:
    _need(isinstance(spec, dict), "structured_outputs", "structured_outputs must be an object")
    for key in VLLM_REFUSED:
        _need(spec.get(key) is None, "structured_outputs", f"structured_outputs.{key} is not supported here: use "
                                                           "choice, regex or json")
    given = {k: v for k, v in spec.items() if v is not None and v is not False}
    unknown = sorted(set(given) - set(VLLM_KINDS) - {"json_object"})
    _need(not unknown, "structured_outputs", f"structured_outputs.{unknown[0][:40] if unknown else ''} is not "
                                             "supported here; its fields are choice, regex, json and json_object")
    _need(len(given) == 1, "structured_outputs", "structured_outputs needs exactly one of choice, regex, json and "
                                                 "json_object")
    (key, value), = given.items()
    if key == "json_object":
        _need(value is True, "structured_outputs", "structured_outputs.json_object must be true")
        return "json_schema", JSON_OBJECT
    return _of_kind(VLLM_KINDS[key], value, f"structured_outputs.{key}")


def _of_kind(kind: str, value, name: str) -> tuple[str, str]:
    read = {"choice": _choice_text, "regex": _regex_text, "json_schema": _schema_text}[kind]
    return kind, read(value, name)


def _pack(spec) -> tuple[str, str]:
    _need(isinstance(spec, dict) and spec.get("kind") in KINDS and isinstance(spec.get("text"), str),
          "constraint", f"dgemma.constraint must be {{'kind': one of {', '.join(KINDS)}, 'text': text}}")
    return spec["kind"], spec["text"]


def constraint_of(body: dict, ext: dict) -> tuple[Constraint | None, str | None]:
    """(the request's Constraint or None, the field it came from)."""
    found = []
    if body.get("response_format") is not None:
        found.append(("response_format", _response_format(body["response_format"])))
    if body.get("structured_outputs") is not None:
        found.append(("structured_outputs", _structured_outputs(body["structured_outputs"])))
    for key, kind in (("guided_choice", "choice"), ("guided_regex", "regex"), ("guided_json", "json_schema")):
        if body.get(key) is not None:
            found.append((key, _of_kind(kind, body[key], key)))
    if ext.get("constraint") is not None:
        found.append(("constraint", _pack(ext["constraint"])))
    found = [(name, spec) for name, spec in found if spec is not None]
    _need(len(found) <= 1, found[-1][0] if found else "body", "send one constraint: "
          f"{' and '.join(name for name, _ in found)} both ask for one")
    if not found:
        return None, None
    name, (kind, text) = found[0]
    return checked(name, lambda: Constraint(kind, text)), name


def checked(name: str, make):
    """`make()`, its constraint refusals renamed to the request's field."""
    try:
        return make()
    except InputError as err:
        if err.name in ("constraint", "constraint_type") and name != "constraint":
            raise InputError(name, f"{name}: {err}") from None
        raise


def common() -> list:
    """The constraints a server compiles at start, each as a callable that makes it: `json_object` first (the
    commonest), the example graph's schema, and `json_object` again (read back, so it stays among those kept in
    memory)."""
    from ..dgemma.demo import ANSWER_SCHEMA

    texts = [JSON_OBJECT, json.dumps(ANSWER_SCHEMA), JSON_OBJECT]
    return [lambda text=text: Constraint("json_schema", text) for text in texts]
