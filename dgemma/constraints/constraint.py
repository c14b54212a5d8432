"""A constraint on the answer: JSON Schema, regex or a choice, checked and compiled to a token automaton.

`Constraint(kind, text)` is what callers build (nodes, MCP, scripts); empty text means no
constraint. Everything that can be refused is refused here, before any model work: invalid JSON,
a schema keyword the compiler would silently ignore (named), a regex that does not compile, an
empty choice list, an answer that cannot fit in the run's positions. outlines-core turns the
constraint into a regular expression and a token-level automaton (decision 0017).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
import threading
from dataclasses import dataclass

from ..errors import InputError, short
from . import budget

KINDS = ("json_schema", "regex", "choice")
MAX_TEXT = 20_000
MAX_INT_SPAN = 1000  # an integer range becomes an enum of its values
INSTALL = "pip install outlines-core (it is in the pack's requirements.txt)"

# Schema keywords the compiled automaton enforces; any other keyword is refused by name rather
# than silently ignored. Integer bounds are rewritten into an enum before compiling.
SUPPORTED = {"type", "properties", "required", "additionalProperties", "items", "prefixItems", "minItems",
             "maxItems", "enum", "const", "pattern", "minLength", "maxLength", "anyOf", "oneOf", "allOf", "$ref",
             "$defs", "definitions", "format", "title", "description", "default", "examples", "$schema", "$id",
             "$comment"}
BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\(?:0|x00|x\{0+\}|u0000)")  # \0, \x00, \x{0}, \u0000, not \\0
_DATA = ("enum", "const", "default", "examples")  # keywords whose values are data, not schemas


def _json_type_is(schema: dict, name: str) -> bool:
    return schema.get("type") == name


def _integer_enum(schema: dict, where: str) -> dict:
    """An integer with both bounds as an enum of its values (the compiler ignores bounds)."""
    lo, hi = schema.get("minimum"), schema.get("maximum")
    if "exclusiveMinimum" in schema:
        lo = schema["exclusiveMinimum"] + 1
    if "exclusiveMaximum" in schema:
        hi = schema["exclusiveMaximum"] - 1
    if not (isinstance(lo, int) and isinstance(hi, int)) or isinstance(lo, bool) or isinstance(hi, bool):
        raise InputError("constraint", f"integer bounds at {where} need both a minimum and a maximum as integers, "
                                       f"got minimum={short(lo)} maximum={short(hi)}; give both")
    if hi < lo:
        raise InputError("constraint", f"integer at {where} has maximum {hi} below minimum {lo}; no value fits")
    if hi - lo >= MAX_INT_SPAN:
        raise InputError("constraint", f"integer at {where} spans {hi - lo + 1} values, over {MAX_INT_SPAN}; "
                                       "narrow minimum/maximum or use a pattern on a string")
    rest = {k: v for k, v in schema.items() if k not in BOUNDS and k != "type"}
    return {**rest, "enum": list(range(lo, hi + 1))}


def check_schema(schema, where: str = "#", depth: int = 0) -> dict:
    """The schema with integer bounds rewritten; refuses keywords that would not be enforced."""
    if depth > budget.MAX_DEPTH:
        raise InputError("constraint", f"the JSON Schema is nested more than {budget.MAX_DEPTH} deep at "
                                       f"{where[:200]}; flatten it")
    if isinstance(schema, bool):
        return schema
    if not isinstance(schema, dict):
        raise InputError("constraint", f"the JSON Schema at {where} must be an object, got {type(schema).__name__}")
    schema = _unbounded(schema, where)
    for key in schema:
        if key not in SUPPORTED:
            raise InputError("constraint", f"unsupported schema keyword {short(key)} at {where}: it would not be "
                                           f"enforced; remove it (supported: {', '.join(sorted(SUPPORTED))})")
    return {key: _checked_part(key, value, f"{where}/{key}", depth + 1) for key, value in schema.items()}


def _unbounded(schema: dict, where: str) -> dict:
    """An integer's bounds as an enum; bounds on anything else refused."""
    if not any(k in schema for k in BOUNDS):
        return schema
    if not _json_type_is(schema, "integer"):
        bound = next(k for k in BOUNDS if k in schema)
        raise InputError("constraint", f"unsupported schema keyword {bound!r} at {where} (only integers may be "
                                       "bounded); remove it or make the value an integer")
    return _integer_enum(schema, where)


# The keywords that hold sub-schemas: a map of them, a list of them, or one.
_SCHEMA_MAPS = ("properties", "$defs", "definitions")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SCHEMA_ONES = ("items", "additionalProperties")


def _checked_part(key: str, value, where: str, depth: int):
    """A keyword's value, its sub-schemas checked; any other value as it is."""
    if key in _SCHEMA_MAPS and isinstance(value, dict):
        return {n: check_schema(sub, f"{where}/{_name(n)}", depth) for n, sub in value.items()}
    if key in _SCHEMA_LISTS and isinstance(value, list):
        return [check_schema(sub, f"{where}/{i}", depth) for i, sub in enumerate(value)]
    if key in _SCHEMA_ONES and isinstance(value, dict):
        return check_schema(value, where, depth)
    return value


def _refs_in(node, where: str):
    """(where, target) of each $ref in `node`'s schemas."""
    stack = [(node, where)]
    while stack:
        part, at = stack.pop()
        if isinstance(part, dict):
            if "$ref" in part:
                yield at, part["$ref"]
            stack.extend((v, f"{at}/{_name(str(k))}") for k, v in part.items() if k != "$ref" and k not in _DATA)
        elif isinstance(part, list):
            stack.extend((v, f"{at}/{i}") for i, v in enumerate(part))


def _resolve(root: dict, target, where: str):
    """The schema a local $ref points at; anything else refused, naming where it is."""
    if not isinstance(target, str) or not target.startswith("#"):
        raise InputError("constraint", f"the $ref at {where} is {short(target)}; only a reference inside the "
                                       "schema (#, #/$defs/name) can be compiled: put the target under $defs")
    node = root
    for step in [s.replace("~1", "/").replace("~0", "~") for s in target[1:].split("/")[1:]]:
        node = node.get(step) if isinstance(node, dict) else None
        if node is None:
            raise InputError("constraint", f"the $ref at {where} points at {short(target)}, which the schema does "
                                           "not hold; fix the path")
    return node


def check_refs(root: dict) -> None:
    """Refuse a $ref that cannot be followed, and a cycle of them: an automaton holds no recursion, and
    the compiler would cut it at a depth where the answer may break the schema."""
    done: set = set()

    def visit(target: str, chain: tuple, where: str) -> None:
        node = _resolve(root, target, where)  # refuses a target that is not a local path first
        if target in chain:
            loop = " → ".join(chain[chain.index(target):] + (target,))
            raise InputError("constraint", f"the $ref at {where[:200]} is recursive ({loop[:200]}); a "
                                           "constraint cannot recurse: unroll it to the depth you need")
        if target in done:
            return
        for at, inner in _refs_in(node, target):
            visit(inner, chain + (target,), at)
        done.add(target)

    if isinstance(root, dict):
        for at, target in _refs_in(root, "#"):
            visit(target, (), at)


def _name(name: str) -> str:
    """A property's name in a path a refusal quotes: cut, since a name may be thousands of characters."""
    return name if len(name) <= 40 else name[:39] + "…"


def _escape(text: str) -> str:
    """A literal for the automaton's regex syntax: every ASCII symbol as a \\x{..} escape."""
    return "".join(c if c.isalnum() or ord(c) > 127 or c == " " else f"\\x{{{ord(c):x}}}" for c in text)


def choices(text: str) -> list[str]:
    return [line.strip() for line in text.split("\n") if line.strip()]


@dataclass(frozen=True)
class Constraint:
    """What the answer must be: `kind` json_schema, regex or choice, and its text (empty: none)."""

    kind: str = "json_schema"
    text: str = ""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise InputError("constraint_type", f"constraint_type must be one of {', '.join(KINDS)}, got "
                                                f"{short(self.kind)}")
        if not isinstance(self.text, str):
            raise InputError("constraint", f"constraint must be text, got {type(self.text).__name__}")
        if len(self.text) > MAX_TEXT:
            raise InputError("constraint", f"constraint is {len(self.text)} characters, over {MAX_TEXT}")
        if "\0" in self.text or (self.kind == "regex" and _NUL_ESCAPE.search(self.text)):
            raise InputError("constraint", f"the {self.kind} constraint holds a NUL character, which no answer "
                                           "shows and the compiler cannot take; remove it")
        if self.active:
            self.regex  # noqa: B018 - refuse bad text on construction

    @property
    def active(self) -> bool:
        """Only the empty text means no constraint; blank text is refused, as it is likely a mistake."""
        return self.text != ""

    @property
    def regex(self) -> str:
        """The regular expression the answer must match in full (compiled within the budget, kept)."""
        if self.kind == "json_schema":
            _outlines()
        return _regex_of(self.kind, self.text)

    def costliest(self) -> budget.Part:
        """The part of the constraint that costs the most to compile, for a refusal to name."""
        return costliest(self.kind, self.text)

    def summary(self) -> dict:
        """The constraint as the run log's header records it: kind, text and a short hash."""
        digest = hashlib.sha256(f"{self.kind}\n{self.text}".encode()).hexdigest()[:16]
        return {"kind": self.kind, "text": self.text, "sha256": digest}


def costliest(kind: str, text: str) -> budget.Part:
    if kind == "choice":
        options = choices(text)
        return budget.Part(0, "", f"the choice list of {len(options)} options", "give fewer or shorter options")
    total, parts = budget.regex_parts(text.strip()) if kind == "regex" else \
        budget.schema_parts(check_schema(json.loads(text)))
    return budget.costliest(parts, total, "regex" if kind == "regex" else "schema")


@functools.lru_cache(maxsize=32)
def _regex_of(kind: str, text: str) -> str:
    if kind == "choice":
        options = choices(text)
        if not options:
            raise InputError("constraint", "the choice list is empty; write one option per line")
        return "(" + "|".join(_escape(o) for o in options) + ")"
    if kind == "regex":
        return _checked_regex(text.strip())
    return _schema_regex(text)


def _checked_regex(text: str) -> str:
    if not text:
        raise InputError("constraint", "the regex is blank; write a pattern, or leave constraint empty for none")
    try:
        re.compile(text)
    except (re.error, RecursionError, OverflowError) as err:
        raise InputError("constraint", f"the regex {text[:80]!r} does not compile: {err}; fix it") from None
    if re.search(r"\(\?[=!<]|\\[1-9]", text):
        raise InputError("constraint", f"the regex {text[:80]!r} uses lookaround or a backreference, which a "
                                       "finite automaton cannot enforce; rewrite it without them")
    budget.check("regex", text)
    return _unanchored(text)


def _unanchored(text: str) -> str:
    """The answer always matches whole, so an outer ^ and $ add nothing; the compiler cannot take them."""
    if text.startswith("^"):
        text = text[1:]
    body = text[:-1]
    if text.endswith("$") and (len(body) - len(body.rstrip("\\"))) % 2 == 0:  # not an escaped \$
        text = body
    return text


def _schema_regex(text: str) -> str:
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError("constraint", f"the JSON Schema is not valid JSON ({err.msg} at line {err.lineno} column "
                                       f"{err.colno}); fix the text") from None
    except RecursionError:
        raise InputError("constraint", f"the JSON Schema is nested too deep to read; keep it under "
                                       f"{budget.MAX_DEPTH} levels") from None
    schema = check_schema(schema)
    check_refs(schema)
    budget.check("schema", schema)
    return budget.schema_regex(json.dumps(schema), functools.partial(costliest, "json_schema", text))


def _outlines():
    try:
        import outlines_core
    except ImportError:
        raise InputError("constraint", f"a constraint needs the outlines-core package, which is not installed; "
                                       f"{INSTALL}") from None
    return outlines_core


_compiled: dict = {}
_lock = threading.Lock()
KEEP = 4  # compiled automata kept; one at the real vocabulary is a few hundred MB while it builds


def automaton(dm, constraint: Constraint, should_cancel=None):
    """The constraint's token automaton for this model's tokenizer, compiled once and kept; Cancel
    (`should_cancel`) stops a compile."""
    from .automaton import Automaton

    key = _key(dm, constraint)
    with _lock:
        found = _compiled.get(key)
        if found is None:
            _outlines()
            found = Automaton.build(constraint, dm, should_cancel)
            if len(_compiled) >= KEEP:
                _compiled.pop(next(iter(_compiled)))
            _compiled[key] = found
    return found


def _key(dm, constraint: Constraint) -> tuple:
    return dm.tokenizer_fingerprint, constraint.kind, constraint.text


def held(dm, constraint: Constraint) -> bool:
    """Whether `automaton` answers from memory, at once."""
    return _key(dm, constraint) in _compiled
