"""DGemmaDecide: each option's probability as the answer, over noise draws, with its chart and per-step trace."""

from __future__ import annotations

import dataclasses
import json

import torch

from ..dgemma.denoising.decide import (
    KNOB_NAMES,
    MAX_SAMPLES,
    check_options,
    options_from_text,
    prepare_decision,
    run_decision,
)
from ..dgemma.errors import InputError
from ..dgemma.inputs.knobs import KNOBS, Knobs
from ..dgemma.inputs.tokens import frame_texts
from ..dgemma.readouts.decide_pictures import chart, trace_lines
from . import host, memory
from .schema import (
    CANVAS_STATE,
    CANVAS_TRACE,
    CATEGORY,
    RUN_CONFIG,
    Output,
    comfy_hints,
    context_input,
    image_input,
    knob_inputs,
    model_input,
    output_spec,
    validate_knobs,
)

SCHEDULE = "Used by the answer block's denoising run, whose steps the trace reads. "
DECIDE_KNOBS = {
    "seed": dataclasses.replace(KNOBS["seed"], tooltip="Seed of the first noise draw; draw i uses seed + i. The "
                                "answer block's run (the trace) uses this seed, so its first step is draw 0."),
    **{name: dataclasses.replace(KNOBS[name], tooltip=SCHEDULE + KNOBS[name].tooltip) for name in KNOB_NAMES[1:]},
}


def _probabilities(model, decision) -> str:
    return json.dumps(decision.asdict()["probabilities"], ensure_ascii=False, indent=1)


# Each row's value from (model, Decision); `run` is the answer block's denoising run.
DECIDE_OUTPUTS = (
    Output("STRING", "choice", "The option with the highest mean probability (a tie: the one listed first).", False,
           lambda model, decision: decision.choice),
    Output("STRING", "probabilities", "JSON: option -> {mean, standard_error} of its probability over the noise "
                                      "draws; the means sum to 1.", False, _probabilities),
    Output("IMAGE", "chart", "Bar chart of the mean probabilities, whiskers at ± one standard error, the choice "
                             "marked.", False, lambda model, decision: torch.from_numpy(chart(decision))),
    Output("IMAGE", "trace", "Each option's probability at the answer slot before every step of the answer block's "
                             "denoising run, one line per option.", False,
           lambda model, decision: torch.from_numpy(trace_lines(decision))),
    Output(CANVAS_STATE, "canvas_state", "Readout of the answer block's run (what the denoising wrote).", False,
           lambda model, decision: decision.run.state),
    Output(CANVAS_TRACE, "canvas_trace", "Every step of the answer block's run, for DGemmaTrace and the Run Log "
                                         "Writer.", False, lambda model, decision: decision.run.trace),
    Output("STRING", "frames", "One text per step of the answer block's run (a list), for the Run Log Writer.", True,
           lambda model, decision: frame_texts(decision.run.trace, model.token_strings)),
    Output(RUN_CONFIG, "run_config", "The run's knobs and model with this decision in it: the Run Log Writer keeps "
                                     "the decision and each step's probabilities.", False,
           lambda model, decision: decision.run.config),
)

OPTIONS_TOOLTIP = ("The answers to choose among, one per line (blank lines skipped): each option is the whole "
                   "answer, e.g. red / green / blue. No option twice; each must fit on one canvas.")
SAMPLES_TOOLTIP = (f"Noise draws N (1 to {MAX_SAMPLES}): each option's probability is read on N seeded noise "
                   "canvases; the mean and its standard error come out. One decoder forward per draw for "
                   "single-token options.")


class DGemmaDecide:
    CATEGORY = CATEGORY
    FUNCTION = "decide"
    RETURN_TYPES, RETURN_NAMES, OUTPUT_TOOLTIPS, OUTPUT_IS_LIST = output_spec(DECIDE_OUTPUTS)
    DESCRIPTION = ("Reads which option the model answers, and how sure it is: each option's probability as the "
                   "whole answer, read from the model's own logits at the start of the answer (the end of the "
                   "turn right after the option, then its tokens one by one), normalized over the options and "
                   "averaged over N noise draws with its standard error. The trace shows the same reading at every "
                   "step of a normal denoising run of the answer block. Thinking is off: the answer starts the "
                   "canvas.")

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {"model": model_input(),
                         "prompt": ("STRING", {"multiline": True, "default": "What colour is this?", "tooltip":
                                    "The question (the user turn, through the model's chat template)."}),
                         "options": ("STRING", {"multiline": True, "default": "red\ngreen\nblue\nyellow",
                                                "tooltip": OPTIONS_TOOLTIP}),
                         "samples": ("INT", {"default": 8, "min": 1, "max": MAX_SAMPLES, "step": 1,
                                             "tooltip": SAMPLES_TOOLTIP}),
                         **knob_inputs(DECIDE_KNOBS)},
            "optional": {"image": image_input(), "kv_cache": context_input()},
            "hidden": {"unique_id": "UNIQUE_ID"},
        }

    @classmethod
    def VALIDATE_INPUTS(cls, options=None, t_min=None, t_max=None, entropy_bound=None):
        """The options (empty, blank, repeated, too many, too long) and the knob rules ComfyUI cannot check,
        when the graph is queued: before the Loader loads a model. Their length in tokens against the canvas
        needs the tokenizer, so it is checked when the node runs, before any model work."""
        if options is not None:
            try:
                check_options(options_from_text(options))
            except InputError as err:
                return str(err)
        return validate_knobs({"t_min": t_min, "t_max": t_max, "entropy_bound": entropy_bound})

    def decide(self, model, prompt, options, samples, image=None, kv_cache=None, unique_id=None, **knobs):
        missing = [name for name in DECIDE_KNOBS if name not in knobs]
        if missing:
            raise InputError(missing[0], f"{missing[0]} is missing; wire or set it (default "
                                         f"{DECIDE_KNOBS[missing[0]].default!r})")
        with comfy_hints():
            req = prepare_decision(model, prompt, options_from_text(options), samples, Knobs(**knobs),
                                   context=kv_cache, image=image)
        with memory.running(model, unique_id), comfy_hints():
            decision = run_decision(req, should_cancel=host.check_interrupt)
        return tuple(row.get(model, decision) for row in DECIDE_OUTPUTS)
