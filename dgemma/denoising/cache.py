"""KV cache primitives: a fresh cache, a zero-copy fork, and encoding at global positions."""

from __future__ import annotations

import copy
import itertools

import torch

from ..versions import cache_kw
from .threads import with_compute_threads


def new_cache(model):
    from transformers import DynamicCache

    return DynamicCache(config=model.config.get_text_config(decoder=True))


def fork_cache(cache):
    """A cache that can grow without touching `cache`: DynamicCache layers replace their tensors
    (torch.cat) on update, so copying the layer objects is enough and shares no mutable state."""
    new = copy.copy(cache)
    new.layers = [copy.copy(layer) for layer in cache.layers]
    return new


def input_device(model) -> torch.device:
    """Where token ids must live: the device of the (tied) embedding's tensors (its first parameter or buffer:
    a GGUF embedding holds blocks, and reading its `weight` would dequantize the whole of it)."""
    embedding = model.get_input_embeddings()
    return next(itertools.chain(embedding.parameters(), embedding.buffers())).device


@torch.no_grad()
@with_compute_threads
def encode_ids(model, cache, ids, images=None) -> None:
    """Append `ids` to `cache` at the next global positions (position = index in the sequence).

    `images` (an ImageInput) fills the ids' image placeholders with the vision tower's features.
    """
    device = input_device(model)
    ids = torch.as_tensor(ids, dtype=torch.long, device=device).reshape(1, -1)
    start = cache.get_seq_length()
    positions = torch.arange(start, start + ids.shape[1], device=device).unsqueeze(0)
    encoder = model.model.encoder
    extra = {}
    if images is not None:
        dtype = next(encoder.vision_tower.parameters()).dtype
        extra = images.encoder_kwargs(ids, model.config.image_token_id, device, dtype)
    encoder(input_ids=ids, position_ids=positions, **extra, **{cache_kw(type(encoder).forward): cache})
