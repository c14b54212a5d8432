"""The three diffusers schedulers for DiffusionGemma, driven exactly as DiffusionGemmaPipeline drives them.

`Scheduling` is the choice and its own knobs (one table, `SCHEDULER_KNOBS`); `Stepper` runs one
step of a block and reports the scheduler's real committed mask: EntropyBound's accepted mask,
BlockRefinement's committed set, and for DiscreteDDIM (which commits nothing) the positions that
hold its predicted clean token after the step. EntropyBound also reports the per-position entropy
it accepted by, so the capture need not compute it again over the vocabulary.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from .errors import InputError
from .knobs import Knobs, KnobSpec, check_knob
from .patches import step_with_entropy

SCHEDULERS = ("entropy_bound", "block_refinement", "discrete_ddim")
DIFFUSERS_NAMES = {"entropy_bound": "EntropyBoundScheduler", "block_refinement": "BlockRefinementScheduler",
                   "discrete_ddim": "DiscreteDDIMScheduler"}

SCHEDULER_KNOBS: dict[str, KnobSpec] = {
    "temperature": KnobSpec(
        float, 0.0, 0.0, 2.0, 0.01,
        "block_refinement and discrete_ddim: sampling temperature (softmax divisor; 0 takes the argmax). "
        "entropy_bound ignores it and anneals t_max -> t_min."),
    "threshold": KnobSpec(
        float, 0.95, 0.0, 1.0, 0.01,
        "block_refinement: a position whose sampled token has probability above this is committed at once "
        "(beyond the even share of the canvas committed each step)."),
    "editing_threshold": KnobSpec(
        float, 0.0, 0.0, 1.0, 0.01,
        "block_refinement: a committed token is replaced when the model samples another with probability above "
        "this; 0 never edits."),
    "corrector_steps": KnobSpec(
        int, 0, 0, 16, 1,
        "discrete_ddim: Gibbs corrector sweeps after each early predictor step, folded into num_inference_steps "
        "(a count; 0 is plain ancestral DDIM)."),
    "corrector_k": KnobSpec(
        int, 1, 1, 1024, 1,
        "discrete_ddim: positions resampled per corrector sweep (a count)."),
}
USES = {"entropy_bound": ("t_min", "t_max", "entropy_bound"),
        "block_refinement": ("temperature", "threshold", "editing_threshold"),
        "discrete_ddim": ("temperature", "corrector_steps", "corrector_k")}


@dataclass(frozen=True)
class Scheduling:
    """Which scheduler runs the steps, and its own knobs (validated on construction)."""

    name: str = "entropy_bound"
    temperature: float = 0.0
    threshold: float = 0.95
    editing_threshold: float = 0.0
    corrector_steps: int = 0
    corrector_k: int = 1

    def __post_init__(self):
        if self.name not in SCHEDULERS:
            raise InputError("scheduler", f"scheduler must be one of {', '.join(SCHEDULERS)}, got {self.name!r}")
        for knob in SCHEDULER_KNOBS:
            check_knob(knob, getattr(self, knob), SCHEDULER_KNOBS)

    @property
    def diffusers_name(self) -> str:
        return DIFFUSERS_NAMES[self.name]

    def config(self, knobs: Knobs) -> dict:
        """The knobs this scheduler reads, for the run log's header."""
        values = {**asdict(self), **knobs.asdict()}
        return {"num_inference_steps": knobs.num_inference_steps, **{k: values[k] for k in USES[self.name]}}


def budget(n_steps: int, corrector_steps: int) -> tuple[int, int]:
    """(predictor steps, corrected steps): correctors fold into the per-block budget, as the pipeline does."""
    if corrector_steps <= 0:
        return n_steps, 0
    corrected = (n_steps - 1) // (1 + corrector_steps)
    return n_steps - corrected * corrector_steps, corrected


class Stepper:
    """One scheduler for one run: `step` advances a block's canvas by one predictor step."""

    def __init__(self, scheduling: Scheduling, knobs: Knobs, canvas_length: int, device):
        import diffusers

        self.s, self.knobs = scheduling, knobs
        n = knobs.num_inference_steps
        if scheduling.name == "entropy_bound":
            self.impl = diffusers.EntropyBoundScheduler(entropy_bound=knobs.entropy_bound, t_max=knobs.t_max,
                                                        t_min=knobs.t_min, num_inference_steps=n)
            self.steps, self.corrected = n, 0
            self.impl.set_timesteps(n, device=device)
            return
        if scheduling.name == "block_refinement":
            self.impl = diffusers.BlockRefinementScheduler(
                block_length=canvas_length, num_inference_steps=n, threshold=scheduling.threshold,
                editing_threshold=scheduling.editing_threshold or None)
            self.steps, self.corrected = n, 0
            self.impl.set_timesteps(n, device=device, block_length=canvas_length)
            return
        self.impl = diffusers.DiscreteDDIMScheduler(num_inference_steps=n, corrector_steps=scheduling.corrector_steps,
                                                    corrector_k=scheduling.corrector_k)
        self.steps, self.corrected = budget(n, scheduling.corrector_steps)
        self.impl.set_timesteps(self.steps, device=device)

    def temperature(self, step: int) -> float:
        return self.knobs.temperature(step) if self.s.name == "entropy_bound" else self.s.temperature

    def position(self, step: int) -> float:
        return (self.steps - step) / self.steps

    def step(self, logits, step: int, canvas, generator, forward):
        """(canvas, committed mask, logits for self-conditioning, float entropy or None) after step `step`.

        The entropy (B, L) is EntropyBound's own, of those logits; the other schedulers give None.
        `forward(canvas, self_cond)` gives fresh logits, for DiscreteDDIM's corrector sweeps.
        """
        name = self.s.name
        if name == "entropy_bound":
            out, entropy = step_with_entropy(self.impl, logits, step, canvas, generator)
            return out.prev_sample, out.accepted_index, out.pred_logits, entropy.float()
        if name == "block_refinement":
            out = self.impl.step(logits, step, canvas, mask_token_id=None, temperature=self.s.temperature,
                                 generator=generator)
            return out.prev_sample, self.impl._committed.clone(), out.pred_logits, None
        out = self.impl.step(logits, step, canvas, temperature=self.s.temperature, generator=generator)
        canvas = out.prev_sample
        if step < self.corrected:
            for _ in range(self.s.corrector_steps):
                canvas = self.impl.step_correct(forward(canvas, out.pred_logits), step, canvas,
                                                generator=generator).prev_sample
        return canvas, canvas == out.sampled_tokens, out.pred_logits, None

    def state(self):
        """What the scheduler carries between steps of a block (BlockRefinement's committed set)."""
        committed = getattr(self.impl, "_committed", None)
        return None if committed is None else committed.clone()

    def restore(self, state) -> None:
        if state is not None and hasattr(self.impl, "_committed"):
            self.impl._committed = state.clone()
