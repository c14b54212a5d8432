"""The pack's queue-time rules, run once per queued prompt before ComfyUI validates it.

ComfyUI lists a VALIDATE_INPUTS refusal under every input the check names, so a rule reading three inputs
would be shown three times. Instead the on-prompt handler (ComfyUI's server calls it with every posted prompt;
the headless runner too) runs each pack node's `queue_refusal` over its constant inputs, as ComfyUI would
hand them over, and writes the first refusal into the node's hidden input QUEUED_CHECK. The node's
VALIDATE_INPUTS names only that input, so the refusal is listed once, and ComfyUI keeps its own type,
range and choice checks on every other input. A linked input is checked when the node runs.

Decide's options are also checked against its model's canvas here: where its model comes from a
DGemmaLoader with a constant local checkpoint (through any LoRA loaders, which keep the tokenizer), the
checkpoint's tokenizer and canvas length are read (no weights). Anything not resolved (a remote or hub
model, an unreadable tokenizer) is left to the node's own check when it runs.
"""

from __future__ import annotations

import logging

from ..dgemma.denoising.decide import check_options, option_ids, options_from_text
from ..dgemma.errors import InputError
from ..dgemma.loading.token_canvas import token_canvas
from . import host
from .loader import HUB_IDS, model_choices, resolve_choice
from .schema import widget_values
from .wiring import is_link

QUEUED_CHECK = "queued_check"
QUEUED_CHECK_TYPE = "DGEMMA_QUEUED_CHECK"
HIDDEN = {QUEUED_CHECK: QUEUED_CHECK_TYPE}  # a node declares it among its hidden inputs
ADAPTERS = ("DGemmaLoraLoader",)  # model -> model nodes that keep the tokenizer
CONVERT = {"INT": int, "FLOAT": float, "STRING": str, "BOOLEAN": bool}  # ComfyUI's conversion of constants

log = logging.getLogger("dgemma")


class QueueChecked:
    """A node whose queue-time rules the handler runs: it declares HIDDEN and overrides `queue_refusal`."""

    @classmethod
    def VALIDATE_INPUTS(cls, queued_check=None):
        """The handler's refusal, or True: the only input named here, so ComfyUI lists a refusal once."""
        for text in widget_values(queued_check):  # a list node gets it as a list
            if isinstance(text, str) and text:
                return text
        return True

    @classmethod
    def queue_refusal(cls, inputs: dict) -> str | None:
        """The first rule refused for these constant inputs (name -> value, a linked one absent), or None."""
        return None

    @classmethod
    def graph_refusal(cls, graph: dict, inputs: dict, values: dict) -> str | None:
        """A rule that reads the rest of the graph (the model a link comes from), run when `queue_refusal`
        passes; None where it passes or cannot tell (the node checks when it runs)."""
        return None


def comfy_value(spec: tuple, value):
    """(True, value) as ComfyUI hands a constant to VALIDATE_INPUTS, or (False, None) where ComfyUI refuses
    it itself (type, min/max, choice): that input is then refused once, by ComfyUI, and not here."""
    kind, options = spec[0], (spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {})
    if isinstance(value, dict) and "__value__" in value:
        value = value["__value__"]
    try:
        value = CONVERT[kind](value) if isinstance(kind, str) and kind in CONVERT else value
        if "min" in options and value < options["min"] or "max" in options and value > options["max"]:
            return False, None
    except (TypeError, ValueError, OverflowError):
        return False, None
    if isinstance(kind, list) and value not in kind:
        return False, None
    return True, value


def constants(cls, inputs: dict) -> dict:
    """The node's declared constant inputs as its checks get them; a linked (list) value is left out."""
    spec = cls.INPUT_TYPES()
    declared = {**spec.get("required", {}), **spec.get("optional", {})}
    found = {}
    for name, value in inputs.items():
        if name in declared and not isinstance(value, list):
            kept, value = comfy_value(declared[name], value)
            if kept:
                found[name] = value
    return found


def checkpoint_of(graph: dict, link) -> str | None:
    """The local checkpoint path a model link comes from, or None when the graph does not say it plainly."""
    seen = set()
    while is_link(link) and link[0] not in seen:
        seen.add(link[0])
        node = graph.get(link[0])
        inputs = node.get("inputs") if isinstance(node, dict) else None
        if not isinstance(inputs, dict):
            return None
        if node.get("class_type") in ADAPTERS:
            link = inputs.get("model")
            continue
        if node.get("class_type") != "DGemmaLoader" or link[1] != 0:
            return None
        name = inputs.get("model", model_choices()[0])
        if not isinstance(name, str) or name in HUB_IDS:
            return None  # a link, or a hub id: read only once downloaded, by the Loader
        return resolve_choice(name)
    return None


def canvas_refusal(graph: dict, inputs: dict, text) -> str | None:
    """A Decide node's options (`text`) refused against its model's canvas, or None (fitting, or not known here)."""
    if not isinstance(text, str):
        return None
    try:
        options = check_options(options_from_text(text))
    except InputError:
        return None  # refused by the node's own rules, without a tokenizer
    path = checkpoint_of(graph, inputs.get("model"))
    if path is None:
        return None
    try:
        option_ids(token_canvas(path), options)
    except InputError as err:
        return str(err)
    return None


def node_refusal(graph: dict, node_id, cls, inputs: dict) -> str | None:
    """The first of one node's queue-time rules its constant inputs break, then its rules over the graph."""
    try:
        values = constants(cls, inputs)
        said = cls.queue_refusal(values)
    except Exception as err:  # a rule that fails to run refuses, as a VALIDATE_INPUTS raising did
        log.warning("DiffusionGemma: node %s's inputs could not be checked when queued", node_id, exc_info=True)
        return f"the inputs could not be checked when queued: {err}"
    if said is not None:
        return said
    try:
        return cls.graph_refusal(graph, inputs, values)
    except Exception as err:  # unresolved here: the node checks when it runs
        log.debug("DiffusionGemma: node %s's options not checked when queued: %s", node_id, err)
        return None


def check_prompt(graph, classes: dict) -> None:
    """Write, in place, each pack node's refusal into its QUEUED_CHECK input, and drop one a client sent.
    `classes`: class_type -> node class; those with `queue_refusal` are checked."""
    if not isinstance(graph, dict):
        return
    for node_id, node in graph.items():
        kind = node.get("class_type") if isinstance(node, dict) else None
        cls = classes.get(kind) if isinstance(kind, str) else None
        if not hasattr(cls, "queue_refusal") or not isinstance(node.get("inputs"), dict):
            continue
        node["inputs"].pop(QUEUED_CHECK, None)
        said = node_refusal(graph, node_id, cls, node["inputs"])
        if said:
            node["inputs"][QUEUED_CHECK] = said


def on_prompt(classes: dict):
    """ComfyUI's on-prompt handler: checks the queued prompt's pack nodes and hands it on."""
    return host.prompt_handler(lambda graph: check_prompt(graph, classes))
