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
from ..dgemma.readings import percent
from ..dgemma.readouts.decide_pictures import chart, trace_lines
from . import host, memory
from .events import DONE, START, STEP, StepStream
from .queue_check import HIDDEN, QueueChecked, canvas_refusal
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
    refusal,
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


class DGemmaDecide(QueueChecked):
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
            "hidden": {"unique_id": "UNIQUE_ID", **HIDDEN},
        }

    @classmethod
    def queue_refusal(cls, inputs: dict) -> str | None:
        """The options (empty, blank, repeated, too many, too long) and the knob rules ComfyUI cannot check, when
        the graph is queued: before the Loader loads a model. The queue's handler then checks the options' tokens
        against the canvas where it can read the tokenizer (queue_check.py); the node checks them when it runs."""
        if inputs.get("options") is not None:
            try:
                check_options(options_from_text(inputs["options"]))
            except InputError as err:
                return str(err)
        return refusal(validate_knobs(inputs))

    @classmethod
    def graph_refusal(cls, graph: dict, inputs: dict, values: dict) -> str | None:
        """The options' tokens against the canvas of the model the graph loads, where its tokenizer can be read."""
        return canvas_refusal(graph, inputs, values.get("options"))

    def decide(self, model, prompt, options, samples, image=None, kv_cache=None, unique_id=None, **knobs):
        missing = [name for name in DECIDE_KNOBS if name not in knobs]
        if missing:
            raise InputError(missing[0], f"{missing[0]} is missing; wire or set it (default "
                                         f"{DECIDE_KNOBS[missing[0]].default!r})")
        with comfy_hints():
            req = prepare_decision(model, prompt, options_from_text(options), samples, Knobs(**knobs),
                                   context=kv_cache, image=image)
        view = DecideView(unique_id, model, prompt, req)
        with memory.running(model, unique_id), comfy_hints():
            view.start()
            try:
                decision = run_decision(req, should_cancel=host.check_interrupt, on_progress=view.progress)
            except BaseException as err:
                view.failed(err)
                raise
        view.done(decision)
        return tuple(row.get(model, decision) for row in DECIDE_OUTPUTS)


class DecideView:
    """What a decision shows in ComfyUI as it reads: the progress bar over the draws' canvases and then the
    answer block's steps, the progress text, and the live view's events of the answer block's run (its
    canvas as it settles), as the Sampler shows its run."""

    def __init__(self, node_id, model, prompt: str, req):
        steps = req.request.knobs.num_inference_steps
        self.reads = req.samples * len(req.plan.rows)
        self.samples, self.node_id, self.prompt = req.samples, node_id, prompt
        self.bar, self.note = host.Progress(self.reads + steps, node_id), host.ProgressText(node_id)
        self.stream = StepStream(str(node_id) if node_id is not None else "", 1, steps, model.canvas_length,
                                 model.token_strings, adapters=getattr(model, "lora_text", ""))
        self.live = host.live()

    def start(self) -> None:
        if self.live:
            host.send(START, self.stream.start(None, {"prompt": self.prompt, "thumbnail": None}))

    def progress(self, done: int, total: int, frame) -> None:
        self.bar.to(done, total)
        if not self.live:
            return
        if frame is None:
            drawn = -(-done * self.samples // self.reads)
            self.note.show(f"reading the options on noise draw {drawn}/{self.samples}", force=done == self.reads)
            return
        self.note.show(lambda: self.stream.progress_text(frame))
        host.send(STEP, self.stream.step(frame))

    def failed(self, err: BaseException) -> None:
        if self.live:
            host.send_failed(self.stream, self.note, err)

    def done(self, decision) -> None:
        self.bar.to(self.bar.total)
        if self.live:
            read = " · ".join(f"{o} {percent(m)}" for o, m in zip(decision.options, decision.mean))
            text = f"done · choice {decision.choice!r}\n{read}"
            state = decision.run.state
            memory.when_returned(self.node_id, lambda: (
                self.note.show(text, force=True),
                host.send(DONE, self.stream.done(state.steps_used, decision.run.text))))
