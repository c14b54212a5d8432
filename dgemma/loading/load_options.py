"""The loader's options, one table for the Loader node and the MCP server's load_model tool."""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from ..errors import short
from .quant import QUANTS

DTYPES = ("auto", "bfloat16", "float16", "float32")
DEVICES = ("auto", "cuda", "cpu")


def resolve_device(device: str) -> None:
    """Refuse a device that is not one of DEVICES or a CUDA device by index (cuda:N) this torch sees."""
    if isinstance(device, str) and re.fullmatch(r"cuda:\d{1,2}", device):
        count = torch.cuda.device_count()
        if int(device[5:]) >= count:
            raise ValueError(f"device is {device!r} but this torch sees {count} CUDA GPU(s); choose one below "
                             f"cuda:{count}, or 'auto'")
        return
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES} or cuda:N, got {short(device)}; pick one of those")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device is 'cuda' but this torch sees no CUDA GPU; choose device 'cpu' or 'auto', "
                         "or install a CUDA build of torch")


def resolve_dtype(dtype: str):
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {short(dtype)}; pick one of those")
    return "auto" if dtype == "auto" else getattr(torch, dtype)


@dataclass(frozen=True)
class LoadOption:
    choices: tuple | None  # None: a true/false option
    default: object
    tooltip: str


LOAD_OPTIONS: dict[str, LoadOption] = {
    "quant": LoadOption(tuple(QUANTS), "auto",
                        "auto: the best mode that fits this machine (bf16 whole on the GPU, else 8bit, else 4bit; "
                        "a split or the CPU when none fits whole). none: the checkpoint's own dtype (bf16, about "
                        "52 GiB at a step for the real model); 8bit / 4bit: the bf16 checkpoint's MoE experts "
                        "quantized while it loads (about 29 / 20 GiB at a step; needs bitsandbytes); autoround: a "
                        "pre-quantized AutoRound INT4 checkpoint (about 31 GiB, needs auto-round); gguf: a .gguf "
                        "file, its weights kept in their GGUF blocks (the mode auto picks for a .gguf, and the "
                        "only one it loads in)."),
    "device": LoadOption(tuple(DEVICES), "auto",
                         "auto: the GPU when there is one, offloading to CPU RAM when VRAM is short; cuda: all on "
                         "the GPU; cpu: all on the CPU."),
    "dtype": LoadOption(tuple(DTYPES), "auto",
                        "Weight dtype; auto keeps the checkpoint's own (bfloat16 for the real model)."),
    "local_files_only": LoadOption(None, False, "Never contact the hub: load a hub id only from the local HF cache."),
}
