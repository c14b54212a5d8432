"""Experts' weights quantized at load (bitsandbytes NF4 or blockwise 8-bit), and the experts that use them.

Each quantized weight is one flat uint8 parameter in the place of the bf16 one: the block scales
(float32 bytes) then the codes. One tensor per weight keeps every mechanism that moves, ties or
counts parameters working unchanged, and an encoder layer that shares the decoder's module shares
its one quantized copy. An experts module dequantizes its two fused 3-D tensors to the compute
dtype when it runs (one layer's experts in bf16 at a time, about 1.4 GiB at the real widths), then
computes exactly as the unquantized module does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

CHUNK_ELEMENTS = 1 << 25  # quantized this many at a time: bounds the CPU quantizer's float32 temporaries


@dataclass(frozen=True)
class Mode:
    """One quant mode: bitsandbytes' format, its block size and its bits per weight."""

    name: str
    bits: int
    blocksize: int

    def scale_bytes(self, numel: int) -> int:
        return 4 * math.ceil(numel / self.blocksize)

    def code_bytes(self, numel: int) -> int:
        return math.ceil(numel * self.bits / 8)

    def packed_bytes(self, numel: int) -> int:
        return self.scale_bytes(numel) + self.code_bytes(numel)


MODES = {"4bit": Mode("4bit", 4, 64), "8bit": Mode("8bit", 8, 256)}


def has_bitsandbytes() -> bool:
    import importlib.util

    return importlib.util.find_spec("bitsandbytes") is not None


def require_bitsandbytes(quant: str) -> None:
    try:
        import bitsandbytes  # noqa: F401
    except ImportError as exc:
        raise ValueError(f"quant {quant!r} needs the bitsandbytes package in the Python that runs ComfyUI: "
                         "pip install 'bitsandbytes>=0.48'") from exc


def _functional():
    import bitsandbytes.functional as bnbf

    return bnbf


def quantize(weight: torch.Tensor, mode: Mode) -> torch.Tensor:
    """`weight` (any float tensor) as one flat uint8 tensor: float32 block scales, then codes.

    Quantized CHUNK_ELEMENTS at a time along its first dimension, each chunk a whole number of
    blocks (so the result is the same as quantizing it whole, with bounded temporaries).
    """
    bnbf = _functional()
    rows = weight.reshape(weight.shape[0], -1) if weight.dim() > 1 else weight.reshape(1, -1)
    per_row = rows.shape[1]
    step = max(1, CHUNK_ELEMENTS // per_row)
    step = math.lcm(step, mode.blocksize // math.gcd(per_row, mode.blocksize))
    scales, codes = [], []
    for start in range(0, rows.shape[0], step):
        part = rows[start:start + step].contiguous()
        if mode.bits == 4:
            packed, state = bnbf.quantize_4bit(part, blocksize=mode.blocksize, quant_type="nf4",
                                               compress_statistics=False, quant_storage=torch.uint8)
        else:
            packed, state = bnbf.quantize_blockwise(part, blocksize=mode.blocksize)
        scales.append(state.absmax.float().reshape(-1))
        codes.append(packed.reshape(-1))
        del part, packed, state
    out = torch.cat([torch.cat(scales).view(torch.uint8), *codes])
    assert out.numel() == mode.packed_bytes(weight.numel())
    return out


def dequantize(packed: torch.Tensor, shape: tuple[int, ...], mode: Mode, dtype: torch.dtype) -> torch.Tensor:
    """The weight of `shape` that `quantize` packed, in `dtype`."""
    bnbf = _functional()
    numel = math.prod(shape)
    split = mode.scale_bytes(numel)
    absmax = packed[:split].view(torch.float32)
    codes = packed[split:]
    if mode.bits == 4:
        state = bnbf.QuantState(absmax=absmax, shape=torch.Size(shape), code=_code("nf4", packed.device),
                                blocksize=mode.blocksize, quant_type="nf4", dtype=dtype)
        return bnbf.dequantize_4bit(codes, state)
    state = bnbf.QuantState(absmax=absmax, code=_code("dynamic", packed.device), blocksize=mode.blocksize, dtype=dtype)
    return bnbf.dequantize_blockwise(codes, state).reshape(shape)


_CODES: dict = {}


def _code(kind: str, device) -> torch.Tensor:
    """bitsandbytes' code table of `kind` on `device`, made once: NF4's, or the signed 8-bit dynamic one
    quantize_blockwise uses by default (made from host values, each making would wait for the device)."""
    key = (kind, str(device))
    if key not in _CODES:
        bnbf = _functional()
        _CODES[key] = (bnbf.get_4bit_type("nf4", device) if kind == "nf4"
                       else bnbf.create_dynamic_map(signed=True).to(device))
    return _CODES[key]


class QuantizedExperts:
    """Mixed into transformers' fused experts class: its 3-D tensors hold `quantize`'s bytes.

    forward hands the class's own forward a view whose `gate_up_proj` and `down_proj` are the
    dequantized tensors, so the experts compute exactly as unquantized, through whichever experts
    implementation the model is set to.
    """

    def forward(self, hidden_states, top_k_index, top_k_weights):
        return self._dgemma_dense_class.forward(_DenseView(self, hidden_states.dtype), hidden_states, top_k_index,
                                                top_k_weights)


class _DenseView:
    """The experts module as its forward reads it, with each quantized tensor dequantized once."""

    def __init__(self, module, dtype):
        self.__dict__.update(_module=module, _dtype=dtype, _dense={})

    def __getattr__(self, name):
        module, dense = self.__dict__["_module"], self.__dict__["_dense"]
        if name in module._dgemma_shapes:
            if name not in dense:
                weight = dequantize(getattr(module, name), module._dgemma_shapes[name],
                                    MODES[module._dgemma_mode], self.__dict__["_dtype"])
                adapt = getattr(module, "lora_delta", None)  # an adapter's view (lora_view.py) adds its deltas
                dense[name] = weight if adapt is None else adapt(name, weight)
            return dense[name]
        return getattr(module, name)


_EXPERT_CLASSES: dict = {}


def quantized_class(cls):
    """`cls` with QuantizedExperts mixed in (one class per experts class)."""
    if cls not in _EXPERT_CLASSES:
        _EXPERT_CLASSES[cls] = type(f"Quantized{cls.__name__}", (QuantizedExperts, cls), {})
    return _EXPERT_CLASSES[cls]


def convert_module(module, mode: str) -> None:
    """Make `module` (a fused experts module, its weights still unloaded) hold quantized weights."""
    module._dgemma_mode = mode
    module._dgemma_shapes = {name: tuple(getattr(module, name).shape) for name in ("gate_up_proj", "down_proj")}
    module._dgemma_dense_class = type(module)
    module.__class__ = quantized_class(type(module))


def quantized_names(module) -> tuple[str, ...]:
    """The parameters of `module` that hold quantized bytes (none for any other module)."""
    if isinstance(module, QuantizedExperts):
        return tuple(module._dgemma_shapes)
    return ()


def logical_shape(module, name: str) -> tuple[int, ...]:
    return module._dgemma_shapes[name]
