"""Checks shared by the tests and benchmarks/fit.py: one step's logits, the demo's answers, a forced split.

`step_logits` runs the engine's own forward for one denoising step (prompt encoded into a fresh
cache, a seeded random canvas, no self-conditioning), so two loads of one checkpoint in different
quant modes can be compared on the same inputs. `forced_split` loads a checkpoint split the way the
device plan splits one (accelerate's "sequential" map under the plan's budgets); without a GPU the
two tiers are the CPU and an offload folder on disk, with the same hooks that serve offloaded
weights at the forward.
"""

from __future__ import annotations

import torch

PROMPT = "What is 3+4?"


@torch.no_grad()
def step_logits(dm, prompt: str = PROMPT, seed: int = 3) -> torch.Tensor:
    """One step's logits (float32, [canvas, vocabulary]) at a seeded canvas after `prompt`."""
    from ..dgemma.denoising.cache import encode_ids, new_cache
    from ..dgemma.denoising.loop import BlockDecoder

    cache = new_cache(dm.model)
    ids = dm.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=True,
                                           add_generation_prompt=True, return_dict=True)["input_ids"]
    encode_ids(dm.model, cache, ids)
    blocks = BlockDecoder(dm.model, cache)
    canvas = blocks.start_block(torch.Generator(device=blocks.device).manual_seed(seed))
    return blocks.logits(canvas, None)[0].float()


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Cosine of two logit tensors, flattened (float64 sums)."""
    a, b = a.double().flatten(), b.double().flatten()
    return float(a @ b / (a.norm() * b.norm()))


def trained_attention_scale(model, undo: bool = False) -> None:
    """Scale every text attention's q and k norm weights by head_dim^-1/4 (back with `undo`): attention logits
    at the usual 1/sqrt(head_dim) temperature instead of a random model's near argmax (see benchmarks/fit.py)."""
    weights = {}
    for stack in (model.model.decoder.layers, model.model.encoder.language_model.layers):
        for layer in stack:
            attention = layer.self_attn
            for norm in (attention.q_norm, attention.k_norm):
                if getattr(norm, "weight", None) is not None:  # the encoder's are tied to the decoder's: once each
                    weights[id(norm.weight)] = (norm.weight, attention.head_dim)
    with torch.no_grad():
        for weight, head_dim in weights.values():
            weight.mul_(head_dim ** (0.25 if undo else -0.25))


def demo_accuracy(dm) -> tuple[int, int, list[str]]:
    """(right, asked, what it got wrong) on the demo's 100 sums, with the demo's knobs and seeds."""
    from ..dgemma import Knobs, generate
    from ..dgemma.demo import DEMO_KNOBS, WORDS

    right, wrong = 0, []
    for i, (a, b) in enumerate((a, b) for a in range(10) for b in range(10)):
        text = generate(dm, f"What is {a}+{b}?", Knobs(**{**DEMO_KNOBS.asdict(), "seed": i})).text
        if text == WORDS[a + b]:
            right += 1
        else:
            wrong.append(f"{a}+{b} -> {text!r}")
    return right, 100, wrong


def unserved_meta(model) -> list[str]:
    """Parameters on the meta device that no offload hook holds a value for: what a forward would fail on."""
    served = set()
    for path, module in model.named_modules():
        weights = getattr(getattr(module, "_hf_hook", None), "weights_map", None)
        if weights is None:
            continue
        prefix, stored = getattr(weights, "prefix", ""), getattr(weights, "dataset", {})
        for name, _ in module.named_parameters(recurse=False):
            if prefix + name in stored:
                served.add(f"{path}.{name}" if path else name)
    return [n for n, p in model.named_parameters(remove_duplicate=False) if p.device.type == "meta"
            and n not in served]


def forced_split(folder, fast_bytes: int, offload_dir):
    """`folder` loaded as the device plan splits a model too big for its fast tier (`fast_bytes`): the plan's
    device map and budgets, the fast tier (the GPU) played by the CPU and the slow one (CPU RAM) by disk."""
    from ..dgemma.loading import deviceplan, patches
    from ..dgemma.loading.quant import model_class

    need = deviceplan.Need(fast_bytes * 4, fast_bytes * 4)
    split = deviceplan._split(need, ram=1 << 40, vram=fast_bytes + need.step + deviceplan.CUDA_RESERVE)
    budget = {"cpu": split.max_memory[0], "disk": split.max_memory["cpu"]}
    with patches.for_load("none"):
        model = model_class("none").from_pretrained(
            str(folder), dtype=torch.bfloat16, use_safetensors=True, use_kernels=False, device_map=split.device_map,
            max_memory=budget, offload_folder=str(offload_dir))
    return model.eval()
