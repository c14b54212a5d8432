"""The block-diffusion loop: the one path every run takes (plain, thinking, KV context, multi-block).

Per block: a uniform random canvas at the next global positions, decoder forwards with
self-conditioning, a diffusers scheduler step (EntropyBoundScheduler unless a `LoopPlan` picks another),
pins put back, the adaptive stop of diffusers 0.42 / transformers generate, then the committed
canvas is encoded into the cache for the next block. A `LoopPlan` may also start the first block
later in its schedule, pause at a step (leaving what resuming needs in `plan.paused`) and resume.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from .cache import encode_ids, input_device
from .guide import UNCONSTRAINED
from .knobs import Knobs
from .pins import Pins
from .schedulers import Scheduling
from .threads import with_compute_threads
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

    def apply(self, canvas, logits, entropy):
        """(canvas after the stop, per-position mask of what the stop committed, block done?)."""
        if self.confidence <= 0:
            return canvas, torch.zeros_like(canvas, dtype=torch.bool), False
        nxt = torch.where(self.frozen[:, None], self.argmax, logits.argmax(dim=-1))
        stable = (self.history == nxt[None]).all(dim=-1).all(dim=0)
        self.history = torch.roll(self.history, shifts=-1, dims=0)
        self.history[-1] = nxt
        self.frozen = self.frozen | (stable & (entropy.mean(-1) < self.confidence))
        self.argmax = nxt
        committed = self.frozen[:, None].expand_as(canvas)
        return torch.where(committed, self.argmax, canvas), committed, bool(self.frozen.all())

    def copy(self, confidence: float) -> AdaptiveStop:
        """An independent copy (apply only rebinds its tensors) with the knob now in force."""
        new = copy.copy(self)
        new.confidence = confidence
        return new


@dataclass(frozen=True, eq=False)
class Pause:
    """Where a run stopped inside a block: everything the loop needs to continue it exactly."""

    block: int
    step: int
    canvas: torch.Tensor
    self_cond: torch.Tensor | None
    stop: AdaptiveStop
    scheduler_state: object
    done: tuple  # the finished blocks' ids

    @property
    def nbytes(self) -> int:
        held = (self.canvas, self.self_cond, self.scheduler_state)
        return sum(t.numel() * t.element_size() for t in held if isinstance(t, torch.Tensor))


@dataclass
class LoopPlan:
    """How an advanced run walks the schedule: scheduler, window [start, end) and pins.

    `resume` is the `Pause` of an earlier run to continue; the loop sets `paused` when it stops at
    `end` with a block unfinished.
    """

    scheduling: Scheduling = field(default_factory=Scheduling)
    start: int = 0
    end: int | None = None
    pins: Pins | None = None
    resume: Pause | None = None
    paused: Pause | None = None


def step_entropy(logits, scheduler_entropy, confidence: float):
    """The per-position entropy of a step, for the adaptive stop and the trace.

    The scheduler's own when it has one, so capture adds no vocabulary-size work. The stop uses
    the pipeline's measure, the float entropy of the scaled logits: for float32 logits (what the
    model returns) that is the scheduler's very value; for lower precision it is computed again,
    as a bf16 entropy could tip the stop.
    """
    if scheduler_entropy is None or (confidence > 0 and logits.dtype != torch.float32):
        return torch.distributions.Categorical(logits=logits.float()).entropy()
    return scheduler_entropy


def _pin(canvas, pins):
    return canvas if pins is None else torch.where(pins[0], pins[1], canvas)


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
        self.enter_block()
        return torch.randint(0, self.vocab, (1, self.L), device=self.device, generator=generator)

    def enter_block(self) -> None:
        """Positions and attention mask of the block after what the cache holds."""
        start = self.cache.get_seq_length()
        self.positions = torch.arange(start, start + self.L, device=self.device).unsqueeze(0)
        self.mask = self.decoder.create_diffusion_decoder_attention_mask(
            config=self.config, inputs_embeds=torch.empty((1, self.L, 0), device=self.device),
            decoder_attention_mask=torch.ones((1, start + self.L), dtype=torch.bool, device=self.device),
            **{self.mask_kw: self.cache})

    def logits(self, canvas, self_cond):
        return self.model(decoder_input_ids=canvas, self_conditioning_logits=self_cond,
                          decoder_attention_mask=self.mask, decoder_position_ids=self.positions,
                          **{self.model_kw: self.cache}).logits


def _open_block(decoder, plan, block, first, done, knobs, stepper, generator):
    """(canvas, self_cond, stop, first step) of `block`: resumed where the plan paused, else fresh."""
    at = plan.resume
    if at is not None and block == at.block:
        decoder.enter_block()
        stepper.restore(at.scheduler_state)
        return at.canvas, at.self_cond, at.stop.copy(knobs.confidence), at.step
    if done:
        encode_ids(decoder.model, decoder.cache, done[-1])
    canvas = decoder.start_block(generator)
    return canvas, None, AdaptiveStop(knobs.confidence, canvas, decoder.device), plan.start if block == first else 0


@with_compute_threads
@torch.no_grad()
def denoise_blocks(model, cache, knobs: Knobs, generator: torch.Generator, eos_ids: tuple[int, ...],
                   recorder: Recorder, on_frame: Callable[[Frame], None] | None = None,
                   should_cancel: Callable[[], bool] | None = None, encode_last: bool = False,
                   plan: LoopPlan | None = None, scheduler=None, guide=None) -> torch.Tensor:
    """Generate blocks onto `cache` (which grows); returns the ids so far, shape (B, blocks*L).

    `scheduler` is the plan's scheduler adapter, built when not given. A paused run returns its
    finished blocks and the unfinished canvas, and sets `plan.paused`. A `guide`
    (dgemma/guide.py) makes each step's canvas satisfy a constraint.
    """
    plan = plan if plan is not None else LoopPlan()
    guide = guide if guide is not None else UNCONSTRAINED
    decoder = BlockDecoder(model, cache)
    stepper = scheduler if scheduler is not None else plan.scheduling.build(knobs, decoder.L, decoder.device)
    eos = torch.tensor(eos_ids, device=decoder.device)
    done: list[torch.Tensor] = list(plan.resume.done) if plan.resume else []
    first = plan.resume.block if plan.resume else 0
    for block in range(first, num_blocks(knobs.gen_length, decoder.L)):
        pins = plan.pins.for_block(block, decoder.L, decoder.device) if plan.pins is not None else None
        canvas, self_cond, stop, step0 = _open_block(decoder, plan, block, first, done, knobs, stepper, generator)
        canvas, stopped = _pin(canvas, pins), False
        for step in range(step0, stepper.steps):
            if plan.end is not None and step >= plan.end:
                plan.paused = Pause(block, step, canvas, self_cond, stop, stepper.state(), tuple(done))
                return torch.cat([*done, canvas], dim=-1)
            if should_cancel is not None and should_cancel():
                raise Cancelled(len(recorder))
            out = stepper.step(decoder.logits(canvas, self_cond).to(decoder.device), step, canvas, generator,
                               decoder.logits)
            self_cond = out.pred_logits
            entropy = step_entropy(self_cond, out.entropy, stop.confidence)
            canvas, by_stop, stopped = stop.apply(out.canvas, self_cond, entropy)
            canvas = _pin(canvas, pins)
            pinned = None if pins is None else pins[0]
            canvas, constrained = guide.apply(block, done, canvas, out.committed | by_stop, self_cond, pinned,
                                              stopped or step == stepper.steps - 1)
            frame = recorder.add(block, step, canvas, out.committed, by_stop, entropy, pinned, constrained)
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
