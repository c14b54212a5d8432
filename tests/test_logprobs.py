"""Log-probabilities captured at commit time: the model's own log p of each position's final token at the step
that committed it, and nothing else about the run changes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from diffusiongemma.dgemma import Constraint, Knobs, generate
from diffusiongemma.dgemma.denoising.resume import Advanced
from diffusiongemma.dgemma.denoising.run import prepare, run_batch
from diffusiongemma.dgemma.errors import InputError

PROMPT = "What is 3+4?"


def same_run(a, b) -> None:
    assert a.text == b.text and a.state == b.state and a.config.asdict() | {"run_id": 0} == \
        b.config.asdict() | {"run_id": 0}
    for name in ("ids", "committed_bits", "entropy", "stop_bits", "times", "knob_index"):
        assert np.array_equal(getattr(a.trace, name), getattr(b.trace, name)), name


@pytest.mark.parametrize("knobs, constraint", [
    (Knobs(seed=1), None), (Knobs(seed=2, thinking=True), None), (Knobs(seed=3, gen_length=64), None),
    (Knobs(seed=4, gen_length=64), Constraint("choice", "seven\nsix"))])
def test_asking_changes_nothing_but_the_capture(demo_model, knobs, constraint):
    plain = generate(demo_model, PROMPT, knobs, constraint=constraint)
    asked = generate(demo_model, PROMPT, knobs, constraint=constraint, logprobs=5)
    same_run(plain, asked)
    assert plain.logprobs is None
    lp = asked.logprobs
    assert lp.values.shape == (len(asked.state.raw_ids),) and lp.top_ids.shape == (len(asked.state.raw_ids), 5)
    assert (lp.values <= 0).all() and (np.diff(lp.top_values, axis=1) <= 0).all()
    assert (lp.top_values[:, 0] >= lp.values - 1e-6).all()


def placed(ids, committed) -> int:
    """The step that put the final token in place: where its last stretch on the canvas began, or the
    last step in that stretch that committed it after a step that had not."""
    start = len(ids) - 1
    while start > 0 and ids[start - 1] == ids[-1]:
        start -= 1
    rises = [i for i in range(start + 1, len(ids)) if committed[i] and not committed[i - 1]]
    return rises[-1] if rises else start


@pytest.mark.parametrize("constraint", [None, Constraint("choice", "six\nfour"), Constraint("regex", "f[a-z]+")])
def test_each_value_is_log_p_of_the_final_token_at_the_step_that_placed_it(demo_model, constraint):
    """Under a constraint too: the host picks each token among candidates whose values the step's copy carried."""
    logits = []
    hook = demo_model.model.register_forward_hook(lambda m, i, out: logits.append(out.logits.detach().clone()))
    try:
        result = generate(demo_model, PROMPT, Knobs(seed=7, gen_length=64), logprobs=2, constraint=constraint)
    finally:
        hook.remove()
    trace, lp, L = result.trace, result.logprobs, demo_model.canvas_length
    assert constraint is None or trace.constrained.any()  # the constraint's own choices were read
    assert len(logits) == len(trace)  # one decoder forward per step: step i read logits[i]
    committed, checked = trace.committed, 0
    for block in range(trace.num_blocks):
        rows = np.flatnonzero(trace.blocks == block)
        final = trace.ids[rows[-1]]
        for pos in range(L):
            row = placed(trace.ids[rows, pos], committed[rows, pos]) + rows[0]
            expect = torch.log_softmax(logits[row][0, pos].double(), -1)
            at = block * L + pos
            assert lp.values[at] == pytest.approx(float(expect[final[pos]]), abs=1e-4)
            assert lp.top_ids[at, 0] == int(expect.argmax())
            checked += 1
    assert checked == len(result.state.raw_ids)


def test_a_batch_captures_each_item_as_its_solo_run(demo_model):
    solo = [generate(demo_model, PROMPT, Knobs(seed=s), logprobs=1) for s in (11, 12)]
    batch = run_batch([prepare(demo_model, PROMPT, Knobs(seed=s), logprobs=1) for s in (11, 12)])
    for one, many in zip(solo, batch):
        assert one.text == many.text
        np.testing.assert_allclose(one.logprobs.values, many.logprobs.values, atol=1e-4)


def test_refusals(demo_model):
    for bad in (6, -1, True, 1.5):
        with pytest.raises(InputError, match="logprobs must be a count"):
            generate(demo_model, PROMPT, Knobs(), logprobs=bad)
    first = generate(demo_model, PROMPT, Knobs(), advanced=Advanced(end_step=3))
    with pytest.raises(InputError, match="resumed run cannot give log-probabilities"):
        generate(demo_model, PROMPT, Knobs(), advanced=Advanced(start_step=3, resume=first.state.resume), logprobs=0)
