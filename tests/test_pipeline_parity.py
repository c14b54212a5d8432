"""The engine's loop against diffusers' DiffusionGemmaPipeline: same seed, same tokens, same steps.

The pipeline stops only on the tokenizer's <eos>, so the engine is given the same EOS set here.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest
import torch

from diffusiongemma.dgemma import Knobs, generate
from diffusiongemma.dgemma.denoising.threads import compute_threads
from diffusiongemma.dgemma.versions import _release

pytestmark = [
    pytest.mark.pipeline,
    pytest.mark.skipif(_release("transformers")[:2] >= (5, 24),
                       reason="diffusers' pipeline passes past_key_values, renamed in transformers 5.24"),
]


def pipeline_run(dm, prompt: str, knobs: Knobs, eos_stop: bool):
    from diffusers import DiffusionGemmaPipeline, EntropyBoundScheduler

    accepted = []
    scheduler = EntropyBoundScheduler(entropy_bound=knobs.entropy_bound, t_max=knobs.t_max, t_min=knobs.t_min,
                                      num_inference_steps=knobs.num_inference_steps)
    step = scheduler.step

    @functools.wraps(step)  # the pipeline passes only the arguments this signature names
    def recording_step(*args, **kwargs):
        out = step(*args, **kwargs)
        accepted.append(out.accepted_index[0].cpu().numpy())
        return out

    scheduler.step = recording_step

    canvases = []

    def on_step(pipe, global_step, step, kwargs):
        canvases.append(kwargs["canvas"][0].cpu().numpy())
        return {}

    pipe = DiffusionGemmaPipeline(model=dm.model, scheduler=scheduler, processor=dm.processor)
    with compute_threads(dm.model):  # the engine's thread count, so both sum in the same order
        out = pipe(prompt=prompt, gen_length=knobs.gen_length, num_inference_steps=knobs.num_inference_steps,
                   confidence_threshold=knobs.confidence or None,
                   generator=torch.Generator().manual_seed(knobs.seed),
                   eos_early_stop=eos_stop, output_type="seq", callback_on_step_end=on_step)
    return out.sequences[0].tolist(), canvases, accepted


def assert_same_run(dm, prompt, knobs, eos_stop=True, min_blocks=1, expect_early_stop=False):
    engine_model = dataclasses.replace(dm, eos_ids=(dm.tokenizer.eos_token_id,) if eos_stop else ())
    ours = generate(engine_model, prompt, knobs)
    sequence, canvases, accepted = pipeline_run(dm, prompt, knobs, eos_stop)
    assert list(ours.state.raw_ids) == sequence
    assert ours.state.blocks >= min_blocks
    assert len(ours.trace) == len(canvases)
    assert np.array_equal(ours.trace.committed & ~ours.trace.stop, np.array(accepted))
    L = dm.canvas_length
    for i, frame in enumerate(ours.trace.frames()):
        last = i == len(ours.trace) - 1 or ours.trace.blocks[i + 1] != frame.block
        if last and ours.trace.block_stopped_early[frame.block]:
            # The stop commits the argmax: the engine's frame is what the pipeline appended, all committed.
            assert list(frame.ids) == sequence[frame.block * L:(frame.block + 1) * L]
            assert frame.committed.all()
        else:
            assert np.array_equal(frame.ids, canvases[i])
    assert any(ours.trace.block_stopped_early) == expect_early_stop


@pytest.mark.parametrize("gen_length, confidence, seed, min_blocks", [
    (200, 0.0, 3, 1),        # one block, every step executed
    (768, 0.0, 0, 3),        # three blocks
    (600, 0.005, 5, 3),      # adaptive stop armed (random weights never settle)
])
def test_random_checkpoint_matches_pipeline(tiny_model, gen_length, confidence, seed, min_blocks):
    assert_same_run(tiny_model, "What is 3+4?",
                    Knobs(seed=seed, num_inference_steps=6, gen_length=gen_length, confidence=confidence),
                    min_blocks=min_blocks)


@pytest.mark.skipif(_release("diffusers")[:2] < (0, 42), reason="diffusers before 0.42 stops on the raw logits "
                    "for the whole batch; the engine follows 0.42 and transformers generate")
@pytest.mark.parametrize("gen_length, eos_stop, min_blocks", [(32, True, 1), (96, False, 3)])
def test_demo_model_matches_pipeline_with_adaptive_stop(demo_model, gen_length, eos_stop, min_blocks):
    assert_same_run(demo_model, "What is 2+5?", Knobs(seed=5, gen_length=gen_length),
                    eos_stop=eos_stop, min_blocks=min_blocks, expect_early_stop=True)
