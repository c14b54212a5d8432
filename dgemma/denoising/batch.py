"""One decoder forward for many lanes: their caches as one left-padded batch, masked per layer kind.

Each lane keeps its own cache, prefilled alone, so what the encoder wrote is bit for bit what a
solo run writes. Per forward the working lanes' caches are stacked, each row padded on the left to
the longest (sliding layers hold at most their window, so full and sliding layers pad apart), and
keeps its own canvas positions. Where rows are padded, sdpa attends row by row over each row's own
keys (`rows_attention`, a patch listed in dgemma/loading/patches.py), so attention rounds as in a solo run;
on the CPU the mixture-of-experts layers group each row's tokens alone too (dgemma/denoising/batch_experts.py), so
every row's logits are its solo run's to the bit. Every other layer runs once for the whole batch. The
stacked view is rebuilt only when the working lanes or their blocks change.
"""

from __future__ import annotations

import inspect

import torch

from ..loading.patching import LOCK, note_once
from .batch_experts import experts_by_row, rows_of
from .cache import fork_cache

SLIDING, FULL = "sliding_attention", "full_attention"


class RowKeys:
    """The attention "mask" of a batch whose rows hold different numbers of keys: row r's first
    `pads[r]` keys are padding."""

    def __init__(self, pads):
        self.pads = tuple(int(p) for p in pads)


def _rows_alone(sdpa):
    def attention(module, query, key, value, attention_mask, **kwargs):
        if not isinstance(attention_mask, RowKeys):
            return sdpa(module, query, key, value, attention_mask, **kwargs)
        rows = [sdpa(module, query[r:r + 1], key[r:r + 1, :, p:], value[r:r + 1, :, p:], None, **kwargs)[0]
                for r, p in enumerate(attention_mask.pads)]
        return torch.cat(rows), None

    attention.rows_alone = True
    return attention


def rows_attention() -> bool:
    """Give transformers' sdpa attention a path for `RowKeys`: each row attends over its own keys alone,
    with a solo run's very arithmetic (a masked batch rounds differently, which moves tokens at half
    precision). False where the registry or sdpa's signature is not the kind this was checked against."""
    try:
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    except ImportError:
        return False
    installed = lambda: getattr(ALL_ATTENTION_FUNCTIONS["sdpa"] if "sdpa" in ALL_ATTENTION_FUNCTIONS else None,
                                "rows_alone", False)
    if installed():  # in place already: no lock on the way of every batch
        return True
    with LOCK:
        sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"] if "sdpa" in ALL_ATTENTION_FUNCTIONS else None
        if sdpa is not None and not getattr(sdpa, "rows_alone", False):
            names = list(inspect.signature(sdpa).parameters)[:5]
            if names == ["module", "query", "key", "value", "attention_mask"]:
                ALL_ATTENTION_FUNCTIONS["sdpa"] = _rows_alone(sdpa)
        applied = installed()
    note_once("transformers sdpa rows", applied, "a padded batch attends row by row" if applied else "sdpa differs")
    return applied


def _left_pad(t: torch.Tensor, n: int) -> torch.Tensor:
    pad = n - t.shape[-2]
    return t if pad == 0 else torch.cat([t.new_zeros(*t.shape[:-2], pad, t.shape[-1]), t], dim=-2)


def _mask(lengths: list[int], n: int, canvas_length: int, device, rows_alone: bool):
    """What keeps each row to its own keys and the canvas: None when no row is padded; the rows' padding
    for sdpa's row-by-row path (a solo run's arithmetic); else a (B, 1, L, n + L) bool mask."""
    if all(k == n for k in lengths):
        return None
    if rows_alone:
        return RowKeys([n - k for k in lengths])
    seen = torch.arange(n + canvas_length, device=device)[None, :] >= torch.tensor(
        [n - k for k in lengths], device=device)[:, None]
    return seen[:, None, None, :].expand(len(lengths), 1, canvas_length, n + canvas_length)


class View:
    """The stacked cache, per-kind masks and per-row positions of one set of lanes in their blocks."""

    def __init__(self, lanes, rows_alone: bool):
        caches = [lane.decoder.cache for lane in lanes]
        d = lanes[0].decoder
        self.cache = fork_cache(caches[0])
        self.masks: dict[str, torch.Tensor | None] = {}
        for i, layer in enumerate(self.cache.layers):
            keys = [c.layers[i].keys for c in caches]
            values = [c.layers[i].values for c in caches]
            n = max(k.shape[-2] for k in keys)
            layer.keys = torch.cat([_left_pad(k, n) for k in keys])
            layer.values = torch.cat([_left_pad(v, n) for v in values])
            kind = SLIDING if self.cache.is_sliding[i] else FULL
            if kind not in self.masks:
                self.masks[kind] = _mask([k.shape[-2] for k in keys], n, d.L, d.device, rows_alone)
        self.positions = torch.cat([lane.decoder.positions for lane in lanes])


class BatchForward:
    """`forward(lanes)` -> [(lanes, logits (B, L, V))]: one forward per self-conditioning kind.

    A lane at a block's first step has no self-conditioning yet; it runs in its own forward with the
    other such lanes, as the model's forward takes the signal for the whole batch or none.
    """

    def __init__(self, model):
        self.model = model
        self.views: dict[tuple, View] = {}
        implementation = model.config.get_text_config(decoder=True)._attn_implementation
        self.rows_alone = implementation == "sdpa" and rows_attention()
        self.experts_alone = experts_by_row(model)

    def _view(self, lanes) -> View:
        key = tuple((id(lane), lane.block) for lane in lanes)
        if key not in self.views:
            if len(self.views) > 1:
                self.views.clear()
            self.views[key] = View(lanes, self.rows_alone)
        return self.views[key]

    def _run(self, lanes) -> torch.Tensor:
        d, view = lanes[0].decoder, self._view(lanes)
        canvas = torch.cat([lane.canvas for lane in lanes])
        fresh = lanes[0].self_cond is None
        self_cond = None if fresh else torch.cat([lane.self_cond for lane in lanes])
        with rows_of(d.L if self.experts_alone else 0):
            return self.model(decoder_input_ids=canvas, self_conditioning_logits=self_cond,
                              decoder_attention_mask=view.masks, decoder_position_ids=view.positions,
                              **{d.model_kw: view.cache}).logits

    def __call__(self, lanes) -> list[tuple[list, torch.Tensor]]:
        groups = []
        for fresh in (True, False):
            group = [lane for lane in lanes if (lane.self_cond is None) == fresh]
            if group:
                groups.append((group, self._run(group)))
        return groups


def give_back_freed() -> None:
    """Return the C heap's free pages to the system (glibc's malloc_trim; elsewhere nothing). A long list
    frees each item's cache and step tensors among the results it keeps, and glibc gives back only the
    top of its heap on its own, so the freed holes would count as the process's memory item after item."""
    global _trim
    if _trim is None:
        try:
            import ctypes

            _trim = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):
            _trim = False
    if _trim:
        _trim(0)


_trim = None
MAX_BATCH_CAP = 32  # beyond this a step is compute-bound on any device we know; more items only add latency
MEMORY_SHARE = 0.5  # of the free memory a batch may plan to take (activations and allocator slack take the rest)


def item_bytes(dm, held_tokens: int) -> int:
    """What one more item adds to a batched step: the device plan's one-step working memory (at the real
    vocabulary the self-conditioning alone is canvas x 262,144 values) plus its rows of the stacked cache."""
    from ..loading.deviceplan import kv_bytes, step_bytes

    tc = dm.model.config.get_text_config(decoder=True)
    width = next(dm.model.parameters()).element_size()
    return step_bytes(tc, dm.canvas_length, held_tokens) + kv_bytes(tc, held_tokens, width)


def default_max_batch(dm, held_tokens: int, free: int) -> int:
    """Items per batch that fit in `free` bytes (between 1 and MAX_BATCH_CAP)."""
    return max(1, min(MAX_BATCH_CAP, int(free * MEMORY_SHARE) // max(item_bytes(dm, held_tokens), 1)))


def fitting_batch(requests) -> int:
    """The default batch size of these requests: what fits in the free memory of their model's device."""
    from ..loading.machine import current
    from .cache import input_device

    dm = requests[0].dm
    held = max((r.context.length if r.context is not None else 0) + len(r.turn) + r.blocks * dm.canvas_length
               for r in requests)
    return default_max_batch(dm, held, current().free(input_device(dm.model)))
