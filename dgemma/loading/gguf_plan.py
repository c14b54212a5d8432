"""Where a GGUF model goes, decided before any weight is allocated: its tensors as they will be held plus
one step's working memory, against the free VRAM or RAM (deviceplan), or a refusal naming what works.

Held: every 2-D and 3-D tensor stays in its GGUF blocks (the file's bytes) but the token embedding, made
dense in the compute dtype; norms, scales and scalars are plain tensors of the compute dtype; and the
experts' scratch, one layer's experts dense (gguf_modules.Scratch). A step adds to deviceplan's
logit-sized temporaries and KV cache what dequantizing costs beyond that, one chunk's float32
intermediate, beside the previous step's logits that the self-conditioning reads.
"""

from __future__ import annotations

import math

import torch

from . import deviceplan, machine
from .gguf_modules import CHUNK_BYTES

EMBEDDING = "token_embd.weight"  # held dense: gguf_load
EXPERTS = "_exps.weight"  # the experts' GGUF tensors, dequantized into the scratch
SELF_COND_BYTES_PER_LOGIT = 4  # the kept float32 logits of the previous step, read by the self-conditioning


def held_bytes(plan: dict, dtype: torch.dtype) -> int:
    """Bytes the loaded model holds: blocks at their stored size; 1-D tensors, the token embedding and one
    buffer per expert tensor shape (the scratch) in `dtype`."""
    element = torch.tensor([], dtype=dtype).element_size()
    dense = {id(t): math.prod(t.shape) for t in plan.values() if len(t.shape) < 2 or t.name == EMBEDDING}
    scratch = {tuple(t.shape) for t in plan.values() if t.name.endswith(EXPERTS)}
    blocks = sum(t.nbytes for t in plan.values() if id(t) not in dense)
    return blocks + element * (sum(dense.values()) + sum(math.prod(shape) for shape in scratch))


def dense_bytes() -> int:
    """What a forward dequantizes beyond what the model holds: one chunk's float32 intermediate."""
    return CHUNK_BYTES


def need(plan: dict, text_config, canvas: int, dtype: torch.dtype) -> deviceplan.Need:
    weights = held_bytes(plan, dtype)
    inside = dense_bytes() + SELF_COND_BYTES_PER_LOGIT * canvas * text_config.vocab_size
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
