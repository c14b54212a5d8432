"""DGemmaSampler and DGemmaDenoise: one engine run, with live events, progress and Cancel."""

from __future__ import annotations

from ..dgemma.backend import backend_of, constraint_options
from ..dgemma.images import Asked, render_images
from ..dgemma.knobs import knobs_from
from ..dgemma.loop import num_blocks
from ..dgemma.schedulers import Scheduling
from ..dgemma.tokens import frame_texts
from ..dgemma.vision import image_record
from . import host, memory
from .events import DONE, START, STEP, StepStream
from .schema import (
    CATEGORY,
    KV_CACHE,
    RESUME_HINTS,
    SAMPLER_OUTPUTS,
    comfy_hints,
    constraint_inputs,
    constraint_of,
    context_input,
    image_input,
    knob_inputs,
    model_input,
    output_spec,
)

PROMPT_TOOLTIP = "The user turn; it is rendered through the model's own chat template."
TURN_TOOLTIP = ("The TURN: chat-templated and prefilled onto kv_cache before decoding. Leave it empty with "
                "a kv_cache wired for pure injection (the cache alone conditions the canvas).")


class LiveRun:
    """What one node's run shows in ComfyUI: the live view's events, the progress bar and text."""

    def __init__(self, node_id, model, knobs, advanced, prompt: str = "", image=None):
        self.model, self.resume = model, advanced.resume if advanced is not None else None
        blocks = num_blocks(knobs.gen_length, model.canvas_length)
        self.steps = (advanced.scheduling if advanced is not None else Scheduling()).steps(knobs)
        self.total = blocks * self.steps
        self.stream = StepStream(str(node_id) if node_id is not None else "", blocks, self.steps,
                                 model.canvas_length, model.token_strings)
        self.bar, self.note = host.Progress(self.total, node_id), host.ProgressText(node_id)
        self.live = host.live()
        self.prompt, self.image = prompt, image

    def start(self) -> None:
        if self.live:
            thumb = image_record(self.image)["thumbnail"] if self.image is not None else None
            host.send(START, self.stream.start(self.resume.recorded if self.resume is not None else None,
                                               {"prompt": self.prompt, "thumbnail": thumb}))

    def frame(self, frame) -> None:
        if self.live:
            split = getattr(self.model, "placement_note", "")  # a remote model has no local placement
            self.note.show(self.stream.progress_text(frame) + (f"\n{split}" if split else ""))
            host.send(STEP, self.stream.step(frame))
        self.bar.to(frame.block * self.steps + frame.step + 1)

    def failed(self, err: BaseException) -> None:
        if self.live:
            ended = self.stream.failed(err)
            self.note.show(f"{ended['status']} after {ended['steps_used']} steps", force=True)
            host.send(DONE, ended)

    def done(self, result) -> None:
        self.bar.to(self.total)
        if self.live:
            state = result.state
            self.note.show(self.stream.done_text(state.steps_used, result.text, state.paused), force=True)
            host.send(DONE, self.stream.done(state.steps_used, result.text, state.paused))


def run_node(node_id, model, prompt, kv_cache=None, advance=False, advanced=None, image=None, constraint=None,
             **knobs):
    """Run the engine for a node and shape its outputs; events and progress go to ComfyUI."""
    engine = backend_of(model)  # this process's engine, or a remote model's server
    resuming = advanced is not None and advanced.resume is not None
    with comfy_hints(RESUME_HINTS if resuming else None):  # a resume's refusals carry this node's fix
        knobs = knobs_from(knobs, every=True)  # a node's inputs: a missing knob is never a default
        engine.check(model, prompt, knobs, kv_cache, image, advanced)  # before the view resets: a refusal leaves it
        options = constraint_options(model, constraint, knobs.gen_length)
    view = LiveRun(node_id, model, knobs, advanced, prompt, image)
    with memory.running(model, node_id) as lease:
        view.start()
        try:
            with comfy_hints():
                result = engine.run(model, prompt, knobs, context=kv_cache, image=image, on_frame=view.frame,
                                    should_cancel=host.check_interrupt, advance_context=advance, advanced=advanced,
                                    **options)
        except BaseException as err:
            view.failed(err)
            raise
        if result.state.paused:
            lease.keep()  # a paused canvas keeps the model where it is for the node that resumes it
    view.done(result)
    outputs = (result.text, result.state, result.trace, frame_texts(result.trace, model.token_strings),
               render_images(result.trace, model.token_strings, Asked.of(prompt, result.config.image)), result.config)
    return outputs + ((result.context,) if advance else ())


class DGemmaSampler:
    CATEGORY = CATEGORY
    FUNCTION = "sample"
    RETURN_TYPES, RETURN_NAMES, OUTPUT_TOOLTIPS, OUTPUT_IS_LIST = output_spec(SAMPLER_OUTPUTS)
    DESCRIPTION = ("Generates an answer by block diffusion and records every step: the canvas starts as uniform "
                   "noise and the lowest-entropy positions are committed step by step. The node paints the canvas "
                   "live; frames and images replay it, canvas_trace feeds DGemmaTrace and DGemmaRunLogWriter. "
                   "An optional image is read by the encoder with the turn. For context from a KV cache use "
                   "DGemmaDenoise.")

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {"model": model_input(),
                         "prompt": ("STRING", {"multiline": True, "default": "", "tooltip": PROMPT_TOOLTIP}),
                         **knob_inputs()},
            "optional": {"image": image_input()},
            "hidden": {"unique_id": "UNIQUE_ID"},
        }

    def sample(self, model, prompt, image=None, unique_id=None, **knobs):
        return run_node(unique_id, model, prompt, image=image, **knobs)


DENOISE_OUTPUTS = SAMPLER_OUTPUTS + (
    (KV_CACHE, "kv_cache", "The context advanced by this run: kv_cache + turn + every generated block (the input "
                           "is unchanged).", False),)


class DGemmaDenoise(DGemmaSampler):
    FUNCTION = "denoise"
    RETURN_TYPES, RETURN_NAMES, OUTPUT_TOOLTIPS, OUTPUT_IS_LIST = output_spec(DENOISE_OUTPUTS)
    DESCRIPTION = ("DGemmaSampler with an optional kv_cache from DGemmaEncode. prompt is the TURN, kv_cache is "
                   "CONTEXT: both wired is a composed run (the turn is prefilled after the context), an empty "
                   "prompt is pure injection, no cache is exactly the Sampler. Works for any gen_length; the "
                   "cache is never modified, so it gives the same result every time it is reused.")

    @classmethod
    def INPUT_TYPES(cls):
        spec = super().INPUT_TYPES()
        spec["required"]["prompt"] = ("STRING", {"multiline": True, "default": "", "tooltip": TURN_TOOLTIP})
        spec["optional"] = {"kv_cache": context_input(), "image": image_input(), **constraint_inputs()}
        return spec

    def denoise(self, model, prompt, kv_cache=None, image=None, unique_id=None, constraint_type=None,
                constraint=None, **knobs):
        return run_node(unique_id, model, prompt, kv_cache=kv_cache, advance=True, image=image,
                        constraint=constraint_of(constraint_type, constraint), **knobs)
