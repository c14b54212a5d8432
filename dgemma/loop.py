"""The block-diffusion loop: the one path every run takes (plain, thinking, KV context, multi-block).

Per block: a uniform random canvas at the next global positions, decoder forwards with
self-conditioning, diffusers' EntropyBoundScheduler step, the adaptive stop of diffusers 0.42 /
transformers generate, then the committed canvas is encoded into the cache for the next block.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from .cache import encode_ids, input_device
from .knobs import Knobs
from .schedstep import step_with_entropy
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


class AdaptiveStop:
    """A block ends once its argmax is stable and its mean entropy is below `confidence`.

    When it fires it commits the argmax over the whole canvas (diffusers 0.42 / transformers).
    """

    def __init__(self, confidence: float, canvas, device):
        self.confidence = confidence
        self.frozen = torch.zeros(canvas.shape[0], dtype=torch.bool, device=device)
        self.argmax = canvas
        self.history = torch.full((STABILITY_STEPS, *canvas.shape), -1, dtype=torch.long, device=device)

    def apply(self, canvas, logits):
        """(canvas after the stop, per-position mask of what the stop committed, block done?)."""
        if self.confidence <= 0:
            return canvas, torch.zeros_like(canvas, dtype=torch.bool), False
        # the pipeline's own measure: float entropy of the scaled logits, paid only when the stop is on
        entropy = torch.distributions.Categorical(logits=logits.float()).entropy()
        nxt = torch.where(self.frozen[:, None], self.argmax, logits.argmax(dim=-1))
        stable = (self.history == nxt[None]).all(dim=-1).all(dim=0)
        self.history = torch.roll(self.history, shifts=-1, dims=0)
        self.history[-1] = nxt
        self.frozen = self.frozen | (stable & (entropy.mean(-1) < self.confidence))
        self.argmax = nxt
        committed = self.frozen[:, None].expand_as(canvas)
        return torch.where(committed, self.argmax, canvas), committed, bool(self.frozen.all())


class BlockDecoder:
    """What every step of a block needs from the model: the forward pass at fixed positions."""

    def __init__(self, model, cache):
        self.model, self.cache = model, cache
        self.config = model.config
        self.L = self.config.canvas_length
        self.vocab = self.config.get_text_config(decoder=True).vocab_size
        self.device = input_device(model)
        self.model_kw = cache_kw(type(model).forward)
        self.decoder = model.model.decoder
        self.mask_kw = cache_kw(type(self.decoder).create_diffusion_decoder_attention_mask)

    def start_block(self, generator):
        """A uniform random canvas at the next global positions; returns it."""
        start = self.cache.get_seq_length()
        self.positions = torch.arange(start, start + self.L, device=self.device).unsqueeze(0)
        self.mask = self.decoder.create_diffusion_decoder_attention_mask(
            config=self.config, inputs_embeds=torch.empty((1, self.L, 0), device=self.device),
            decoder_attention_mask=torch.ones((1, start + self.L), dtype=torch.bool, device=self.device),
            **{self.mask_kw: self.cache})
        return torch.randint(0, self.vocab, (1, self.L), device=self.device, generator=generator)

    def logits(self, canvas, self_cond):
        return self.model(decoder_input_ids=canvas, self_conditioning_logits=self_cond,
                          decoder_attention_mask=self.mask, decoder_position_ids=self.positions,
                          **{self.model_kw: self.cache}).logits


@torch.no_grad()
def denoise_blocks(model, cache, knobs: Knobs, generator: torch.Generator, eos_ids: tuple[int, ...],
                   recorder: Recorder, on_frame: Callable[[Frame], None] | None = None,
                   should_cancel: Callable[[], bool] | None = None, encode_last: bool = False) -> torch.Tensor:
    """Generate blocks onto `cache` (which grows); returns the committed ids, shape (B, blocks*L)."""
    from diffusers import EntropyBoundScheduler

    n_steps = knobs.num_inference_steps
    scheduler = EntropyBoundScheduler(entropy_bound=knobs.entropy_bound, t_max=knobs.t_max,
                                      t_min=knobs.t_min, num_inference_steps=n_steps)
    blocks = BlockDecoder(model, cache)
    scheduler.set_timesteps(n_steps, device=blocks.device)
    eos = torch.tensor(eos_ids, device=blocks.device)
    done: list[torch.Tensor] = []
    for block in range(num_blocks(knobs.gen_length, blocks.L)):
        if done:
            encode_ids(model, cache, done[-1])
        canvas = blocks.start_block(generator)
        stop, self_cond, stopped = AdaptiveStop(knobs.confidence, canvas, blocks.device), None, False
        for step in range(n_steps):
            if should_cancel is not None and should_cancel():
                raise Cancelled(len(recorder))
            out, entropy = step_with_entropy(scheduler, blocks.logits(canvas, self_cond).to(blocks.device), step,
                                             canvas, generator)
            self_cond = out.pred_logits
            canvas, committed, stopped = stop.apply(out.prev_sample, self_cond)
            frame = recorder.add(block, step, canvas, out.accepted_index, committed, entropy)
            if on_frame is not None:
                on_frame(frame)
            if stopped:
                break
        del self_cond
        recorder.end_block(stopped)
        done.append(canvas)
        if torch.isin(canvas, eos).any():
            break
    if encode_last:
        encode_ids(model, cache, done[-1])
    return torch.cat(done, dim=-1)
