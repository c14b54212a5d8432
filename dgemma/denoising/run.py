"""One run, start to end: validate, prefill the cache, run the block loop, read the result."""

from __future__ import annotations

import dataclasses
import functools
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from ..constraints.guide import Guide, GuidePlan, guide_for
from ..errors import InputError, short
from ..inputs.knobs import Knobs, canvas_positions, num_blocks
from ..inputs.pins import report as pin_report
from ..inputs.seeding import make_generator
from ..inputs.tokens import check_text, prompt_ids
from ..inputs.vision import check_image_tensor, check_vision, prepare_images
from ..loading.lora import applied
from ..payloads import CanvasState, DGemmaModel, RunConfig, check_model
from ..readouts.excision import excise, thought_text
from ..readouts.logprobs import MAX_TOP, Capture
from ..readouts.trace import CanvasTrace, Frame, Recorder
from ..steps.schedulers import steps_together
from .batch import BatchForward, fitting_batch, give_back_freed
from .cache import encode_ids, fork_cache, input_device, new_cache
from .context import KVCache, mint
from .loop import Lane, LoopPlan, drive
from .resume import Advanced, Resume, check_advanced
from .threads import with_compute_threads

MAX_TURN_TOKENS = 8192  # the turn is encoded in one forward; longer text belongs in a KV context


@dataclass(frozen=True)
class RunResult:
    """What `generate` returns: the answer, its honesty readout, every step, and the run's config."""

    text: str
    state: CanvasState
    trace: CanvasTrace
    config: RunConfig
    context: object | None = None  # the KVCache advanced by this run, when asked for
    logprobs: object | None = None  # logprobs.Logprobs of every generated position, when asked for


def check_inputs(dm, prompt, knobs, context, image=None) -> None:
    """Every check that needs no model work: types, emptiness, the cache's fit (the image: by `prepare`)."""
    check_model(dm)
    check_turn(prompt, knobs)
    if context is not None and not isinstance(context, KVCache):
        raise InputError("context", f"the KV context must be an encoded context, got {type(context).__name__}; "
                                    "encode one with encode_context")
    if context is None and image is None and not prompt.strip():
        raise InputError("prompt", "prompt is empty; type a prompt, or give an encoded KV context for a "
                                   "pure-injection run")
    if context is not None:
        context.check_model(dm)


def check_turn(prompt, knobs) -> None:
    """The prompt's text and the knobs' type: what every engine, local or remote, checks first."""
    check_text("prompt", prompt)
    if not isinstance(knobs, Knobs):
        raise InputError("knobs", f"knobs must be a Knobs, got {type(knobs).__name__}")


def turn_ids(dm, prompt: str, knobs: Knobs, context, images=None) -> list[int]:
    """The turn's ids, refused when it or the whole run exceeds what the model can take."""
    has_turn = bool(prompt.strip()) or images is not None
    turn = prompt_ids(dm, prompt, knobs.thinking, with_bos=context is None, images=images) if has_turn else []
    if len(turn) > MAX_TURN_TOKENS:
        raise InputError("prompt", f"prompt is {len(turn)} tokens, over the limit of {MAX_TURN_TOKENS} for a "
                                   "turn; shorten it, or encode the long part as a KV context")
    held = (context.length if context is not None else 0) + len(turn)
    total = held + canvas_positions(knobs.gen_length, dm.canvas_length)
    limit = dm.max_positions
    if total > limit:
        raise InputError("gen_length", f"gen_length {knobs.gen_length} after {held} tokens of context and turn "
                                       f"needs {total} positions, over the model's {limit}; lower gen_length "
                                       "or shorten the input")
    return turn


@dataclass(frozen=True, eq=False)
class Request:
    """A run checked once by `prepare`: its inputs, the turn's ids and images, and the loop's plan.

    It holds nothing a run changes (each run starts its own lane and guide), so it may run more than
    once. A plain run is a default Advanced run that records its knobs alone and keeps no resume data.
    """

    dm: DGemmaModel
    prompt: str
    knobs: Knobs
    context: KVCache | None
    advanced: Advanced
    plain: bool
    plan: LoopPlan
    turn: tuple[int, ...] = ()
    images: object = None  # vision.ImageInput of a fresh run's image
    advance_context: bool = False
    constraint: object = None  # the Constraint asked for, and its compiled plan (None: unconstrained)
    guide_plan: GuidePlan | None = None
    logprobs: int | None = None  # alternatives per position to capture with the log-probabilities (None: none)

    @property
    def resume(self) -> Resume | None:
        return self.advanced.resume

    @property
    def blocks(self) -> int:
        return num_blocks(self.knobs.gen_length, self.dm.canvas_length)

    @property
    def steps(self) -> int:
        """Predictor steps per block, as the chosen scheduler counts them."""
        return self.plan.scheduling.steps(self.knobs)


def prepare(dm: DGemmaModel, prompt: str, knobs: Knobs = Knobs(), *, context=None, image=None,
            advance_context: bool = False, advanced: Advanced | None = None, constraint=None,
            logprobs: int | None = None, should_cancel: Callable[[], bool] | None = None) -> Request:
    """Check every input once (model, text, image, context, knobs, window, pins, resume, constraint)
    before any model work. `logprobs` (0 to 5 alternatives) captures each position's log-probability;
    `should_cancel` stops a constraint's compile."""
    check_inputs(dm, prompt, knobs, context, image)
    plain = advanced is None
    advanced = Advanced() if plain else advanced
    resume = advanced.resume
    check_logprobs(logprobs, resume)
    if image is not None and resume is not None:
        check_image_tensor("image", image)
        check_vision("image", dm)
    plan = check_advanced(dm, prompt, knobs, context, advanced, image)
    guided = guide_for(dm, constraint, knobs.gen_length, should_cancel)
    images = prepare_images(dm, image) if image is not None and resume is None else None
    turn = tuple(turn_ids(dm, prompt, knobs, context, images)) if resume is None else ()
    return Request(dm, prompt, knobs, context, advanced, plain, plan, turn, images, advance_context,
                   constraint, guided, logprobs)


def check_logprobs(top, resume) -> None:
    if top is None:
        return
    if isinstance(top, bool) or not isinstance(top, int) or not 0 <= top <= MAX_TOP:
        raise InputError("logprobs", f"logprobs must be a count of alternatives from 0 to {MAX_TOP}, got {top!r}")
    if resume is not None:
        raise InputError("logprobs", "a resumed run cannot give log-probabilities: the positions committed in the "
                                     "earlier window were not captured; ask for them in a run that starts fresh")


def generate(dm: DGemmaModel, prompt: str, knobs: Knobs = Knobs(), *, context=None, image=None,
             on_frame: Callable[[Frame], None] | None = None,
             should_cancel: Callable[[], bool] | None = None, advance_context: bool = False,
             advanced: Advanced | None = None, constraint=None, logprobs: int | None = None) -> RunResult:
    """Generate an answer to `prompt` (the turn), optionally on top of a KV `context`: `prepare`, then `run`.

    `image` (a ComfyUI IMAGE batch, [B, H, W, C] in 0..1) joins the turn as B images before the
    text; the encoder reads them, the canvas never holds them. The context is never modified: the
    run works on a fork. With `advance_context` the result carries a new context holding context +
    turn + every generated block. `advanced` picks the scheduler, window and pins, and may resume
    an earlier advanced run; its state is resumable. `constraint` (a `Constraint`) makes the answer
    satisfy a JSON Schema, regex or choice; `state.constraint` says whether it did. `logprobs` fills
    the result's `logprobs` (dgemma/readouts/logprobs.py).
    """
    request = prepare(dm, prompt, knobs, context=context, image=image, advance_context=advance_context,
                      advanced=advanced, constraint=constraint, logprobs=logprobs, should_cancel=should_cancel)
    return run(request, on_frame=on_frame, should_cancel=should_cancel)


@dataclass(frozen=True)
class Start:
    """Where the block loop starts: the cache and generator, or nothing left to run."""

    cache: object
    generator: torch.Generator | None


def fresh_start(req: Request) -> Start:
    """The context's fork (or a new cache) prefilled with the turn, and a generator from the seed."""
    cache = req.context.fork_for(req.dm) if req.context is not None else new_cache(req.dm.model)
    if req.turn:
        encode_ids(req.dm.model, cache, list(req.turn), req.images)
    return Start(cache, make_generator(req.knobs.seed, input_device(req.dm.model)))


def resumed_start(req: Request) -> Start:
    """The resumed run's cache (a fork) and generator; nothing to run when it had finished."""
    resume = req.resume
    if resume.finished:
        return Start(None, None)
    return Start(fork_cache(resume.cache), resume.generator(input_device(req.dm.model)))


def run(req: Request, *, on_frame: Callable[[Frame], None] | None = None,
        should_cancel: Callable[[], bool] | None = None) -> RunResult:
    """Run a prepared request to its end or its window's end."""
    report = None if on_frame is None else (lambda index, frame: on_frame(frame))
    return run_batch([req], on_frame=report, should_cancel=should_cancel)[0]


def run_watched(req: Request, watch: Callable[[object], None],
                on_frame: Callable[[Frame], None] | None = None) -> RunResult:
    """Run a prepared request alone, calling `watch(lane)` before each step's decoder forward: the lane's
    canvas and self-conditioning are then that step's input (the options' reads of a decision use them);
    `on_frame(frame)` reports each step."""
    with applied(req.dm):  # the payload's adapters, if any, in its forwards only
        item = _launch(req, on_frame)
        if item.lane is not None:
            _watched(req.dm.model, item.lane, watch)
    return _result(item)


@with_compute_threads
@torch.no_grad()
def _watched(model, lane: Lane, watch) -> None:
    while lane.ready():
        watch(lane)
        lane.advance(lane.decoder.logits(lane.canvas, lane.self_cond))


def run_batch(requests, *, on_frame: Callable[[int, Frame], None] | None = None,
              should_cancel: Callable[[], bool] | None = None, max_batch: int | None = None,
              on_settled: Callable[[int], None] | None = None) -> list[RunResult]:
    """Run prepared requests of one model together, at most `max_batch` at once (None: as many as fit in
    free memory): one decoder forward per step for every item still working, everything else (generator,
    scheduler, stop, pins, constraint, record) per item, so each result is its solo run's. An item that
    ends leaves the batch at once: its result is read, its cache freed, and the next item starts in its
    place, so a long list streams through in the memory of one batch.
    `on_frame(index, frame)` reports each step, `on_settled(index)` each item that finished or paused."""
    check_batch(requests, max_batch)
    size = max_batch or (fitting_batch(requests) if len(requests) > 1 else 1)
    results: list = [None] * len(requests)
    settled = [0]

    def settle(index: int, item: _Item) -> None:
        results[index] = _result(item)
        if item.lane is not None:
            item.lane.on_end = None  # nothing holds the lane after it leaves the batch
        settled[0] += 1
        if len(requests) > size and settled[0] % size == 0:  # a list streaming through its batch
            give_back_freed()
        if on_settled is not None:
            on_settled(index)

    def lanes():
        for index, req in enumerate(requests):
            item = _launch(req, None if on_frame is None else functools.partial(on_frame, index))
            if item.lane is None:  # a resumed run that had finished: nothing left to run
                settle(index, item)
                continue
            item.lane.on_end = functools.partial(settle, index, item)
            yield item.lane

    model = requests[0].dm.model
    forward = BatchForward(model) if size > 1 else None
    with applied(requests[0].dm):  # the payload's adapters, if any, in its forwards only (its lanes launch here)
        drive(model, lanes(), should_cancel, forward, size, steps_together if forward is not None else None)
    return results


def check_batch(requests, max_batch=None) -> None:
    """Prepared requests of one model, refused (naming the item) before any model work."""
    for index, req in enumerate(requests):
        if not isinstance(req, Request):
            raise InputError("requests", f"item {index} is a {type(req).__name__}, not a prepared Request; "
                                         "make each with prepare()")
        if req.dm is not requests[0].dm:
            raise InputError("model", f"item {index} uses another model than item 0; a batch runs on one "
                                      "model, so run each model's items apart")
    if max_batch is not None and (isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1):
        raise InputError("max_batch", f"max_batch must be a whole number of items of at least 1, got "
                                      f"{short(max_batch)}")


@dataclass(eq=False)
class _Item:
    """One run of a request under way, and all it changes: its scheduler adapter, recorder, start, guide
    (None: unconstrained) and lane (None: nothing to run)."""

    req: Request
    scheduler: object
    recorder: Recorder
    start: Start
    guide: Guide | None
    lane: Lane | None


def _launch(req: Request, on_frame) -> _Item:
    dm, knobs, resume, plan = req.dm, req.knobs, req.resume, req.plan
    scheduler = plan.scheduling.build(knobs, dm.canvas_length, input_device(dm.model))
    recorder = Recorder(knobs, dm.canvas_length, dm.token_strings, resumed=resume.recorded if resume else None,
                        clock=scheduler, knob_set=None if req.plain else req.advanced.knob_set(knobs))
    start = resumed_start(req) if resume is not None else fresh_start(req)
    guide = req.guide_plan.start() if req.guide_plan is not None else None
    lane = None if start.cache is None else Lane(
        dm.model, start.cache, knobs, start.generator, dm.eos_ids, recorder, on_frame,
        encode_last=req.advance_context, plan=plan, scheduler=scheduler, guide=guide,
        capture=None if req.logprobs is None else Capture(req.logprobs))
    return _Item(req, scheduler, recorder, start, guide, lane)


def _result(item: _Item) -> RunResult:
    req, scheduler, recorder, start = item.req, item.scheduler, item.recorder, item.start
    dm, knobs, resume = req.dm, req.knobs, req.resume
    sequence = resume.ids if item.lane is None else item.lane.sequence
    summary = req.context.summary() if req.context is not None else None
    run_id = uuid.uuid4().hex
    named = () if req.plain else (scheduler.diffusers_name, scheduler.config())
    trace = recorder.finish(context=summary, run_id=run_id, scheduler=named,
                            adapters=tuple((a.name, s) for a, s in dm.adapters))
    image_record = req.images.record if req.images is not None else resume.image if resume is not None else None
    state = _read_result(item, sequence, trace, recorder.snapshot(), image_record)
    config = RunConfig(prompt=req.prompt, knobs=knobs, context=summary, run_id=run_id, image=image_record,
                       advanced=None if req.plain else req.advanced.record(),
                       constraint=req.constraint.summary() if item.guide is not None else None,
                       model_defaults=dm.sampler_defaults, **dm.describe())
    captured = item.lane.capture.result() if item.lane is not None and item.lane.capture is not None else None
    return RunResult(state.text, state, trace, config, _advanced_context(req, start.cache, state, image_record),
                     captured)


def _read_result(item: _Item, sequence, trace, recorded, image_record) -> CanvasState:
    """The readout, with what a later window needs to resume it and the constraint's verdict."""
    req, start, guide = item.req, item.start, item.guide
    ids = sequence[0].tolist() if item.lane is None else item.lane.sequence_ids.tolist()  # a lane's: no wait
    state = read_state(req.dm, ids, trace, req.plan.pins)
    if not req.plain:
        paused = item.lane.paused if item.lane is not None else None
        keep = Resume(req.dm.model, req.prompt, req.context, req.knobs, req.plan.scheduling.name, recorded,
                      sequence, paused, start.cache if paused else None,
                      start.generator.get_state() if paused else None, image=image_record)
        state = dataclasses.replace(state, paused=paused is not None, resume=keep)
    if guide is not None:
        state = dataclasses.replace(state, text=guide.answer(state.text),
                                    constraint=guide.verdict(state.raw_ids, state.paused))
    return state


def _advanced_context(req: Request, cache, state: CanvasState, image_record):
    """The context grown by this run's turn and blocks, when asked for (never for a paused or resumed run)."""
    if not req.advance_context or state.paused or req.resume is not None:
        return None
    held, seen = list(req.turn) + list(state.raw_ids), (image_record,) if image_record else ()
    return req.context.advanced(cache, held, seen) if req.context is not None else mint(req.dm, cache, held, seen)


def read_state(dm: DGemmaModel, raw_ids: list[int], trace: CanvasTrace, pins=None) -> CanvasState:
    opened, closed = dm.channel_ids or (-1, -1)
    cut = excise(raw_ids, opened, closed, dm.eos_ids)
    end = next((i for i, t in enumerate(raw_ids) if t in dm.eos_ids), len(raw_ids))
    # The thought channel's delimiters are the model's writing; padding and end tokens are not.
    pinned = pin_report(pins, raw_ids, end, set(dm.tokenizer.all_special_ids) - set(dm.channel_ids or ()))
    text = dm.tokenizer.decode(list(cut.answer), skip_special_tokens=True).strip()
    committed = trace.committed
    last_of_block = np.flatnonzero(np.diff(np.append(trace.blocks, -1)) != 0)
    converged = all(stopped or bool(committed[i].all())
                    for stopped, i in zip(trace.block_stopped_early, last_of_block))
    return CanvasState(
        text=text, raw_ids=tuple(raw_ids), answer_ids=cut.answer, thought=thought_text(dm.tokenizer, cut.thoughts),
        turn_closed=cut.turn_closed, answer_tokens=len(cut.answer), stray_thought_delimiter=cut.stray_delimiter,
        converged=converged, committed_fraction=float(committed[-1].mean()) if len(trace) else 0.0,
        steps_used=len(trace), blocks=trace.num_blocks, run_id=trace.run_id, pins_applied=pinned.applied,
        pins_skipped=pinned.skipped, blanks_unfilled=pinned.blanks_unfilled)
