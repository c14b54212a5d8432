"""Decide reports its progress as the Sampler does: ComfyUI's bar and the live view's events through the node,
MCP progress notifications, and server-sent events from POST /v1/dgemma/decide; probabilities a person reads
are percentages, and the pictures' colours never contradict an option's colour word."""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

import anyio
import fakecomfy
import numpy as np
import pytest
from executor import call
from remote_server import served

from diffusiongemma import NODE_CLASS_MAPPINGS
from diffusiongemma.dgemma import Knobs
from diffusiongemma.dgemma.demo import colour_image
from diffusiongemma.dgemma.denoising.decide import decide
from diffusiongemma.dgemma.readings import percent
from diffusiongemma.dgemma.readouts import decide_pictures

SCHEDULE = {"num_inference_steps": 12, "t_min": 0.4, "t_max": 0.8, "entropy_bound": 0.1, "confidence": 0.005}
COLOURS = ["red", "green", "blue", "yellow"]


def test_the_node_moves_the_bar_and_sends_the_live_views_events(demo_model, tmp_path):
    with fakecomfy.installed(tmp_path) as comfy:
        out, _ = call(NODE_CLASS_MAPPINGS["DGemmaDecide"], model=demo_model, prompt="What colour is this?",
                      options="\n".join(COLOURS), samples=3, seed=0, image=colour_image("blue", 64, 64), **SCHEDULE)
        comfy.registry.finish_progress("17")
    kinds = [event for event, _, _ in comfy.events]
    steps = comfy.steps()
    assert kinds[0] == "dgemma.start" and kinds[-1] == "dgemma.done" and len(steps) == len(out[5])
    assert [s["step"] for s in steps] == list(range(len(steps))) and steps[0]["node"] == "17"
    values = [v for v, _ in comfy.progress]
    assert values == sorted(values) and comfy.progress[-1][0] == comfy.progress[-1][1] > len(steps)
    texts = [text for _, text in comfy.text]
    assert any("noise draw 3/3" in t for t in texts) and "blue" in texts[-1] and "choice" in texts[-1]
    assert "%" in texts[-1] and "e-" not in texts[-1]


def test_mcp_sends_a_notification_per_read_and_step(demo_model):
    pytest.importorskip("mcp.server.mcpserver")
    from mcp import Client

    from diffusiongemma.mcp_server.engine import Engine
    from diffusiongemma.mcp_server.server import build_server

    seen = []

    async def on_progress(progress, total, message):
        seen.append((progress, total, message))

    async def go():
        async with Client(build_server(Engine(dm=demo_model))) as client:
            return await client.call_tool("decide", {"prompt": "What is 3+4?", "options": ["six", "seven"],
                                                     "samples": 2, "seed": 0, **SCHEDULE},
                                          progress_callback=on_progress)

    result = anyio.run(go)
    assert not result.is_error, result.content[0].text
    steps = len(result.structured_content["trace"])
    assert len(seen) >= steps + 1 and seen[-1][0] == seen[-1][1]
    assert any("noise draws" in m for _, _, m in seen) and any("step" in m for _, _, m in seen)
    assert "%" in result.structured_content["message"]


@pytest.fixture(scope="module")
def server():
    with served() as (url, proc):
        yield url


def test_the_server_streams_progress_then_the_decision(demo_model, server):
    parts = urlsplit(server)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=300)
    body = {"prompt": "What is 3+4?", "options": ["six", "seven"], "samples": 2, "stream": True,
            "knobs": {"seed": 0, **SCHEDULE}}
    conn.request("POST", "/v1/dgemma/decide", json.dumps(body), {"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200 and response.getheader("Content-Type").startswith("text/event-stream")
    events = [line[6:] for line in response.read().decode().split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    parsed = [json.loads(e) for e in events[:-1]]
    progress, final = parsed[:-1], parsed[-1]
    assert all(p["object"] == "dgemma.decide.progress" for p in progress) and final["object"] == "dgemma.decide"
    assert progress[-1]["done"] == progress[-1]["total"] and progress[0]["step"] is None
    local = decide(demo_model, "What is 3+4?", ["six", "seven"], 2, Knobs(seed=0, **SCHEDULE))
    assert final["per_sample"] == local.per_sample.tolist() and final["choice"] == "seven"
    assert sum(p["step"] is not None for p in progress) == len(local.trace)


def test_percentages_read_as_a_person_reads_them():
    assert [percent(p) for p in (0.0, 1e-15, 0.0004, 0.4237, 0.99996, 1.0)] == \
        ["0 %", "<0.1 %", "<0.1 %", "42.4 %", ">99.9 %", "100 %"]


def _drawn(picture: np.ndarray, colour) -> bool:
    target = np.asarray(colour, np.float32) / 255
    return bool((np.abs(picture[0] - target).max(axis=-1) < 0.02).any())


def test_every_colour_word_is_drawn_in_its_colour(demo_model):
    found = decide(demo_model, "What colour is this?", COLOURS, samples=2, knobs=Knobs(seed=0, **SCHEDULE),
                   image=colour_image("blue", 64, 64))
    colours = decide_pictures.option_colours(found.options)
    assert colours == [decide_pictures.COLOURS[c] for c in COLOURS]
    for picture in (decide_pictures.chart(found), decide_pictures.trace_lines(found)):
        assert all(_drawn(picture, c) for c in colours)
    # options that name no colour take colours no option names
    mixed = decide_pictures.option_colours(["sky", "red", "grass"])
    assert mixed[1] == decide_pictures.COLOURS["red"] and decide_pictures.COLOURS["red"] not in (mixed[0], mixed[2])


def test_the_pictures_text_is_legible_in_the_templates_preview():
    """The smallest text, scaled into the template's 420-pixel-wide Preview Image, is at least 12 px."""
    assert decide_pictures.WIDTH <= 420 and decide_pictures.SMALL * 420 / decide_pictures.WIDTH >= 12
