"""The transformers config, sampler defaults, tokenizer and chat template of a DiffusionGemma GGUF, from its
metadata alone (decision 0032 lists what the converter changed and how each change is undone here)."""

from __future__ import annotations

import torch

from .gguf_file import GGUF, ROPE_FREQS

P = "diffusion-gemma."
UNROTATED = 1e30  # the converter's frequency factor for a dimension that rope leaves alone
# ggml token types: normal, unknown, control, user-defined, unused, byte
UNKNOWN, CONTROL, USER_DEFINED = 2, 3, 4


def f32(value: float) -> float:
    """The shortest decimal that a float32 metadata value was rounded from (1e-06, not 9.99999997e-07): the
    checkpoint's own number, as GGUF stores floats in 32 bits."""
    import numpy as np

    return float(np.format_float_positional(np.float32(value), unique=True, trim="-"))


def _per_layer(g: GGUF, key: str, layers: int) -> list:
    value = g.need(P + key)
    values = value if isinstance(value, list) else [value] * layers
    if len(values) != layers:
        raise ValueError(f"GGUF {g.path.name}: {P + key} lists {len(values)} values for {layers} layers; the metadata "
                         "disagree with themselves, convert the checkpoint again")
    return values


def _one_per_kind(g: GGUF, key: str, swa: list[bool]) -> tuple[int, int]:
    """(sliding value, full value) of a per-layer key the checkpoint keeps one number per layer kind for."""
    values = _per_layer(g, key, len(swa))
    kinds = ({v for v, s in zip(values, swa) if s}, {v for v, s in zip(values, swa) if not s})
    if any(len(k) > 1 for k in kinds):
        raise ValueError(f"GGUF {g.path.name}: {P + key} = {values} varies within a layer kind, which DiffusionGemma "
                         "does not have; this file is not a DiffusionGemma conversion")
    sliding, full = (next(iter(k), None) for k in kinds)
    return sliding if sliding is not None else full, full if full is not None else sliding


def _maybe_f32(value):
    return None if value is None else f32(value)


def partial_rotary(g: GGUF, head_dim: int) -> float:
    """The full-attention layers' rope share: the converter wrote it as a frequency factor per dimension pair,
    1 for a rotated pair and 1e30 for the rest (proportional rope); read it back from that tensor."""
    t = g.tensors.get(ROPE_FREQS)
    if t is None:
        return 1.0
    factors = torch.from_numpy(t.data.copy()).float()
    rotated = int((factors == 1.0).sum())
    expected = torch.tensor([1.0] * rotated + [UNROTATED] * (factors.numel() - rotated))
    if factors.numel() != head_dim // 2 or not torch.equal(factors, expected):
        raise ValueError(f"GGUF {g.path.name}: {ROPE_FREQS} is not the proportional rope of a {head_dim}-wide head "
                         "(ones, then 1e30); the metadata disagree with the tensors, convert the checkpoint again")
    return rotated * 2 / head_dim


def text_config(g: GGUF) -> dict:
    layers = int(g.need(P + "block_count"))
    swa = [bool(s) for s in _per_layer(g, "attention.sliding_window_pattern", layers)]
    kv_swa, kv_full = _one_per_kind(g, "attention.head_count_kv", swa)
    ff, _ = _one_per_kind(g, "feed_forward_length", swa)
    head, global_head = int(g.need(P + "attention.key_length_swa")), int(g.need(P + "attention.key_length"))
    full_layers = [i for i, s in enumerate(swa) if not s]
    k_eq_v = bool(full_layers) and all(f"blk.{i}.attn_v.weight" not in g.tensors for i in full_layers)
    rope_swa = int(g.meta(P + "rope.dimension_count_swa", head))
    sliding_rope = {"rope_theta": f32(g.need(P + "rope.freq_base_swa")), "rope_type": "default"}
    if rope_swa != head:
        sliding_rope["partial_rotary_factor"] = rope_swa / head
    experts = int(g.meta(P + "expert_count", 0))
    return {
        "model_type": "diffusion_gemma_text", "hidden_size": int(g.need(P + "embedding_length")),
        "num_hidden_layers": layers, "intermediate_size": int(ff),
        "num_attention_heads": int(_one_per_kind(g, "attention.head_count", swa)[0]),
        "num_key_value_heads": int(kv_swa), "num_global_key_value_heads": int(kv_full),
        "head_dim": head, "global_head_dim": global_head, "attention_k_eq_v": k_eq_v,
        "layer_types": ["sliding_attention" if s else "full_attention" for s in swa],
        "max_position_embeddings": int(g.need(P + "context_length")),
        "rms_norm_eps": f32(g.need(P + "attention.layer_norm_rms_epsilon")),
        "final_logit_softcapping": _maybe_f32(g.meta(P + "final_logit_softcapping")),
        "sliding_window": int(g.need(P + "attention.sliding_window")),
        "enable_moe_block": experts > 0, "num_experts": experts or None,
        "top_k_experts": int(g.meta(P + "expert_used_count", 0)) or None,
        "moe_intermediate_size": int(g.meta(P + "expert_feed_forward_length", 0)) or None,
        "rope_parameters": {"full_attention": {"partial_rotary_factor": partial_rotary(g, global_head),
                                               "rope_theta": f32(g.need(P + "rope.freq_base")),
                                               "rope_type": "proportional"},
                            "sliding_attention": sliding_rope},
        "vocab_size": len(g.need("tokenizer.ggml.tokens")), "tie_word_embeddings": True,
        "hidden_activation": "gelu_pytorch_tanh", "attention_bias": False,
        "bos_token_id": g.meta("tokenizer.ggml.bos_token_id"), "eos_token_id": g.meta("tokenizer.ggml.eos_token_id"),
        "pad_token_id": g.meta("tokenizer.ggml.padding_token_id"),
    }


def model_config(g: GGUF):
    """DiffusionGemmaConfig: the text model from the metadata; the vision config is transformers' default, but
    the model built from it gets no vision tower (the converter drops it)."""
    from transformers import DiffusionGemmaConfig

    tokens = g.need("tokenizer.ggml.tokens")
    ids = {name: tokens.index(tok) if tok in tokens else None
           for name, tok in (("image_token_id", "<|image|>"), ("boi_token_id", "<|image>"),
                             ("eoi_token_id", "<image|>"))}
    canvas = int(g.need("diffusion.canvas_length"))
    config = DiffusionGemmaConfig(text_config=text_config(g), canvas_length=canvas, tie_word_embeddings=True,
                                  **{k: v for k, v in ids.items() if v is not None})
    config.architectures = ["DiffusionGemmaForBlockDiffusion"]
    return config


def generation_config(g: GGUF):
    """The `diffusion.*` sampler defaults as the checkpoint's generation_config.json states them."""
    from transformers import GenerationConfig

    values = {"max_denoising_steps": g.meta("diffusion.eb_max_steps"), "t_min": g.meta("diffusion.eb_t_min"),
              "t_max": g.meta("diffusion.eb_t_max"), "stability_threshold": g.meta("diffusion.eb_stability_threshold"),
              "confidence_threshold": g.meta("diffusion.eb_confidence_threshold")}
    values = {k: (f32(v) if isinstance(v, float) else v) for k, v in values.items() if v is not None}
    bound = g.meta("diffusion.eb_entropy_bound")
    if bound is not None:
        values["sampler_config"] = {"_cls_name": "EntropyBoundSamplerConfig", "entropy_bound": f32(bound)}
    eos = [g.meta("tokenizer.ggml.eos_token_id")]
    tokens = g.need("tokenizer.ggml.tokens")
    if "<turn|>" in tokens:
        eos.append(tokens.index("<turn|>"))
    return GenerationConfig(bos_token_id=g.meta("tokenizer.ggml.bos_token_id"), eos_token_id=eos,
                            pad_token_id=g.meta("tokenizer.ggml.padding_token_id"), **values)


def tokenizer(g: GGUF):
    """Gemma's BPE tokenizer from tokens, merges and token types; every control, unknown and user-defined token
    is a special added token (the converter marked the checkpoint's visible special tokens user-defined)."""
    from tokenizers import AddedToken
    from transformers.models.gemma.tokenization_gemma import GemmaTokenizer

    if g.meta("tokenizer.ggml.model") != "gemma4":
        raise ValueError(f"GGUF {g.path.name}: tokenizer model {g.meta('tokenizer.ggml.model')!r} is not gemma4; "
                         "this file is not a DiffusionGemma conversion")
    tokens, types = g.need("tokenizer.ggml.tokens"), g.need("tokenizer.ggml.token_type")
    if len(types) != len(tokens):
        raise ValueError(f"GGUF {g.path.name}: {len(tokens)} tokens but {len(types)} token types; the metadata "
                         "disagree with themselves, convert the checkpoint again")
    merges = [tuple(m.split(" ", 1)) for m in g.meta("tokenizer.ggml.merges", [])]
    named = {k: tokens[g.need(f"tokenizer.ggml.{k}_token_id")] for k in ("unknown", "bos", "eos", "padding")}
    mask = g.meta("tokenizer.ggml.mask_token_id")
    special = [AddedToken(t, special=True, normalized=False) for t, k in zip(tokens, types)
               if k in (UNKNOWN, CONTROL, USER_DEFINED)]
    return GemmaTokenizer(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, unk_token=named["unknown"],
                          bos_token=named["bos"], eos_token=named["eos"], pad_token=named["padding"],
                          mask_token=tokens[mask] if mask is not None else "<mask>",
                          chat_template=g.need("tokenizer.chat_template"), extra_special_tokens=special)
