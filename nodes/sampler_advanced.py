"""DGemmaSamplerAdvanced: a choice of scheduler, a window of the schedule, pins, and a resumable canvas_state."""

from __future__ import annotations

from ..dgemma.denoising.resume import WINDOW_KNOBS, Advanced
from ..dgemma.errors import InputError
from ..dgemma.inputs.pins import check_shape
from ..dgemma.payloads import CanvasState
from ..dgemma.steps.schedulers import SCHEDULER_KNOBS, SCHEDULERS, Scheduling, applies, default, scheduler_tooltip
from .sampler import (
    MAX_BATCH,
    SAMPLER_OUTPUTS,
    TURN_TOOLTIP,
    Call,
    DGemmaSampler,
    check_call,
    constraint_and_knobs,
    run_list,
)
from .schema import (
    CANVAS_STATE,
    RESUME_HINTS,
    comfy_hints,
    constraint_inputs,
    constraint_of,
    context_input,
    image_input,
    knob_inputs,
    widget_values,
)

PINS_TOOLTIP = ("Text held in place on the canvas (shown pinned). A template pins its text at the start of the "
                "answer, each blank (___, or ___{n} for n positions) left to the model, e.g. 'The answer is ___.'; "
                "a line '12: text' pins text from answer position 12. \\n is a newline. Empty: no pins.")
STATE_IN_TOOLTIP = ("Resume exactly where an earlier DGemmaSamplerAdvanced stopped (its end_step): same model, "
                    "prompt, kv_cache, gen_length, num_inference_steps, thinking and scheduler; the other knobs may "
                    "change. seed is not used: the resumed run's generator continues.")
STATE_OUT_TOOLTIP = ("Honesty readout, plus (in memory only, never in the run log) what resuming needs: canvas, "
                     "self-conditioning logits (canvas x vocab: about 134 MB in bf16 at the real vocabulary), "
                     "generator, cache, block and step. paused is true when the node stopped at end_step.")

ADVANCED_OUTPUTS = tuple(row._replace(tooltip=STATE_OUT_TOOLTIP) if row.name == "canvas_state" else row
                         for row in SAMPLER_OUTPUTS)


def resume_of(canvas_state):
    """The resume data a wired canvas_state carries; a plain Sampler's state has none and is refused."""
    if canvas_state is None:
        return None
    if isinstance(canvas_state, CanvasState) and canvas_state.resume is None:
        raise InputError("canvas_state", "canvas_state comes from a DGemmaSampler or DGemmaDenoise, which keep no "
                                         "resume data; wire the canvas_state of a DGemmaSamplerAdvanced")
    return canvas_state.resume if isinstance(canvas_state, CanvasState) else canvas_state


class DGemmaSamplerAdvanced(DGemmaSampler):
    FUNCTION = "sample_advanced"
    OUTPUTS = ADVANCED_OUTPUTS
    DESCRIPTION = ("The Sampler with a choice of scheduler, a window [start_step, end_step) of the schedule (like "
                   "KSamplerAdvanced: it enters the first block at start_step, pauses at end_step), pins that "
                   "hold text in place (infilling), and a canvas_state that the next Advanced sampler resumes "
                   "exactly: two chained windows give the same tokens, frames and steps as one run. Knobs may "
                   "change between windows; each frame records them.")

    @classmethod
    def INPUT_TYPES(cls):
        spec = super().INPUT_TYPES()
        spec["required"]["prompt"] = ("STRING", {"multiline": True, "default": "", "tooltip": TURN_TOOLTIP})
        spec["required"].update({
            "scheduler": (list(SCHEDULERS), {"default": default().name, "tooltip": scheduler_tooltip(),
                                             "dgemma_applies": applies()}),
            **knob_inputs(WINDOW_KNOBS),
            "pins": ("STRING", {"multiline": True, "default": "", "tooltip": PINS_TOOLTIP}),
        })
        spec["optional"] = {
            "kv_cache": context_input(),
            "canvas_state": (CANVAS_STATE, {"tooltip": STATE_IN_TOOLTIP}),
            "image": image_input(),
            **knob_inputs(SCHEDULER_KNOBS),
            **constraint_inputs(),
            "max_batch": MAX_BATCH,
        }
        return spec

    @classmethod
    def queue_refusal(cls, inputs: dict) -> str | None:
        """The pins' shape, the constraint and the knob rules ComfyUI cannot check, before any node of the prompt
        runs (the window is checked at run start)."""
        try:
            for text in widget_values(inputs.get("pins")):
                if text is not None:
                    check_shape(text)
        except InputError as err:
            return str(err)
        return constraint_and_knobs(inputs)

    def sample_advanced(self, unique_id=None, **inputs):
        return run_list(self, unique_id, inputs)

    def item_call(self, model, prompt, scheduler, start_step, end_step, pins, kv_cache=None, canvas_state=None,
                  image=None, constraint_type=None, constraint=None, **knobs) -> Call:
        own = {k: knobs.pop(k) for k in list(knobs) if k in SCHEDULER_KNOBS}
        with comfy_hints(RESUME_HINTS):
            resume = resume_of(canvas_state)
        with comfy_hints():
            advanced = Advanced(Scheduling(scheduler, **own), start_step, end_step, pins, resume)
            rule = constraint_of(constraint_type, constraint)
        return check_call(model, prompt, kv_cache=kv_cache, advanced=advanced, image=image, constraint=rule, **knobs)
