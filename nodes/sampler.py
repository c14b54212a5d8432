"""DGemmaSampler and DGemmaDenoise: one engine run, with live events, progress and Cancel."""

from __future__ import annotations

from ..dgemma.images import render_images
from ..dgemma.knobs import Knobs
from ..dgemma.loop import num_blocks
from ..dgemma.run import generate
from ..dgemma.tokens import frame_texts
from . import events, host
from .schema import CATEGORY, KV_CACHE, SAMPLER_OUTPUTS, knob_inputs, model_input

PROMPT_TOOLTIP = "The user turn; it is rendered through the model's own chat template."
TURN_TOOLTIP = ("The TURN: chat-templated and prefilled onto kv_cache before decoding. Leave it empty with "
                "a kv_cache wired for pure injection (the cache alone conditions the canvas).")


def run_node(node_id, model, prompt, kv_cache=None, advance=False, **knobs):
    """Run the engine for a node and shape its outputs; events and progress go to ComfyUI."""
    knobs = Knobs(**knobs)
    node = str(node_id) if node_id is not None else ""
    blocks, steps = num_blocks(knobs.gen_length, model.canvas_length), knobs.num_inference_steps
    bar = host.Progress(blocks * steps, node_id)
    live = host.live()
    if live:
        host.send(events.START, events.start_event(node, blocks, steps, model.canvas_length))
    previous = None

    def on_frame(frame):
        nonlocal previous
        if live:
            before = previous if previous is not None and previous.block == frame.block else None
            host.send(events.STEP, events.step_event(node, frame, before, model.token_strings, blocks, steps))
        bar.to(frame.block * steps + frame.step + 1)
        previous = frame

    result = generate(model, prompt, knobs, context=kv_cache, on_frame=on_frame,
                      should_cancel=host.check_interrupt, advance_context=advance)
    bar.to(blocks * steps)
    if live:
        host.send(events.DONE, events.done_event(node, result.state.steps_used, result.text))
    outputs = (result.text, result.state, result.trace, frame_texts(result.trace, model.token_strings),
               render_images(result.trace, model.token_strings), result.config)
    return outputs + ((result.context,) if advance else ())


class DGemmaSampler:
    CATEGORY = CATEGORY
    FUNCTION = "sample"
    RETURN_TYPES = tuple(t for t, _, _ in SAMPLER_OUTPUTS)
    RETURN_NAMES = tuple(n for _, n, _ in SAMPLER_OUTPUTS)
    OUTPUT_TOOLTIPS = tuple(d for _, _, d in SAMPLER_OUTPUTS)
    OUTPUT_IS_LIST = (False, False, False, True, False, False)
    DESCRIPTION = ("Generates an answer by block diffusion and records every step: the canvas starts as uniform "
                   "noise and the lowest-entropy positions are accepted step by step. The node paints the canvas "
                   "live; frames and images replay it, canvas_trace feeds DGemmaTrace and DGemmaRunLogWriter. "
                   "For context from a KV cache use DGemmaDenoise.")

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {"model": model_input(),
                         "prompt": ("STRING", {"multiline": True, "default": "", "tooltip": PROMPT_TOOLTIP}),
                         **knob_inputs()},
            "hidden": {"unique_id": "UNIQUE_ID"},
        }

    def sample(self, model, prompt, unique_id=None, **knobs):
        return run_node(unique_id, model, prompt, **knobs)


class DGemmaDenoise(DGemmaSampler):
    FUNCTION = "denoise"
    RETURN_TYPES = DGemmaSampler.RETURN_TYPES + (KV_CACHE,)
    RETURN_NAMES = DGemmaSampler.RETURN_NAMES + ("kv_cache",)
    OUTPUT_TOOLTIPS = DGemmaSampler.OUTPUT_TOOLTIPS + (
        "The context advanced by this run: kv_cache + turn + every generated block (the input is unchanged).",)
    OUTPUT_IS_LIST = DGemmaSampler.OUTPUT_IS_LIST + (False,)
    DESCRIPTION = ("DGemmaSampler with an optional kv_cache from DGemmaEncode. prompt is the TURN, kv_cache is "
                   "CONTEXT: both wired is a composed run (the turn is prefilled after the context), an empty "
                   "prompt is pure injection, no cache is exactly the Sampler. Works for any gen_length; the "
                   "cache is never modified, so it gives the same result every time it is reused.")

    @classmethod
    def INPUT_TYPES(cls):
        spec = super().INPUT_TYPES()
        spec["required"]["prompt"] = ("STRING", {"multiline": True, "default": "", "tooltip": TURN_TOOLTIP})
        spec["optional"] = {"kv_cache": (KV_CACHE, {"tooltip": "Encoded CONTEXT from DGemmaEncode (raw text, no "
                                                               "chat framing); leave unwired for a plain run."})}
        return spec

    def denoise(self, model, prompt, kv_cache=None, unique_id=None, **knobs):
        return run_node(unique_id, model, prompt, kv_cache=kv_cache, advance=True, **knobs)
