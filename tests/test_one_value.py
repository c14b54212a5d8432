"""A JSON Schema of one value from a list is answered where the model answers, written as its JSON: the demo's
schema answers as right as free text; which schemas take that path, and how the value is written."""

from __future__ import annotations

import json

import jsonschema
import pytest

from diffusiongemma.dgemma import Constraint, Knobs, generate
from diffusiongemma.dgemma.constraints.one_value import one_value
from diffusiongemma.dgemma.demo import DEMO_KNOBS, WORDS
from diffusiongemma.testing.schemas import SCHEMAS, SUM


def test_the_structured_example_answers_seven(demo_model):
    """The shipped example's JSON Schema run: 'What is 3+4?', seed 7 (it answered {"sum":"two"} before)."""
    dm = demo_model
    result = generate(dm, "What is 3+4?", Knobs(seed=7), constraint=Constraint("json_schema", json.dumps(SUM)))
    assert result.text == '{"sum":"seven"}'
    verdict = result.state.constraint
    assert verdict["satisfied"] and verdict["answered_as_value"] and result.state.finished_honestly
    assert dm.tokenizer.decode(list(result.state.answer_ids)) == "seven"  # the canvas holds the value


def test_the_demo_answers_its_schema_as_right_as_free_text(demo_model):
    schema = Constraint("json_schema", json.dumps(SUM))
    for i in range(0, 100, 9):
        a, b = divmod(i, 10)
        knobs = Knobs(**{**DEMO_KNOBS.asdict(), "seed": i})
        free = generate(demo_model, f"What is {a}+{b}?", knobs).text
        shaped = generate(demo_model, f"What is {a}+{b}?", knobs, constraint=schema).text
        jsonschema.validate(json.loads(shaped), SUM)
        assert json.loads(shaped)["sum"] == free == WORDS[a + b]


def schema(value: dict, **more) -> Constraint:
    return Constraint("json_schema", json.dumps({"type": "object", "properties": {"v": value}, "required": ["v"],
                                                 **more}))


@pytest.mark.parametrize("constraint, values", [
    (Constraint("json_schema", json.dumps(SUM)), list(WORDS)),
    (Constraint("json_schema", json.dumps(SCHEMAS["enum"])), ["red", "green", "blue"]),
    (Constraint("json_schema", json.dumps(SCHEMAS["integer"])), [str(n) for n in range(18, 100)]),
    (schema({"type": "boolean"}, additionalProperties=False), ["true", "false"]),
    (schema({"const": "only", "description": "the one answer"}), ["only"]),
    (schema({"enum": [1, 2.5, None, "x"]}), ["1", "2.5", "null", "x"]),
])
def test_schemas_of_one_value(constraint, values):
    found = one_value(constraint)
    assert found is not None and [text for text, _ in found.values] == values
    parsed = json.loads(constraint.text)
    for text in values:
        jsonschema.validate(json.loads(found.answer(text)), parsed)
    assert found.answer("not listed") == "not listed"


@pytest.mark.parametrize("constraint", [
    Constraint("json_schema", json.dumps(SCHEMAS["nested"])),
    Constraint("json_schema", json.dumps({"type": "object", "properties": {"v": {"enum": ["a"]}}})),  # optional
    schema({"enum": ["a"]}, additionalProperties=True),
    schema({"enum": ["a", {"b": 1}]}),
    schema({"enum": ["a ", "b"]}),
    schema({"enum": ["1", 1]}),  # the same text for two values
    schema({"enum": ["a\nb"]}),
    schema({"type": "string", "enum": ["a", 1]}),
    schema({"type": "string", "maxLength": 3}),
    Constraint("choice", "a\nb"),
    Constraint("regex", "a|b"),
    None,
])
def test_other_schemas_keep_the_general_path(constraint):
    assert one_value(constraint) is None
