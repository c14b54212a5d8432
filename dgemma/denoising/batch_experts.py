"""The experts of a batched forward, each row's tokens grouped alone, as its solo run groups them.

A mixture-of-experts layer multiplies each expert's tokens in one matmul. In a batch an expert gets
every row's tokens, and a matmul of more rows rounds differently (on the CPU a handful of rows takes
another kernel than many), which self-conditioning carries into every later step's entropy. So while
a batched forward runs (`rows_of`), each row's tokens are grouped alone. With transformers' grouped_mm
experts each row's two grouped matmuls are called on their own (its solo run's very calls: its tokens
in its sort's order, its groups; a grouped matmul's kernel depends on all its groups) and the rest
runs once; that is used where the function is the one this was written against and a probe of the
layer gives its row-by-row calls' bits. Anything else calls the layer's own forward row by row (exact
too, about twice the cost on the demo). On every device: the batch a request ran in never changes its
tokens (an accelerator reads the experts' weights once per row for it).
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import threading
import weakref

import torch

from ..loading.patching import note_once

CHECKED = "54beecae8764c6e9"  # sha256 (16 hex) of transformers' grouped_mm_experts_forward, as in 5.23
_rows = threading.local()  # the batch's row length while a batched forward runs in this thread
_fast: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # experts module -> its probe passed


@contextlib.contextmanager
def rows_of(length: int):
    """While a batched forward of rows of `length` tokens runs (0: none)."""
    _rows.length = length
    try:
        yield
    finally:
        _rows.length = 0


def _grouped_rows(module, hidden, index, weights, n: int) -> torch.Tensor:
    """transformers' grouped_mm experts forward, each row's grouped matmuls called on their own (the very
    calls of its solo run: its tokens, in its sort's order, its groups); the elementwise rest once."""
    from transformers.integrations.moe import _grouped_linear

    k, rows, experts = index.size(-1), hidden.shape[0] // n, module.num_experts
    ids, order = torch.sort(index.reshape(rows, n * k), dim=-1)
    base = torch.arange(rows, device=hidden.device)[:, None]
    picked = hidden[(order // k + n * base).reshape(-1)]
    offsets = torch.cumsum(torch.nn.functional.one_hot(ids, experts).sum(dim=1), dim=1, dtype=torch.int32)
    span = n * k
    up = torch.cat([_grouped_linear(picked[r * span:(r + 1) * span], module.gate_up_proj, offsets[r], None,
                                    module.is_transposed) for r in range(rows)])
    gated = module._apply_gate(up)
    down = torch.cat([_grouped_linear(gated[r * span:(r + 1) * span], module.down_proj, offsets[r], None,
                                      module.is_transposed) for r in range(rows)])
    flat = (order + span * base).reshape(-1)
    weighted = down * weights.reshape(-1)[flat].unsqueeze(-1)
    back = torch.empty_like(flat)
    back[flat] = torch.arange(flat.numel(), device=flat.device)
    return weighted[back].view(rows * n, k, -1).sum(dim=1).to(hidden.dtype)


def _by_row(forward, hidden, index, weights, n: int) -> torch.Tensor:
    return torch.cat([forward(hidden[i:i + n], index[i:i + n], weights[i:i + n])
                      for i in range(0, hidden.shape[0], n)])


def _may_group(module, forward, n: int) -> bool:
    """Whether `_grouped_rows` stands for this layer's row-by-row calls: its implementation is the checked
    grouped_mm, and a probe of three rows (one expert given a single token, one two) gave the same bits."""
    if module not in _fast:
        _fast[module] = _probe(module, forward, n)
    return _fast[module]


def _probe(module, forward, n: int) -> bool:
    try:
        from transformers.integrations import moe

        plain = (getattr(module.config, "_experts_implementation", None) == "grouped_mm"
                 and not getattr(module, "has_bias", True) and not getattr(module, "_is_expert_parallel", True)
                 and not getattr(module, "has_post_expert_norm", True)
                 and hashlib.sha256(inspect.getsource(moe.grouped_mm_experts_forward).encode()).hexdigest()[:16]
                 == CHECKED)
    except (ImportError, AttributeError, OSError, TypeError):
        return False
    if not plain:
        return False
    w = module.gate_up_proj
    gen = torch.Generator(device=w.device).manual_seed(0)
    width = w.shape[-2] if module.is_transposed else w.shape[-1]  # the experts' input
    hidden = torch.randn(3 * n, width, generator=gen, device=w.device).to(w.dtype)
    scores = torch.rand(3 * n, module.num_experts, generator=gen, device=w.device)
    scores[:, -1] -= 1  # the last expert only where forced: groups of one and two tokens, as real routing has
    scores[[0, n, n + 1], -1] += 3
    top = scores.topk(min(2, module.num_experts), dim=-1)
    return torch.equal(_by_row(forward, hidden, top.indices, top.values, n),
                       _grouped_rows(module, hidden, top.indices, top.values, n))


def _alone(module, forward):
    def experts(hidden_states, top_k_index, top_k_weights, *args, **kwargs):
        n = getattr(_rows, "length", 0)
        if not n or hidden_states.shape[0] <= n or args or kwargs:
            return forward(hidden_states, top_k_index, top_k_weights, *args, **kwargs)
        if _may_group(module, forward, n):
            return _grouped_rows(module, hidden_states, top_k_index, top_k_weights, n)
        return _by_row(forward, hidden_states, top_k_index, top_k_weights, n)

    experts.rows_alone = True
    return experts


def experts_by_row(model) -> bool:
    """Give the decoder's mixture-of-experts layers (the module instances) their path for a batched
    forward; False where none was given it (no such layer of the kind checked)."""
    layers = getattr(getattr(getattr(model, "model", None), "decoder", None), "layers", ())
    applied = False
    for layer in layers:
        experts = getattr(layer, "experts", None)
        if experts is None:
            continue
        if not getattr(experts.forward, "rows_alone", False):
            names = list(inspect.signature(experts.forward).parameters)[:3]
            if names != ["hidden_states", "top_k_index", "top_k_weights"]:
                continue
            experts.forward = _alone(experts, experts.forward)
        applied = True
    note_once("transformers experts rows", applied, "a batch's rows take the experts alone"
              if applied else "no experts of the kind checked")
    return applied
