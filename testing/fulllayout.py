"""The published AutoRound checkpoint's every tensor name, at narrow widths: a load-path timing twin.

The real Intel/diffusiongemma-26B-A4B-it-int4-AutoRound holds 71,494 tensors (23,450 packed
modules, 30 layers x 128 experts, both text stacks). What the loader does per key and per module
(patterns, renames, placement) depends on those counts, not on the widths, so this writes the same
names, dtypes and file split with every width cut to the group size (about 200 MB, seconds to
write) and random values. It times the load path; its values mean nothing.
"""

from __future__ import annotations

import json
import math
import zlib
from pathlib import Path

from . import realscale

TEXT = dict(hidden_size=64, intermediate_size=64, moe_intermediate_size=64, head_dim=16, global_head_dim=32,
            vocab_size=8192)
VISION = dict(hidden_size=64, intermediate_size=128, head_dim=8, num_attention_heads=8, num_key_value_heads=8)
MAIN_SHARDS = 6  # model-0000N-of-00006, plus model_extra_tensors.safetensors as published
EXTRA = ("model.decoder.embed_tokens.weight", "model.decoder.norm.weight")


def config(text=TEXT, vision=VISION):
    cfg = realscale.real_config(text=text, vision=vision)
    cfg.quantization_config = realscale.quantization_config()
    return cfg


def build(out: Path, seed: int = 0, text: dict = TEXT, vision: dict = VISION) -> Path:
    """Write the checkpoint (weights, config, tokenizer) to `out`; `text={}, vision={}` is the real width
    (30.6 GB, what benchmarks/gpu.py loads on a GPU machine)."""
    from safetensors.torch import save_file

    from .realslice import Size, _release_config
    from .tiny import _edit_json, generation_config
    from .tiny_tokenizer import build_tokenizer

    cfg = config(text, vision)
    layout = realscale.autoround_layout(realscale.meta_model(realscale.real_config(text=text, vision=vision)))
    names = sorted(n for n in layout if n not in EXTRA)
    per_file = math.ceil(len(names) / MAIN_SHARDS)
    files = {f"model-{i + 1:05d}-of-{MAIN_SHARDS:05d}.safetensors": names[i * per_file:(i + 1) * per_file]
             for i in range(MAIN_SHARDS)}
    files["model_extra_tensors.safetensors"] = list(EXTRA)
    out.mkdir(parents=True, exist_ok=True)
    weight_map, total = {}, 0
    for file, keys in files.items():
        tensors = {k: _random(k, *layout[k], seed) for k in keys}
        total += sum(t.nbytes for t in tensors.values())
        save_file(tensors, out / file, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(keys, file))
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    cfg.save_pretrained(out)
    generation_config().save_pretrained(out)
    build_tokenizer(cfg.get_text_config(decoder=True).vocab_size, seed=seed).save_pretrained(out)
    _edit_json(out / "tokenizer_config.json", lambda d: d.update(processor_class="GemmaTokenizer"))
    _release_config(out / "config.json", Size("full", text=text, vision=vision))
    return out


def _random(name: str, dtype: str, shape: tuple[int, ...], seed: int):
    """Values drawn from the name with the stack left out: the encoder's copy equals the decoder's, as tied."""
    import torch

    role = name.replace(realscale.ENCODER, realscale.DECODER).replace("model.encoder.language_model.", "model.decoder.")
    gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(role.encode()))

    if dtype == "I32":
        return torch.randint(-(2**31), 2**31 - 1, shape, dtype=torch.int32, generator=gen)
    kind = torch.float16 if dtype == "F16" else torch.bfloat16
    scale = 1e-3 if dtype == "F16" else 0.02  # scales of 4-bit groups; plain weights at init size
    return (torch.randn(shape, generator=gen) * scale).to(kind)
