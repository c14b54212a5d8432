"""The 4bit and 8bit modes: transformers loads the bf16 checkpoint, quantizing tensor by tensor.

A quantizer registered with transformers (its public `register_quantizer`) marks the text layers'
fused experts (88 % of the weights) before any weight is read, makes each encoder layer
share the decoder's quantized modules (the checkpoint ties them, so one copy serves both), and
quantizes each of their tensors on its device the moment it is read. transformers loads
on-the-fly-quantized models one tensor at a time, without reader threads, so the bf16 model is
never whole anywhere: the most in flight is one tensor (1 GB: a layer's fused gate/up experts).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from . import weightquant
from .weightquant import MODES, convert_module, logical_shape, quantized_names

METHOD = "dgemma-bitsandbytes"
ENCODER, DECODER = "model.encoder.language_model.layers", "model.decoder.layers"


def targets(layer) -> dict[str, torch.nn.Module]:
    """The modules of one text layer whose weights a mode quantizes: its fused experts. Attention and the dense
    MLP stay in the compute dtype: their quantization noise, not the experts', dominated the logits' error
    (decision 0029)."""
    return {name: module for name, module in layer.named_modules() if _fused_experts(module)}


def _fused_experts(module) -> bool:
    return all(isinstance(getattr(module, n, None), torch.nn.Parameter) and getattr(module, n).dim() == 3
               for n in ("gate_up_proj", "down_proj"))


def prepare(model, mode: str) -> int:
    """Mark every target for `mode`, each encoder layer sharing its decoder twin's; returns the modules marked."""
    decoder = model.get_submodule(DECODER)
    encoder = model.get_submodule(ENCODER)
    marked = 0
    for i, dec_layer in enumerate(decoder):
        enc_layer = encoder[i] if i < len(encoder) else None
        for name, module in targets(dec_layer).items():
            convert_module(module, mode)
            marked += 1
            if enc_layer is not None and _same_shapes(enc_layer, name, module):
                parent, _, leaf = name.rpartition(".")
                setattr(enc_layer.get_submodule(parent) if parent else enc_layer, leaf, module)
    for enc_layer in encoder:  # an encoder layer without a decoder twin keeps its own
        for module in targets(enc_layer).values():
            if not quantized_names(module):
                convert_module(module, mode)
                marked += 1
    return marked


def _same_shapes(layer, name: str, module) -> bool:
    try:
        twin = layer.get_submodule(name)
    except AttributeError:
        return False
    mine = {n: p.shape for n, p in module.named_parameters(recurse=False)}
    return type(twin) in (type(module), getattr(module, "_dgemma_dense_class", None)) and mine == {
        n: p.shape for n, p in twin.named_parameters(recurse=False)}


@dataclass(frozen=True)
class Geometry:
    """Counts of a model's weights that size the modes quantized at load (see deviceplan.made_need)."""

    total_numel: int                 # every stored weight once (tied copies once)
    quantized: tuple[int, ...]       # the numel of each tensor a mode quantizes
    dense_numel: int                 # the most one layer dequantizes at once (its fused experts)

    def packed_bytes(self, quant: str) -> int:
        return sum(MODES[quant].packed_bytes(n) for n in self.quantized)


_GEOMETRIES: dict[str, Geometry] = {}


def geometry(config) -> Geometry:
    """The Geometry of `config`'s model, counted on the meta device (a fraction of a second at the real size)."""
    key = config.to_json_string()
    if key not in _GEOMETRIES:
        from transformers import DiffusionGemmaForBlockDiffusion

        with torch.device("meta"):
            model = DiffusionGemmaForBlockDiffusion(config)
        persistent = set(model.state_dict(keep_vars=True))
        total = sum(p.numel() for p in model.parameters())
        total += sum(b.numel() for n, b in model.named_buffers() if n in persistent)
        sizes, dense = [], 0
        for layer in model.get_submodule(DECODER):
            tensors = [p for m in targets(layer).values() for p in m.parameters(recurse=False) if p.dim() > 1]
            sizes += [p.numel() for p in tensors]
            dense = max(dense, sum(p.numel() for p in tensors if p.dim() == 3))
        _GEOMETRIES[key] = Geometry(total, tuple(sizes), dense)
    return _GEOMETRIES[key]


def quantization_config(quant: str):
    """The config to hand from_pretrained for `quant` (registers the quantizer on first use)."""
    config_class, _ = _registered()
    return config_class(bits=MODES[quant].bits)


@functools.cache
def _registered():
    """(config class, quantizer class), registered with transformers under METHOD once per process."""
    from transformers.quantizers.auto import (
        AUTO_QUANTIZATION_CONFIG_MAPPING,
        AUTO_QUANTIZER_MAPPING,
        register_quantization_config,
        register_quantizer,
    )

    if METHOD not in AUTO_QUANTIZATION_CONFIG_MAPPING:
        register_quantization_config(METHOD)(_config_class())
    if METHOD not in AUTO_QUANTIZER_MAPPING:
        register_quantizer(METHOD)(_quantizer_class())
    return AUTO_QUANTIZATION_CONFIG_MAPPING[METHOD], AUTO_QUANTIZER_MAPPING[METHOD]


def _config_class():
    from transformers.utils.quantization_config import QuantizationConfigMixin

    class WeightsConfig(QuantizationConfigMixin):
        def __init__(self, bits: int = 4, **_):
            self.quant_method = METHOD
            self.bits = bits

        @property
        def mode(self) -> str:
            return f"{self.bits}bit"

    return WeightsConfig


def _op_class():
    from transformers.core_model_loading import ConversionOps
    from transformers.quantizers.quantizers_utils import get_module_from_name

    class QuantizeOp(ConversionOps):
        """Quantizes each tensor handed to it on its device; transformers places the result."""

        def __init__(self, mode: str):
            self.mode = mode

        def convert(self, input_dict, model=None, **kwargs):
            out = {}
            for name, value in input_dict.items():
                value = value[0] if isinstance(value, list) else value
                module, leaf = get_module_from_name(model, name)
                if tuple(value.shape) != logical_shape(module, leaf):
                    raise ValueError(f"{name} has shape {tuple(value.shape)}, the model expects "
                                     f"{logical_shape(module, leaf)}")
                out[name] = weightquant.quantize(value, MODES[self.mode])
            return out

    return QuantizeOp


def _quantizer_class():
    from transformers.quantizers import HfQuantizer
    from transformers.quantizers.quantizers_utils import get_module_from_name

    op_class = _op_class()

    class WeightsQuantizer(HfQuantizer):
        requires_calibration = False

        def validate_environment(self, *args, **kwargs):
            weightquant.require_bitsandbytes(self.quantization_config.mode)

        def param_needs_quantization(self, model, param_name: str, **kwargs) -> bool:
            module, leaf = get_module_from_name(model, param_name)
            return leaf in quantized_names(module)

        @property
        def quantized_element_size(self) -> float:
            return MODES[self.quantization_config.mode].packed_bytes(1 << 20) / (1 << 20)

        def _process_model_before_weight_loading(self, model, **kwargs):
            prepare(model, self.quantization_config.mode)

        def _process_model_after_weight_loading(self, model, **kwargs):
            return model

        def is_serializable(self, *args, **kwargs):
            return False

        @property
        def is_trainable(self) -> bool:
            return False

        def get_quantize_ops(self):
            return op_class(self.quantization_config.mode)

    return WeightsQuantizer


def check_loaded(model) -> tuple[int, int]:
    """Refuse a load that left a marked weight unquantized; returns (quantized tensors, their bytes)."""
    count = size = 0
    seen = set()
    for prefix, module in model.named_modules():
        for name in quantized_names(module):
            tensor = getattr(module, name)
            if id(tensor) in seen:
                continue
            seen.add(id(tensor))
            expected = MODES[module._dgemma_mode].packed_bytes(_numel(logical_shape(module, name)))
            if tensor.dtype != torch.uint8 or tensor.numel() != expected or tensor.device.type == "meta":
                raise ValueError(f"{prefix}.{name} was not quantized while loading ({tensor.dtype}, "
                                 f"{tuple(tensor.shape)} on {tensor.device.type}); the checkpoint lacks it or does "
                                 "not match this model: load it with quant 'none' to see transformers' report")
            count += 1
            size += tensor.numel()
    return count, size


def _numel(shape) -> int:
    out = 1
    for d in shape:
        out *= d
    return out
