"""JSON Schemas the constrained-decoding tests and benchmark share: one of each kind the issue names
(nested object, array with min/max items, enum, integer with bounds, string with pattern), and the
demo's own answer as JSON."""

from __future__ import annotations

from ..dgemma.demo import ANSWER_SCHEMA

SCHEMAS = {
    "nested": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 8},
        "home": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6}}, "required": ["city"]}},
        "required": ["name", "home"], "additionalProperties": False},
    "array": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 2,
              "maxItems": 4},
    "enum": {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}}, "required": ["colour"]},
    "integer": {"type": "object", "properties": {"age": {"type": "integer", "minimum": 18, "maximum": 99}},
                "required": ["age"]},
    "pattern": {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}},
                "required": ["code"]},
}
SUM = ANSWER_SCHEMA
