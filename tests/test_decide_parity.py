"""The decide tool over MCP and POST /v1/dgemma/decide on a real server give the engine's very numbers for the
same seed, with an image and with a KV context; the server refuses bad bodies with the field named."""

from __future__ import annotations

import base64
import http.client
import io
import json
from urllib.parse import urlsplit

import anyio
import numpy as np
import pytest
from remote_server import served

pytest.importorskip("mcp.server.mcpserver", reason="the MCP SDK is not installed: pip install 'mcp>=2,<3'")

from mcp import Client  # noqa: E402

from diffusiongemma.dgemma import Knobs  # noqa: E402
from diffusiongemma.dgemma.demo import colour_image  # noqa: E402
from diffusiongemma.dgemma.denoising.context import encode_context  # noqa: E402
from diffusiongemma.dgemma.denoising.decide import decide  # noqa: E402
from diffusiongemma.mcp_server.engine import Engine  # noqa: E402
from diffusiongemma.mcp_server.inputs import image as read_image  # noqa: E402
from diffusiongemma.mcp_server.server import build_server  # noqa: E402

SCHEDULE = {"num_inference_steps": 16, "t_min": 0.4, "t_max": 0.8, "entropy_bound": 0.1, "confidence": 0.005}
SAME = ("choice", "probabilities", "options", "samples", "seed", "forwards_per_sample", "per_sample", "trace")


def png(colour: str) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray((colour_image(colour, 64, 48)[0].numpy() * 255).astype("uint8")).save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


def post(url: str, path: str, body) -> tuple[int, dict]:
    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=300)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    return response.status, json.loads(response.read())


def mcp_decide(demo_model, args: dict) -> dict:
    async def go():
        async with Client(build_server(Engine(dm=demo_model))) as client:
            return await client.call_tool("decide", args)

    result = anyio.run(go)
    assert not result.is_error, result.content[0].text
    return result.structured_content


@pytest.fixture(scope="module")
def server():
    with served() as (url, _):
        yield url


def test_mcp_and_the_server_give_the_engines_numbers(demo_model, server):
    picture = png("magenta")
    ask = {"prompt": "What colour is this?", "options": ["red", "magenta", "white"], "samples": 3}
    engine = decide(demo_model, ask["prompt"], ask["options"], 3, Knobs(seed=21, **SCHEDULE),
                    image=read_image(picture, ())).asdict()
    by_mcp = mcp_decide(demo_model, {**ask, "seed": 21, **SCHEDULE, "image": picture})
    status, by_http = post(server, "/v1/dgemma/decide", {**ask, "knobs": {"seed": 21, **SCHEDULE},
                                                         "image": "data:image/png;base64," + picture})
    assert status == 200, by_http
    assert engine["choice"] == "magenta" and engine["trace"]
    for name in SAME:
        assert by_mcp[name] == engine[name] == by_http[name], name
    assert by_mcp["runlog_uri"].endswith(f"{by_mcp['run_id']}/runlog.jsonl") and by_http["run_id"]
    assert np.isclose(sum(p["mean"] for p in engine["probabilities"].values()), 1.0)


def test_a_kv_context_reads_the_same_everywhere(demo_model, server):
    ask = {"prompt": "What is a+b?", "options": ["eleven", "twelve", "thirteen"], "samples": 2, "trace": False}
    engine = decide(demo_model, ask["prompt"], ask["options"], 2, Knobs(seed=8),
                    context=encode_context(demo_model, "a=6, b=6."), trace=False).asdict()
    by_mcp = mcp_decide(demo_model, {**ask, "seed": 8, "context": "a=6, b=6."})
    _, made = post(server, "/v1/dgemma/contexts", {"text": "a=6, b=6."})
    status, by_http = post(server, "/v1/dgemma/decide", {**ask, "knobs": {"seed": 8}, "context": made["handle"]})
    assert status == 200, by_http
    assert engine["choice"] == "twelve" and engine["trace"] is None
    for name in SAME:
        assert by_mcp[name] == engine[name] == by_http[name], name


@pytest.mark.parametrize("body, param, says", [
    ({"prompt": "x", "options": []}, "options", "options is empty"),
    ({"prompt": "x", "options": ["a", "a"]}, "options", "given twice"),
    ({"prompt": "x", "options": ["a"], "samples": 65}, "samples", "from 1 to 64, got 65"),
    ({"prompt": "x", "options": ["a"], "knobs": {"gen_length": 64}}, "knobs", "'gen_length' is not a knob of decide"),
    ({"prompt": "x", "options": ["a"], "colour": "red"}, "colour", "'colour' is not a field of a decide request"),
    ({"prompt": "x", "options": ["a"], "trace": "yes"}, "trace", "trace must be true or false"),
    ({"prompt": "x", "options": ["a"], "context": "ctx-nothing"}, "context", "is not held by this server"),
    ([1, 2], "body", "must be a JSON object"),
])
def test_the_server_refuses_bad_bodies_naming_the_field(server, body, param, says):
    status, answer = post(server, "/v1/dgemma/decide", body)
    assert status == 400 and answer["error"]["param"] == param and says in answer["error"]["message"]
