"""Per-step capture reuses the scheduler's own entropy: no vocabulary-size work beyond the pipeline's."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from diffusiongemma.dgemma import Knobs, generate
from diffusiongemma.dgemma.denoising.loop import step_entropy
from diffusiongemma.dgemma.denoising.resume import Advanced
from diffusiongemma.dgemma.loading import patches
from diffusiongemma.dgemma.steps import batch_step
from diffusiongemma.dgemma.steps.schedulers import Scheduling


def _scheduler(steps: int = 4):
    from diffusers import EntropyBoundScheduler

    knobs = Knobs(num_inference_steps=steps)
    scheduler = EntropyBoundScheduler(entropy_bound=0.1, t_max=knobs.t_max, t_min=knobs.t_min,
                                      num_inference_steps=steps)
    scheduler.set_timesteps(steps)
    return scheduler, knobs


def _logits(vocab: int, dtype=torch.float32):
    return torch.randn(1, 8, vocab, generator=torch.Generator().manual_seed(0)).to(dtype)


@pytest.mark.parametrize("confidence, scheduler, per_step", [
    (0.0, "entropy_bound", 1),       # the scheduler's own acceptance entropy, nothing more
    (0.005, "entropy_bound", 1),     # float32 logits: the stop's float entropy is that same value
    (0.0, "block_refinement", 1),    # this scheduler computes none: the loop measures it once
])
def test_vocabulary_entropies_per_step(tiny_model, monkeypatch, confidence, scheduler, per_step):
    knobs = Knobs(seed=1, num_inference_steps=6, gen_length=16, confidence=confidence)
    generate(tiny_model, "hi", knobs, advanced=Advanced(Scheduling(scheduler)))  # the fused step's one check
    calls = []
    original, fused = torch.distributions.Categorical.entropy, batch_step.entropy_of
    monkeypatch.setattr(torch.distributions.Categorical, "entropy",
                        lambda self: calls.append(self.logits.shape[-1]) or original(self))
    monkeypatch.setattr(batch_step, "entropy_of", lambda logits: calls.append(logits.shape[-1]) or fused(logits))
    result = generate(tiny_model, "hi", knobs, advanced=Advanced(Scheduling(scheduler)))
    assert len(calls) == per_step * len(result.trace)
    assert set(calls) == {tiny_model.vocab_size}


def test_kept_entropy_is_the_one_the_scheduler_accepted_by(tiny_model):
    scheduler, knobs = _scheduler()
    logits = _logits(tiny_model.vocab_size)
    out, entropy = patches.step_with_entropy(scheduler, logits, 1, torch.zeros(1, 8, dtype=torch.long),
                                               torch.Generator().manual_seed(0))
    T = knobs.temperature(1)
    assert torch.equal(out.pred_logits, logits / T)
    assert torch.equal(entropy, torch.distributions.Categorical(logits=out.pred_logits).entropy())
    # float32 logits: the pipeline's float entropy for its stop is this very value
    assert torch.equal(torch.distributions.Categorical(logits=out.pred_logits.float()).entropy(), entropy)
    assert step_entropy(out.pred_logits, entropy, 0.005) is entropy


def test_bf16_logits_keep_the_pipeline_float_entropy_for_the_stop(tiny_model):
    scheduler, _ = _scheduler()
    out, entropy = patches.step_with_entropy(scheduler, _logits(tiny_model.vocab_size, torch.bfloat16), 1,
                                               torch.zeros(1, 8, dtype=torch.long), torch.Generator().manual_seed(0))
    assert entropy.dtype == torch.bfloat16  # the scheduler measures in the logits' dtype
    stop = step_entropy(out.pred_logits, entropy.float(), 0.005)
    assert stop.dtype == torch.float32
    assert torch.equal(stop, torch.distributions.Categorical(logits=out.pred_logits.float()).entropy())
    assert torch.equal(step_entropy(out.pred_logits, entropy.float(), 0.0), entropy.float())  # the scheduler's
    assert torch.allclose(entropy.float(), stop, atol=0.05)


def test_another_thread_calling_the_scheduler_sees_no_difference(tiny_model):
    canvas = torch.zeros(1, 8, dtype=torch.long)
    logits = _logits(tiny_model.vocab_size)
    scheduler, _ = _scheduler()
    patches.step_with_entropy(scheduler, logits, 1, canvas, torch.Generator().manual_seed(0))  # view installed
    plain = scheduler.step(logits, 1, canvas, generator=torch.Generator().manual_seed(3))
    patches._kept.listening, patches._kept.value = True, None  # this thread listens ...
    try:
        seen = []
        worker = threading.Thread(target=lambda: seen.append(
            scheduler.step(logits, 1, canvas, generator=torch.Generator().manual_seed(3))))
        worker.start()
        worker.join()
        assert patches._kept.value is None  # ... and keeps nothing from the other thread's step
    finally:
        patches._kept.listening = False
    other = seen[0]
    for field in ("prev_sample", "accepted_index", "sampled_tokens", "sampled_probs", "pred_logits"):
        assert torch.equal(getattr(other, field), getattr(plain, field)), field
    again = torch.distributions.Categorical(logits=plain.pred_logits).entropy()  # nothing kept outside a step
    assert np.isfinite(again.numpy()).all() and patches._kept.value is None
