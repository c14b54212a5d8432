"""Encoded context as an immutable KV cache payload: mint, advance, validate, fork.

Nothing here grows a cache someone else holds: every use starts from a zero-copy fork, so one
payload can be reused and fanned out to any number of runs with identical results.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..errors import Cancelled, InputError
from ..inputs.tokens import check_text, literal_ids
from ..inputs.vision import check_image_tensor, check_vision, image_token_ids, prepare_images
from ..loading.lora import applied
from ..paths import shown_path
from ..payloads import check_model
from .cache import encode_ids, fork_cache, input_device, new_cache

CHUNK = 1024  # tokens encoded per forward, so a long context stays interruptible


GEOMETRY_KEYS = ("layer_types", "hidden_size", "sliding_window", "vocab_size", "head_dim", "num_key_value_heads",
                 "global_head_dim", "num_global_key_value_heads", "per_layer_config")


def geometry(model) -> dict:
    """What makes a cache fit a model: layer kinds and attention shapes, as the config states them."""
    tc = model.config.get_text_config(decoder=True).to_dict()
    return {**{k: tc.get(k) for k in GEOMETRY_KEYS}, "canvas_length": model.config.canvas_length}


@dataclass(frozen=True, eq=False)
class KVCache:
    """An encoded token sequence. Never mutated: runs read it through `fork_for`."""

    cache: object
    token_ids: tuple[int, ...]   # provenance: every id this cache holds, in order
    model_source: str
    tokenizer_fingerprint: str
    geometry: dict
    images: tuple[dict, ...] = ()  # provenance of the images it holds: count, sizes, content hash
    checkpoint: str = ""           # the minting model's identity: the same files, not only the same folder

    def __repr__(self) -> str:
        """A line, never every id: ComfyUI puts str() of every input into its error report."""
        return f"KVCache({self.length} tokens from {shown_path(self.model_source)!r}, {len(self.images)} image(s))"

    @property
    def length(self) -> int:
        return len(self.token_ids)

    def check_model(self, dm) -> None:
        """Refuse a cache minted by a different model or tokenizer, before any work."""
        mine = geometry(dm.model)
        if self.geometry != mine:
            diff = {k: (v, mine.get(k)) for k, v in self.geometry.items() if mine.get(k) != v}
            raise InputError("context", f"the KV context was encoded by a model with another geometry {diff} "
                                        "(context, model); encode the context again with this model")
        if self.model_source != dm.source:
            raise InputError("context", f"the KV context was encoded by {self.model_source!r}, not by "
                                        f"{dm.source!r}; encode the context again with the model this run uses")
        if self.tokenizer_fingerprint != dm.tokenizer_fingerprint:
            raise InputError("context", f"the KV context was encoded with tokenizer {self.tokenizer_fingerprint}, "
                                        f"this model's is {dm.tokenizer_fingerprint}; encode the context again "
                                        "with this model")
        if self.checkpoint != dm.identity:
            raise InputError("context", f"the KV context was encoded by checkpoint {self.checkpoint} of "
                                        f"{self.model_source!r}, but what this model loaded from there is "
                                        f"{dm.identity} (its weights, config or tokenizer changed); encode the "
                                        "context again with this model")

    def fork_for(self, dm):
        """A private cache on the model's device and dtype; the payload's tensors are untouched."""
        forked = fork_cache(self.cache)
        device = input_device(dm.model)
        dtype = next(dm.model.parameters()).dtype
        for layer in forked.layers:
            keys = getattr(layer, "keys", None)
            if isinstance(keys, torch.Tensor) and keys.numel() and (keys.device != device or
                                                                    (keys.is_floating_point() and keys.dtype != dtype)):
                layer.keys = keys.to(device=device, dtype=dtype)
                layer.values = layer.values.to(device=device, dtype=dtype)
        return forked

    def summary(self) -> dict:
        ids = ",".join(map(str, self.token_ids)).encode()
        summary = {"length": self.length, "model_source": shown_path(self.model_source),
                   "tokenizer_fingerprint": self.tokenizer_fingerprint,
                   "token_ids_sha256": hashlib.sha256(ids).hexdigest()[:16]}
        # Image placeholders are the same ids for every picture: only the records tell them apart.
        return {**summary, "images": list(self.images)} if self.images else summary

    def advanced(self, cache, new_ids, images: tuple[dict, ...] = ()) -> KVCache:
        return KVCache(cache, self.token_ids + tuple(int(i) for i in new_ids), self.model_source,
                       self.tokenizer_fingerprint, self.geometry, self.images + tuple(images), self.checkpoint)


def encode_context(dm, text: str, onto: KVCache | None = None,
                   should_cancel: Callable[[], bool] | None = None, image=None) -> KVCache:
    """Mint a cache from raw `text` (no chat framing), or advance `onto` with more text.

    `image` (a ComfyUI IMAGE batch) is encoded before the text as bare image blocks, no chat
    framing either; with an image the text may be empty.
    """
    check_model(dm)
    check_text("text", text)
    if image is not None:
        check_image_tensor("image", image)
        check_vision("image", dm)
    if not text.strip() and image is None:
        raise InputError("text", "text is empty; type the context to encode (a document, a prior turn)")
    if onto is not None and not isinstance(onto, KVCache):
        raise InputError("context", f"the KV context to continue must be an encoded context, got "
                                    f"{type(onto).__name__}; encode one with encode_context")
    if onto is not None:
        onto.check_model(dm)
    images = prepare_images(dm, image) if image is not None else None
    head = [] if onto is not None else [dm.tokenizer.bos_token_id]  # a minted context carries the only BOS
    if images is not None:
        image_id, boi_id, eoi_id = image_token_ids(dm)
        head = images.expand(head + [image_id] * images.record["count"], image_id, boi_id, eoi_id)
    body = literal_ids(dm.tokenizer, text) if text.strip() else []
    ids = head + body
    held = (onto.length if onto is not None else 0) + len(ids)
    if held > dm.max_positions:
        raise InputError("text", f"text is {len(ids)} tokens; with the context before it that is {held}, over "
                                 f"the model's {dm.max_positions} positions; shorten it")
    return _encoded(dm, ids, len(head) if images is not None else 0, images, onto, should_cancel)


def _encoded(dm, ids, image_end: int, images, onto, should_cancel) -> KVCache:
    """`ids` encoded onto a fork of `onto` (or a new cache): ids[:image_end] with the images in one
    forward, the rest in chunks, with a cancel check before each."""
    cache = onto.fork_for(dm) if onto is not None else new_cache(dm.model)
    with applied(dm):  # the payload's adapters, if any, in its forwards only
        if images is not None:
            encode_ids(dm.model, cache, ids[:image_end], images)
        for chunk in range(image_end, len(ids), CHUNK):
            if should_cancel is not None and should_cancel():
                raise Cancelled(0)
            encode_ids(dm.model, cache, ids[chunk:chunk + CHUNK])
    seen = (images.record,) if images is not None else ()
    return onto.advanced(cache, ids, seen) if onto is not None else mint(dm, cache, ids, seen)


def encode_chat(dm, ids: list[int], image=None, onto: KVCache | None = None,
                should_cancel: Callable[[], bool] | None = None) -> KVCache:
    """A KV context holding a templated conversation's ids (`chat.chat_ids`), its image placeholders
    filled by `image` (a ComfyUI IMAGE batch, one image per placeholder, in order)."""
    check_model(dm)
    if onto is not None:
        onto.check_model(dm)
    images, end = None, 0
    if image is not None:
        images = prepare_images(dm, image)
        image_id, boi_id, eoi_id = image_token_ids(dm)
        if ids.count(image_id) != images.record["count"]:
            raise InputError("image", f"the model's chat template placed {ids.count(image_id)} image(s) for "
                                      f"{images.record['count']} given; this checkpoint's template cannot take them")
        ids = images.expand(ids, image_id, boi_id, eoi_id)
        end = len(ids) - ids[::-1].index(eoi_id)
    held = (onto.length if onto is not None else 0) + len(ids)
    if held > dm.max_positions:
        raise InputError("messages", f"the conversation is {len(ids)} tokens; with the context before it that is "
                                     f"{held}, over the model's {dm.max_positions} positions; shorten it")
    return _encoded(dm, ids, end, images, onto, should_cancel)


def mint(dm, cache, ids, images: tuple[dict, ...] = ()) -> KVCache:
    return KVCache(cache, tuple(int(i) for i in ids), dm.source, dm.tokenizer_fingerprint, geometry(dm.model),
                   tuple(images), dm.identity)
