"""The loader's options, one table for the Loader node and the MCP server's load_model tool."""

from __future__ import annotations

from dataclasses import dataclass

from .loading import DEVICES, DTYPES
from .quant import QUANTS


@dataclass(frozen=True)
class LoadOption:
    choices: tuple | None  # None: a true/false option
    default: object
    tooltip: str


LOAD_OPTIONS: dict[str, LoadOption] = {
    "quant": LoadOption(tuple(QUANTS), "none",
                        "none: the checkpoint's own dtype (bf16, about 54 GB for the real model); autoround: a "
                        "pre-quantized AutoRound INT4 checkpoint (about 30 GB, needs auto-round)."),
    "device": LoadOption(tuple(DEVICES), "auto",
                         "auto: the GPU when there is one, offloading to CPU RAM when VRAM is short; cuda: all on "
                         "the GPU; cpu: all on the CPU."),
    "dtype": LoadOption(tuple(DTYPES), "auto",
                        "Weight dtype; auto keeps the checkpoint's own (bfloat16 for the real model)."),
    "local_files_only": LoadOption(None, False, "Never contact the hub: load a hub id only from the local HF cache."),
}
