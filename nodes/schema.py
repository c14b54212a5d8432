"""Socket types, widget specs and error hints shared by the nodes, built from the engine's tables."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from typing import NamedTuple

from ..dgemma.errors import InputError
from ..dgemma.inputs.knobs import KNOBS, Knobs, check_knob

CATEGORY = "DiffusionGemma"
MODEL = "DGEMMA_MODEL"
CANVAS_STATE = "DGEMMA_CANVAS_STATE"
CANVAS_TRACE = "DGEMMA_CANVAS_TRACE"
KV_CACHE = "DGEMMA_KV_CACHE"
RUN_CONFIG = "DGEMMA_RUN_CONFIG"

_WIDGET = {int: "INT", float: "FLOAT", bool: "BOOLEAN"}
MAX_LIST = 10_000  # items a sampler runs from one list (and lines of a DGemmaPromptList): lists stream at flat memory


def knob_inputs(table: dict | None = None) -> dict:
    """Knob widgets, one per entry of an engine table (the Sampler's KNOBS by default), with its ranges."""
    inputs = {}
    for name, spec in (KNOBS if table is None else table).items():
        options = {"default": spec.default, "tooltip": spec.tooltip}
        if name == "seed":
            options["control_after_generate"] = True
        if spec.kind is not bool:
            options.update(min=spec.lo, max=spec.hi, step=spec.step)
        if spec.kind is float:
            options["round"] = False
        inputs[name] = (_WIDGET[spec.kind], options)
    return inputs


def widget_values(value) -> list:
    """The widget values ComfyUI hands a VALIDATE_INPUTS for one input: a list for a list node (one per
    item), `(None,)` or None for a linked input (known only when the node runs): None for each unknown."""
    return list(value) if isinstance(value, (list, tuple)) else [value]


# Stand-ins for a linked knob while its partners are checked: they satisfy every rule between knobs.
NEUTRAL = {"t_min": 0.0, "t_max": 1.0, "entropy_bound": KNOBS["entropy_bound"].default}
QUEUE_KNOBS = tuple(NEUTRAL)  # the knobs a sampler's VALIDATE_INPUTS names: rules ComfyUI cannot check


def validate_knobs(values: dict):
    """The knob rules ComfyUI cannot check when the graph is queued, before any model loads: NaN (it passes
    ComfyUI's min/max), t_min <= t_max, t_max and entropy_bound above 0. True, or the refusal's text.

    `values` holds what ComfyUI accepted (queue_check.constants): a knob it refuses itself, out of range, is
    absent here, as a linked one is, and stands in neutrally for its partners' rules, so it is refused once.
    """
    lists = {name: widget_values(values.get(name)) for name in QUEUE_KNOBS}
    count = max(len(v) for v in lists.values())
    try:
        for index in range(count):
            item = {name: v[min(index, len(v) - 1)] for name, v in lists.items()}
            with naming_item(index, count):
                for name, value in item.items():
                    if value is not None:
                        check_knob(name, value)
                Knobs(**{name: NEUTRAL[name] if value is None else value for name, value in item.items()})
    except InputError as err:
        return str(err)
    return True


class Output(NamedTuple):
    """One output socket: its type, name, tooltip, whether it is a list, and `get`, which reads its value from
    what the node ran (a sampler's: `get(call, result)`). `on_demand`: costly, made only when the queued prompt
    reads it (nodes/wiring.py). Saved workflows link outputs by slot, so a node's rows are only appended."""

    type: str
    name: str
    tooltip: str
    listed: bool
    get: Callable
    on_demand: bool = False


def output_spec(outputs) -> tuple[tuple, tuple, tuple, tuple]:
    """(RETURN_TYPES, RETURN_NAMES, OUTPUT_TOOLTIPS, OUTPUT_IS_LIST) from one table."""
    return tuple(zip(*(row[:4] for row in outputs)))


def on_demand(outputs: tuple) -> tuple[str, ...]:
    """The names of a table's outputs made only when the queued prompt reads them (a node's ON_DEMAND)."""
    return tuple(row.name for row in outputs if row.on_demand)


# What to wire in ComfyUI, by the engine's name of a bad input.
HINTS = {
    "model": "wire the model output of a DGemmaLoader node",
    "context": "wire a kv_cache from a DGemmaEncode node that used this model",
    "prompt": "context goes into DGemmaEncode, whose kv_cache feeds DGemmaDenoise; an empty prompt works only there",
    "canvas_trace": "wire the canvas_trace output of a DGemmaSampler or DGemmaDenoise node",
    "canvas_state": "wire canvas_trace, run_config, frames and canvas_state from the same sampler node",
    "run_config": "wire canvas_trace, run_config, frames and canvas_state from the same sampler node",
    "frames": "wire frames and canvas_trace from the same sampler node",
    "image": "wire an IMAGE (Load Image, or any node with an IMAGE output), or leave image unwired",
}


# What to wire when resuming refuses: the fix is in the resuming Advanced sampler, not elsewhere.
RESUME_HINTS = {
    "prompt": "give this sampler the same prompt as the Advanced sampler whose canvas_state it resumes",
    "context": "wire the same kv_cache (or none) into both Advanced samplers",
    "canvas_state": "wire the canvas_state output of another DGemmaSamplerAdvanced",
    "model": "wire the same DGemmaLoader into both Advanced samplers",
}


@contextmanager
def comfy_hints(hints: dict | None = None):
    """Add the ComfyUI wiring hint (from `hints`, default HINTS) to an engine InputError raised inside."""
    try:
        yield
    except InputError as err:
        hint = (HINTS if hints is None else hints).get(err.name)
        if hint is None:
            raise
        raise InputError(err.name, f"{err} (in ComfyUI: {hint})") from None


@contextmanager
def naming_item(index: int, count: int):
    """Name the list item in a refusal when the node runs a list (a single item's message is unchanged)."""
    try:
        yield
    except InputError as err:
        if count == 1:
            raise
        raise InputError(err.name, f"list item {index} of {count}: {err}") from None


def model_input() -> tuple:
    return (MODEL, {"tooltip": "A loaded DiffusionGemma model (from DGemmaLoader)."})


IMAGE_TOOLTIP = ("Optional picture(s) the model reads through its vision encoder, before the text of the turn; "
                 "a batch is one turn with several images. The model's processor resizes them.")


def image_input() -> tuple:
    return ("IMAGE", {"tooltip": IMAGE_TOOLTIP})


CONSTRAINT_TYPE_TOOLTIP = ("What the constraint text is: json_schema (a JSON Schema the answer must validate "
                           "against), regex (a regular expression the whole answer matches) or choice (one option "
                           "per line; the answer is exactly one of them).")
CONSTRAINT_TOOLTIP = ("The answer's constraint, of constraint_type (text; empty: unconstrained, the same tokens as "
                      "without it). Positions the constraint changed show violet; canvas_state says whether the "
                      "answer satisfied it.")


def constraint_inputs() -> dict:
    from ..dgemma.constraints.constraint import KINDS

    return {"constraint_type": (list(KINDS), {"default": KINDS[0], "tooltip": CONSTRAINT_TYPE_TOOLTIP}),
            "constraint": ("STRING", {"multiline": True, "default": "", "tooltip": CONSTRAINT_TOOLTIP})}


def refusal(verdict) -> str | None:
    """A check's True-or-text verdict as a refusal: None when it passed."""
    return None if verdict is True else verdict


def validate_constraints(kinds, texts):
    """The constraint widgets' checks that need no model (a kind, JSON, a regex, NUL, $ref), when the graph is
    queued; True, or the refusal's text. A linked text (or kind) is checked when the node runs."""
    from ..dgemma.constraints.constraint import KINDS

    kinds, texts = widget_values(kinds), widget_values(texts)
    count = max(len(kinds), len(texts))
    try:
        for index in range(count):
            kind, text = kinds[min(index, len(kinds) - 1)], texts[min(index, len(texts) - 1)]
            with naming_item(index, count):
                if kind is not None and text is not None:
                    constraint_of(kind, text)
                elif kind is not None and kind not in KINDS:
                    raise InputError("constraint_type", f"constraint_type must be one of {', '.join(KINDS)}, "
                                                        f"got {str(kind)[:40]!r}")
    except InputError as err:
        return str(err)
    return True


def constraint_of(kind, text):
    """The engine's Constraint from the two widgets (None when the text is empty), refused with the reason."""
    from ..dgemma.constraints.constraint import Constraint

    with comfy_hints():
        found = Constraint(kind if kind is not None else "json_schema", text if text is not None else "")
    return found if found.active else None


def context_input() -> tuple:
    return (KV_CACHE, {"tooltip": "Encoded CONTEXT from DGemmaEncode (raw text, no chat framing); leave unwired "
                                  "for a plain run."})
