"""DGemmaSampler and DGemmaDenoise: a prompt, or a list of them as one batch, with live events, progress and Cancel."""

from __future__ import annotations

from dataclasses import dataclass

from ..dgemma.backend import backend_of, plan_of, readings_of
from ..dgemma.errors import InputError, short
from ..dgemma.inputs.knobs import knobs_from
from ..dgemma.inputs.tokens import frame_texts
from ..dgemma.inputs.vision import thumbnail, to_uint8
from ..dgemma.readouts.images import Asked, render_images
from . import host, memory
from .events import DONE, START, STEP, BatchStream
from .queue_check import HIDDEN, QueueChecked
from .schema import (
    CANVAS_STATE,
    CANVAS_TRACE,
    CATEGORY,
    KV_CACHE,
    MAX_LIST,
    RESUME_HINTS,
    RUN_CONFIG,
    Output,
    comfy_hints,
    constraint_inputs,
    constraint_of,
    context_input,
    image_input,
    knob_inputs,
    model_input,
    naming_item,
    on_demand,
    output_spec,
    refusal,
    validate_constraints,
    validate_knobs,
)
from .wiring import made

PROMPT_TOOLTIP = "The user turn; it is rendered through the model's own chat template."
TURN_TOOLTIP = ("The TURN: chat-templated and prefilled onto kv_cache before decoding. Leave it empty with "
                "a kv_cache wired for pure injection (the cache alone conditions the canvas).")


def _frames(call, result) -> list[str]:
    return frame_texts(result.trace, call.model.token_strings)


def _images(call, result):
    return render_images(result.trace, call.model.token_strings, Asked.of(call.prompt, result.config.image))


# The samplers' outputs, each row's value read from (Call, RunResult); a new socket is one row, appended.
SAMPLER_OUTPUTS = (
    Output("STRING", "text", "The answer: thought channel cut out on ids, ended at the first EOS.", False,
           lambda call, result: result.text),
    Output(CANVAS_STATE, "canvas_state", "Honesty readout: turn_closed, answer_tokens, thought, converged, "
                                         "committed_fraction (last step of the last block), steps_used.", False,
           lambda call, result: result.state),
    Output(CANVAS_TRACE, "canvas_trace", "Every executed step: canvas ids, committed mask (the scheduler's, plus "
                                         "what the adaptive stop committed), entropy (nats of logits / T).", False,
           lambda call, result: result.trace),
    Output("STRING", "frames", "One text per step: the raw canvas, thought channel included (a list).", True,
           _frames, on_demand=True),
    Output("IMAGE", "images", "The steps as one image batch (B,H,W,3); wire it to Video Combine for a GIF.", False,
           _images, on_demand=True),
    Output(RUN_CONFIG, "run_config", "The knobs and model of this run, for DGemmaRunLogWriter.", False,
           lambda call, result: result.config),
)


class LiveRun:
    """What one node's run shows in ComfyUI (all its list items): the live view's events, the progress
    bar and text."""

    def __init__(self, node_id, calls):
        model = calls[0].model
        rows = [plan_of(model, c.knobs, c.advanced) for c in calls]
        # the bar's own bounds: a remote engine that fixes its steps itself is counted by the knob until it says
        bar = [(blocks or 1, steps or c.knobs.num_inference_steps) for (blocks, steps), c in zip(rows, calls)]
        self.model, self.rows = model, bar
        self.resumed = [c.advanced.resume.recorded if c.advanced is not None and c.advanced.resume is not None
                        else None for c in calls]
        self.asked = [(c.prompt, c.image) for c in calls]
        self.total = sum(blocks * steps for blocks, steps in bar)
        self.reached = [0] * len(calls)  # per item, and in all: steps of the bar reached
        self.done_steps = 0
        self.stream = BatchStream(str(node_id) if node_id is not None else "", rows, model.canvas_length,
                                  model.token_strings, readings_of(model), getattr(model, "lora_text", ""))
        self.bar, self.note = host.Progress(self.total, node_id), host.ProgressText(node_id)
        self.node_id = node_id
        self.live = host.live()

    def start(self) -> None:
        if self.live:
            asked = [{"prompt": prompt, "thumbnail": thumbnail(to_uint8(image[:1])[0]) if image is not None else None}
                     for prompt, image in self.asked]
            host.send(START, self.stream.start(self.resumed, asked))

    def frame(self, index, frame) -> None:
        if self.live:
            split = getattr(self.model, "placement_note", "")  # a remote model has no local placement
            self.note.show(lambda: self.stream.progress_text(index, frame) + (f"\n{split}" if split else ""))
            host.send(STEP, self.stream.step(index, frame))
        reached = min(frame.block * self.rows[index][1] + frame.step + 1, self.rows[index][0] * self.rows[index][1])
        self.done_steps += reached - self.reached[index]
        self.reached[index] = reached
        self.bar.to(self.done_steps)

    def settle(self, index) -> None:
        self.stream.settle(index)

    def failed(self, err: BaseException) -> None:
        if self.live:
            host.send_failed(self.stream, self.note, err)

    def done(self, results) -> None:
        """The end, told once the node has returned: until ComfyUI holds its outputs the run is not done."""
        self.bar.to(self.total)
        if self.live:
            text, event = self.stream.done_text(results), self.stream.done(results)
            memory.when_returned(self.node_id, lambda: (self.note.show(text, force=True), host.send(DONE, event)))


@dataclass(frozen=True, eq=False)
class Call:
    """One list item of a sampler node, checked once: what the live view shows of it, and the request its
    model's backend checked, which that backend runs as it is."""

    model: object
    prompt: str
    knobs: object
    advanced: object
    image: object
    request: object  # a run.Request on this process's engine; a remote backend's own checked request


def check_call(model, prompt, kv_cache=None, advance=False, advanced=None, image=None, constraint=None,
               **knobs) -> Call:
    """Every check of one item before any event or model work."""
    resuming = advanced is not None and advanced.resume is not None
    with comfy_hints(RESUME_HINTS if resuming else None):  # a resume's refusals carry this node's fix
        knobs = knobs_from(knobs, every=True)  # a node's inputs: a missing knob is never a default
        request = backend_of(model).check(  # before the view resets: a refusal leaves it
            model, prompt, knobs, kv_cache, image, advanced, constraint=constraint, advance_context=advance,
            should_cancel=host.check_interrupt)
    return Call(model, prompt, knobs, advanced, image, request)


def list_items(inputs: dict) -> list[dict]:
    """ComfyUI's list rule: as many items as the longest list; a shorter list repeats its last value. An empty
    list (a node upstream that gave no items) and a list over MAX_LIST are refused before any item is checked."""
    lists = {k: v if isinstance(v, list) else [v] for k, v in inputs.items()}
    for name, values in lists.items():
        if not values:
            raise InputError(name, f"{name} is an empty list: the node wired to it gave no items; give it at "
                                   "least one")
    count = max((len(v) for v in lists.values()), default=1)
    if count > MAX_LIST:
        longest = max(lists, key=lambda k: len(lists[k]))
        raise InputError(longest, f"{longest} is a list of {count} items, over the {MAX_LIST} one sampler runs; "
                                  "split the list over several samplers")
    return [{k: v[min(i, len(v) - 1)] for k, v in lists.items()} for i in range(count)]


MAX_BATCH = ("INT", {"forceInput": True, "default": 0, "min": 0, "max": 256, "tooltip":
             "Most prompts of a list denoised together (items); 0 or unwired: as many as fit in half the free "
             "memory, from the memory plan. Longer lists run in batches of this size. The batch never changes an "
             "item's tokens; on the CPU its readings are its solo run's to the bit at float32 (in bfloat16 an "
             "entropy may move by about 0.02 nats); on a GPU this is not yet measured."})


def max_batch_of(inputs: dict) -> int | None:
    """The node's max_batch (a list input, like every input of a list node), checked; None: automatic."""
    value = inputs.pop("max_batch", [0])
    if isinstance(value, list) and len(set(map(repr, value))) > 1:
        raise InputError("max_batch", f"max_batch is a list of {len(value)} different values ({short(value)}); it "
                                      "sets the whole node's batches, so wire one INT")
    value = value[0] if isinstance(value, list) and value else value
    most = MAX_BATCH[1]["max"]  # a linked INT skips ComfyUI's widget range check: the same range here
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= most:
        raise InputError("max_batch", f"max_batch must be a whole number of items from 0 (automatic) to {most}, "
                                      f"got {short(value)}; wire an INT in that range")
    return value or None


def run_calls(node_id, calls: list[Call], max_batch: int | None = None) -> list:
    """Run checked items (batched on a local model, as many at once as fit in free memory), with events and
    progress for all of them."""
    view = LiveRun(node_id, calls)
    model = calls[0].model
    with memory.running(model, node_id) as lease:
        view.start()
        try:
            with comfy_hints():
                results = backend_of(model).run_checked(
                    [c.request for c in calls], on_frame=view.frame, on_settled=view.settle,
                    should_cancel=host.check_interrupt, max_batch=max_batch)
        except BaseException as err:
            view.failed(err)
            raise
        if any(r.state.paused for r in results):
            lease.keep()  # a paused canvas keeps the model where it is for the node that resumes it
    view.done(results)
    return results


UNMADE = ("not made: no node of this prompt read it when it was queued; queue the prompt again from the "
          "page, or through ComfyUI's /prompt")


def item_outputs(outputs: tuple, call: Call, result, make=lambda name: True) -> tuple:
    """One item's outputs, a value per row of the node's table; `make(name)` says whether an on-demand output
    (frames, images) is read: one that is not holds ComfyUI's blocker, in a list for a list output."""
    values = []
    for row in outputs:
        if row.on_demand and not make(row.name):
            unmade = host.unmade(f"{row.name} {UNMADE}")
            values.append([unmade] if row.listed else unmade)
        else:
            values.append(row.get(call, result))
    return tuple(values)


def run_list(node, unique_id, inputs: dict) -> tuple:
    """A sampler node's call: every list item checked (a refusal names its item), then run as one batch
    per model; the outputs merged as ComfyUI merges a list run's (a list output's items joined). The
    frames and images are made only when the prompt reads them (nodes/wiring.py)."""
    node_id = unique_id[0] if isinstance(unique_id, list) else unique_id
    graph = inputs.pop("graph", None)
    max_batch = max_batch_of(inputs)
    items = list_items(inputs)
    calls = []
    for index, item in enumerate(items):
        with naming_item(index, len(items)):
            calls.append(node.item_call(**item))
    per_item: list = [None] * len(calls)
    for model in {id(c.model): c.model for c in calls}.values():  # a list of models: each its own batch
        indexes = [i for i, c in enumerate(calls) if c.model is model]
        results = run_calls(node_id, [calls[i] for i in indexes], max_batch)
        for i, result in zip(indexes, results):
            per_item[i] = item_outputs(node.OUTPUTS, calls[i], result, lambda name: made(graph, node_id, name))
    return tuple([x for out in per_item for x in out[k]] if listed else [out[k] for out in per_item]
                 for k, listed in enumerate(node.ITEM_OUTPUT_IS_LIST))


def constraint_and_knobs(inputs: dict) -> str | None:
    """The constraint widgets' refusal (JSON, regex, NUL, $ref), else the knob rules'; None when both pass."""
    return refusal(validate_constraints(inputs.get("constraint_type"), inputs.get("constraint"))) or \
        refusal(validate_knobs(inputs))


class DGemmaSampler(QueueChecked):
    CATEGORY = CATEGORY
    FUNCTION = "sample"
    INPUT_IS_LIST = True  # a list of prompts (or of any input) runs as one batch
    OUTPUTS = SAMPLER_OUTPUTS  # a subclass sets its own table; its declarations follow (__init_subclass__)
    RETURN_TYPES, RETURN_NAMES, OUTPUT_TOOLTIPS, ITEM_OUTPUT_IS_LIST = output_spec(OUTPUTS)
    OUTPUT_IS_LIST = (True,) * len(RETURN_TYPES)  # one value per item; frames: every item's, in order
    ON_DEMAND = on_demand(OUTPUTS)  # frames and images: made only when the prompt reads them (nodes/wiring.py)
    DESCRIPTION = ("Generates an answer by block diffusion and records every step: the canvas starts as uniform "
                   "noise and the lowest-entropy positions are committed step by step. The node paints the canvas "
                   "live; frames and images replay it, canvas_trace feeds DGemmaTrace and DGemmaRunLogWriter. "
                   "An optional image is read by the encoder with the turn. For context from a KV cache use "
                   "DGemmaDenoise. A list of prompts denoises as one batch, each item exactly its own run on the CPU "
                   "(in bfloat16 its entropy readings may move in the last bits; on a GPU not yet measured).")

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {"model": model_input(),
                         "prompt": ("STRING", {"multiline": True, "default": "", "tooltip": PROMPT_TOOLTIP}),
                         **knob_inputs()},
            "optional": {"image": image_input(), "max_batch": MAX_BATCH},
            "hidden": {"unique_id": "UNIQUE_ID", "graph": "PROMPT", **HIDDEN},
        }

    @classmethod
    def queue_refusal(cls, inputs: dict) -> str | None:
        """The knob rules ComfyUI cannot check (t_min <= t_max, t_max and entropy_bound above 0, NaN), when the
        graph is queued: before the Loader loads a model."""
        return refusal(validate_knobs(inputs))

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.RETURN_TYPES, cls.RETURN_NAMES, cls.OUTPUT_TOOLTIPS, cls.ITEM_OUTPUT_IS_LIST = output_spec(cls.OUTPUTS)
        cls.OUTPUT_IS_LIST = (True,) * len(cls.RETURN_TYPES)
        cls.ON_DEMAND = on_demand(cls.OUTPUTS)

    def sample(self, unique_id=None, **inputs):
        return run_list(self, unique_id, inputs)

    def item_call(self, model, prompt, image=None, **knobs) -> Call:
        return check_call(model, prompt, image=image, **knobs)


KV_CACHE_OUTPUT = Output(KV_CACHE, "kv_cache", "The context advanced by this run: kv_cache + turn + every generated "
                                                "block (the input is unchanged).", False,
                         lambda call, result: result.context)
# Saved Denoise workflows read kv_cache at slot 6: a row added to the samplers' table comes after it here.
DENOISE_OUTPUTS = SAMPLER_OUTPUTS[:6] + (KV_CACHE_OUTPUT,) + SAMPLER_OUTPUTS[6:]


class DGemmaDenoise(DGemmaSampler):
    FUNCTION = "denoise"
    OUTPUTS = DENOISE_OUTPUTS
    DESCRIPTION = ("DGemmaSampler with an optional kv_cache from DGemmaEncode. prompt is the TURN, kv_cache is "
                   "CONTEXT: both wired is a composed run (the turn is prefilled after the context), an empty "
                   "prompt is pure injection, no cache is exactly the Sampler. Works for any gen_length; the "
                   "cache is never modified, so it gives the same result every time it is reused.")

    @classmethod
    def INPUT_TYPES(cls):
        spec = super().INPUT_TYPES()
        spec["required"]["prompt"] = ("STRING", {"multiline": True, "default": "", "tooltip": TURN_TOOLTIP})
        spec["optional"] = {"kv_cache": context_input(), "image": image_input(), **constraint_inputs(),
                            "max_batch": MAX_BATCH}
        return spec

    @classmethod
    def queue_refusal(cls, inputs: dict) -> str | None:
        """The Sampler's queue-time rules, and the constraint's, before any model loads."""
        return constraint_and_knobs(inputs)

    def denoise(self, unique_id=None, **inputs):
        return run_list(self, unique_id, inputs)

    def item_call(self, model, prompt, kv_cache=None, image=None, constraint_type=None, constraint=None,
                  **knobs) -> Call:
        return check_call(model, prompt, kv_cache=kv_cache, advance=True, image=image,
                          constraint=constraint_of(constraint_type, constraint), **knobs)
