"""The loader's options, one table for the Loader node and the MCP server's load_model tool."""

from __future__ import annotations

from dataclasses import dataclass

from .load import DEVICES, DTYPES
from .quant import QUANTS


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
