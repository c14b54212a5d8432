"""The block-diffusion loop: the one path every run takes (plain, thinking, KV context, multi-block).

Per block: a uniform random canvas at the next global positions, decoder forwards with
self-conditioning, diffusers' EntropyBoundScheduler step, the adaptive stop of diffusers 0.42 /
transformers generate, then the committed canvas is encoded into the cache for the next block.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from .cache import encode_ids, input_device
from .knobs import Knobs
from .trace import Frame, Recorder
from .versions import cache_kw

STABILITY_STEPS = 1  # the released generation config's stability_threshold


class Cancelled(Exception):
    """Raised between steps when the caller's cancel check asks the run to stop."""

    def __init__(self, steps_done: int):
        super().__init__(f"run cancelled after {steps_done} steps")
        self.steps_done = steps_done


def num_blocks(gen_length: int, canvas_length: int) -> int:
    return math.ceil(gen_length / canvas_length)


@torch.no_grad()
def denoise_blocks(
    model,
    cache,
    knobs: Knobs,
    generator: torch.Generator,
    eos_ids: tuple[int, ...],
    recorder: Recorder,
    on_frame: Callable[[Frame], None] | None = None,
    should_cancel: Callable[[], bool] | None = None,
    encode_last: bool = False,
) -> torch.Tensor:
    """Generate blocks onto `cache` (which grows); returns the committed ids, shape (B, blocks*L)."""
    from diffusers import EntropyBoundScheduler

    config = model.config
    L = config.canvas_length
    vocab = config.get_text_config(decoder=True).vocab_size
    device = input_device(model)
    decoder = model.model.decoder
    model_kw = cache_kw(type(model).forward)
    mask_kw = cache_kw(type(decoder).create_diffusion_decoder_attention_mask)
    eos = torch.tensor(eos_ids, device=device)
    n_steps = knobs.num_inference_steps

    scheduler = EntropyBoundScheduler(entropy_bound=knobs.entropy_bound, t_max=knobs.t_max,
                                      t_min=knobs.t_min, num_inference_steps=n_steps)
    scheduler.set_timesteps(n_steps, device=device)
    blocks: list[torch.Tensor] = []
    done = 0
    for block in range(num_blocks(knobs.gen_length, L)):
        if blocks:
            encode_ids(model, cache, blocks[-1])
        start = cache.get_seq_length()
        positions = torch.arange(start, start + L, device=device).unsqueeze(0)
        canvas = torch.randint(0, vocab, (1, L), device=device, generator=generator)
        mask = decoder.create_diffusion_decoder_attention_mask(
            config=config, inputs_embeds=torch.empty((1, L, 0), device=device),
            decoder_attention_mask=torch.ones((1, start + L), dtype=torch.bool, device=device),
            **{mask_kw: cache})
        self_cond = None
        frozen = torch.zeros(1, dtype=torch.bool, device=device)
        argmax = canvas
        history = torch.full((STABILITY_STEPS, 1, L), -1, dtype=torch.long, device=device)
        stopped = False
        for step in range(n_steps):
            if should_cancel is not None and should_cancel():
                raise Cancelled(done)
            logits = model(decoder_input_ids=canvas, self_conditioning_logits=self_cond,
                           decoder_attention_mask=mask, decoder_position_ids=positions,
                           **{model_kw: cache}).logits
            out = scheduler.step(logits.to(device), step, canvas, generator=generator)
            del logits
            canvas, self_cond = out.prev_sample, out.pred_logits
            entropy = torch.distributions.Categorical(logits=self_cond.float()).entropy()
            if knobs.confidence > 0:
                # Freeze once the argmax is stable and confident, and commit the argmax.
                nxt = torch.where(frozen[:, None], argmax, self_cond.argmax(dim=-1))
                stable = (history == nxt[None]).all(dim=-1).all(dim=0)
                history = torch.roll(history, shifts=-1, dims=0)
                history[-1] = nxt
                frozen = frozen | (stable & (entropy.mean(-1) < knobs.confidence))
                argmax = nxt
                canvas = torch.where(frozen[:, None], argmax, canvas)
                stopped = bool(frozen.all())
            frame = recorder.add(block, step, canvas, out.accepted_index, entropy)
            done += 1
            if on_frame is not None:
                on_frame(frame)
            if stopped:
                break
        del self_cond
        recorder.stopped_early.append(stopped)
        blocks.append(canvas)
        if torch.isin(canvas, eos).any():
            break
    if encode_last:
        encode_ids(model, cache, blocks[-1])
    return torch.cat(blocks, dim=-1)
