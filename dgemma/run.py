"""One run, start to end: validate, prefill the cache, run the block loop, read the result."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .cache import encode_ids, fork_cache, input_device, new_cache
from .context import KVCache, mint
from .errors import InputError
from .excision import excise, thought_text
from .knobs import Knobs
from .loop import denoise_blocks, num_blocks
from .payloads import CanvasState, DGemmaModel, RunConfig, check_model
from .resume import Advanced, Resume, check_resume
from .schedulers import Scheduling
from .seeding import make_generator
from .tokens import check_text, prompt_ids
from .trace import CanvasTrace, Frame, Recorder
from .vision import check_image_tensor, check_vision, prepare_images

MAX_TURN_TOKENS = 8192  # the turn is encoded in one forward; longer text belongs in a KV context


@dataclass(frozen=True)
class RunResult:
    """What `generate` returns: the answer, its honesty readout, every step, and the run's config."""

    text: str
    state: CanvasState
    trace: CanvasTrace
    config: RunConfig
    context: object | None = None  # the KVCache advanced by this run, when asked for


def check_inputs(dm, prompt, knobs, context, image=None) -> None:
    """Every check that needs no model work: types, emptiness, the cache's fit, the image's shape."""
    check_model(dm)
    check_text("prompt", prompt)
    if not isinstance(knobs, Knobs):
        raise InputError("knobs", f"knobs must be a Knobs, got {type(knobs).__name__}")
    if context is not None and not isinstance(context, KVCache):
        raise InputError("context", f"the KV context must be an encoded context, got {type(context).__name__}; "
                                    "encode one with encode_context")
    if image is not None:
        check_image_tensor("image", image)
        check_vision("image", dm)
    if context is None and image is None and not prompt.strip():
        raise InputError("prompt", "prompt is empty; type a prompt, or give an encoded KV context for a "
                                   "pure-injection run")
    if context is not None:
        context.check_model(dm)


def turn_ids(dm, prompt: str, knobs: Knobs, context, images=None) -> list[int]:
    """The turn's ids, refused when it or the whole run exceeds what the model can take."""
    has_turn = bool(prompt.strip()) or images is not None
    turn = prompt_ids(dm, prompt, knobs.thinking, with_bos=context is None, images=images) if has_turn else []
    if len(turn) > MAX_TURN_TOKENS:
        raise InputError("prompt", f"prompt is {len(turn)} tokens, over the limit of {MAX_TURN_TOKENS} for a "
                                   "turn; shorten it, or encode the long part as a KV context")
    held = (context.length if context is not None else 0) + len(turn)
    total = held + num_blocks(knobs.gen_length, dm.canvas_length) * dm.canvas_length
    limit = dm.max_positions
    if total > limit:
        raise InputError("gen_length", f"gen_length {knobs.gen_length} after {held} tokens of context and turn "
                                       f"needs {total} positions, over the model's {limit}; lower gen_length "
                                       "or shorten the input")
    return turn


def generate(dm: DGemmaModel, prompt: str, knobs: Knobs = Knobs(), *, context=None, image=None,
             on_frame: Callable[[Frame], None] | None = None,
             should_cancel: Callable[[], bool] | None = None, advance_context: bool = False,
             advanced: Advanced | None = None) -> RunResult:
    """Generate an answer to `prompt` (the turn), optionally on top of a KV `context`.

    `image` (a ComfyUI IMAGE batch, [B, H, W, C] in 0..1) joins the turn as B images before the
    text; the encoder reads them, the canvas never holds them. The context is never modified: the
    run works on a fork. With `advance_context` the result carries a new context holding context +
    turn + every generated block. `advanced` picks the scheduler, window and pins, and may resume
    an earlier advanced run; its state is resumable.
    """
    check_inputs(dm, prompt, knobs, context, image)
    resume = advanced.resume if advanced is not None else None
    if resume is not None:
        check_resume(resume, dm, prompt, knobs, context, advanced.scheduling)
    images = prepare_images(dm, image) if image is not None and resume is None else None
    turn = turn_ids(dm, prompt, knobs, context, images) if resume is None else []
    plan = advanced.plan(dm, knobs) if advanced is not None else None
    model = dm.model
    scheduler = (advanced.scheduling if advanced is not None else Scheduling()).build(
        knobs, dm.canvas_length, input_device(model))
    recorder = Recorder(knobs, dm.canvas_length, dm.token_strings,
                        resumed=resume.recorded if resume is not None else None, clock=scheduler)
    if resume is not None:
        recorder.use_knobs(advanced.knob_set(knobs))
    elif advanced is not None:
        recorder.knob_sets = [advanced.knob_set(knobs)]
    if resume is not None and resume.finished:
        sequence, cache, generator = resume.ids, None, None
    else:
        cache, generator = _start(dm, turn, images, context, knobs, resume)
        sequence = denoise_blocks(model, cache, knobs, generator, dm.eos_ids, recorder, on_frame=on_frame,
                                  should_cancel=should_cancel, encode_last=advance_context, plan=plan)
    summary = context.summary() if context is not None else None
    run_id = uuid.uuid4().hex
    named = (scheduler.diffusers_name, scheduler.config()) if advanced is not None else ()
    trace = recorder.finish(context=summary, run_id=run_id, scheduler=named)
    state = read_state(dm, sequence[0].tolist(), trace)
    if advanced is not None:
        paused = plan.paused if plan is not None and cache is not None else None
        keep = Resume(model, prompt, context, knobs, advanced.scheduling.name, recorder.snapshot(), sequence,
                      paused, cache if paused else None,
                      generator.get_state() if paused else None)
        state = dataclasses.replace(state, paused=paused is not None, resume=keep)
    image_record = images.record if images is not None else None
    config = RunConfig(prompt=prompt, knobs=knobs, context=summary, run_id=run_id, image=image_record,
                       **dm.describe())
    new_context = None
    if advance_context and not state.paused and resume is None:
        held, seen = turn + list(state.raw_ids), (image_record,) if image_record else ()
        new_context = context.advanced(cache, held, seen) if context is not None else mint(dm, cache, held, seen)
    return RunResult(state.text, state, trace, config, new_context)


def _start(dm, turn, images, context, knobs, resume):
    """The cache and generator a run starts from: fresh (prefilled with the turn) or the resumed run's."""
    if resume is not None:
        return fork_cache(resume.cache), resume.generator(input_device(dm.model))
    cache = context.fork_for(dm) if context is not None else new_cache(dm.model)
    if turn:
        encode_ids(dm.model, cache, turn, images)
    return cache, make_generator(knobs.seed, input_device(dm.model))


def read_state(dm: DGemmaModel, raw_ids: list[int], trace: CanvasTrace) -> CanvasState:
    opened, closed = dm.channel_ids or (-1, -1)
    cut = excise(raw_ids, opened, closed, dm.eos_ids)
    text = dm.tokenizer.decode(list(cut.answer), skip_special_tokens=True).strip()
    accepted = trace.accepted
    last_of_block = np.flatnonzero(np.diff(np.append(trace.blocks, -1)) != 0)
    converged = all(stopped or bool(accepted[i].all())
                    for stopped, i in zip(trace.block_stopped_early, last_of_block))
    return CanvasState(
        text=text, raw_ids=tuple(raw_ids), answer_ids=cut.answer, thought=thought_text(dm.tokenizer, cut.thoughts),
        turn_closed=cut.turn_closed, answer_tokens=len(cut.answer), stray_thought_delimiter=cut.stray_delimiter,
        converged=converged, committed_fraction=float(accepted[-1].mean()) if len(trace) else 0.0,
        steps_used=len(trace), blocks=trace.num_blocks, run_id=trace.run_id)
