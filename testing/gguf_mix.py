"""The tensors of a DiffusionGemma GGUF at any geometry, and the ggml type llama-quantize gives each one.

`tensors(config)` lists every tensor the DiffusionGemma converter writes (GGUF name, torch-order shape),
from the model built on the meta device and the loader's own name tables. `qtype` follows llama.cpp's
llama-quantize (src/llama-quant.cpp: llama_tensor_get_type, tensor_type_fallback) for the three file
types the README sizes; decision 0032 states the rules. On the demo they give every tensor the type the
shipped Q8_0 and Q4_K_M files hold (tests/test_gguf_mix.py).
"""

from __future__ import annotations

from ..dgemma.loading import gguf_file, gguf_load
from ..dgemma.loading.gguf_quants import BY_NAME, TYPES

MIXES = ("Q4_K_M", "Q6_K", "Q8_0")
DEFAULT = {"Q4_K_M": "Q4_K", "Q6_K": "Q6_K", "Q8_0": "Q8_0"}
FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}  # a row that is no whole number of 256 weights


def tensors(config) -> list[tuple[str, tuple[int, ...]]]:
    """(GGUF name, torch-order shape) of every tensor the converter writes for `config`, in layer order."""
    model = gguf_load.skeleton(config)
    back = {v: k for k, v in gguf_file.TOP_NAMES.items()}
    layer = {v: k for k, v in gguf_file.LAYER_NAMES.items()}
    out = []
    for name in gguf_load.owners(model):
        shape = tuple(gguf_load._shape_of(model, name))
        if name in back:
            out.append((back[name], shape))
            continue
        stack, _, rest = name.partition(".layers.")
        index, _, rest = rest.partition(".")
        gguf = "enc_layer_output_scale.weight" if "encoder" in stack else layer[rest]
        out.append((f"blk.{index}.{gguf}", shape))
    head = max(layer.self_attn.head_dim for layer in model.model.decoder.layers)  # the full layers' width
    out.append((gguf_file.ROPE_FREQS, (head // 2,)))
    return sorted(out, key=lambda t: (_layer(t[0]), t[0]))


def _layer(name: str) -> int:
    return int(name.split(".")[1]) if name.startswith("blk.") else -1


def more_bits(i: int, n: int) -> bool:
    """llama-quantize's use_more_bits: the first and last eighth of the layers, and every third between."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def qtype(name: str, shape: tuple[int, ...], mix: str, layers: int, attn_v: tuple[int, int] = (0, 1),
          layer: int | None = None) -> int:
    """The ggml type of one tensor in a `mix` file. `attn_v` is (this attn_v's place among them, their count);
    `layer` the layer index the rules read (default: the one in the name)."""
    if len(shape) < 2 or not name.endswith("weight") or "_norm.weight" in name or "ffn_gate_inp.weight" in name:
        return BY_NAME["F32"]  # the converter writes these F32 and llama-quantize keeps them
    chosen = DEFAULT[mix]
    index = _layer(name) if layer is None else layer
    if name == "token_embd.weight":  # tied to the output head: quantized as the output tensor
        chosen = "Q8_0" if mix == "Q8_0" or shape[-1] % 256 else "Q6_K"
    elif mix == "Q4_K_M" and "attn_v.weight" in name and more_bits(*attn_v):
        chosen = "Q6_K"
    elif mix == "Q4_K_M" and "ffn_down" in name and more_bits(index, layers):
        chosen = "Q6_K"
    size = TYPES[BY_NAME[chosen]][1]
    if shape[-1] % size:
        chosen = FALLBACK[chosen]
    return BY_NAME[chosen]


def types(config, mix: str, layers: int | None = None, real_index: dict[int, int] | None = None) -> dict[str, int]:
    """GGUF name -> ggml type for every tensor of `config` in a `mix` file. `layers` and `real_index` (slice
    layer -> layer of the model it stands for) let a slice take the types of the real model's layers."""
    listed = tensors(config)
    n = layers or config.get_text_config(decoder=True).num_hidden_layers
    where = real_index or {}
    v_names = [name for name, _ in listed if name.endswith("attn_v.weight")]
    v_count = len(v_names) if not where else sum(1 for i in range(n) if (i + 1) % 6)
    out = {}
    for name, shape in listed:
        layer = where.get(_layer(name), _layer(name))
        v_place = (layer - layer // 6 if where else v_names.index(name)) if name in v_names else 0
        out[name] = qtype(name, shape, mix, n, (v_place, v_count), layer)
    return out


def nbytes(shape: tuple[int, ...], qtype_id: int) -> int:
    _, size, block = TYPES[qtype_id]
    rows = 1
    for d in shape[:-1]:
        rows *= d
    return rows * (shape[-1] // size) * block
