"""The Decide options' length in tokens, checked when the graph is queued, before the Loader loads a model.

ComfyUI passes every queued prompt through the pack's on-prompt handler before it validates it (the headless
runner does the same). For each DGemmaDecide whose options are a constant and whose model comes from a
DGemmaLoader with a constant local checkpoint (through any LoRA loaders, which keep the tokenizer), the
checkpoint's tokenizer and canvas length are read (no weights) and the options are checked as the node checks
them when it runs. A refusal is written into the node's hidden input QUEUED_CHECK, which its VALIDATE_INPUTS
returns. Anything not resolved here (linked options, a remote or hub model, an unreadable tokenizer) leaves
the prompt as it was: the node's own check when it runs still applies.
"""

from __future__ import annotations

import logging

from ..dgemma.denoising.decide import check_options, option_ids, options_from_text
from ..dgemma.errors import InputError
from ..dgemma.loading.token_canvas import token_canvas
from .loader import HUB_IDS, model_choices, resolve_choice
from .wiring import is_link

QUEUED_CHECK = "queued_check"
QUEUED_CHECK_TYPE = "DGEMMA_QUEUED_CHECK"
ADAPTERS = ("DGemmaLoraLoader",)  # model -> model nodes that keep the tokenizer

log = logging.getLogger("dgemma")


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


def refusal(graph: dict, node: dict) -> str | None:
    """The Decide node's options refused against its model's canvas, or None (fitting, or not known here)."""
    inputs = node["inputs"]
    text = inputs.get("options")
    if not isinstance(text, str):
        return None
    try:
        options = check_options(options_from_text(text))
    except InputError:
        return None  # VALIDATE_INPUTS refuses these already, without a tokenizer
    path = checkpoint_of(graph, inputs.get("model"))
    if path is None:
        return None
    try:
        option_ids(token_canvas(path), options)
    except InputError as err:
        return str(err)
    return None


def check_prompt(graph) -> None:
    """Write, in place, each Decide node's refusal into its QUEUED_CHECK input (and drop one sent in)."""
    if not isinstance(graph, dict):
        return
    for node_id, node in graph.items():
        if not isinstance(node, dict) or node.get("class_type") != "DGemmaDecide" or \
                not isinstance(node.get("inputs"), dict):
            continue
        node["inputs"].pop(QUEUED_CHECK, None)
        try:
            said = refusal(graph, node)
        except Exception as err:  # unresolved here: the node checks when it runs
            log.debug("DiffusionGemma: node %s's options not checked when queued: %s", node_id, err)
            continue
        if said is not None:
            node["inputs"][QUEUED_CHECK] = said


def on_prompt(json_data):
    """ComfyUI's on-prompt handler: checks the queued prompt's Decide options and hands it on."""
    if isinstance(json_data, dict):
        check_prompt(json_data.get("prompt"))
    return json_data
