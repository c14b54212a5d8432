"""The real DiffusionGemma geometry (google/diffusiongemma-26B-A4B-it), at any number of layers.

`real_config(30)` is the released model's shape; fewer layers give a slice whose every tensor has
a real shape. `autoround_layout` lists the tensors auto-round stores for such a model (names,
dtypes, shapes) so a meta-device model can be counted against the published checkpoint.
"""

from __future__ import annotations

import math
import re

REAL_TEXT = dict(
    vocab_size=262_144, hidden_size=2816, intermediate_size=2112, num_attention_heads=16, num_key_value_heads=8,
    num_global_key_value_heads=2, head_dim=256, global_head_dim=512, attention_k_eq_v=True, enable_moe_block=True,
    num_experts=128, top_k_experts=8, moe_intermediate_size=704, sliding_window=1024,
    max_position_embeddings=262_144, final_logit_softcapping=30.0, hidden_activation="gelu_pytorch_tanh",
    rms_norm_eps=1e-6, pad_token_id=0, bos_token_id=2, eos_token_id=1)
REAL_VISION = dict(model_type="gemma4_vision", hidden_size=1152, intermediate_size=4304, num_hidden_layers=27,
                   num_attention_heads=16, num_key_value_heads=16, head_dim=72, standardize=True)
REAL_LAYERS = 30
GROUP_SIZE = 64
# The published Intel/diffusiongemma-26B-A4B-it-int4-AutoRound index: tensors and bytes.
REAL_PACKED_MODULES, REAL_TENSORS, REAL_TOTAL_SIZE = 23_450, 71_494, 30_576_322_776
ENCODER, DECODER = "model.encoder.language_model.layers", "model.decoder.layers"
_LAYER = re.compile(r"^(model\.encoder\.language_model|model\.decoder)\.layers\.\d+\.")
_FUSED = re.compile(r"\.experts\.(gate_up_proj|down_proj)$")


def layer_types(layers: int) -> list[str]:
    """Every 6th layer full attention, the rest sliding; a slice of under 6 layers ends on a full one."""
    types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(layers)]
    if "full_attention" not in types:
        types[-1] = "full_attention"
    return types


def real_config(layers: int = REAL_LAYERS, vision_layers: int = 27, experts: int = 128, vocab: int | None = None,
                text: dict | None = None, vision: dict | None = None):
    """A DiffusionGemmaConfig at the real geometry with `layers` text layers.

    `text` and `vision` replace fields of REAL_TEXT and REAL_VISION (narrower widths for a small twin).
    """
    from transformers import DiffusionGemmaConfig

    widths = dict(REAL_TEXT, **(text or {}))
    text = dict(widths, num_hidden_layers=layers, layer_types=layer_types(layers), num_experts=experts,
                top_k_experts=min(8, experts), vocab_size=vocab or widths["vocab_size"])
    vision = dict(REAL_VISION, **(vision or {}), num_hidden_layers=vision_layers)
    return DiffusionGemmaConfig(text_config=text, vision_config=vision,
                                canvas_length=256, boi_token_id=255_999, image_token_id=258_880,
                                eoi_token_id=258_882, tie_word_embeddings=True)


def quantization_config(layers: int = REAL_LAYERS, group_size: int = GROUP_SIZE) -> dict:
    """The AutoRound INT4 quantization_config of the published checkpoint, for `layers` text layers."""
    routers = {f"{stack}.{i}.router.proj": {"bits": 16, "data_type": "fp"}
               for stack in (ENCODER, DECODER) for i in range(layers)}
    return {"quant_method": "auto-round", "bits": 4, "group_size": group_size, "sym": True, "data_type": "int",
            "packing_format": "auto_round:auto_gptq", "block_name_to_quantize": f"{ENCODER},{DECODER}",
            "extra_config": {"model.decoder.embed_tokens": {"bits": 16, "data_type": "fp"}, **routers}}


def meta_model(config, cls=None):
    """The model on the meta device: every module and shape, no memory."""
    import torch

    if cls is None:
        from transformers import DiffusionGemmaForBlockDiffusion as cls
    with torch.device("meta"):
        return cls(config)


def autoround_layout(model, group_size: int = GROUP_SIZE) -> dict[str, tuple[str, tuple[int, ...]]]:
    """name -> (safetensors dtype, shape) of what auto-round stores for `model` (experts per expert, no lm_head)."""
    out: dict[str, tuple[str, tuple[int, ...]]] = {}

    def packed(name: str, in_f: int, out_f: int) -> None:
        out[f"{name}.qweight"] = ("I32", (in_f // 8, out_f))
        out[f"{name}.qzeros"] = ("I32", (math.ceil(in_f / group_size), out_f // 8))
        out[f"{name}.scales"] = ("F16", (math.ceil(in_f / group_size), out_f))

    for name, p in model.named_parameters(remove_duplicate=False):
        if name == "lm_head.weight":
            continue
        base = name.rsplit(".", 1)[0]
        if _LAYER.match(name) and _FUSED.search(name):
            which = name.rsplit(".", 1)[1]
            for e in range(p.shape[0]):
                if which == "gate_up_proj":
                    half = p.shape[1] // 2
                    packed(f"{base}.{e}.gate_proj", p.shape[2], half)
                    packed(f"{base}.{e}.up_proj", p.shape[2], half)
                else:
                    packed(f"{base}.{e}.down_proj", p.shape[2], p.shape[1])
        elif _LAYER.match(name) and name.endswith("_proj.weight") and ".router." not in name:
            packed(base, p.shape[1], p.shape[0])
        else:
            out[name] = ("BF16", tuple(p.shape))
    persistent = set(model.state_dict(keep_vars=True))
    for name, b in model.named_buffers(remove_duplicate=False):
        if name in persistent:
            out[name] = ("BF16", tuple(b.shape))
    return out


def layout_bytes(layout: dict) -> int:
    size = {"I32": 4, "F16": 2, "BF16": 2, "F32": 4}
    return sum(size[d] * math.prod(s) for d, s in layout.values())


def prepare_autoround(layers: int = REAL_LAYERS, vision_layers: int = 27, experts: int = 128):
    """What from_pretrained does for an AutoRound checkpoint before it reads any weight, on the meta device.

    Builds the pack's AutoRound model class at the real geometry and lets transformers' AutoRound
    quantizer (auto-round itself) swap in packed layers, under the pack's loading wrappers.
    Returns the prepared model.
    """
    import torch
    from transformers.integrations import accelerate  # noqa: F401  (the quantizer imports it lazily)
    from transformers.quantizers import AutoHfQuantizer
    from transformers.utils import ContextManagers

    from ..dgemma.loading.patches_autoround import merged_tie_patterns
    from ..dgemma.loading.quant import model_class

    config = real_config(layers, vision_layers, experts)
    config.quantization_config = quantization_config(layers)
    quantizer = AutoHfQuantizer.from_config(config.quantization_config, pre_quantized=True)
    quantizer.validate_environment(device_map="cpu")
    config.quantization_config = quantizer.quantization_config  # as from_pretrained leaves it
    cls = model_class("autoround")
    with ContextManagers(cls.get_init_context(torch.bfloat16, True, False, None)), merged_tie_patterns("autoround"):
        model = cls(config)
        quantizer.preprocess_model(model=model, dtype=torch.bfloat16, device_map="cpu", checkpoint_files=None,
                                   use_kernels=False)
    return model


def packed_names(module) -> list[str]:
    """Names of the auto-round packed layers inside `module` (those holding a `qweight` tensor)."""
    import torch

    return [n for n, m in module.named_modules() if isinstance(getattr(m, "qweight", None), torch.Tensor)]
