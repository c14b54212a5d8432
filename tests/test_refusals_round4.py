"""Constraints checked by type and content on every surface (nodes, MCP, the server), and the server's
`response_format` and `messages` edges: each refused by name before model work, or honoured as documented."""

from __future__ import annotations

import json

import jsonschema
import pytest
from executor import call
from remote_server import served
from serve_client import ask

from diffusiongemma import NODE_CLASS_MAPPINGS as NODES
from diffusiongemma.dgemma import Knobs

CHAT = "/v1/chat/completions"
ADVANCED = dict(scheduler="entropy_bound", pins="", start_step=0, end_step=1024)
USER = [{"role": "user", "content": "What is 3+4?"}]
CYCLE = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
LIST = {"$defs": {"n": {"type": "object", "properties": {"next": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/n"}]}},
                        "required": ["next"]}}, "$ref": "#/$defs/n"}


@pytest.mark.parametrize("kind,text,says", [
    ("regex", "se\0ven", "NUL character"), ("regex", r"seven\x00", "NUL character"),
    ("regex", r"[\u0000-z]+", "NUL character"), ("choice", "seven\neig\0ht", "NUL character"),
    ("json_schema", json.dumps({"$ref": "#"}), "is recursive (# → #)"),
    ("json_schema", json.dumps(CYCLE), "is recursive (#/$defs/a → #/$defs/b → #/$defs/a)"),
    ("json_schema", json.dumps(LIST), "is recursive (#/$defs/n → #/$defs/n)"),
    ("json_schema", json.dumps({"$ref": "http://example.com/s.json"}), "only a reference inside the schema"),
    ("json_schema", json.dumps({"$ref": "#/$defs/missing"}), "which the schema does not hold")])
def test_a_nul_or_a_ref_cycle_is_refused_by_name_before_model_work(demo_model, no_model_work, kind, text, says):
    with pytest.raises(ValueError) as caught:
        call(NODES["DGemmaSamplerAdvanced"], model=demo_model, prompt="What is 3+4?", **Knobs().asdict(),
             **ADVANCED, constraint_type=kind, constraint=text)
    assert says in str(caught.value) and caught.value.name == "constraint" and len(str(caught.value)) < 500


def test_a_regex_with_an_escaped_backslash_and_zero_is_not_a_nul():
    from diffusiongemma.dgemma.constraints.constraint import Constraint

    assert Constraint("regex", r"a\\0").active


@pytest.mark.parametrize("args,says", [
    ({"constraint_type": "choice", "constraint": {"seven": 1}}, "constraint is an object, but constraint_type is"),
    ({"constraint_type": "regex", "constraint": {"pattern": "s"}}, "constraint is an object, but constraint_type is"),
    ({"constraint_type": "regex", "constraint": "a\0"}, "NUL character"),
    ({"constraint": CYCLE}, "is recursive")])
def test_mcp_generate_checks_the_constraint_by_type_before_use(demo_model, args, says):
    from test_mcp import call as mcp_call
    from test_mcp import serve

    srv = serve(demo_model)
    result = mcp_call(srv, "generate", {"prompt": "What is 3+4?", **args})
    text = result.content[0].text
    assert result.is_error and says in text and len(text) < 500, text
    assert not srv.engine.runs


@pytest.fixture(scope="module")
def server():
    with served("--model", "diffusiongemma-demo") as (url, _):
        yield url


@pytest.mark.parametrize("body,says", [
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "string"}}, "strict": True}},
     "response_format.strict is not a field here"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "string"}, "stric": True}}},
     "response_format.json_schema.stric is not a field here"),
    ({"response_format": {"type": "text", "schema": {}}}, "response_format.schema is not a field here"),
    ({"response_format": {"type": "json_object", "json_schema": {}}}, "response_format.json_schema is not a field"),
    ({"response_format": {"type": "json_object", "schema": CYCLE}}, "is recursive"),
    ({"structured_outputs": {"regex": "sev\0en"}}, "NUL character"),
    ({"guided_choice": ["seven", "ei\0ght"]}, "NUL character"),
    ({"messages": [*USER, {"role": "assistant", "content": "The answer is"}]},
     "messages[1] is an assistant message at the end")])
def test_server_constraint_and_message_edges_are_refused_by_name(server, body, says):
    status, answer, _ = ask(server, "POST", CHAT, {"messages": USER, **body})
    error = answer["error"]
    assert status == 400 and says in error["message"], answer
    assert error["param"] in ("response_format", "structured_outputs", "guided_choice", "messages")


def test_json_object_with_a_schema_is_honoured_as_json_schema(server):
    schema = {"type": "string", "enum": ["seven", "eight"]}
    status, answer, _ = ask(server, "POST", CHAT, {"messages": USER, "stream": False,
                                                   "response_format": {"type": "json_object", "schema": schema}})
    assert status == 200, answer
    jsonschema.validate(json.loads(answer["choices"][0]["message"]["content"]), schema)
