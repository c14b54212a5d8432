"""Checks before any weight is read: is the checkpoint code-free and whole, and where will it fit?

config.json is read as plain JSON before transformers sees the folder, so a checkpoint that asks
to run its own code is refused without importing anything. The checkpoint's size comes from its
safetensors headers (or, for a hub id, its index), so a model that cannot fit is refused in
milliseconds instead of after reading 54 GB.
"""

from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path

import torch

from ..errors import short

GIB = 1024**3
MODEL_TYPE = "diffusion_gemma"
MAX_HEADER = 100_000_000  # safetensors' own limit on a header
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8,
               "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "C64": 8}
# Files beside config.json whose auto_map would make transformers import code from the checkpoint.
CODE_MAPS = ("tokenizer_config.json", "processor_config.json", "preprocessor_config.json")
def read_json(path: Path) -> dict:
    """A JSON object from a checkpoint file; refuses text that is not one."""
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path.name} in {str(path.parent)!r} is not valid JSON ({exc}); download the "
                         "checkpoint again") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path.name} in {str(path.parent)!r} holds a JSON {type(data).__name__}, not an "
                         "object; download the checkpoint again")
    return data


def check_config(config: dict, where: str) -> None:
    """Refuse a config.json that asks for the checkpoint's own code or is not a DiffusionGemma config."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if "auto_map" in config:
        raise ValueError(f"config.json of {where!r} has auto_map {short(config['auto_map'])}: the checkpoint asks "
                         "to run its own Python code, which this loader never does; use the official "
                         f"DiffusionGemma checkpoint (model_type {MODEL_TYPE!r}, no auto_map)")
    model_type = config.get("model_type")
    if model_type == MODEL_TYPE:
        return
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING_NAMES:
        raise ValueError(f"config.json of {where!r} has model_type {short(model_type)}, which this transformers "
                         f"does not know; use a DiffusionGemma checkpoint (model_type {MODEL_TYPE!r})")
    raise ValueError(f"config.json of {where!r} has model_type {model_type!r}, not DiffusionGemma's; use a "
                     f"DiffusionGemma checkpoint (model_type {MODEL_TYPE!r})")


def check_folder(folder: Path) -> dict:
    """The folder's config.json, once the folder is known to hold no code for transformers to run."""
    code = sorted(str(p.relative_to(folder)) for p in folder.rglob("*.py"))
    if code:
        raise ValueError(f"model folder {str(folder)!r} holds Python code ({short(code)}); this loader never runs "
                         "checkpoint code, so remove those files or use the official DiffusionGemma checkpoint")
    for name in CODE_MAPS:
        if (folder / name).is_file() and "auto_map" in read_json(folder / name):
            raise ValueError(f"{name} in {str(folder)!r} has an auto_map that asks to run the checkpoint's own "
                             "code, which this loader never does; remove its auto_map or download the official "
                             "DiffusionGemma files again")
    config = read_json(folder / "config.json")
    check_config(config, str(folder))
    return config


def read_header(path: Path) -> dict:
    """The JSON header of one safetensors file, every tensor entry checked; refuses a damaged or foreign file."""
    size = path.stat().st_size
    with path.open("rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise ValueError(f"{path.name} is not a safetensors file (only {size} bytes); download it again")
        (length,) = struct.unpack("<Q", head)
        if length > size - 8:
            raise ValueError(f"{path.name} is truncated (header says {length} bytes, file has {size}); "
                             "download the checkpoint again")
        if length > MAX_HEADER:  # never read gigabytes of "header" from a damaged file
            raise ValueError(f"{path.name} declares a {length}-byte header, over safetensors' 100 MB limit; the "
                             "file is damaged, download the checkpoint again")
        raw = fh.read(length)
    try:
        header = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path.name} has a header that is not UTF-8 text (bad byte at {exc.start}); the file "
                         "is damaged, download the checkpoint again") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path.name} has a header that is not valid JSON ({exc.msg} at byte {exc.pos}); the "
                         "file is damaged, download the checkpoint again") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path.name} has a header that is a JSON {type(header).__name__}, not an object; the "
                         "file is damaged, download the checkpoint again")
    for name, info in header.items():
        problem = None if name == "__metadata__" else _entry_problem(info)
        if problem:
            raise ValueError(f"{path.name}: tensor {short(name)} {problem}; the file is damaged, download the "
                             "checkpoint again")
    end = max((info["data_offsets"][1] for name, info in header.items() if name != "__metadata__"), default=0)
    if 8 + length + end > size:
        raise ValueError(f"{path.name} is truncated: its tensors need {8 + length + end} bytes, the file has "
                         f"{size}; download the checkpoint again")
    return header


def _entry_problem(info) -> str | None:
    """What is wrong with one tensor entry of a header, or None."""
    if not isinstance(info, dict):
        return f"is {short(info)}, not an object"
    for key in ("dtype", "shape", "data_offsets"):
        if key not in info:
            return f"has no {key}"
    dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
        return f"has unknown dtype {short(dtype)}"
    if not isinstance(shape, list) or not all(_count(d) for d in shape):
        return f"has bad shape {short(shape)}"
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_count(o) for o in offsets)
            and offsets[0] <= offsets[1]):
        return f"has bad data_offsets {short(offsets)} (need [start, end] with 0 <= start <= end)"
    if offsets[1] - offsets[0] != math.prod(shape) * DTYPE_BYTES[dtype]:
        return f"has data_offsets {short(offsets)} that do not fit its shape {short(shape)} of {dtype}"
    return None


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def safetensors_bytes(path: Path, header: dict | None = None) -> tuple[int, dict[str, int]]:
    """Tensor bytes in one file and the count per dtype; refuses a truncated or foreign file."""
    header = read_header(path) if header is None else header
    end, per_dtype = 0, {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, stop = info["data_offsets"]
        end = max(end, stop)
        per_dtype[info["dtype"]] = per_dtype.get(info["dtype"], 0) + (stop - start)
    return end, per_dtype


def read_headers(folder: Path) -> dict[Path, dict]:
    """The checked header of every *.safetensors file in `folder`."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{str(folder)!r} holds no *.safetensors weights; this loader reads safetensors only")
    return {path: read_header(path) for path in files}


def checkpoint_bytes(folder: Path, headers: dict[Path, dict] | None = None) -> tuple[int, dict[str, int]]:
    total, per_dtype = 0, {}
    for path, header in (read_headers(folder) if headers is None else headers).items():
        size, kinds = safetensors_bytes(path, header)
        total += size
        for k, v in kinds.items():
            per_dtype[k] = per_dtype.get(k, 0) + v
    return total, per_dtype


def hub_index(repo_id: str, local_files_only: bool) -> dict | None:
    """The hub checkpoint's index (a small file), or None when it cannot be read."""
    from huggingface_hub import hf_hub_download

    try:
        index = json.loads(Path(hf_hub_download(repo_id, "model.safetensors.index.json",
                                                local_files_only=local_files_only)).read_text())
    except Exception:
        return None
    return index if isinstance(index, dict) else None


def hub_bytes(repo_id: str, local_files_only: bool) -> int | None:
    """Total size from the hub index, or None when it cannot be read."""
    index = hub_index(repo_id, local_files_only) or {}
    metadata = index.get("metadata")
    total = metadata.get("total_size") if isinstance(metadata, dict) else None
    return total if _count(total) and total else None


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



