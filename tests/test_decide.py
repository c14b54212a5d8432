"""Structured reads: each option's probability equals the brute-force scoring of its definition; refusals;
N = 1 and N = 64; images and KV contexts; the trace and its run log; the node."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from diffusiongemma.dgemma import Knobs
from diffusiongemma.dgemma.demo import colour_image
from diffusiongemma.dgemma.denoising.context import encode_context
from diffusiongemma.dgemma.denoising.decide import decide, prepare_decision, read_plan
from diffusiongemma.dgemma.errors import InputError
from diffusiongemma.dgemma.inputs.tokens import frame_texts
from diffusiongemma.dgemma.readouts.runlog import records
from diffusiongemma.testing.brute_decide import brute_probabilities

SUMS = ["six", "seven", "sixteen", "seventeen", "eleven"]  # prefixes of each other, and several lengths


def decoder_canvases(dm):
    """A hook counting the canvases the decoder reads (rows of every forward), and its remover."""
    seen = []
    def count(module, args, kwargs, out):
        ids = next(kwargs[k] for k in ("decoder_input_ids", "input_ids", "inputs_embeds") if kwargs.get(k) is not None)
        seen.append(ids.shape[0])

    handle = dm.model.model.decoder.register_forward_hook(count, with_kwargs=True)
    return seen, handle


def test_multi_token_options_equal_the_brute_force_scoring(demo_model):
    found = decide(demo_model, "What is 9+8?", SUMS, samples=2, knobs=Knobs(seed=5), trace=False)
    brute = brute_probabilities(demo_model, "What is 9+8?", SUMS, 2, 5)
    assert np.abs(found.per_sample - brute).max() <= 1e-6
    assert np.abs(found.per_sample.sum(axis=1) - 1).max() <= 1e-12
    assert found.choice == "seventeen" and found.mean[3] > 0.9
    assert found.forwards_per_sample == len(read_plan([tuple(demo_model.tokenizer.encode(o, add_special_tokens=False))
                                                      for o in SUMS], 106).rows)


def test_options_of_one_length_share_the_end_which_cancels(demo_model):
    """No forward reads the end where every option has one length; the brute force, which reads it, agrees."""
    options = ["three", "seven", "eight"]
    found = decide(demo_model, "What is 3+4?", options, samples=2, knobs=Knobs(seed=1), trace=False)
    assert np.abs(found.per_sample - brute_probabilities(demo_model, "What is 3+4?", options, 2, 1)).max() <= 1e-6
    assert found.choice == "seven"


def test_single_token_options_take_one_forward_per_draw(demo_model):
    seen, handle = decoder_canvases(demo_model)
    try:
        found = decide(demo_model, "What is 1+2?", ["a", "b", "c", "d"], samples=5, knobs=Knobs(seed=2), trace=False)
    finally:
        handle.remove()
    assert found.forwards_per_sample == 1 and sum(seen) == 5
    assert np.abs(found.per_sample - brute_probabilities(demo_model, "What is 1+2?", list("abcd"), 5, 2)).max() <= 1e-6


def test_n_1_and_n_64(demo_model):
    one = decide(demo_model, "What is 1+2?", ["x", "y", "z"], samples=1, knobs=Knobs(seed=9), trace=False)
    many = decide(demo_model, "What is 1+2?", ["x", "y", "z"], samples=64, knobs=Knobs(seed=9), trace=False)
    assert one.per_sample.shape == (1, 3) and not one.standard_error.any()
    assert many.per_sample.shape == (64, 3)
    assert np.allclose(many.per_sample[0], one.per_sample[0], atol=1e-6)  # draw 0 is the same noise
    seeded = decide(demo_model, "What is 1+2?", ["x", "y", "z"], samples=1, knobs=Knobs(seed=9 + 63), trace=False)
    assert np.allclose(many.per_sample[63], seeded.per_sample[0], atol=1e-6)  # draw i uses seed + i
    assert np.allclose(many.standard_error, many.per_sample.std(axis=0, ddof=1) / 8)
    assert len({tuple(row) for row in many.per_sample.round(6).tolist()}) > 1  # the draws differ


def test_an_image_and_a_kv_context(demo_model):
    colours = ["red", "green", "blue", "yellow"]
    picture = colour_image("yellow", 96, 48)
    seen = decide(demo_model, "What colour is this?", colours, samples=2, knobs=Knobs(seed=3), image=picture,
                  trace=False)
    assert seen.choice == "yellow"
    brute = brute_probabilities(demo_model, "What colour is this?", colours, 2, 3, image=picture)
    assert np.abs(seen.per_sample - brute).max() <= 1e-6
    context = encode_context(demo_model, "a=8, b=5.")
    told = decide(demo_model, "What is a+b?", ["twelve", "thirteen", "fourteen"], samples=2, knobs=Knobs(seed=4),
                  context=context, trace=False)
    assert told.choice == "thirteen"
    brute = brute_probabilities(demo_model, "What is a+b?", ["twelve", "thirteen", "fourteen"], 2, 4, context=context)
    assert np.abs(told.per_sample - brute).max() <= 1e-6


def test_the_trace_reads_every_step_and_the_run_log_keeps_it(demo_model):
    found = decide(demo_model, "What is 2+2?", ["three", "four", "five"], samples=2, knobs=Knobs(seed=6))
    run = found.run
    assert found.trace.shape == (len(run.trace), 3)
    assert np.array_equal(found.trace[0], found.per_sample[0])  # step 0 reads draw 0's noise, before any step
    assert run.text == "four" and run.config.decision["choice"] == "four"
    header, *frames, final = records(run.trace, run.config, run.state, frame_texts(run.trace, demo_model.token_strings))
    assert header["decision"]["probabilities"] == found.asdict()["probabilities"] and "trace" not in header["decision"]
    per_step = [dict(zip(found.options, row)) for row in found.trace.tolist()]
    assert [f["option_probabilities"] for f in frames] == per_step
    assert "decision: \"four\"" in str(run.config)


@pytest.mark.parametrize("options, samples, name, says", [
    ([], 8, "options", "options is empty"),
    (["red", " ", "blue"], 8, "options", "option 2 is blank"),
    (["red", "blue", "red"], 8, "options", "'red' is given twice (options 1 and 3)"),
    (["x" * 40], 8, "options", "is 40 tokens; with the end of the turn after it that is over the canvas of 32"),
    (["red"], 0, "samples", "from 1 to 64, got 0"),
    (["red"], 65, "samples", "from 1 to 64, got 65"),
    (["red"], True, "samples", "got True"),
    ("red", 8, "options", "must be a list of texts"),
])
def test_refusals_name_the_input_the_value_and_the_fix(demo_model, no_model_work, options, samples, name, says):
    with pytest.raises(InputError) as caught:
        prepare_decision(demo_model, "What colour is this?", options, samples)
    assert caught.value.name == name and says in str(caught.value)


def test_the_node_reads_a_picture_and_feeds_the_run_log_writer(demo_model, tmp_path, monkeypatch):
    import fakecomfy  # noqa: F401
    from executor import call

    from diffusiongemma import NODE_CLASS_MAPPINGS

    monkeypatch.setenv("DGEMMA_OUTPUT_DIR", str(tmp_path))
    out, _ = call(NODE_CLASS_MAPPINGS["DGemmaDecide"], model=demo_model, prompt="What colour is this?",
                  options="red\ngreen\n\nblue\nyellow\n", samples=3, seed=0, num_inference_steps=48, t_min=0.4,
                  t_max=0.8, entropy_bound=0.1, confidence=0.005, image=colour_image("green", 64, 64))
    choice, probabilities, chart, trace, state, canvas_trace, frames, config = out
    engine = decide(demo_model, "What colour is this?", ["red", "green", "blue", "yellow"], samples=3,
                    knobs=Knobs(seed=0), image=colour_image("green", 64, 64))
    assert choice == "green" and json.loads(probabilities) == engine.asdict()["probabilities"]
    assert chart.shape[0] == trace.shape[0] == 1 and chart.shape[2] == trace.shape[2] == 400
    assert state.text == "green" and len(frames) == len(canvas_trace) == len(engine.trace)
    (path,), _ = call(NODE_CLASS_MAPPINGS["DGemmaRunLogWriter"], canvas_trace=canvas_trace, run_config=config,
                      frames=frames, canvas_state=state, filename_prefix="decide")
    rows = [json.loads(line) for line in open(path, encoding="utf-8")]
    assert rows[0]["decision"]["choice"] == "green" and "option_probabilities" in rows[1]
    with pytest.raises(InputError, match="options is empty"):
        call(NODE_CLASS_MAPPINGS["DGemmaDecide"], model=demo_model, prompt="What colour is this?", options="\n \n",
             samples=3, seed=0, num_inference_steps=48, t_min=0.4, t_max=0.8, entropy_bound=0.1, confidence=0.005)


def test_pictures_are_the_same_every_time(demo_model):
    from diffusiongemma.dgemma.readouts.decide_pictures import chart, trace_lines

    found = decide(demo_model, "What is 1+1?", ["one", "two", "three"], samples=2, knobs=Knobs(seed=0))
    assert np.array_equal(chart(found), chart(found)) and np.array_equal(trace_lines(found), trace_lines(found))
    assert torch.from_numpy(chart(found)).dtype == torch.float32
    assert found.choice == "two"

