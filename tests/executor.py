"""Call a node the way ComfyUI's executor does, and check what comes back against its declaration."""

from __future__ import annotations

import torch

from diffusiongemma.dgemma import CanvasState, CanvasTrace, DGemmaModel, RunConfig
from diffusiongemma.dgemma.denoising.context import KVCache
from diffusiongemma.remote.model import RemoteContext, RemoteModel
from diffusiongemma.runner.execute import call_node

PYTHON_TYPES = {"STRING": str, "IMAGE": torch.Tensor, "DGEMMA_MODEL": (DGemmaModel, RemoteModel),
                "DGEMMA_CANVAS_STATE": CanvasState, "DGEMMA_CANVAS_TRACE": CanvasTrace, "DGEMMA_RUN_CONFIG": RunConfig,
                "DGEMMA_KV_CACHE": (KVCache, RemoteContext)}
HIDDEN = {"UNIQUE_ID": "17", "PROMPT": {}, "EXTRA_PNGINFO": None}


def call(cls, **inputs):
    """INPUT_TYPES -> FUNCTION(**inputs, hidden...) -> (outputs, ui); checks names, types, lists.

    A list node (a sampler) given no list returns its one item's outputs, as a downstream node sees
    them; given lists, its lists.
    """
    spec = cls.INPUT_TYPES()
    missing = set(spec.get("required", {})) - set(inputs)
    assert not missing, f"missing required inputs {missing}"
    declared = set(spec.get("required", {})) | set(spec.get("optional", {}))
    assert set(inputs) <= declared, f"undeclared inputs {set(inputs) - declared}"
    kwargs = dict(inputs)
    if getattr(cls, "INPUT_IS_LIST", False):
        kwargs = {k: v if isinstance(v, list) else [v] for k, v in kwargs.items()}
    # a hidden input of the pack's own type gets only what the prompt holds for it: nothing here
    hidden = {name: HIDDEN[kind] for name, kind in spec.get("hidden", {}).items() if kind in HIDDEN}
    out, ui = call_node(cls, kwargs, hidden)
    assert isinstance(out, tuple) and len(out) == len(cls.RETURN_TYPES) == len(cls.RETURN_NAMES)
    as_list = getattr(cls, "OUTPUT_IS_LIST", (False,) * len(out))
    assert len(getattr(cls, "OUTPUT_TOOLTIPS", out)) == len(out)
    for value, kind, listed in zip(out, cls.RETURN_TYPES, as_list):
        items = value if listed else [value]
        assert not listed or isinstance(value, list)
        for item in items:
            assert isinstance(item, PYTHON_TYPES[kind]), (kind, type(item))
            if kind == "IMAGE":
                assert item.dtype == torch.float32 and item.ndim == 4 and item.shape[-1] == 3
                assert 0.0 <= float(item.min()) and float(item.max()) <= 1.0
    per_item = getattr(cls, "ITEM_OUTPUT_IS_LIST", None)
    if per_item is not None and not any(isinstance(v, list) for v in inputs.values()):
        assert all(len(v) == 1 for v, listed in zip(out, per_item) if not listed)
        out = tuple(v if listed else v[0] for v, listed in zip(out, per_item))
    return out, ui
