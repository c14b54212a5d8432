"""Checks before any weight is read: are the files whole, and where will the weights fit?

The checkpoint's size comes from its safetensors headers (or, for a hub id, its index), so a
model that cannot fit is refused in milliseconds instead of after reading 54 GB.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

HEADROOM = 0.9       # use at most this share of free memory for weights
GIB = 1024**3
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
               "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


@dataclass(frozen=True)
class Plan:
    """Where the weights go: one device, or a device_map with per-device budgets (offload)."""

    device: str
    device_map: object
    max_memory: dict | None
    weight_bytes: int


def safetensors_bytes(path: Path) -> tuple[int, dict[str, int]]:
    """Tensor bytes in one file and the count per dtype; refuses a truncated or foreign file."""
    size = path.stat().st_size
    with path.open("rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise ValueError(f"{path.name} is not a safetensors file (only {size} bytes); download it again")
        (length,) = struct.unpack("<Q", head)
        if length > size - 8:
            raise ValueError(f"{path.name} is truncated (header says {length} bytes, file has {size}); "
                             "download the checkpoint again")
        header = json.loads(fh.read(length))
    end, per_dtype = 0, {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, stop = info["data_offsets"]
        end = max(end, stop)
        per_dtype[info["dtype"]] = per_dtype.get(info["dtype"], 0) + (stop - start)
    if 8 + length + end > size:
        raise ValueError(f"{path.name} is truncated: its tensors need {8 + length + end} bytes, the file has "
                         f"{size}; download the checkpoint again")
    return end, per_dtype


def checkpoint_bytes(folder: Path) -> tuple[int, dict[str, int]]:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{str(folder)!r} holds no *.safetensors weights; this loader reads safetensors only")
    total, per_dtype = 0, {}
    for path in files:
        size, kinds = safetensors_bytes(path)
        total += size
        for k, v in kinds.items():
            per_dtype[k] = per_dtype.get(k, 0) + v
    return total, per_dtype


def hub_bytes(repo_id: str, local_files_only: bool) -> int | None:
    """Total size from the hub index (a small file), or None when it cannot be read."""
    from huggingface_hub import hf_hub_download

    try:
        index = hf_hub_download(repo_id, "model.safetensors.index.json", local_files_only=local_files_only)
    except Exception:
        return None
    return int(json.loads(Path(index).read_text()).get("metadata", {}).get("total_size", 0)) or None


def loaded_bytes(stored: int, per_dtype: dict[str, int], dtype) -> int:
    """Bytes in memory once floating weights are cast to `dtype` ("auto" keeps them)."""
    if dtype == "auto" or not per_dtype:
        return stored
    target = torch.tensor([], dtype=dtype).element_size()
    floats = {k: v for k, v in per_dtype.items() if k.startswith(("F", "BF"))}
    return stored - sum(floats.values()) + sum(v // DTYPE_BYTES[k] * target for k, v in floats.items())


def free_ram() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def free_vram() -> int:
    return torch.cuda.mem_get_info()[0] if torch.cuda.is_available() else 0


def plan(weight_bytes: int, device: str, ram: int | None = None, vram: int | None = None) -> Plan:
    """Choose the placement for `device` (auto, cuda or cpu) or refuse with the fix."""
    ram = free_ram() if ram is None else ram
    vram = free_vram() if vram is None else vram
    need = f"{weight_bytes / GIB:.1f} GiB"
    if device == "cpu" or (device == "auto" and not torch.cuda.is_available() and not vram):
        if weight_bytes > ram * HEADROOM:
            raise ValueError(f"the weights need {need} but only {ram / GIB:.1f} GiB of RAM is free; free memory, "
                             "use a GPU (device auto), or load the AutoRound INT4 checkpoint (quant autoround)")
        return Plan("cpu", None, None, weight_bytes)
    if weight_bytes <= vram * HEADROOM:
        return Plan("cuda", {"": 0}, None, weight_bytes)
    if device == "cuda":
        raise ValueError(f"the weights need {need} but the GPU has {vram / GIB:.1f} GiB free; choose device auto "
                         "to offload the rest to CPU RAM, or quant autoround (about 30 GB for the real model)")
    if weight_bytes > (vram + ram) * HEADROOM:
        raise ValueError(f"the weights need {need} but GPU and RAM together have {(vram + ram) / GIB:.1f} GiB "
                         "free; close other programs or load the AutoRound INT4 checkpoint (quant autoround)")
    budget = {0: int(vram * HEADROOM), "cpu": int(ram * HEADROOM)}
    return Plan("cuda", "auto", budget, weight_bytes)
