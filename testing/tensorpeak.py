"""The bytes of the tensors a piece of work makes and that are alive at once, at their peak: its own working
memory on any device, as a CUDA allocator's statistics would show it (without the weights and inputs it
was given, and without an allocator's slack). Every op's fresh output (not a view or an in-place result)
counts from its making until the last tensor on its storage is gone.
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class TensorPeak(TorchDispatchMode):
    """`peak`: the most bytes of fresh tensors alive at once while the mode was on; `live`: those alive now."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self._storages: dict[int, list] = {}  # data pointer -> [bytes, tensors on it that are alive]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        fresh = [r.alias_info is None for r in func._schema.returns]
        for i, t in enumerate(tree_leaves(out)):
            if not isinstance(t, torch.Tensor) or t.device.type == "meta":
                continue
            key = t.untyped_storage().data_ptr()
            if key not in self._storages:
                if not (fresh[i] if i < len(fresh) else fresh[-1:] == [True]):
                    continue  # a view or an in-place result on a storage made before
                self._storages[key] = [t.untyped_storage().nbytes(), 0]
                self.live += self._storages[key][0]
                self.peak = max(self.peak, self.live)
            self._storages[key][1] += 1
            weakref.finalize(t, self._drop, key)
        return out

    def _drop(self, key: int) -> None:
        entry = self._storages.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] == 0:
            self.live -= entry[0]
            del self._storages[key]
