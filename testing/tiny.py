"""Build tiny DiffusionGemma checkpoints through the real transformers classes.

They keep the real model's structure (MoE beside the dense MLP, sliding and full layers, K=V on
full layers, tied encoder/decoder/lm_head weights, self-conditioning, a vision tower) at a size
that builds in seconds, and they load through the same `from_pretrained` path as the 26B model.
"""

from __future__ import annotations

import json
from pathlib import Path

from .tiny_tokenizer import build_tokenizer

REAL_VOCAB = 262_144

# Layer shapes per preset; everything else follows the released config.
PRESETS = {
    "random": dict(canvas_length=256, hidden_size=64, intermediate_size=128, num_attention_heads=2,
                   num_key_value_heads=1, head_dim=32, global_head_dim=64, moe_intermediate_size=32),
    "real-vocab": dict(canvas_length=256, hidden_size=64, intermediate_size=128, num_attention_heads=2,
                       num_key_value_heads=1, head_dim=32, global_head_dim=64, moe_intermediate_size=32,
                       vocab_size=REAL_VOCAB),
    "demo": dict(canvas_length=32, hidden_size=128, intermediate_size=128, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32, global_head_dim=64, moe_intermediate_size=32),
}


def text_config(vocab_size: int, p: dict) -> dict:
    return dict(
        vocab_size=vocab_size, hidden_size=p["hidden_size"], intermediate_size=p["intermediate_size"],
        num_hidden_layers=2, layer_types=["sliding_attention", "full_attention"], sliding_window=512,
        num_attention_heads=p["num_attention_heads"], num_key_value_heads=p["num_key_value_heads"],
        head_dim=p["head_dim"], global_head_dim=p["global_head_dim"], num_global_key_value_heads=1,
        attention_k_eq_v=True, enable_moe_block=True, num_experts=4, top_k_experts=2,
        moe_intermediate_size=p["moe_intermediate_size"], max_position_embeddings=16_384,
        final_logit_softcapping=30.0, pad_token_id=0, bos_token_id=2, eos_token_id=1,
    )


def build_model(preset: str = "random", seed: int = 0):
    """A randomly initialised model and its tokenizer, in memory."""
    import torch
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {preset!r}")
    p = PRESETS[preset]
    tok = build_tokenizer(p.get("vocab_size"), seed=seed)
    config = DiffusionGemmaConfig(
        text_config=text_config(len(tok), p),
        vision_config=dict(model_type="gemma4_vision", hidden_size=16, intermediate_size=32,
                           num_hidden_layers=1, num_attention_heads=1, num_key_value_heads=1, head_dim=16),
        canvas_length=p["canvas_length"], boi_token_id=108, image_token_id=109, eoi_token_id=110,
    )
    torch.manual_seed(seed)
    return DiffusionGemmaForBlockDiffusion(config), tok


def generation_config():
    from transformers.models.diffusion_gemma.generation_diffusion_gemma import (
        DiffusionGemmaGenerationConfig,
        EntropyBoundSamplerConfig,
    )

    return DiffusionGemmaGenerationConfig(
        max_denoising_steps=48, sampler_config=EntropyBoundSamplerConfig(0.1), t_min=0.4, t_max=0.8,
        stability_threshold=1, confidence_threshold=0.005, eos_token_id=[1, 106], pad_token_id=0,
        bos_token_id=2)


# The smallest image budget Gemma 4's processor supports: about 64 soft tokens per image.
IMAGE_SOFT_TOKENS = 70


def image_processor():
    """Gemma 4's image processor (the PIL one: no torchvision) at the tiny models' image budget."""
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

    return Gemma4ImageProcessorPil(max_soft_tokens=IMAGE_SOFT_TOKENS)


def save_checkpoint(model, tok, out_dir: str | Path, preset: str) -> Path:
    """Save in the release layout, so the folder loads on every supported transformers."""
    out = Path(out_dir)
    model.generation_config = generation_config()
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    try:  # preprocessor_config.json: what AutoImageProcessor reads for the vision tower
        image_processor().save_pretrained(out)
    except ImportError:
        pass  # a transformers without Gemma 4's PIL image processor: the checkpoint takes no images
    # AutoProcessor then returns the tokenizer instead of building Gemma4Processor (torchvision).
    _edit_json(out / "tokenizer_config.json", lambda d: d.update(processor_class="GemmaTokenizer"))
    _rewrite_release_config(out / "config.json", PRESETS[preset]["global_head_dim"])
    return out


def build_checkpoint(out_dir: str | Path, preset: str = "random", seed: int = 0) -> Path:
    model, tok = build_model(preset, seed)
    return save_checkpoint(model, tok, out_dir, preset)


def _edit_json(path: Path, edit) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def _rewrite_release_config(path: Path, global_head_dim: int) -> None:
    # Newer transformers serialise the derived `per_layer_config` and drop the fields it came
    # from; 5.13 cannot read that, so write the fields the released config.json carries.
    def edit(data):
        tc = data["text_config"]
        tc.pop("per_layer_config", None)
        tc.update(global_head_dim=global_head_dim, num_global_key_value_heads=1, attention_k_eq_v=True)
        data["vision_config"].pop("rope_parameters", None)
    _edit_json(path, edit)

