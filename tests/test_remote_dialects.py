"""The two text dialects against streams written from their serving code, replayed by a real HTTP
server on loopback: what the live view paints, what the trace admits it cannot know, and what vLLM
is sent."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import REPO
from executor import call
from fake_engine import engine

from diffusiongemma import NODE_CLASS_MAPPINGS
from diffusiongemma.dgemma.errors import InputError
from diffusiongemma.dgemma.inputs.knobs import Knobs
from diffusiongemma.nodes import host

FIXTURES = REPO / "tests" / "fixtures" / "remote"
KNOBS = dict(Knobs().asdict(), thinking=True)
Loader, Sampler = NODE_CLASS_MAPPINGS["DGemmaRemoteLoader"], NODE_CLASS_MAPPINGS["DGemmaSampler"]


def files(name: str):
    """(stream, model list) of a fixture: `vllm`, or `vllm.recorded` saved by tools/gpu_vllm_check.py."""
    base, _, kind = name.partition(".")
    suffix = f".{kind}" if kind else ""
    return FIXTURES / f"{base}_stream{suffix}.sse", FIXTURES / f"{base}_models{suffix}.json"


def replaying(name: str):
    """The fake engine serving a fixture's model list and stream; yields its URL and the request bodies."""
    stream, models = files(name)
    return engine(json.loads(models.read_text()), stream.read_text())


def run_with_events(model):
    events = []
    host.listen(lambda name, data: events.append((name, data)))
    try:
        out, _ = call(Sampler, model=model, prompt="What is 3+4?", **KNOBS)
    finally:
        host._listeners.clear()
    return out, [d for n, d in events if n == "dgemma.step"]


def test_diffusion_frame_dialect_paints_every_step_and_invents_nothing():
    with replaying("shim") as (url, bodies):
        (model, dialect), _ = call(Loader, url=url)
        assert dialect == "diffusion_frame"
        (text, state, trace, frames, images, config), steps = run_with_events(model)
    assert text == "seven" and state.thought == "3+4=7" and state.turn_closed
    assert len(steps) == len(trace) == len(frames) == 5 and images.shape[0] == 5
    assert steps[-1]["tokens"][:4] == ["<|chann…", "thought", "\n3+4=7", "<channe…"]
    assert frames[3] == "<|channel>thought\n3+4=7<channel|>seven<turn|>"
    assert np.isnan(trace.entropy.astype(np.float32)).all() and not trace.committed.any()
    assert {"entropy", "ids", "committed", "t", "T"} <= set(trace.readings.unknown)
    assert bodies[0]["seed"] == KNOBS["seed"] and bodies[0]["max_tokens"] == KNOBS["gen_length"]
    for mode in ("commit", "entropy"):  # the heatmap reads a text-only trace (unknown entropy is NaN)
        (image, summary), _ = call(NODE_CLASS_MAPPINGS["DGemmaTrace"], canvas_trace=trace, mode=mode, cell_px=2)
        assert image.shape[1:3] == (5 * 2, trace.canvas_length * 2) and summary
    with pytest.raises(InputError, match="no KV contexts"):
        call(NODE_CLASS_MAPPINGS["DGemmaDenoise"], model=model, prompt="x", kv_cache=object(), **KNOBS)


def test_vllm_dialect_one_frame_per_canvas_knobs_in_vllm_xargs():
    with replaying("vllm") as (url, bodies):
        (model, dialect), _ = call(Loader, url=url)
        assert dialect == "vllm" and model.max_positions == 16384
        (text, state, trace, frames, images, config), steps = run_with_events(model)
        with pytest.raises(InputError, match="windows, pins and resuming need this pack's server"):
            call(NODE_CLASS_MAPPINGS["DGemmaSamplerAdvanced"], model=model, prompt="x", scheduler="entropy_bound",
                 start_step=0, end_step=1024, pins="", **KNOBS)
    assert text == "seven, and the next canvas says so." and state.thought == "3+4=7"
    assert len(steps) == len(trace) == 2 and list(trace.blocks) == [0, 1] and trace.committed.all()
    assert state.answer_tokens is None and "answer_tokens" in state.readings.unknown  # usage counts the thought
    assert np.isnan(trace.entropy.astype(np.float32)).all()
    body = bodies[0]
    assert body["vllm_xargs"] == {"diffusion_max_steps": KNOBS["num_inference_steps"]}
    assert "response_format" not in body and body["stream_options"] == {"include_usage": True}
    fixed = config.readings.knobs_not_sent
    assert set(fixed) == {"t_min", "t_max", "entropy_bound", "confidence"}


@pytest.mark.skipif(not files("vllm.recorded")[0].is_file(), reason="no real vLLM stream recorded yet (needs a GPU)")
def test_a_recorded_vllm_stream_is_read():
    with replaying("vllm.recorded") as (url, _):
        (model, dialect), _ = call(Loader, url=url)
        (text, state, trace, *_), steps = run_with_events(model)
    assert dialect == "vllm" and text and len(steps) == len(trace) >= 1
