"""The block loop on a tiny random DiffusionGemma: blocks, EOS, seeds, cancel, capture."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from diffusiongemma.dgemma import Cancelled, Knobs, generate
from diffusiongemma.dgemma.inputs.tokens import prompt_ids

FAST = dict(num_inference_steps=4, confidence=0.0)


def test_thinking_switch_renders_through_the_template(tiny_model):
    tok = tiny_model.tokenizer
    plain = tok.decode(prompt_ids(tiny_model, "Why?", thinking=False))
    think = tok.decode(prompt_ids(tiny_model, "Why?", thinking=True))
    assert plain == "<bos><|turn>user\nWhy?<turn|>\n<|turn>model\n<|channel>thought\n<channel|>"
    assert think == "<bos><|turn>system\n<|think|>\n<turn|>\n<|turn>user\nWhy?<turn|>\n<|turn>model\n"
    assert prompt_ids(tiny_model, "Why?", False, with_bos=False)[0] != tok.bos_token_id


def test_same_seed_same_tokens_and_trace(tiny_model):
    knobs = Knobs(seed=11, gen_length=300, **FAST)
    a, b = generate(tiny_model, "hello", knobs), generate(tiny_model, "hello", knobs)
    assert a.state.raw_ids == b.state.raw_ids
    assert np.array_equal(a.trace.ids, b.trace.ids) and np.array_equal(a.trace.entropy, b.trace.entropy)
    other = generate(tiny_model, "hello", dataclasses.replace(knobs, seed=12))
    assert other.state.raw_ids != a.state.raw_ids


def test_blocks_follow_gen_length_and_stop_after_any_eos(tiny_model):
    """A block holding <eos> or <turn|> ends the run; otherwise ceil(gen_length / L) blocks run."""
    L = tiny_model.canvas_length
    eos_ids = set(tiny_model.eos_ids)
    assert eos_ids == {1, 106}
    stopped_by = set()
    for seed in range(12):
        r = generate(tiny_model, "hi", Knobs(seed=seed, gen_length=3 * L - 5, **FAST))
        ids = r.state.raw_ids
        blocks = [set(ids[i:i + L]) for i in range(0, len(ids), L)]
        assert len(ids) == r.state.blocks * L and r.state.steps_used == len(r.trace) == r.state.blocks * 4
        assert all(not block & eos_ids for block in blocks[:-1])
        if len(blocks) < 3:
            assert blocks[-1] & eos_ids
            stopped_by.add(frozenset(blocks[-1] & eos_ids))
    assert frozenset({1}) in stopped_by and frozenset({106}) in stopped_by


def test_last_frame_of_each_block_is_the_appended_canvas(tiny_model):
    r = generate(tiny_model, "hello", Knobs(seed=0, gen_length=600, **FAST))
    L = tiny_model.canvas_length
    for b in range(r.trace.num_blocks):
        last = np.flatnonzero(r.trace.blocks == b)[-1]
        assert list(r.trace.ids[last]) == list(r.state.raw_ids[b * L:(b + 1) * L])


def test_capture_is_compact_and_honest(tiny_model):
    r = generate(tiny_model, "hello", Knobs(seed=1, num_inference_steps=6, gen_length=10, confidence=0.0))
    t = r.trace
    assert len(t) == 6 and t.ids.dtype == np.int32 and t.entropy.dtype == np.float16
    assert list(t.steps) == list(range(6)) and set(t.blocks) == {0}
    assert 0 <= float(t.entropy.min()) and float(t.entropy.max()) <= np.log(tiny_model.vocab_size) + 0.01
    frame = t.frame(5)
    assert frame.t == pytest.approx(1 / 6) and frame.temperature == pytest.approx(0.4 + 0.4 / 6)
    assert frame.committed.any() and frame.committed_fraction == r.state.committed_fraction
    assert t.nbytes / len(t) < 7.5 * tiny_model.canvas_length
    with pytest.raises(ValueError):
        t.ids[0, 0] = 5


def test_trace_bytes_do_not_grow_with_the_vocabulary(tiny_model, realvocab_model):
    knobs = Knobs(seed=0, num_inference_steps=2, gen_length=10, confidence=0.0)
    small = generate(tiny_model, "hi", knobs).trace
    big = generate(realvocab_model, "hi", knobs).trace
    assert realvocab_model.vocab_size == 262_144
    assert big.nbytes == small.nbytes


def test_cancel_stops_within_one_step(tiny_model):
    seen = []
    with pytest.raises(Cancelled) as err:
        generate(tiny_model, "hello", Knobs(seed=0, num_inference_steps=20, **{"confidence": 0.0}),
                 on_frame=seen.append, should_cancel=lambda: len(seen) >= 3)
    assert len(seen) == 3 and err.value.steps_done == 3


@pytest.mark.parametrize("field, value, words", [
    ("t_min", 0.9, "t_min must not exceed t_max"),
    ("num_inference_steps", 0, "num_inference_steps must be between 1"),
    ("gen_length", 0, "gen_length must be between 1"),
    ("entropy_bound", -0.1, "entropy_bound must be between 0"),
    ("confidence", 1.5, "confidence must be between 0"),
    ("seed", -1, "seed must be between 0"),
    ("seed", 2**64, "seed must be between 0"),
    ("seed", 1.5, "seed must be an int"),
    ("thinking", "yes", "thinking must be true or false"),
    ("t_max", 0.0, "t_max must be above 0"),
])
def test_bad_knobs_are_refused_with_name_and_value(field, value, words):
    kwargs = {field: value, **({"t_min": 0.0} if field == "t_max" else {})}
    with pytest.raises(ValueError) as err:
        Knobs(**kwargs)
    assert words in str(err.value) and repr(value)[:6] in str(err.value)


def test_bad_inputs_fail_before_the_model_runs(tiny_model, monkeypatch):
    import diffusiongemma.dgemma.denoising.run as run

    monkeypatch.setattr(run, "encode_ids", lambda *a, **k: pytest.fail("model ran"))
    with pytest.raises(ValueError, match="prompt is empty"):
        generate(tiny_model, "   ", Knobs())
    with pytest.raises(ValueError, match="prompt must be text"):
        generate(tiny_model, None, Knobs())
    with pytest.raises(ValueError, match="model must be a loaded DiffusionGemma"):
        generate("not a model", "hi", Knobs())


def test_the_largest_seed_is_accepted(tiny_model):
    r = generate(tiny_model, "hi", Knobs(seed=2**64 - 1, num_inference_steps=1, gen_length=1))
    assert r.state.steps_used == 1
