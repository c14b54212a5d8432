"""Where a GGUF model goes, decided before any weight is allocated: its tensors as they will be held plus
one step's working memory, against the free VRAM or RAM (deviceplan), or a refusal naming what works.

Held: every 2-D and 3-D tensor stays in its GGUF blocks (the file's bytes); norms, scales and scalars are
made plain tensors of the compute dtype. A step adds to deviceplan's logit-sized temporaries and KV cache
what dequantizing costs: the token embedding dense for the whole forward (held once per step) and one
layer's experts dense at a time, beside the previous step's logits that the self-conditioning reads.
"""

from __future__ import annotations

import torch

from . import deviceplan, machine
from .gguf_modules import CHUNK_BYTES

SELF_COND_BYTES_PER_LOGIT = 4  # the kept float32 logits of the previous step, read by the self-conditioning


def held_bytes(plan: dict, dtype: torch.dtype) -> int:
    """Bytes the loaded model holds: blocks at their stored size, 1-D tensors in `dtype`."""
    element = torch.tensor([], dtype=dtype).element_size()
    total = 0
    for t in plan.values():
        numel = 1
        for d in t.shape:
            numel *= d
        total += t.nbytes if len(t.shape) >= 2 else numel * element
    return total


def dense_bytes(text_config, dtype: torch.dtype) -> int:
    """What a forward holds dequantized at its fullest: the embedding, one layer's experts and one chunk's
    float32 intermediate."""
    element = torch.tensor([], dtype=dtype).element_size()
    embedding = text_config.vocab_size * text_config.hidden_size
    experts = 0
    if getattr(text_config, "enable_moe_block", False) and text_config.num_experts:
        experts = 3 * text_config.num_experts * text_config.moe_intermediate_size * text_config.hidden_size
    return (embedding + experts) * element + CHUNK_BYTES


def need(plan: dict, text_config, canvas: int, dtype: torch.dtype) -> deviceplan.Need:
    weights = held_bytes(plan, dtype)
    inside = dense_bytes(text_config, dtype) + SELF_COND_BYTES_PER_LOGIT * canvas * text_config.vocab_size
    step = deviceplan.kv_bytes(text_config, deviceplan.LOAD_CONTEXT) + max(
        deviceplan.logit_bytes(text_config, canvas), inside)
    return deviceplan.Need(weights, weights, step, deviceplan.kept_bytes(text_config, canvas))


def place(plan: dict, config, device: str, dtype, host: machine.Machine) -> tuple[str, torch.dtype]:
    """(device, compute dtype) for this GGUF on `host`; a deviceplan.Refusal with the routes that work when it
    does not fit. `dtype` auto computes in bfloat16 on the GPU and float32 on the CPU."""
    on_gpu = device != "cpu" and host.gpu() is not None
    compute = dtype if dtype != "auto" else (torch.bfloat16 if on_gpu else torch.float32)
    wanted = need(plan, config.get_text_config(decoder=True), config.canvas_length, compute)
    placed = deviceplan.plan(wanted, device, quant="gguf", **host.room(device, wanted.peak))
    return machine.bind(placed, host.accelerator).device, compute
