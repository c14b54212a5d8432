"""The block-diffusion loop: the one path every run takes (plain, thinking, KV context, multi-block).

Per block: a uniform random canvas at the next global positions, decoder forwards with
self-conditioning, a diffusers scheduler step (EntropyBoundScheduler unless a `LoopPlan` picks another),
pins put back, the adaptive stop of diffusers 0.42 / transformers generate, then the committed
canvas is encoded into the cache for the next block. A `LoopPlan` may also start the first block
later in its schedule, pause at a step (the lane's `paused`: what resuming needs) and resume.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from ..constraints.guide import UNCONSTRAINED
from ..errors import Cancelled
from ..inputs.knobs import Knobs, num_blocks
from ..inputs.pins import Pins
from ..readouts.trace import Frame, Recorder
from ..steps.schedulers import Scheduling
from ..versions import cache_kw
from .cache import encode_ids, input_device
from .stepcopy import HostStep, Packed, StepCopy, pack
from .threads import with_compute_threads

STABILITY_STEPS = 1  # the released generation config's stability_threshold


class AdaptiveStop:
    """A block ends once its argmax is stable and its mean entropy is below `confidence`.

    When it fires it commits the argmax over the whole canvas (diffusers 0.42 / transformers).
    """

    def __init__(self, confidence: float, canvas, device):
        self.confidence = confidence
        self.frozen = torch.zeros(canvas.shape[0], dtype=torch.bool, device=device)
        self.argmax = canvas
        self.history = torch.full((STABILITY_STEPS, *canvas.shape), -1, dtype=torch.long, device=device)
        self.off_mask = None  # what a stop that is off commits: nothing (made once, never written)

    def apply(self, canvas, logits, entropy):
        """(canvas after the stop, per-position mask of what the stop committed, block done?). Whether the block
        is done stays on the device (a 0-dim bool; None when the stop is off): the step's copy reads it."""
        if self.confidence <= 0:
            if self.off_mask is None:  # a block's canvas keeps its shape
                self.off_mask = torch.zeros_like(canvas, dtype=torch.bool)
            return canvas, self.off_mask, None
        nxt = torch.where(self.frozen[:, None], self.argmax, logits.argmax(dim=-1))
        stable = (self.history == nxt[None]).all(dim=-1).all(dim=0)
        self.history = torch.roll(self.history, shifts=-1, dims=0)
        self.history[-1] = nxt
        self.frozen = self.frozen | (stable & (entropy.mean(-1) < self.confidence))
        self.argmax = nxt
        committed = self.frozen[:, None].expand_as(canvas)
        return torch.where(committed, self.argmax, canvas), committed, self.frozen.all()

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


@dataclass(frozen=True, eq=False)
class LoopPlan:
    """How an advanced run walks the schedule: scheduler, window [start, end) and pins.

    `resume` is the `Pause` of an earlier run to continue. The plan is never written: a lane that stops
    at `end` with a block unfinished keeps its own `Pause` (`Lane.paused`).
    """

    scheduling: Scheduling = field(default_factory=Scheduling)
    start: int = 0
    end: int | None = None
    pins: Pins | None = None
    resume: Pause | None = None


def step_entropy(logits, scheduler_entropy, confidence: float):
    """The per-position entropy of a step, for the adaptive stop and the trace.

    The scheduler's own when it has one, so capture adds no vocabulary-size work. The stop uses
    the pipeline's measure, the float entropy of the scaled logits: for float32 logits (what the
    model returns) that is the scheduler's very value; for lower precision it is computed again,
    as a bf16 entropy could tip the stop.
    """
    if scheduler_entropy is None or (confidence > 0 and logits.dtype != torch.float32):
        return torch.distributions.Categorical(logits=logits.float(), validate_args=False).entropy()
    return scheduler_entropy


def _host(canvas) -> np.ndarray:
    return canvas[0].to("cpu").numpy()


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
        # Nothing is padded: a growing cache takes no mask (an all-true one would be read on the host to see that)
        keys = None if not self.cache.is_compileable else torch.ones((1, start + self.L), dtype=torch.bool,
                                                                      device=self.device)
        self.mask = self.decoder.create_diffusion_decoder_attention_mask(
            config=self.config, inputs_embeds=torch.empty((1, self.L, 0), device=self.device),
            decoder_attention_mask=keys, **{self.mask_kw: self.cache})

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


@dataclass(frozen=True, eq=False)
class Pending:
    """A step launched on the device and not yet landed on the host."""

    packed: Packed
    canvas: torch.Tensor
    self_cond: torch.Tensor
    guided: int  # bytes of the packed extra that the constraint's choice reads on the host (a capture's follow)


class Lane:
    """One run walking its blocks: its own cache, generator, scheduler, stop, pins, guide and recorder.

    `ready` opens the next block when due and says whether a step is left; `advance` takes that step
    from the logits of the lane's canvas. Lanes share nothing, so a batch of them (`drive`) shares
    only each step's decoder forward, and every lane walks exactly as it would alone.
    """

    def __init__(self, model, cache, knobs: Knobs, generator, eos_ids, recorder: Recorder, on_frame=None,
                 encode_last: bool = False, plan: LoopPlan | None = None, scheduler=None, guide=None,
                 capture=None):
        self.plan = plan if plan is not None else LoopPlan()
        self.capture = capture  # a logprobs.Capture when the run asked for log-probabilities
        self.guide = guide if guide is not None else UNCONSTRAINED
        self.decoder = BlockDecoder(model, cache)
        self.stepper = scheduler if scheduler is not None else self.plan.scheduling.build(
            knobs, self.decoder.L, self.decoder.device)
        self.knobs, self.generator, self.recorder = knobs, generator, recorder
        self.on_frame, self.encode_last = on_frame, encode_last
        self.eos_host = np.asarray(eos_ids, dtype=np.int64)
        self.copy = StepCopy(self.decoder.device)
        self.last_ids = None  # the host ids of the block's last step
        self.done: list[torch.Tensor] = list(self.plan.resume.done) if self.plan.resume else []
        self.done_ids = [_host(t) for t in self.done]  # the same blocks on the host, for the result's ids
        self.first = self.plan.resume.block if self.plan.resume else 0
        self.blocks = num_blocks(knobs.gen_length, self.decoder.L)
        self.block, self.step = self.first - 1, 0
        self.canvas = self.self_cond = self.stop = self.pins = None
        self.in_block = self.stopped = self.finished = False
        self.sequence = self.sequence_ids = None  # (1, n) on the device, (n,) on the host, once ended
        self.paused: Pause | None = None  # where the lane stopped at its plan's end, a block unfinished
        self.on_end: Callable[[], None] | None = None  # told once, when the lane finished or paused

    def ready(self) -> bool:
        """True when the lane has a step to take; False once it finished or paused."""
        while not self.finished:
            if not self.in_block:
                self._open()
            elif self.step >= self.stepper.steps:
                self._end_block()
            elif self.plan.end is not None and self.step >= self.plan.end:
                self._pause()
            else:
                return True
        return False

    def _open(self) -> None:
        self.block += 1
        if self.block >= self.blocks:
            self._finish()
            return
        d = self.decoder
        self.pins = self.plan.pins.for_block(self.block, d.L, d.device) if self.plan.pins is not None else None
        canvas, self.self_cond, self.stop, self.step = _open_block(d, self.plan, self.block, self.first, self.done,
                                                                   self.knobs, self.stepper, self.generator)
        self.canvas, self.stopped, self.in_block, self.last_ids = _pin(canvas, self.pins), False, True, None

    def advance(self, logits, out=None) -> None:
        """One step of the block from the decoder's logits for this lane's canvas (`out`: the scheduler's
        step of them, when it was taken together with other lanes')."""
        pending = self.launch(logits, out)
        self.land(pending, self.copy.take_all([pending.packed])[0])  # the one wait

    def launch(self, logits, out=None) -> Pending:
        """The step's device work, up to its record packed for the host (`land` takes it from there)."""
        d, pins, step = self.decoder, self.pins, self.step
        if out is None:
            out = self.stepper.step(logits.to(d.device), step, self.canvas, self.generator, d.logits)
        self_cond = out.pred_logits
        entropy = step_entropy(self_cond, out.entropy, self.stop.confidence)
        canvas, by_stop, stopped = self.stop.apply(out.canvas, self_cond, entropy)
        canvas = _pin(canvas, pins)
        pinned = None if pins is None else pins[0]
        guided = self.guide.launch(self.block, self.done_ids, canvas, self_cond)
        extra = [] if guided is None else [guided]
        if self.capture is not None:
            extra.append(self.capture.rows(logits, canvas, None if guided is None else self.guide.candidates))
        packed = pack(canvas, out.committed, by_stop, entropy, pinned, None, stopped,
                      torch.cat(extra, dim=-1) if extra else None)
        return Pending(packed, canvas, self_cond, 0 if guided is None else guided.shape[-1])

    def land(self, pending: Pending, host: HostStep) -> None:
        """The step's host work once its record is on the host: the constraint's choice, the recorder, the frame,
        the block's end."""
        canvas, ids, constrained = pending.canvas, host.ids, None
        choice, rows = (None, host.extra) if host.extra is None else np.split(host.extra, [pending.guided])
        if self.guide is not UNCONSTRAINED:
            ids, constrained = self.guide.choose(host.ids, host.committed | host.stop, host.pinned, choice,
                                                 self.step == self.stepper.steps - 1 or host.stopped)
            if pending.guided:  # the chosen canvas goes back without a wait: the device idles after the copy
                canvas = torch.from_numpy(ids.astype(np.int64)).reshape(1, -1).to(canvas.device, non_blocking=True)
        frame = self.recorder.add_host(self.block, self.step, ids, host.committed, host.stop, host.entropy,
                                       host.pinned, constrained)
        if self.capture is not None:
            rows = self.capture.settle(rows, ids) if pending.guided else rows
            self.capture.add(self.block, ids, frame.committed, rows)
        if self.on_frame is not None:
            self.on_frame(frame)
        self.canvas, self.self_cond, self.stopped = canvas, pending.self_cond, host.stopped
        self.step += 1
        self.last_ids = frame.ids
        if host.stopped:
            self._end_block()

    def _end_block(self) -> None:
        self.self_cond, self.in_block = None, False
        self.recorder.end_block(self.stopped)
        self.done.append(self.canvas)
        self.done_ids.append(self._canvas_ids())
        if np.isin(self.done_ids[-1], self.eos_host).any():
            self._finish()

    def _canvas_ids(self) -> np.ndarray:
        """The canvas on the host: as its last step brought it there; read now when the block took no step."""
        return self.last_ids if self.last_ids is not None else _host(self.canvas)

    def _pause(self) -> None:
        self.paused = Pause(self.block, self.step, self.canvas, self.self_cond, self.stop, self.stepper.state(),
                            tuple(self.done))
        self._end(torch.cat([*self.done, self.canvas], dim=-1), [*self.done_ids, self._canvas_ids()])

    def _finish(self) -> None:
        if self.encode_last:
            encode_ids(self.decoder.model, self.decoder.cache, self.done[-1])
        self._end(torch.cat(self.done, dim=-1), self.done_ids)

    def _end(self, sequence, ids) -> None:
        self.sequence, self.sequence_ids, self.finished = sequence, np.concatenate(ids), True
        if self.on_end is not None:
            self.on_end()


@with_compute_threads
@torch.no_grad()
def drive(model, lanes, should_cancel: Callable[[], bool] | None = None, forward=None, size: int | None = None,
          together=None) -> None:
    """Step lanes to their ends, at most `size` at once (None: all of them): per step one decoder forward
    (`forward(working)` -> (lanes, logits rows) groups) for every working lane; alone, a lane's own forward.
    `lanes` may be a generator: a lane is taken (and launched) only when another has left, so a long list
    streams through. `together(lanes, logits)` takes a group's scheduler steps at once where it can.
    The steps run in helpers, so nothing here holds a lane (or its logits) after it left."""
    waiting, working, steps, copies = iter(lanes), [], [0], {}
    while True:
        working = [lane for lane in working if lane.ready()]
        _take(waiting, working, size, should_cancel, steps)
        if not working:
            return
        if should_cancel is not None and should_cancel():
            raise Cancelled(steps[0])
        _step(working, forward, together, copies)
        steps[0] += len(working)


def _take(waiting, working: list, size, should_cancel, steps: list) -> None:
    """Fill `working` up to `size` from `waiting` (a resumed lane's earlier steps count as done)."""
    while size is None or len(working) < size:
        if working and should_cancel is not None and should_cancel():
            raise Cancelled(steps[0])
        lane = next(waiting, None)
        if lane is None:
            return
        steps[0] += len(lane.recorder)
        if lane.ready():
            working.append(lane)


def _step(working: list, forward, together, copies: dict) -> None:
    """One step of every working lane; a group's lanes reach the host in one copy (`copies`: one per device,
    kept for the whole drive)."""
    if len(working) == 1 or forward is None:
        for lane in working:
            lane.advance(lane.decoder.logits(lane.canvas, lane.self_cond))
        return
    for group, logits in forward(working):
        outs = together(group, logits) if together is not None else [None] * len(group)
        pending = [lane.launch(logits[row:row + 1], out) for row, (lane, out) in enumerate(zip(group, outs))]
        device = group[0].decoder.device
        if device not in copies:
            copies[device] = StepCopy(device)
        hosts = copies[device].take_all([p.packed for p in pending])  # the group's one wait
        for lane, p, host in zip(group, pending, hosts):
            lane.land(p, host)


def denoise_blocks(model, cache, knobs: Knobs, generator: torch.Generator, eos_ids: tuple[int, ...],
                   recorder: Recorder, on_frame: Callable[[Frame], None] | None = None,
                   should_cancel: Callable[[], bool] | None = None, encode_last: bool = False,
                   plan: LoopPlan | None = None, scheduler=None, guide=None) -> torch.Tensor:
    """Generate blocks onto `cache` (which grows); returns the ids so far, shape (1, blocks*L).

    `scheduler` is the plan's scheduler adapter, built when not given. A paused run returns its
    finished blocks and the unfinished canvas. A `guide` (one run's
    dgemma/constraints/guide.Guide) makes each step's canvas satisfy a constraint.
    """
    lane = Lane(model, cache, knobs, generator, eos_ids, recorder, on_frame, encode_last, plan, scheduler, guide)
    drive(model, [lane], should_cancel)
    return lane.sequence
