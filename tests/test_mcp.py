"""The MCP server through the SDK's own clients: in memory, and `python -m mcp_server` over stdio."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
import torch

pytest.importorskip("mcp.server.mcpserver", reason="the MCP SDK is not installed: pip install 'mcp>=2,<3'")

from mcp import Client, StdioServerParameters  # noqa: E402

from diffusiongemma.dgemma import generate, load_model  # noqa: E402
from diffusiongemma.dgemma.inputs.knobs import KNOBS, Knobs  # noqa: E402
from diffusiongemma.mcp_server.engine import Engine  # noqa: E402
from diffusiongemma.mcp_server.server import build_server  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TOOLS = {"load_model", "model_status", "generate", "encode", "cancel_run", "free_handle", "decide"}
LONG = dict(num_inference_steps=1024, confidence=0.0)  # 8 blocks of 1024 steps: minutes unless cancelled


def serve(dm):
    return build_server(Engine(dm=dm))


def call(srv, tool, args=None, **kw):
    """Call one tool on a fresh in-memory client; returns the CallToolResult."""
    async def go():
        async with Client(srv) as client:
            return await client.call_tool(tool, args or {}, **kw)

    return anyio.run(go)


def message(exc_type, fn, *args, **kwargs) -> str:
    """The message an engine call raises, as the nodes would show it."""
    with pytest.raises(exc_type) as info:
        fn(*args, **kwargs)
    return str(info.value)


def test_tools_and_knob_schemas_come_from_the_knob_table(demo_model):
    async def go():
        async with Client(serve(demo_model)) as client:
            return {t.name: t for t in (await client.list_tools()).tools}

    tools = anyio.run(go)
    assert set(tools) == TOOLS
    props = tools["generate"].input_schema["properties"]
    for name, spec in KNOBS.items():
        if name == "seed":
            continue
        schema = props[name]
        assert schema["type"] == {int: "integer", float: "number", bool: "boolean"}[spec.kind]
        assert schema["default"] == spec.default and schema["description"] == spec.tooltip
        if spec.kind is not bool:
            assert (schema["minimum"], schema["maximum"]) == (spec.lo, spec.hi)
    assert tools["generate"].input_schema["required"] == [] and props["prompt"]["default"] == ""
    assert tools["load_model"].input_schema["properties"]["device"]["enum"] == ["auto", "cuda", "cpu"]
    assert tools["encode"].input_schema["required"] == ["text"]
    assert all(t.input_schema.get("additionalProperties") is False for t in tools.values())


def test_load_the_demo_model_and_read_its_status():
    srv = build_server()
    assert call(srv, "model_status").structured_content["loaded"] is False
    loaded = call(srv, "load_model", {"model": "diffusiongemma-demo", "device": "cpu"})
    assert not loaded.is_error, loaded.content
    status = call(srv, "model_status").structured_content
    info = status["model_info"]
    assert status["loaded"] and status["model"] == "diffusiongemma-demo" and info["device"] == "cpu"
    assert info["memory"]["weights_bytes"]["cpu"] > 0 and status["busy"] is None


def test_generate_answers_seven_with_a_progress_notification_per_step(demo_model, tmp_path):
    notes = []

    async def on_progress(progress, total, text):
        notes.append((progress, total, text))

    result = call(serve(demo_model), "generate", {"prompt": "What is 3+4?", "runlog": True, "gif": True,
                                                  "output_dir": str(tmp_path)}, progress_callback=on_progress)
    out = result.structured_content
    assert not result.is_error and out["text"] == "seven" and not out["cancelled"]
    state = out["canvas_state"]
    assert state["finished_honestly"] and state["turn_closed"] and state["steps_used"] > 1
    assert [p for p, _, _ in notes] == list(range(1, state["steps_used"] + 1))
    assert notes[0][1] == 8 * 48 and "  committed " in notes[-1][2] and "%: " in notes[-1][2]
    assert notes[0][2].startswith("block 1/≤8  step 1/≤48")
    assert notes[-1][1] == state["steps_used"]  # the total drops to what ran once the answer ends
    rows = [json.loads(line) for line in Path(out["runlog"]).read_text().splitlines()]
    assert rows[0]["schema"] == "dg-runlog/1" and rows[-1]["text"] == "seven" and len(rows) == state["steps_used"] + 2
    from PIL import Image

    with Image.open(out["gif"]) as gif:
        assert gif.n_frames == state["steps_used"]
    assert Path(out["gif"]).parent == tmp_path


def test_generate_takes_a_constraint_and_refuses_a_bad_one(demo_model):
    srv = serve(demo_model)
    out = call(srv, "generate", {"prompt": "What is 3+4?", "constraint_type": "choice",
                                 "constraint": "yes\nno"}).structured_content
    assert out["text"] in ("yes", "no") and out["canvas_state"]["constraint"]["satisfied"]
    assert out["config"]["constraint"]["kind"] == "choice"
    bad = call(srv, "generate", {"prompt": "What is 3+4?", "constraint": '{"type": "array", "uniqueItems": true}'})
    assert bad.is_error and "uniqueItems" in str(bad.content)


def test_encode_then_generate_with_the_handle_leaves_the_context_untouched(demo_model):
    srv = serve(demo_model)
    encoded = call(srv, "encode", {"text": "a=3, b=4."}).structured_content
    kv = srv.engine.contexts[encoded["handle"]]
    before = [t.clone() for layer in kv.cache.layers for t in (layer.keys, layer.values)]
    answers = [call(srv, "generate", {"prompt": "What is a+b?", "context_handle": encoded["handle"]})
               .structured_content for _ in range(2)]
    assert [a["text"] for a in answers] == ["seven", "seven"]
    assert answers[0]["config"]["context"]["length"] == encoded["length"]
    after = [t for layer in kv.cache.layers for t in (layer.keys, layer.values)]
    assert len(after) == len(before) and all(torch.equal(a, b) for a, b in zip(after, before))
    inline = call(srv, "generate", {"prompt": "What is a+b?", "context": "a=3, b=4."}).structured_content
    assert inline["text"] == "seven"


def test_cancel_run_stops_a_long_run_within_one_step(demo_model):
    srv = serve(demo_model)

    async def go():
        seen, started = [], anyio.Event()

        async def on_progress(progress, total, text):
            seen.append(progress)
            if progress >= 3:
                started.set()

        async with Client(srv) as client:
            outcome = {}

            async def run():
                outcome["generate"] = await client.call_tool("generate", {"prompt": "What is 3+4?", **LONG},
                                                             progress_callback=on_progress)

            async with anyio.create_task_group() as tg:
                tg.start_soon(run)
                await started.wait()
                busy = await client.call_tool("generate", {"prompt": "What is 1+1?"})
                outcome["cancel"] = await client.call_tool("cancel_run", {})
                outcome["busy"] = busy
            return outcome, seen

    outcome, seen = anyio.run(go)
    cancel, out = outcome["cancel"].structured_content, outcome["generate"].structured_content
    assert cancel["cancelled"] and cancel["tool"] == "generate"
    assert out["cancelled"] and out["steps_done"] <= cancel["steps_done"] + 1 and out["steps_done"] < 100
    assert out["message"] == f"run cancelled after {out['steps_done']} steps" and seen[-1] == out["steps_done"]
    busy = outcome["busy"]
    assert busy.is_error and "one run at a time" in busy.content[0].text and "cancel_run" in busy.content[0].text
    assert call(srv, "cancel_run").structured_content["cancelled"] is False  # nothing left running
    assert call(srv, "generate", {"prompt": "What is 3+4?"}).structured_content["text"] == "seven"


def test_a_client_that_gives_up_on_generate_stops_the_run(demo_model):
    srv = serve(demo_model)

    async def go():
        started = anyio.Event()

        async def on_progress(progress, total, text):
            if progress >= 3:
                started.set()

        async with Client(srv) as client:
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: client.call_tool("generate", {"prompt": "What is 3+4?", **LONG},
                                                       progress_callback=on_progress))
                await started.wait()
                tg.cancel_scope.cancel()
            with anyio.fail_after(30):  # the worker stops at its next step and frees the model
                while srv.engine.run is not None:
                    await anyio.sleep(0.05)
            return await client.call_tool("generate", {"prompt": "What is 3+4?"})

    assert anyio.run(go).structured_content["text"] == "seven"


@pytest.mark.parametrize("args, expected", [
    ({"t_min": 2.0}, lambda dm: message(ValueError, Knobs, t_min=2.0)),
    ({"num_inference_steps": 2.5}, lambda dm: message(ValueError, Knobs, num_inference_steps=2.5)),
    ({"t_min": 0.9, "t_max": 0.5}, lambda dm: message(ValueError, Knobs, t_min=0.9, t_max=0.5)),
    ({"thinking": "yes"}, lambda dm: "thinking must be true or false (a JSON boolean), got 'yes'"),
    ({"prompt": "  "}, lambda dm: message(ValueError, generate, dm, "  ")),
    ({"context_handle": "ctx-nope"}, lambda dm: "context handle 'ctx-nope' is unknown"),
])
def test_bad_generate_inputs_are_refused_with_the_nodes_messages(demo_model, args, expected):
    result = call(serve(demo_model), "generate", {"prompt": "What is 3+4?", **args})
    assert result.is_error and expected(demo_model) in result.content[0].text


def test_a_misspelled_knob_is_refused_not_ignored(demo_model):
    result = call(serve(demo_model), "generate", {"prompt": "What is 3+4?", "num_steps": 5})
    text = result.content[0].text
    assert result.is_error and "num_steps is not an argument of generate (got 5); its arguments are prompt" in text
    assert "pydantic" not in text and "Extra inputs" not in text


def test_bad_encode_inputs_are_refused_with_the_engines_messages(demo_model):
    from diffusiongemma.dgemma.denoising.context import encode_context

    srv = serve(demo_model)
    empty = call(srv, "encode", {"text": " "})
    assert empty.is_error and message(ValueError, encode_context, demo_model, " ") in empty.content[0].text
    unknown = call(srv, "encode", {"text": "a=3.", "onto": "ctx-nope"})
    assert unknown.is_error and "context handle 'ctx-nope' is unknown" in unknown.content[0].text
    assert call(srv, "model_status").structured_content["contexts"] == {}


def test_bad_load_inputs_are_refused_with_the_loaders_messages(demo_model, tmp_path):
    srv = serve(demo_model)
    bad_device = call(srv, "load_model", {"device": "tpu"})
    assert bad_device.is_error and "device must be one of auto, cuda, cpu, got 'tpu'" in bad_device.content[0].text
    empty = call(srv, "load_model", {"model": str(tmp_path)})
    assert empty.is_error and message(ValueError, load_model, str(tmp_path)) in empty.content[0].text
    assert call(srv, "model_status").structured_content["model_info"]["model_source"] == demo_model.source


def test_stdio_server_subprocess_answers_over_the_stdio_client():
    params = StdioServerParameters(command=sys.executable, args=["-m", "mcp_server"], cwd=str(REPO))

    async def go():
        with anyio.fail_after(120):
            return await talk()

    async def talk():
        async with Client(params) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            notes = []

            async def on_progress(progress, total, text):
                notes.append(progress)

            result = await client.call_tool("generate", {"prompt": "What is 3+4?"}, progress_callback=on_progress)
            return names, result, notes

    names, result, notes = anyio.run(go)
    assert names == TOOLS
    assert result.structured_content["text"] == "seven"
    assert len(notes) == result.structured_content["canvas_state"]["steps_used"]


def test_without_the_sdk_the_command_says_how_to_install_it(tmp_path):
    blocked = tmp_path / "mcp"
    blocked.mkdir()
    (blocked / "__init__.py").write_text("raise ImportError('not installed')\n")
    proc = subprocess.run([sys.executable, "-m", "mcp_server"], cwd=REPO, capture_output=True, text=True,
                          check=False, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}, timeout=60)
    assert proc.returncode == 2 and "pip install 'mcp>=2,<3'" in proc.stderr and proc.stdout == ""


def test_generate_with_several_prompts_runs_them_as_one_batch(demo_model, tmp_path):
    notes = []

    async def on_progress(progress, total, text):
        notes.append((progress, total, text))

    srv = serve(demo_model)
    prompts = ["What is 3+4?", "What is 2+2?", "What is 5+6?"]
    result = call(srv, "generate", {"prompts": prompts, "seed": 10, "runlog": True, "output_dir": str(tmp_path),
                                    "context": "Numbers are words."}, progress_callback=on_progress)
    out = result.structured_content
    assert not result.is_error and out["text"] is None and [i["prompt"] for i in out["items"]] == prompts
    for index, (prompt, item) in enumerate(zip(prompts, out["items"])):
        alone = call(srv, "generate", {"prompt": prompt, "seed": 10 + index, "context": "Numbers are words."})
        assert item["text"] == alone.structured_content["text"] and item["config"]["seed"] == 10 + index
        assert item["canvas_state"] == {**alone.structured_content["canvas_state"],
                                        "run_id": item["canvas_state"]["run_id"]}
        assert Path(item["runlog"]).is_file() and item["runlog_uri"].startswith("dgemma://runs/")
    assert [p for p, _, _ in notes] == list(range(1, out["steps_done"] + 1))
    assert notes[-1][1] == out["steps_done"] and notes[0][2].startswith("item ")
    assert out["message"].startswith("3 answers: ")
    both = call(srv, "generate", {"prompts": prompts, "prompt": "Hi"})
    assert both.is_error and "prompts cannot be given with prompt" in str(both.content)
    bad = call(srv, "generate", {"prompts": ["Hi", "  "]})
    assert bad.is_error and "prompts item 1: prompt is empty" in str(bad.content)
    typed = call(srv, "generate", {"prompts": "Hi"})
    assert typed.is_error and "prompts must be a list of strings" in str(typed.content)


def test_a_list_over_its_limit_is_refused_before_any_run(demo_model):
    from diffusiongemma.mcp_server.args import MAX_PROMPTS, generate_args
    from diffusiongemma.mcp_server.schemas import check_args

    srv = serve(demo_model)
    result = call(srv, "generate", {"prompts": ["What is 3+4?"] * 10_000})
    text = result.content[0].text
    assert result.is_error and "prompts has 10000 items, over the limit of 64" in text and len(text) < 200
    assert not srv.engine.runs  # no run was made
    check_args("generate", generate_args(), {"prompts": ["What is 3+4?"] * MAX_PROMPTS})  # the limit itself passes


@pytest.mark.parametrize("tool, args, says", [
    ("generate", {"prompts": []}, "prompts is an empty list"),
    ("generate", {"prompts": [["x"]] * 5000}, "prompts must be a list of strings, got [['x'], ['x'], ['x'], "),
    ("generate", {"prompt": "hi", "constraint_type": "x" * 100_000}, "constraint_type must be one of json_schema"),
    ("generate", {"prompt": "hi", "scheduler": "x" * 100_000}, "scheduler must be one of entropy_bound"),
    ("generate", {"prompt": "hi", "context_handle": "ctx\0" * 30_000}, "context_handle is 120000 characters, over"),
    ("generate", {"prompt": "hi", "resume": "r" * 100_000}, "resume is 100000 characters, over 64"),
    ("generate", {"prompt": "hi", "output_dir": "a/" + "x" * 300}, "cannot be used as a folder (File name too long)"),
    ("generate", {"prompt": "hi", "output_dir": "a/" + "x" * 5000}, "output_dir is 5002 characters, over 4096"),
    ("generate", {"prompt": "hi", "y" * 100_000: 1}, "is not an argument of generate (got 1)"),
    ("generate", {"prompt": "hi", "thinking": [True] * 100_000}, "thinking must be true or false"),
    ("generate", {"prompt": "hi", "seed": "9" * 5000}, "seed must be an integer or a string of digits up to"),
    ("generate", {"prompt": "hi", "seed": 1.5}, "seed must be an integer from 0 to"),
    ("generate", {"prompt": "hi", "seed": -1}, "seed must be an integer from 0 to"),
    ("generate", {"prompt": "hi", "start_step": [1]}, "start_step must be an int, got [1]"),
    ("generate", {"prompt": "hi", "num_inference_steps": 10**30}, "num_inference_steps must be between 1 and 1024"),
    ("encode", {"text": "a", "onto": "\0" * 100_000}, "onto is 100000 characters, over 64"),
    ("load_model", {"model": "x" * 300}, "is neither a checkpoint folder nor a hub id"),
    ("load_model", {"quant": "x" * 10_000}, "quant must be one of auto, none, autoround, 4bit, 8bit, gguf, got 'xxx"),
    ("free_handle", {"handle": ["x"] * 10_000}, "handle must be a string, got ['x', 'x', "),
    ("free_handle", {"handle": "x" * 1_000_000}, "handle is 1000000 characters, over 64"),
])
def test_hostile_arguments_are_refused_short_and_named(demo_model, tool, args, says):
    result = call(serve(demo_model), tool, args)
    text = result.content[0].text
    assert result.is_error and says in text and len(text) < 500, text[:600]


def test_a_schema_nested_too_deep_to_serialize_is_refused():
    from diffusiongemma.dgemma.errors import InputError
    from diffusiongemma.mcp_server.readout import constraint_text

    deep: dict = {}
    inner = deep
    for _ in range(100_000):
        inner["anyOf"] = [{}]
        inner = inner["anyOf"][0]
    with pytest.raises(InputError, match="nested too deep to read"):
        constraint_text(deep)
