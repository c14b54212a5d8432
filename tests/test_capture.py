"""Per-step capture reuses the scheduler's own entropy: nothing of vocabulary size is computed for it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from diffusiongemma.dgemma import Knobs, generate, schedstep


@pytest.mark.parametrize("confidence, per_step", [(0.0, 1), (0.005, 2)])
def test_one_vocabulary_entropy_per_step_unless_the_stop_needs_its_own(tiny_model, monkeypatch, confidence,
                                                                        per_step):
    """The scheduler's entropy is the trace's; only the adaptive stop (as the pipeline does) adds one."""
    calls = []
    original = torch.distributions.Categorical.entropy
    monkeypatch.setattr(torch.distributions.Categorical, "entropy",
                        lambda self: calls.append(self.logits.shape[-1]) or original(self))
    result = generate(tiny_model, "hi", Knobs(seed=1, num_inference_steps=6, gen_length=16, confidence=confidence))
    assert len(calls) == per_step * len(result.trace)


def test_trace_entropy_is_the_entropy_the_scheduler_accepted_by(tiny_model):
    from diffusers import EntropyBoundScheduler

    knobs = Knobs(seed=2, num_inference_steps=4)
    scheduler = EntropyBoundScheduler(entropy_bound=0.1, t_max=knobs.t_max, t_min=knobs.t_min, num_inference_steps=4)
    scheduler.set_timesteps(4)
    logits = torch.randn(1, 8, tiny_model.vocab_size, generator=torch.Generator().manual_seed(0))
    canvas = torch.zeros(1, 8, dtype=torch.long)
    out, entropy = schedstep.step_with_entropy(scheduler, logits, 1, canvas, torch.Generator().manual_seed(0))
    T = knobs.temperature(1)
    expected = torch.distributions.Categorical(logits=logits / T).entropy()
    assert torch.allclose(entropy, expected, atol=1e-5)
    assert torch.equal(out.pred_logits, logits / T)
    again = torch.distributions.Categorical(logits=out.pred_logits).entropy()  # nothing kept outside a step
    assert np.isfinite(again.numpy()).all()
