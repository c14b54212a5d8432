"""DGemmaSampler and DGemmaDenoise: one engine run, with live events, progress and Cancel."""

from __future__ import annotations

from ..dgemma.images import render_images
from ..dgemma.knobs import knobs_from
from ..dgemma.loop import num_blocks
from ..dgemma.resume import check_advanced
from ..dgemma.run import check_inputs, generate
from ..dgemma.tokens import frame_texts
from . import host
from .events import DONE, START, STEP, StepStream
from .schema import (
    CATEGORY,
    KV_CACHE,
    SAMPLER_OUTPUTS,
    comfy_hints,
    context_input,
    image_input,
    knob_inputs,
    model_input,
    output_spec,
    validate_knobs,
)

PROMPT_TOOLTIP = "The user turn; it is rendered through the model's own chat template."
TURN_TOOLTIP = ("The TURN: chat-templated and prefilled onto kv_cache before decoding. Leave it empty with "
                "a kv_cache wired for pure injection (the cache alone conditions the canvas).")


def run_node(node_id, model, prompt, kv_cache=None, advance=False, advanced=None, image=None, **knobs):
    """Run the engine for a node and shape its outputs; events and progress go to ComfyUI."""
    with comfy_hints():
        knobs = knobs_from(knobs)
        check_inputs(model, prompt, knobs, kv_cache, image)  # before the view resets: a refusal leaves it as it was
        if advanced is not None:
            check_advanced(model, prompt, knobs, kv_cache, advanced)
    blocks, steps = num_blocks(knobs.gen_length, model.canvas_length), knobs.num_inference_steps
    stream = StepStream(str(node_id) if node_id is not None else "", blocks, steps, model.canvas_length,
                        model.token_strings)
    bar = host.Progress(blocks * steps, node_id)
    note = host.ProgressText(node_id)
    host.model_ready(model)
    live = host.live()
    if live:
        resumed = advanced.resume if advanced is not None else None
        host.send(START, stream.start(resumed.recorded if resumed is not None else None))

    def on_frame(frame):
        if live:
            note.show(stream.progress_text(frame))
            host.send(STEP, stream.step(frame))
        bar.to(frame.block * steps + frame.step + 1)

    try:
        with comfy_hints():
            result = generate(model, prompt, knobs, context=kv_cache, image=image, on_frame=on_frame,
                              should_cancel=host.check_interrupt, advance_context=advance, advanced=advanced)
    except BaseException as err:
        if live:
            ended = stream.failed(err)
            note.show(f"{ended['status']} after {ended['steps_used']} steps", force=True)
            host.send(DONE, ended)
        host.run_finished(model, node_id, failed=True)
        raise
    if not result.state.paused:  # a paused canvas keeps the model where it is for the node that resumes it
        host.run_finished(model, node_id)
    bar.to(blocks * steps)
    if live:
        state = result.state
        note.show(stream.done_text(state.steps_used, result.text, state.paused), force=True)
        host.send(DONE, stream.done(state.steps_used, result.text, state.paused))
    outputs = (result.text, result.state, result.trace, frame_texts(result.trace, model.token_strings),
               render_images(result.trace, model.token_strings), result.config)
    return outputs + ((result.context,) if advance else ())


class DGemmaSampler:
    CATEGORY = CATEGORY
    FUNCTION = "sample"
    RETURN_TYPES, RETURN_NAMES, OUTPUT_TOOLTIPS, OUTPUT_IS_LIST = output_spec(SAMPLER_OUTPUTS)
    DESCRIPTION = ("Generates an answer by block diffusion and records every step: the canvas starts as uniform "
                   "noise and the lowest-entropy positions are accepted step by step. The node paints the canvas "
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

    @classmethod
    def VALIDATE_INPUTS(cls, **inputs):
        return validate_knobs(inputs)

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
        spec["optional"] = {"kv_cache": context_input(), "image": image_input()}
        return spec

    def denoise(self, model, prompt, kv_cache=None, image=None, unique_id=None, **knobs):
        return run_node(unique_id, model, prompt, kv_cache=kv_cache, advance=True, image=image, **knobs)
