"""The diffusers schedulers for DiffusionGemma, one adapter class each, driven as DiffusionGemmaPipeline drives them.

An adapter is the one place that knows its scheduler: its own knobs (a table), the diffusers
class, how to build it, how many predictor steps a block runs, one step as a `StepOutput`, what it
carries between steps (for resuming), the temperature at a step, how the adaptive stop reads it,
and the config it reports, read back from the built scheduler. Defining a subclass with a `name`
registers it; `Scheduling` is the choice of one and its knob values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ..errors import InputError, short
from ..inputs.knobs import Knobs, KnobSpec, anneal, check_knob, schedule_position
from ..loading.patches import step_with_entropy
from . import batch_step, fastpath

REGISTRY: dict = {}         # name -> adapter class, in the order they were defined; the first is the default
SCHEDULERS = REGISTRY       # the names (iterate it, or test `in`)
SCHEDULER_KNOBS: dict[str, KnobSpec] = {}  # every adapter's own knobs, one table (a shared name shares its spec)

TEMPERATURE = KnobSpec(
    float, 0.0, 0.0, 2.0, 0.01,
    "block_refinement and discrete_ddim: sampling temperature (softmax divisor; 0 takes the argmax). "
    "entropy_bound ignores it and anneals t_max -> t_min.")
UNSCALED_STOP = ("its adaptive stop reads the entropy of the unscaled logits (T = 1), which rarely falls below the "
                 "default confidence of 0.005 nats, so its blocks run every scheduled step unless confidence is "
                 "raised")


@dataclass(frozen=True)
class StepOutput:
    """One predictor step: the canvas after it, what the scheduler holds committed, the logits for
    self-conditioning, and the per-position entropy it chose by (None when it has none)."""

    canvas: object
    committed: object
    pred_logits: object
    entropy: object = None


def register(cls) -> None:
    REGISTRY[cls.name] = cls
    _rebuild_knobs()


def unregister(name: str) -> None:
    REGISTRY.pop(name, None)
    _rebuild_knobs()


def _rebuild_knobs() -> None:
    SCHEDULER_KNOBS.clear()
    for cls in REGISTRY.values():
        SCHEDULER_KNOBS.update(cls.own_knobs)


class SchedulerAdapter:
    """One scheduler for one run. Subclasses set the class attributes and `build`/`step`."""

    name: ClassVar[str] = ""
    diffusers_name: ClassVar[str] = ""
    own_knobs: ClassVar[dict[str, KnobSpec]] = {}
    reads: ClassVar[tuple[str, ...]] = ()  # the sampler knobs it reads besides its own (for the run log)
    summary: ClassVar[str] = ""              # what it does, for the scheduler widget's tooltip
    stop_rule: ClassVar[str] = ""            # how the adaptive stop behaves with it, said plainly

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if cls.name:
            register(cls)

    def __init__(self, settings: dict, knobs: Knobs, canvas_length: int, device):
        self.settings, self.knobs = dict(settings), knobs
        self.steps = self.predictor_steps(knobs, settings)
        self.impl = self.build(canvas_length, device)

    @classmethod
    def predictor_steps(cls, knobs: Knobs, settings: dict) -> int:
        """Steps a block runs (the schedule's length): `num_inference_steps` unless the scheduler folds in others."""
        return knobs.num_inference_steps

    def build(self, canvas_length: int, device):
        raise NotImplementedError

    def step(self, logits, step: int, canvas, generator, forward) -> StepOutput:
        """Advance the canvas by step `step`; `forward(canvas, self_cond)` gives fresh logits when needed."""
        raise NotImplementedError

    def temperature(self, step: int) -> float:
        return self.settings["temperature"]

    def position(self, step: int) -> float:
        return schedule_position(self.steps, step)

    def state(self):
        """What the scheduler carries between steps of a block, for resuming (None: nothing)."""
        return None

    def restore(self, state) -> None:
        return None

    @classmethod
    def knob_config(cls, knobs: Knobs) -> dict:
        """The config a trace reports when its run recorded none (a plain run): what it reads, from the knobs."""
        return {"num_inference_steps": knobs.num_inference_steps, **{k: getattr(knobs, k) for k in cls.reads}}

    def config(self) -> dict:
        """The settings this run used, for the run log: read back from the built scheduler where it keeps them."""
        kept = getattr(self.impl, "config", {})
        values = {**self.knobs.asdict(), **self.settings}
        names = (*self.reads, *self.own_knobs)
        return {"num_inference_steps": self.knobs.num_inference_steps,
                **{k: kept[k] if k in kept and kept[k] is not None else values[k] for k in names}}


class EntropyBound(SchedulerAdapter):
    name = "entropy_bound"
    diffusers_name = "EntropyBoundScheduler"
    reads = ("t_min", "t_max", "entropy_bound")
    summary = "the released default: accepts the lowest-entropy positions within entropy_bound nats"
    stop_rule = "a block ends once its argmax is stable and the mean entropy of the scaled logits is below confidence"

    def build(self, canvas_length, device):
        import diffusers

        k = self.knobs
        impl = diffusers.EntropyBoundScheduler(entropy_bound=k.entropy_bound, t_max=k.t_max, t_min=k.t_min,
                                               num_inference_steps=self.steps)
        impl.set_timesteps(self.steps, device=device)
        return impl

    @classmethod
    def knob_config(cls, knobs):
        return {"entropy_bound": knobs.entropy_bound, "t_min": knobs.t_min, "t_max": knobs.t_max,
                "num_inference_steps": knobs.num_inference_steps}

    def temperature(self, step):
        """Annealed from t_max at the first step to t_min at the last, as the built scheduler's step does."""
        c = self.impl.config
        return anneal(c.t_min, c.t_max, self.position(step))

    def step(self, logits, step, canvas, generator, forward):
        if fastpath.on() and batch_step.applies(self.impl, logits.device):  # the same tokens, on the device, no wait
            return StepOutput(*batch_step.entropy_bound_rows([self.impl], [step], [generator], logits)[0])
        out, entropy = step_with_entropy(self.impl, logits, step, canvas, generator)
        return StepOutput(out.prev_sample, out.accepted_index, out.pred_logits, entropy.float())


class BlockRefinement(SchedulerAdapter):
    name = "block_refinement"
    diffusers_name = "BlockRefinementScheduler"
    own_knobs = {
        "temperature": TEMPERATURE,
        "threshold": KnobSpec(
            float, 0.95, 0.0, 1.0, 0.01,
            "block_refinement: a position whose sampled token has probability above this is committed at once "
            "(beyond the even share of the canvas committed each step)."),
        "editing_threshold": KnobSpec(
            float, 0.0, 0.0, 1.0, 0.01,
            "block_refinement: a committed token is replaced when the model samples another with probability "
            "above this; 0 never edits."),
    }
    summary = "commits the most confident share of the canvas each step, plus any above threshold"
    stop_rule = UNSCALED_STOP

    def build(self, canvas_length, device):
        import diffusers

        s = self.settings
        impl = diffusers.BlockRefinementScheduler(block_length=canvas_length, num_inference_steps=self.steps,
                                                  threshold=s["threshold"],
                                                  editing_threshold=s["editing_threshold"] or None)
        impl.set_timesteps(self.steps, device=device, block_length=canvas_length)
        return impl

    def step(self, logits, step, canvas, generator, forward):
        out = self.impl.step(logits, step, canvas, mask_token_id=None, temperature=self.settings["temperature"],
                             generator=generator)
        return StepOutput(out.prev_sample, self.impl._committed.clone(), out.pred_logits)

    def state(self):
        return self.impl._committed.clone()

    def restore(self, state):
        if state is not None:
            self.impl._committed = state.clone()


def budget(n_steps: int, corrector_steps: int) -> tuple[int, int]:
    """(predictor steps, corrected steps): correctors fold into the per-block budget, as the pipeline does."""
    if corrector_steps <= 0:
        return n_steps, 0
    corrected = (n_steps - 1) // (1 + corrector_steps)
    return n_steps - corrected * corrector_steps, corrected


class DiscreteDDIM(SchedulerAdapter):
    """Commits nothing of its own: `committed` is where the canvas holds its predicted clean token."""

    name = "discrete_ddim"
    diffusers_name = "DiscreteDDIMScheduler"
    own_knobs = {
        "temperature": TEMPERATURE,
        "corrector_steps": KnobSpec(
            int, 0, 0, 16, 1,
            "discrete_ddim: Gibbs corrector sweeps after each early predictor step, folded into "
            "num_inference_steps (a count; 0 is plain ancestral DDIM)."),
        "corrector_k": KnobSpec(
            int, 1, 1, 1024, 1,
            "discrete_ddim: positions resampled per corrector sweep (a count)."),
    }
    summary = "ancestral sampling of the uniform posterior, optional corrector sweeps"
    stop_rule = UNSCALED_STOP

    @classmethod
    def predictor_steps(cls, knobs, settings):
        return budget(knobs.num_inference_steps, settings["corrector_steps"])[0]

    def build(self, canvas_length, device):
        import diffusers

        s = self.settings
        impl = diffusers.DiscreteDDIMScheduler(num_inference_steps=self.knobs.num_inference_steps,
                                               corrector_steps=s["corrector_steps"], corrector_k=s["corrector_k"])
        impl.set_timesteps(self.steps, device=device)
        self.corrected = budget(self.knobs.num_inference_steps, s["corrector_steps"])[1]
        return impl

    def step(self, logits, step, canvas, generator, forward):
        out = self.impl.step(logits, step, canvas, temperature=self.settings["temperature"], generator=generator)
        canvas = out.prev_sample
        if step < self.corrected:
            for _ in range(self.settings["corrector_steps"]):
                canvas = self.impl.step_correct(forward(canvas, out.pred_logits), step, canvas,
                                                generator=generator).prev_sample
        return StepOutput(canvas, canvas == out.sampled_tokens, out.pred_logits)


def steps_together(lanes, logits) -> list:
    """Per lane its scheduler's step of its row of `logits` (B, L, V), taken together where the lanes'
    schedulers allow it (the fused entropy-bound step), else None (the lane steps alone)."""
    together = [r for r, lane in enumerate(lanes)
                if type(lane.stepper) is EntropyBound and batch_step.applies(lane.stepper.impl, lane.decoder.device)]
    outs: list = [None] * len(lanes)
    if len(together) > 1:
        group = [lanes[r] for r in together]
        rows = batch_step.entropy_bound_rows([lane.stepper.impl for lane in group], [lane.step for lane in group],
                                             [lane.generator for lane in group],
                                             (logits if len(together) == len(lanes) else logits[together])
                                             .to(group[0].decoder.device))
        for r, out in zip(together, rows):
            outs[r] = StepOutput(*out)
    return outs


def default() -> type[SchedulerAdapter]:
    """The scheduler a run that picks none runs: the first defined."""
    return next(iter(REGISTRY.values()))


@dataclass(frozen=True, init=False)
class Scheduling:
    """Which scheduler runs the steps, and the values of its own knobs (validated on construction).

    Knobs of other schedulers may be given (a node passes every widget): they are checked and dropped.
    """

    name: str
    settings: tuple  # ((knob, value), ...) of the chosen scheduler's own knobs, defaults filled in

    def __init__(self, name: str | None = None, **values):
        name = default().name if name is None else name
        if name not in REGISTRY:
            raise InputError("scheduler", f"scheduler must be one of {', '.join(REGISTRY)}, got {short(name)}")
        for knob, value in values.items():
            if knob not in SCHEDULER_KNOBS:
                raise InputError(knob, f"{short(knob)[1:-1]} is not a scheduler knob; the scheduler knobs are "
                                       f"{', '.join(SCHEDULER_KNOBS)}")
            check_knob(knob, value, SCHEDULER_KNOBS)
        own = REGISTRY[name].own_knobs
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "settings", tuple((k, values.get(k, spec.default)) for k, spec in own.items()))

    def __getattr__(self, knob):
        for k, v in object.__getattribute__(self, "settings"):
            if k == knob:
                return v
        raise AttributeError(knob)

    @property
    def adapter(self) -> type[SchedulerAdapter]:
        return REGISTRY[self.name]

    @property
    def diffusers_name(self) -> str:
        return self.adapter.diffusers_name

    def steps(self, knobs: Knobs) -> int:
        """Predictor steps per block with these knobs."""
        return self.adapter.predictor_steps(knobs, dict(self.settings))

    def build(self, knobs: Knobs, canvas_length: int, device) -> SchedulerAdapter:
        return self.adapter(dict(self.settings), knobs, canvas_length, device)


def scheduler_tooltip() -> str:
    """The scheduler widget's tooltip, from each adapter's own line."""
    return "Which diffusers scheduler runs the steps: " + "; ".join(
        f"{name} ({cls.summary}; {cls.stop_rule})" for name, cls in REGISTRY.items()) + "."


def applies() -> dict[str, list[str]]:
    """Per scheduler, the knobs it reads (the sampler's and its own): the widgets the Advanced node shows."""
    return {name: [*cls.reads, *cls.own_knobs] for name, cls in REGISTRY.items()}
