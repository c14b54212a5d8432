"""The MCP server offers what the nodes offer: images, schedulers, pins, windows with resume, GIFs,
run logs, typed results, and refusals that name the argument; driven through the SDK's clients."""

from __future__ import annotations

import base64
import io
import json
import sys
from pathlib import Path

import anyio
import pytest

pytest.importorskip("mcp.server.mcpserver", reason="the MCP SDK is not installed: pip install 'mcp>=2,<3'")

from mcp import Client, StdioServerParameters  # noqa: E402

from diffusiongemma.dgemma import Knobs, generate  # noqa: E402
from diffusiongemma.dgemma.demo import colour_image  # noqa: E402
from diffusiongemma.dgemma.denoising.resume import Advanced  # noqa: E402
from diffusiongemma.dgemma.steps.schedulers import Scheduling  # noqa: E402
from diffusiongemma.mcp_server.engine import Engine  # noqa: E402
from diffusiongemma.mcp_server.server import build_server  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
ASK = {"prompt": "What is 3+4?"}


def png_base64(colour: str, size=(64, 48)) -> str:
    from PIL import Image

    pixels = (colour_image(colour, *size)[0].numpy() * 255).astype("uint8")
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "PNG")
    return base64.b64encode(buf.getvalue()).decode()


def session(srv, fn):
    async def go():
        async with Client(srv) as client:
            return await fn(client)

    return anyio.run(go)


def call(srv, tool, args=None, **kw):
    return session(srv, lambda c: c.call_tool(tool, args or {}, **kw))


def error(result) -> str:
    assert result.is_error, result.structured_content
    return result.content[0].text


def test_every_tool_has_an_output_schema_annotations_and_one_line_descriptions(demo_model):
    srv = build_server(Engine(dm=demo_model))
    tools = {t.name: t for t in session(srv, lambda c: c.list_tools()).tools}
    for tool in tools.values():
        schema = tool.output_schema
        assert schema and schema["type"] == "object", tool.name
        for name, prop in schema["properties"].items():
            assert prop.get("description") and ("type" in prop or "anyOf" in prop), (tool.name, name)
        assert tool.annotations is not None and tool.annotations.read_only_hint is not None, tool.name
        assert "  " not in tool.description and "\n" not in tool.description, tool.name
        for prop in tool.input_schema["properties"].values():
            for arm in [prop, *prop.get("anyOf", [])]:
                assert arm.get("maximum", 0) <= 2**53 - 1  # JSON clients hold every bound exactly
    assert tools["model_status"].annotations.read_only_hint and not tools["generate"].annotations.read_only_hint
    assert tools["free_handle"].annotations.destructive_hint
    seed = tools["generate"].input_schema["properties"]["seed"]
    assert {arm["type"] for arm in seed["anyOf"]} == {"integer", "string"}


def test_capabilities_advertise_only_what_is_served(demo_model):
    srv = build_server(Engine(dm=demo_model))

    async def go(client):
        templates = (await client.list_resource_templates()).resource_templates
        return client.server_capabilities, templates

    caps, templates = session(srv, go)
    assert caps.prompts is None and caps.resources is not None and caps.tools is not None
    assert [t.uri_template for t in templates] == ["dgemma://runs/{run_id}/runlog.jsonl"]


def test_an_image_as_base64_or_a_path_under_the_allowed_folder_is_read(demo_model, tmp_path):
    allowed = tmp_path / "input"
    allowed.mkdir()
    (allowed / "blue.png").write_bytes(base64.b64decode(png_base64("blue")))
    srv = build_server(Engine(dm=demo_model, image_dirs=(allowed,)))
    ask = {"prompt": "What colour is this?"}
    inline = call(srv, "generate", {**ask, "image": png_base64("green")}).structured_content
    assert inline["text"] == "green" and inline["config"]["image"]["count"] == 1
    data_url = call(srv, "generate", {**ask, "image": "data:image/png;base64," + png_base64("red")})
    assert data_url.structured_content["text"] == "red"
    assert call(srv, "generate", {**ask, "image": str(allowed / "blue.png")}).structured_content["text"] == "blue"
    outside = tmp_path / "elsewhere.png"
    outside.write_bytes(base64.b64decode(png_base64("red")))
    assert "outside the folders this server reads pictures from" in error(call(srv, "generate", {
        **ask, "image": str(outside)}))
    assert "image is neither valid base64 nor a path" in error(call(srv, "generate", {
        **ask, "image": "data:image/png;base64,not*b64"}))
    encoded = call(srv, "encode", {"text": "", "image": png_base64("cyan")}).structured_content
    assert encoded["summary"]["images"][0]["count"] == 1


def test_scheduler_and_its_knobs_reach_the_engine_and_the_config(demo_model):
    srv = build_server(Engine(dm=demo_model))
    args = {**ASK, "scheduler": "block_refinement", "threshold": 0.5, "num_inference_steps": 16}
    out = call(srv, "generate", args).structured_content
    direct = generate(demo_model, ASK["prompt"], advanced=Advanced(Scheduling("block_refinement", threshold=0.5)),
                      knobs=Knobs(num_inference_steps=16))
    assert out["text"] == direct.text and out["canvas_state"]["steps_used"] == direct.state.steps_used
    assert out["config"]["advanced"]["scheduler"] == "block_refinement"
    assert out["config"]["advanced"]["threshold"] == 0.5
    assert "threshold must be between 0.0 and 1.0" in error(call(srv, "generate", {**ASK, "threshold": 2.0}))


def test_pins_hold_their_text_and_report_what_applied(demo_model):
    srv = build_server(Engine(dm=demo_model))
    out = call(srv, "generate", {**ASK, "pins": "0: seven"}).structured_content
    assert out["text"].startswith("seven")
    applied = out["canvas_state"]["pins_applied"]
    assert applied == list(range(len(applied))) and applied and out["canvas_state"]["pins_skipped"] == []
    assert out["config"]["advanced"]["pins"] == "0: seven"


def test_a_window_pauses_and_the_handle_resumes_it_exactly(demo_model):
    srv = build_server(Engine(dm=demo_model, max_paused=2))
    whole = call(srv, "generate", ASK).structured_content

    async def go(client):
        first = (await client.call_tool("generate", {**ASK, "end_step": 4})).structured_content
        status = (await client.call_tool("model_status", {})).structured_content
        notes = []

        async def on_progress(progress, total, text):
            notes.append((progress, total))

        rest = await client.call_tool("generate", {"resume": first["paused_handle"]}, progress_callback=on_progress)
        freed = (await client.call_tool("free_handle", {"handle": first["paused_handle"]})).structured_content
        again = await client.call_tool("generate", {"resume": first["paused_handle"]})
        return first, status, rest.structured_content, notes, freed, again

    first, status, rest, notes, freed, again = session(srv, go)
    assert first["canvas_state"]["paused"] and first["canvas_state"]["steps_used"] == 4
    held = status["paused_runs"][first["paused_handle"]]
    assert (held["block"], held["step"], held["prompt"]) == (0, 4, ASK["prompt"]) and held["bytes"] > 0
    assert rest["text"] == whole["text"] == "seven"
    assert rest["canvas_state"]["steps_used"] == whole["canvas_state"]["steps_used"]
    assert rest["config"]["advanced"]["resumed_from"]["step"] == 4 and rest["config"]["advanced"]["start_step"] == 4
    assert notes[-1][0] == notes[-1][1]  # the bar ends full
    assert freed["freed"] and freed["kind"] == "paused run" and freed["bytes_freed"] == held["bytes"]
    assert "resume handle" in error(again) and "is unknown" in error(again)
    handles = [call(srv, "generate", {**ASK, "end_step": 2}).structured_content["paused_handle"] for _ in range(3)]
    assert sorted(call(srv, "model_status").structured_content["paused_runs"]) == sorted(handles[1:])  # bounded


def test_resume_refusals_say_the_fix_for_this_tool(demo_model):
    srv = build_server(Engine(dm=demo_model))
    handle = call(srv, "generate", {**ASK, "end_step": 3}).structured_content["paused_handle"]
    assert "leave context out" in error(call(srv, "generate", {"resume": handle, "context": "a=1."}))
    changed = error(call(srv, "generate", {"resume": handle, "prompt": "What is 1+1?"}))
    assert "prompt" in changed and "leave prompt out" in changed
    assert "leave start_step out (auto) or set it to 3" in error(call(srv, "generate", {"resume": handle,
                                                                                        "start_step": 2}))


def test_the_gif_comes_back_as_image_content_and_the_run_log_as_a_resource(demo_model, tmp_path):
    from PIL import Image

    srv = build_server(Engine(dm=demo_model))

    async def go(client):
        result = await client.call_tool("generate", {**ASK, "gif": True, "output_dir": str(tmp_path)})
        link = next(b for b in result.content if b.type == "resource_link")
        log = await client.read_resource(link.uri)
        listed = (await client.list_resources()).resources
        return result, link, log, listed

    result, link, log, listed = session(srv, go)
    assert [str(r.uri) for r in listed] == [str(link.uri)]
    out = result.structured_content
    image = next(b for b in result.content if b.type == "image")
    assert image.mime_type == "image/gif"
    with Image.open(io.BytesIO(base64.b64decode(image.data))) as gif:
        assert gif.n_frames == out["canvas_state"]["steps_used"]
    assert Path(out["gif"]).read_bytes() == base64.b64decode(image.data)
    assert str(link.uri) == out["runlog_uri"]
    rows = [json.loads(line) for line in log.contents[0].text.splitlines()]
    assert rows[0]["run_id"] == out["canvas_state"]["run_id"] and rows[-1]["text"] == "seven"


@pytest.mark.parametrize("args, says", [
    ({"runlog": "false"}, "runlog must be true or false (a JSON boolean), got 'false' (a string)"),
    ({"gif": "0"}, "gif must be true or false (a JSON boolean), got '0' (a string)"),
    ({"context": 5}, "context must be a string, got 5"),
    ({"context_handle": ["ctx-1"]}, "context_handle must be a string, got ['ctx-1'] (a list)"),
    ({"output_dir": 5}, "output_dir must be a string, got 5"),
    ({"output_dir": "out\0put"}, "output_dir holds a NUL byte"),
    ({"seed": 2**64}, "seed must be an integer from 0 to 18446744073709551615"),
    ({"seed": "-1"}, "seed must be an integer or a string of digits"),
    ({"start_step": "soon"}, "start_step must be an integer or \"auto\", got 'soon'"),
    ({"scheduler": "ddpm"}, "scheduler must be one of entropy_bound, block_refinement, discrete_ddim, got 'ddpm'"),
    ({"prompt": None}, "prompt must be a string, got None"),
])
def test_argument_errors_name_the_argument_the_value_and_the_fix(demo_model, args, says):
    text = error(call(build_server(Engine(dm=demo_model)), "generate", {**ASK, **args}))
    assert says in text and "validation error" not in text


def test_an_output_dir_that_is_a_file_is_refused_before_the_run(demo_model, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    notes = []

    async def on_progress(progress, total, text):
        notes.append(progress)

    result = call(build_server(Engine(dm=demo_model)), "generate", {**ASK, "gif": True, "output_dir": str(
        blocker / "sub")}, progress_callback=on_progress)
    assert "is not a folder" in error(result) and notes == []


def test_a_seed_past_two_to_the_53_given_as_digits_runs_exactly(demo_model):
    from diffusiongemma.dgemma.inputs.knobs import Knobs

    big = 2**64 - 1
    out = call(build_server(Engine(dm=demo_model)), "generate", {**ASK, "seed": str(big)}).structured_content
    assert out["config"]["seed"] == big
    assert out["text"] == generate(demo_model, ASK["prompt"], Knobs(seed=big)).text


def test_stdio_server_serves_images_schedulers_pins_windows_and_gifs(tmp_path):
    params = StdioServerParameters(command=sys.executable, args=["-m", "mcp_server", "--image-dir", str(tmp_path)],
                                   cwd=str(REPO))
    picture = tmp_path / "magenta.png"
    picture.write_bytes(base64.b64decode(png_base64("magenta")))

    async def talk():
        async with Client(params) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            seen = {"image": await client.call_tool("generate", {"prompt": "What colour is this?",
                                                                 "image": str(picture)}),
                    "scheduler": await client.call_tool("generate", {**ASK, "scheduler": "discrete_ddim",
                                                                     "num_inference_steps": 8}),
                    "pins": await client.call_tool("generate", {**ASK, "pins": "0: seven"}),
                    "paused": await client.call_tool("generate", {**ASK, "end_step": 5, "gif": True,
                                                                  "output_dir": str(tmp_path)})}
            seen["resumed"] = await client.call_tool("generate", {
                "resume": seen["paused"].structured_content["paused_handle"]})
            return tools, seen

    async def go():
        with anyio.fail_after(240):
            return await talk()

    tools, seen = anyio.run(go)
    assert tools["generate"].output_schema["properties"]["canvas_state"]
    assert seen["image"].structured_content["text"] == "magenta"
    assert seen["scheduler"].structured_content["config"]["advanced"]["scheduler"] == "discrete_ddim"
    assert seen["pins"].structured_content["canvas_state"]["pins_applied"][0] == 0
    assert any(b.type == "image" and b.mime_type == "image/gif" for b in seen["paused"].content)
    assert seen["resumed"].structured_content["text"] == "seven"
