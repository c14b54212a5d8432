"""The text dialects against streams shaped like the real engines': every reading equals a local run's,
is the engine's own report, or is marked unknown on every surface; the shim's in-band errors raise;
knobs never sent are listed as such; a plain OpenAI server is refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import REPO
from executor import call
from fake_engine import engine, sse

from diffusiongemma import NODE_CLASS_MAPPINGS
from diffusiongemma.dgemma.errors import InputError
from diffusiongemma.dgemma.readings import why_unknown
from diffusiongemma.dgemma.readouts.images import render_frames
from diffusiongemma.dgemma.readouts.runlog import read_log, records, replay, write_jsonl
from diffusiongemma.dgemma.readouts.states import NAMES, PALETTE, UNKNOWN_COLOUR
from diffusiongemma.nodes import host
from diffusiongemma.remote.http import RemoteError

REAL_SHIM = REPO / "tests" / "fixtures" / "remote" / "shim_think1.real.sse"  # captured from the real engine
SHIM_CARD = {"object": "list", "data": [{"id": "diffusiongemma", "object": "model", "owned_by": "unsloth"}]}
KNOBS = dict(seed=7, num_inference_steps=48, t_min=0.4, t_max=0.8, entropy_bound=0.1, confidence=0.005,
             gen_length=256, thinking=True)
Loader, Sampler, Trace = (NODE_CLASS_MAPPINGS[n] for n in ("DGemmaRemoteLoader", "DGemmaSampler", "DGemmaTrace"))
SCHEDULE = {"num_inference_steps", "t_min", "t_max", "entropy_bound", "confidence"}


def strict(row: dict) -> dict:
    """`row` through strict JSON: NaN or Infinity anywhere is an error."""
    def refuse(name):
        raise ValueError(f"{name} in a run log")
    return json.loads(json.dumps(row), parse_constant=refuse)


def chunk(**fields) -> dict:
    return {"object": "chat.completion.chunk", "model": "diffusiongemma", **fields}


def delta(finish=None, **d) -> dict:
    return chunk(choices=[{"index": 0, "delta": d, "finish_reason": finish}])


def frame(block, step, total, text) -> dict:
    return chunk(choices=[{"index": 0, "delta": {}, "finish_reason": None}], type="diffusion_frame",
                 block=block, step=step, total=total, text=text)


def shim_run(stream: str, card=SHIM_CARD, **knobs):
    """Load the fake engine and run the Sampler on it; (outputs, live events, request bodies)."""
    events = []
    with engine(card, stream) as (url, bodies):
        (model, _), _ = call(Loader, url=url)
        host.listen(lambda name, data: events.append((name, data)))
        try:
            out, _ = call(Sampler, model=model, prompt="What is 3+4?", **dict(KNOBS, **knobs))
        finally:
            host._listeners.clear()
    return out, events, bodies, url


@pytest.fixture(scope="module")
def local(demo_model):
    out, _ = call(Sampler, model=demo_model, prompt="What is 3+4?", **KNOBS)
    return out


@pytest.fixture(scope="module")
def real_shim():
    return shim_run(REAL_SHIM.read_text())


def test_every_reading_of_the_real_shim_stream_is_exact_the_engines_or_unknown(real_shim, local):
    (text, state, trace, frames, images, config), _, _, _ = real_shim
    timings = trace.readings.reported["timings"]
    # exact: what a local run of the same model reads
    assert text == local[0] == "seven" and state.turn_closed == local[1].turn_closed
    assert state.blocks == local[1].blocks == 1 and state.stray_thought_delimiter is False
    assert trace.block_stopped_early == local[2].block_stopped_early == (True,)
    assert state.converged is local[1].converged is True
    assert trace.readings.reported["canvas_length"] == local[2].canvas_length == 32
    # the engine's own counts: llama.cpp stopped at 18 of its GGUF's 48 steps (locally: 19 of 48)
    assert state.steps_used == len(trace) == timings["diffusion_steps"] == 18
    assert trace.readings.reported["steps_per_block"] == 48 and state.thought == "4+4=7"
    # unknown: never a local value, never a made-up one
    for name in ("ids", "committed", "entropy", "t", "T", "stop", "answer_tokens"):
        assert why_unknown(trace, name), name
    assert state.answer_tokens is None and state.committed_fraction is None and state.raw_ids == ()
    assert "completion_tokens (20)" in state.readings.unknown["answer_tokens"]
    assert "answer tokens unknown" in str(state) and "committed at the last step: unknown" in str(state)
    assert frames[-1] == "<|channel>thought\n4+4=7<channel|>seven" and images.shape[0] == 18


def test_knobs_never_sent_are_listed_and_never_logged_as_the_runs(real_shim, tmp_path):
    (text, state, trace, frames, images, config), _, bodies, _ = real_shim
    assert set(config.readings.knobs_sent) == {"seed", "gen_length"}
    assert set(config.readings.knobs_not_sent) == SCHEDULE | {"thinking"}
    assert "asked but not the run's setting: num_inference_steps 48" in str(config)
    assert bodies[0]["seed"] == 7 and bodies[0]["max_tokens"] == 256 and "vllm_xargs" not in bodies[0]
    rows = [strict(r) for r in records(trace, config, state, frames)]
    header, steps, final = rows[0], rows[1:-1], rows[-1]
    for name in ("t_min", "t_max", "entropy_bound", "confidence", "num_inference_steps_requested", "thinking"):
        assert header[name] is None, name
    assert header["seed"] == 7 and header["knob_sets"] == [{"seed": 7, "gen_length": 256}]
    assert header["readings"]["knobs_not_sent"]["t_min"] and header["canvas_length"] == 32
    assert header["readings"]["reported"]["timings"]["predicted_ms"] == 170.985
    assert header["num_inference_steps_effective"] == [18] and header["block_stopped_early"] == [True]
    for step in steps:
        assert step["t"] is step["temperature"] is step["committed_fraction"] is step["entropy_summary"] is None
        assert step["canvas_ids"] is step["accepted"] is step["stop_committed"] is None
    assert final["raw_ids"] is final["answer_tokens"] is final["committed_fraction"] is None
    assert final["converged"] is True and final["steps_used"] == 18
    log = write_jsonl(rows, tmp_path, "shim")  # the log replays, still painting every state unknown
    again = replay(*read_log(log))
    assert np.array_equal(render_frames(again, again.token_strings), render_frames(trace, trace.token_strings))


def test_the_live_view_captions_heatmaps_and_summary_say_unknown(real_shim):
    (text, state, trace, frames, images, config), events, _, _ = real_shim
    start, steps = events[0][1], [d for n, d in events if n == "dgemma.step"]
    assert start["states"] == [*NAMES, "unknown"] and start["palette"]["unknown"] == "#cd8296"  # UNKNOWN_COLOUR
    assert start["steps"] is None and start["canvas_length"] is None and "committed" in start["unknown"]
    assert len(steps) == 18 and all(s["state"] == "5" * len(s["tokens"]) for s in steps)
    assert all(s["t"] is s["T"] is s["committed"] is None for s in steps)
    # the step budget the shim's frames carry (the GGUF's 48), never a local default
    assert steps[0]["caption"] == "block 1/≤1  step 1/≤48  T ?  committed ?  argmax canvas"
    assert all(s["steps"] == 48 for s in steps)
    for mode in ("commit", "entropy"):
        (picture, summary), _ = call(Trace, canvas_trace=trace, mode=mode, cell_px=1)
        cells = np.rint(picture[0].numpy() * 255).astype(np.uint8)
        assert (cells == UNKNOWN_COLOUR).all(axis=-1).all(), mode
        assert "unknown (rose)" in summary and "not committed" not in summary and "confidence=" not in summary
        assert "knobs sent: seed, gen_length; not the run's setting (the engine's own): num_inference_steps" in summary
        assert "18 of 48 steps, stopped early" in summary and "entropy unknown" in summary
    pictures = render_frames(trace, trace.token_strings)
    text_pixels = pictures.reshape(-1, 3)
    assert (text_pixels == UNKNOWN_COLOUR).all(axis=1).any()  # glyphs painted in the unknown colour
    assert not (text_pixels == PALETTE[0]).all(axis=1).any()  # and never as noise


def test_thinking_off_on_the_shim_is_warned_on_the_output(real_shim):
    (text, state, *_), _, bodies, _ = shim_run(REAL_SHIM.read_text(), thinking=False)
    assert bodies[0]["chat_template_kwargs"] == {"enable_thinking": False}
    assert state.thought == "4+4=7" and any("thinking off was asked, but the shim drops it" in w
                                            for w in state.warnings)
    assert "warning: thinking off" in str(state)


@pytest.mark.parametrize("said, finish", [
    ("\n[engine error: visual server closed the stream]", "stop"),
    ('\n[engine error: Unsupported content part type: "image_url"]', "stop"),
    ("\n[This conversation needs 5000 tokens but the engine holds 4096; shorten it]", "length")])
def test_the_shims_in_band_errors_raise_naming_the_engine_and_url(said, finish):
    stream = sse([delta(role="assistant"), frame(0, 0, 48, "x"), delta(content=said), delta(finish), "[DONE]"])
    with pytest.raises(RemoteError) as err:
        shim_run(stream)
    assert "diffusion_frame engine at http://127.0.0.1:" in str(err.value) and said.strip()[1:20] in str(err.value)


def test_a_picture_is_refused_before_the_shim_is_asked():
    import torch

    with engine(SHIM_CARD, sse(["[DONE]"])) as (url, bodies):
        (model, _), _ = call(Loader, url=url)
        with pytest.raises(InputError, match="takes no pictures"):
            call(Sampler, model=model, prompt="What colour?", image=torch.zeros((1, 8, 8, 3)), **KNOBS)
    assert bodies == []


LLAMA_SERVER_CARD = {"object": "list", "data": [{
    "id": "qwen2.5-0.5b-instruct-q4_k_m.gguf", "object": "model", "created": 1796300000, "owned_by": "llamacpp",
    "meta": {"vocab_type": 2, "n_vocab": 151936, "n_ctx_train": 32768, "n_embd": 896, "n_params": 494032768}}]}
PLAIN_STREAM = sse([delta(role="assistant"), delta(content="3 + 4 = 7."), delta("stop"),
                    chunk(choices=[], usage={"prompt_tokens": 14, "completion_tokens": 8, "total_tokens": 22}),
                    "[DONE]"])


def test_a_plain_llama_server_is_refused_at_load_naming_what_it_showed():
    with engine(LLAMA_SERVER_CARD, PLAIN_STREAM) as (url, bodies):
        with pytest.raises(RemoteError, match="'qwen2.5-0.5b-instruct-q4_k_m.gguf' owned by 'llamacpp'"):
            call(Loader, url=url)
    assert bodies == []


def test_a_plain_stream_behind_a_diffusion_name_is_refused_not_drawn_as_one_step():
    card = {"data": [dict(LLAMA_SERVER_CARD["data"][0], id="diffusiongemma-demo-f32.gguf")]}
    with pytest.raises(RemoteError, match="plain chat stream .*no diffusion_frame chunk"):
        shim_run(PLAIN_STREAM, card)


def test_the_card_canvas_is_taken_and_range_checked():
    for bad in (0, -32, 10**9, "32", 2.5):
        card = {"data": [dict(SHIM_CARD["data"][0], diffusion_canvas=bad)]}
        with engine(card, sse(["[DONE]"])) as (url, _):
            with pytest.raises(RemoteError, match="canvas size"):
                call(Loader, url=url)
    card = {"data": [dict(SHIM_CARD["data"][0], diffusion_canvas=32)]}
    with engine(card, sse(["[DONE]"])) as (url, _):
        (model, _), _ = call(Loader, url=url)
    assert model.canvas_length == 32


def _frames(n, total=8, block=0, text="seven"):
    return [frame(block, i % total, total, text) for i in range(n)]


@pytest.mark.parametrize("name, chunks, match", [
    ("frames forever", [*_frames(500)], "more than 9 frames"),
    ("block 7 step 500 of 8 steps", [frame(7, 500, 8, "x")], "block=7|step=500"),
    ("step 500 of 8 steps", [frame(0, 500, 8, "x")], "step=500"),
    ("a step budget of 10^6", [frame(0, 0, 10**6, "x")], "total=1000000"),
    ("a 500 kB frame", [frame(0, 0, 8, "x" * 500_000)], "frame of 500000 characters"),
    ("frames too wide to paint", _frames(200, 1000, text=" abcdefg" * 1000), "over the 65536 cells"),
    ("a 500 kB content delta", [frame(0, 0, 8, "x"), delta(content="y" * 500_000)], "characters of text"),
    ("canvas -32 in the timings", [frame(0, 0, 8, "x"), delta(content="seven"), delta("stop"),
                                   chunk(choices=[], timings={"diffusion_canvas": -32})], "diffusion_canvas=-32"),
])
def test_what_the_server_sends_is_bounded_and_range_checked(name, chunks, match):
    with pytest.raises(RemoteError, match=match):
        shim_run(sse([delta(role="assistant"), *chunks, delta("stop"), "[DONE]"]))


def test_nan_timings_are_dropped_so_the_run_log_stays_strict_json():
    stream = sse([frame(0, 0, 8, "seven"), delta(content="seven"), delta("stop"),
                  chunk(choices=[], timings={"predicted_ms": float("nan"), "diffusion_steps": 1}), "[DONE]"])
    (text, state, trace, frames, images, config), *_ = shim_run(stream)
    assert trace.readings.reported["timings"] == {"diffusion_steps": 1}
    for row in records(trace, config, state, frames):
        strict(row)


def test_the_vllm_fixture_every_reading_exact_the_engines_or_unknown(local, tmp_path):
    fixtures = REPO / "tests" / "fixtures" / "remote"
    card = json.loads((fixtures / "vllm_models.json").read_text())
    (text, state, trace, frames, images, config), events, bodies, _ = shim_run(
        (fixtures / "vllm_stream.sse").read_text(), card)
    unknown = {"ids", "entropy", "t", "T", "stop", "stopped_early", "steps", "converged", "answer_tokens",
               "canvas_length"}
    assert set(trace.readings.unknown) == unknown  # the rest: text, committed (a canvas is sent committed)
    assert state.committed_fraction == local[1].committed_fraction == 1.0 and trace.committed.all()
    assert state.steps_used is state.converged is state.answer_tokens is None and state.blocks == 2
    assert set(config.readings.knobs_sent) == {"seed", "gen_length", "num_inference_steps", "thinking"}
    assert bodies[0]["vllm_xargs"] == {"diffusion_max_steps": 48}
    rows = [strict(r) for r in records(trace, config, state, frames)]
    assert rows[0]["t_min"] is None and rows[0]["num_inference_steps_requested"] == 48
    assert rows[0]["canvas_length"] is None and rows[0]["num_inference_steps_effective"] is None
    assert all(r["step"] is None and r["t"] is None for r in rows[1:-1]) and rows[-1]["steps_used"] is None
    steps = [d for n, d in events if n == "dgemma.step"]
    assert [s["caption"] for s in steps] == [f"block {b}/≤?  step ?  T ?  committed 100.0%  canvas text"
                                             for b in (1, 2)]
    (_, summary), _ = call(Trace, canvas_trace=trace, mode="commit", cell_px=1)
    assert "block 2: ? steps, early stop unknown" in summary and "confidence=" not in summary
    again = replay(*read_log(write_jsonl(rows, tmp_path, "vllm")))
    assert np.array_equal(render_frames(again, again.token_strings), render_frames(trace, trace.token_strings))


def test_frames_fewer_than_the_engines_steps_leave_the_stops_unknown():
    stream = sse([frame(0, 0, 8, "x"), frame(0, 4, 8, "seven"), delta(content="seven"), delta("stop"),
                  chunk(choices=[], timings={"diffusion_steps": 8, "diffusion_blocks": 1}), "[DONE]"])
    (text, state, trace, *_), *_ = shim_run(stream)
    assert state.steps_used == 8 and state.converged is None
    assert "8 steps but sent 2 frames" in trace.readings.unknown["stopped_early"]
    assert "adaptive stop: unknown" in str(trace)
