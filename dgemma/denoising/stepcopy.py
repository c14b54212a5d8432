"""A step's record brought to the host in one copy: the step's one wait for the device.

Per step a lane keeps the canvas ids, what the scheduler committed, what the adaptive stop committed on
top, what a pin holds, what a constraint changed and the entropy (decision 0004), and the loop needs one
fact back: whether the block stopped. They are packed on the device into one small buffer (about 8
bytes per position), copied into a reused host buffer (pinned on CUDA; a batched step copies all its
lanes' steps at once), and read there: the recorder's row, the frame and every event are built from
host arrays, with no other wait. An entropy holding NaN (which only logits holding NaN or infinity
give) is refused there.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np
import torch

_HOST: set[int] = set()  # ids of the live host buffers (a tensor cannot be compared in a WeakSet)


def is_host(t) -> bool:
    """Whether `t` is a host buffer a step is copied into (dgemma's own; what a wait counter stops at)."""
    return id(t) in _HOST


def _host_buffer(size: int, device) -> torch.Tensor:
    buffer = torch.empty((1, size), dtype=torch.uint8, pin_memory=device.type == "cuda")
    _HOST.add(id(buffer))
    weakref.finalize(buffer, _HOST.discard, id(buffer))
    return buffer


@dataclass(frozen=True, eq=False)
class HostStep:
    """One step on the host: arrays the recorder may keep (each its own copy) and whether the block stopped."""

    ids: np.ndarray          # (L,) int32
    committed: np.ndarray    # (L,) bool: the scheduler's own mask
    stop: np.ndarray         # (L,) bool: what the adaptive stop committed
    entropy: np.ndarray      # (L,) float16
    pinned: np.ndarray | None
    constrained: np.ndarray | None
    stopped: bool
    extra: np.ndarray | None = None  # the bytes a step packed after its record (a capture's rows)

    @property
    def arrays(self) -> tuple:
        """What `Recorder.add_host` takes after the block and step."""
        return self.ids, self.committed, self.stop, self.entropy, self.pinned, self.constrained


@dataclass(frozen=True, eq=False)
class Packed:
    """One lane's step packed on the device (a (1, size) uint8 tensor) and the layout `_read` reads it by."""

    tensor: torch.Tensor
    length: int  # canvas positions
    has_pin: bool
    has_constraint: bool
    has_stop: bool
    extra: int = 0  # bytes after the record


def pack(canvas, committed, stop, entropy, pinned=None, constrained=None, stopped=None, extra=None) -> Packed:
    """Batch row 0 of one step's (1, L) tensors in one device buffer; `stopped` is the stop's device flag (None:
    it cannot stop); `extra` (1, n) uint8 rides along to the host."""
    masks = [_bytes(_row0(m)) for m in (committed, stop, pinned, constrained) if m is not None]
    pieces = [_row0(canvas).to(torch.int32).view(torch.uint8), _row0(entropy).to(torch.float16).view(torch.uint8),
              *masks]
    if stopped is not None:
        pieces.append(stopped.reshape(1, 1).view(torch.uint8))
    if extra is not None:
        pieces.append(extra)
    return Packed(torch.cat(pieces, dim=-1), canvas.shape[-1], pinned is not None, constrained is not None,
                  stopped is not None, 0 if extra is None else extra.shape[-1])


class StepCopy:
    """Host buffers for packed steps, one per size, reused every step."""

    def __init__(self, device):
        self.device = torch.device(device)
        self.buffers: dict[int, tuple[torch.Tensor, np.ndarray]] = {}

    def take_all(self, packs: list[Packed]) -> list[HostStep]:
        """Several lanes' packed steps on the host in one copy: a batched step's one wait. Raises when an
        entropy holds NaN: nothing can be drawn from such logits."""
        packed = packs[0].tensor if len(packs) == 1 else torch.cat([p.tensor for p in packs], dim=-1)
        size = packed.numel()
        if size not in self.buffers:
            buffer = _host_buffer(size, self.device)
            self.buffers[size] = (buffer, buffer.numpy()[0])
        buffer, view = self.buffers[size]
        buffer.copy_(packed)  # blocking: the step's one wait
        steps, at = [], 0
        for p in packs:
            n = p.tensor.shape[-1]
            steps.append(_read(view[at:at + n], p))
            at += n
        return steps


def _row0(t):
    """Batch row 0 of `t`, without a call where it is the only row (each torch call is host time on a GPU)."""
    return t if t.shape[0] == 1 else t[:1]


def _bytes(mask):
    """A mask's bytes (a bool tensor is one byte per element already)."""
    return (mask if mask.dtype == torch.bool else mask.to(torch.bool)).view(torch.uint8)


def _read(view: np.ndarray, p: Packed) -> HostStep:
    length, at = p.length, 6 * p.length
    ids = view[:4 * length].view(np.int32).copy()
    entropy = view[4 * length:at].view(np.float16).copy()
    if np.isnan(entropy).any():
        raise FloatingPointError("the model's logits hold NaN or infinity, so no token can be drawn from them "
                                 "(often a float16 overflow): load the model in bfloat16 or float32")
    masks = []
    for present in (True, True, p.has_pin, p.has_constraint):
        masks.append(view[at:at + length].view(np.bool_).copy() if present else None)
        at += length if present else 0
    stopped = bool(view[at]) if p.has_stop else False
    extra = view[at + p.has_stop:at + p.has_stop + p.extra].copy() if p.extra else None
    return HostStep(ids, masks[0], masks[1], entropy, masks[2], masks[3], stopped, extra)
