"""Socket types and widget specs shared by the nodes, built from the engine's knob table."""

from __future__ import annotations

from ..dgemma.knobs import KNOBS

CATEGORY = "DiffusionGemma"
MODEL = "DGEMMA_MODEL"
CANVAS_STATE = "DGEMMA_CANVAS_STATE"
CANVAS_TRACE = "DGEMMA_CANVAS_TRACE"
KV_CACHE = "DGEMMA_KV_CACHE"
RUN_CONFIG = "DGEMMA_RUN_CONFIG"

_WIDGET = {int: "INT", float: "FLOAT", bool: "BOOLEAN"}


def knob_inputs() -> dict:
    """The Sampler's ten widgets after model and prompt, with the engine's ranges."""
    inputs = {}
    for name, spec in KNOBS.items():
        options = {"default": spec.default, "tooltip": spec.tooltip}
        if name == "seed":
            options["control_after_generate"] = True
        if spec.kind is not bool:
            options.update(min=spec.lo, max=spec.hi, step=spec.step)
        if spec.kind is float:
            options["round"] = False
        inputs[name] = (_WIDGET[spec.kind], options)
    return inputs


SAMPLER_OUTPUTS = (
    ("STRING", "text", "The answer: thought channel cut out on ids, ended at the first EOS."),
    (CANVAS_STATE, "canvas_state", "Honesty readout: turn_closed, answer_tokens, thought, converged, "
                                   "committed_fraction (last step of the last block), steps_used."),
    (CANVAS_TRACE, "canvas_trace", "Every executed step: canvas ids, accepted mask, entropy (nats of logits / T)."),
    ("STRING", "frames", "One text per step: the raw canvas, thought channel included (a list)."),
    ("IMAGE", "images", "The steps as one image batch (B,H,W,3); wire it to Video Combine for a GIF."),
    (RUN_CONFIG, "run_config", "The knobs and model of this run, for DGemmaRunLogWriter."),
)


def model_input() -> tuple:
    return (MODEL, {"tooltip": "A loaded DiffusionGemma model (from DGemmaLoader)."})
