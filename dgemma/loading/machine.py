"""The machine a load plans for: which accelerator (by its own name, cuda:N) and what memory is free there.

Outside ComfyUI these are torch's figures for the current CUDA device, with what torch's caching allocator
holds reserved but unallocated counted as free (it hands that out again). Inside ComfyUI the node layer
installs ComfyUI's own (`use`): the device model management chose, its free memory, and its freeing of other
models before a load, so two loaders never count the same bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from . import deviceplan, preflight
from .load_options import resolve_device


@dataclass(frozen=True)
class Machine:
    """`accelerator`: the GPU a load may use, by name ("cuda:1"), None without one. `free(device)`: bytes free on
    a device (RAM for the CPU). `make_room(need, device)`: ask the host to free `need` bytes there."""

    accelerator: str | None
    free: Callable[[torch.device], int]
    total: Callable[[torch.device], int]
    make_room: Callable[[int, torch.device], None] = lambda need, device: None

    def gpu(self) -> torch.device | None:
        return None if self.accelerator is None else torch.device(self.accelerator)

    def room(self, device: str, peak: int) -> dict:
        """`figures` after the host freed room on its GPU for `peak` bytes (at most the card), when one is used."""
        gpu = self.gpu()
        if gpu is not None and device != "cpu":
            self.make_room(min(peak + deviceplan.CUDA_RESERVE, self.total(gpu)), gpu)
        return self.figures()

    def figures(self) -> dict:
        """What the device plan reads: free RAM, and the accelerator's free and total memory."""
        gpu = self.gpu()
        return {"ram": preflight.free_ram(), "vram": self.free(gpu) if gpu is not None else 0,
                "total_vram": self.total(gpu) if gpu is not None else 0}


def gpu_index(name: str) -> int:
    """The index of a CUDA device named "cuda:N" (plain "cuda": torch's current device)."""
    index = torch.device(name).index
    return torch.cuda.current_device() if index is None else index


def _torch_free(device: torch.device) -> int:
    if device.type != "cuda":
        return preflight.free_ram()
    free, _ = torch.cuda.mem_get_info(device)
    return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


def _torch_total(device: torch.device) -> int:
    return torch.cuda.mem_get_info(device)[1] if device.type == "cuda" else 0


def torch_machine() -> Machine:
    """torch's own view: the current CUDA device, if any."""
    name = f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else None
    return Machine(name, _torch_free, _torch_total)


_host: list[Callable[[], Machine]] = [torch_machine]


def use(host: Callable[[], Machine] | None) -> None:
    """Plan on `host()`'s machine from now on (None: torch's own again)."""
    _host[0] = host or torch_machine


def current() -> Machine:
    return _host[0]()


def on_device(device: str) -> tuple[Machine, str]:
    """(the machine to plan on, the device mode auto / cuda / cpu): a device named cuda:N is that accelerator."""
    from dataclasses import replace

    resolve_device(device)
    host = current()
    if device.startswith("cuda:"):
        return replace(host, accelerator=device), "cuda"
    return host, device


def bind(plan, accelerator: str | None):
    """A plan made for "the GPU" ("cuda", index 0 in its maps) placed on the named accelerator instead."""
    from dataclasses import replace

    if plan.device != "cuda" or accelerator is None:
        return plan
    index = gpu_index(accelerator)
    device_map = {"": index} if isinstance(plan.device_map, dict) else plan.device_map
    budget = None if plan.max_memory is None else {index if k == 0 else k: v for k, v in plan.max_memory.items()}
    return replace(plan, device=f"cuda:{index}", device_map=device_map, max_memory=budget)


def held_bytes(model) -> int:
    """Bytes a loaded model holds: each storage once (tied and shared tensors share one), quantized and GGUF
    weights at their stored size (their bytes are the storage)."""
    storages = {}
    for t in (*model.parameters(), *model.buffers()):
        if t.is_meta:  # an unloaded model's shell holds nothing
            continue
        storage = t.untyped_storage()
        storages[(t.device, storage.data_ptr())] = storage.nbytes()
    return sum(storages.values())
