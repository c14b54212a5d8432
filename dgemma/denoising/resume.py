"""Advanced runs: a window of the schedule, pins, a choice of scheduler, and resuming a paused run.

A `Resume` is everything exact continuation needs (the unfinished canvas, the self-conditioning
logits, the generator's state, the cache, block and step, the adaptive stop's state, the
scheduler's own state, the steps recorded so far). It lives in memory only: the run log never
writes it. At the real vocabulary the self-conditioning logits alone are canvas x vocab (256 x
262,144, about 134 MB in bf16).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import InputError
from ..inputs.knobs import Knobs, KnobSpec, canvas_positions, check_knob
from ..inputs.pins import Pins
from ..inputs.pins import parse as parse_pins
from ..inputs.vision import image_record
from ..readouts.trace import Recorded
from ..steps.schedulers import Scheduling
from .loop import LoopPlan, Pause

AUTO = -1  # start_step: where the wired canvas_state paused, else 0

WINDOW_KNOBS: dict[str, KnobSpec] = {
    "start_step": KnobSpec(
        int, AUTO, AUTO, 1024, 1,
        "Step (0-based) at which this node enters the schedule of its first block; later blocks start at 0. "
        "-1 (auto): where the wired canvas_state paused, else 0. A fresh canvas starts from noise there; with "
        "canvas_state it must be the step where that run paused."),
    "end_step": KnobSpec(
        int, 1024, 1, 1024, 1,
        "Step (exclusive) at which the node pauses, in whichever block reaches it first, and hands on a resumable "
        "canvas_state; at or past num_inference_steps it runs to the end."),
}
RESUMED_FIXED = ("gen_length", "num_inference_steps", "thinking")  # they shape the run; the rest may change


@dataclass(frozen=True, eq=False)
class Resume:
    """Where an advanced run stopped (or that it finished), in memory only; never mutated."""

    model: object
    prompt: str
    context: object
    knobs: Knobs
    scheduler: str
    recorded: Recorded               # the steps so far
    ids: torch.Tensor                # (1, n) the blocks so far, the unfinished canvas last
    paused: Pause | None = None      # the loop's pause point; None when the run finished
    cache: object = None
    generator_state: torch.Tensor | None = None
    image: dict | None = None        # the turn's image record (count, sizes, content hash); None: no image

    def __repr__(self) -> str:
        """A line, never the model's printout or the tensors."""
        where = "finished" if self.paused is None else \
            f"paused at block {self.paused.block + 1} step {self.paused.step}"
        return f"Resume({self.scheduler}, {where}, {len(self.recorded.rows)} steps recorded)"

    @property
    def finished(self) -> bool:
        return self.paused is None

    @property
    def paused_step(self) -> int:
        return self.paused.step if self.paused is not None else 0

    @property
    def nbytes(self) -> int:
        """Bytes of the tensors held for exact continuation (the cache not counted)."""
        held = [t for t in (self.ids, self.generator_state) if isinstance(t, torch.Tensor)]
        return sum(t.numel() * t.element_size() for t in held) + (self.paused.nbytes if self.paused else 0)

    def generator(self, device) -> torch.Generator:
        g = torch.Generator(device=device)
        g.set_state(self.generator_state.clone())
        return g


def resolve_start(start_step, resume) -> int:
    """start_step with auto resolved: where the resumed run paused, else 0."""
    if start_step != AUTO:
        return start_step
    return resume.paused_step if resume is not None else 0


def check_window(start_step, end_step) -> None:
    """The window's own checks, which need no model: each step in range, start below end."""
    for name, value in (("start_step", start_step), ("end_step", end_step)):
        check_knob(name, value, WINDOW_KNOBS)
    check_window_order(start_step, end_step)


def check_window_order(start_step: int, end_step: int) -> None:
    if start_step >= end_step:
        raise InputError("start_step", f"start_step {start_step} must be below end_step {end_step}; the window "
                                       "[start_step, end_step) would run no step")


def window_plan(dm, knobs: Knobs, scheduling, start_step: int, end_step: int, pins: Pins | None,
                resume: Resume | None) -> LoopPlan:
    """Check the window against the scheduler's steps (and a resumed run's pause) and build the plan."""
    if not isinstance(scheduling, Scheduling):
        raise InputError("scheduler", f"scheduler must be a Scheduling, got {type(scheduling).__name__}")
    check_window(start_step, end_step)
    steps = scheduling.steps(knobs)
    if start_step >= steps:
        raise InputError("start_step", f"start_step {start_step} is past the last step of the schedule "
                                       f"({steps} steps per block); set it below {steps}")
    at = None if resume is None else resume.paused
    if at is not None and start_step != at.step:
        raise InputError("start_step", f"canvas_state paused at step {at.step} of block {at.block + 1}, but "
                                       f"start_step is {start_step}; set start_step to {at.step} to continue it")
    return LoopPlan(scheduling=scheduling, start=start_step, end=end_step if end_step < steps else None, pins=pins,
                resume=None if resume is None else resume.paused)


def check_continues(resume, model, prompt: str, context) -> None:
    """A resumed run continues its own turn: the same model, prompt and context (local or remote)."""
    if resume.model is not model:
        raise InputError("canvas_state", "canvas_state comes from a run on another model; wire the same model "
                                         "into both samplers")
    if resume.prompt != prompt:
        raise InputError("prompt", f"prompt differs from the resumed run's ({resume.prompt[:60]!r}); a resumed "
                                   "run continues its own prompt, so give the same prompt")
    if resume.context is not context:
        raise InputError("context", "the KV context differs from the resumed run's; wire the same kv_cache "
                                    "(or none) into both samplers")


def check_resume(resume, dm, prompt: str, knobs: Knobs, context, scheduling: Scheduling, image=None) -> None:
    """Refuse a canvas_state that cannot continue into this run, naming what differs and the fix."""
    if not isinstance(resume, Resume):
        raise InputError("canvas_state", f"canvas_state must be the canvas_state of a DGemmaSamplerAdvanced run, "
                                         f"got {type(resume).__name__}; wire it from an advanced sampler")
    check_continues(resume, dm.model, prompt, context)
    _check_image(resume.image, image)
    for name in RESUMED_FIXED:
        was, now = getattr(resume.knobs, name), getattr(knobs, name)
        if was != now:
            raise InputError(name, f"{name} is {now!r} but the resumed run used {was!r}; it shapes the whole run, "
                                   f"so set it to {was!r}")
    if resume.scheduler != scheduling.name:
        raise InputError("scheduler", f"scheduler is {scheduling.name!r} but the resumed run used "
                                      f"{resume.scheduler!r}; set it to {resume.scheduler!r}")


def _check_image(was: dict | None, image) -> None:
    """A resumed run continues its own turn: the image it read (or its lack of one) cannot change."""
    now = image_record(image)
    if was is not None and now is None:
        raise InputError("image", "the resumed run read an image, but image is unwired here; wire the same image "
                                  "into both samplers")
    if was is None and now is not None:
        raise InputError("image", "the resumed run had no image, but one is wired here; unwire image (a resumed "
                                  "run continues its own turn)")
    if was != now:
        raise InputError("image", f"image differs from the resumed run's ({now['sha256']} against "
                                  f"{was['sha256']}); a resumed run continues its own turn, so wire the same image")


@dataclass(frozen=True, eq=False)
class Advanced:
    """What an advanced run asks for beyond the knobs: scheduler, window, pins, and a run to resume."""

    scheduling: Scheduling = Scheduling()
    start_step: int = AUTO
    end_step: int = WINDOW_KNOBS["end_step"].default
    pins: str = ""
    resume: Resume | None = None

    def plan(self, dm, knobs: Knobs) -> LoopPlan:
        """The loop's plan; refuses a bad window or bad pins (no model work is done here)."""
        pins = parse_pins(dm, self.pins, canvas_positions(knobs.gen_length, dm.canvas_length))
        return window_plan(dm, knobs, self.scheduling, self.start, self.end_step, pins, self.resume)

    @property
    def start(self) -> int:
        return resolve_start(self.start_step, self.resume)

    def knob_set(self, knobs: Knobs) -> dict:
        """The knobs in force in this window, the scheduler's own included."""
        s = self.scheduling
        return {**knobs.asdict(), "scheduler": s.name, **dict(s.settings),
                "start_step": self.start, "end_step": self.end_step, "pins": self.pins}

    def record(self) -> dict:
        """What a run config keeps to repeat this: scheduler and its knobs, window, pins, the run resumed."""
        at = None if self.resume is None else self.resume.paused
        origin = None if self.resume is None else {"block": at and at.block, "step": at and at.step}
        return {**dict(self.scheduling.settings), "scheduler": self.scheduling.name, "start_step": self.start,
                "end_step": self.end_step, "pins": self.pins, "resumed_from": origin}


def check_advanced(dm, prompt: str, knobs: Knobs, context, advanced, image=None) -> LoopPlan:
    """Every check of an advanced run that needs no model work (after `run.check_inputs`); its plan."""
    if not isinstance(advanced, Advanced):
        raise InputError("advanced", f"advanced must be an Advanced, got {type(advanced).__name__}")
    if advanced.resume is not None:
        check_resume(advanced.resume, dm, prompt, knobs, context, advanced.scheduling, image)
    return advanced.plan(dm, knobs)
