"""A real-width DiffusionGemma GGUF slice with random block bytes, built on the CPU and cached.

Every tensor has the released shape (hidden 2816, 128 experts, vocabulary 262,144) but there are two text
layers, a sliding and a full one, standing for the real model's layers 4 and 5: each tensor takes the type
llama-quantize gives that layer's tensor (testing/gguf_mix), so the slice holds both expert-down mixes.
Any bytes are a valid block; each block's scale is then set so the weights have an initialised model's
magnitude (about 0.02), and norms and scales are ones. The metadata are the demo GGUF's (tokenizer,
template, sampler) with the real hyperparameters and the vocabulary padded to its real size. Cached under
~/.cache/dgemma-real-slice/gguf-<key of these sources and the gguf version>/, never in the repository.
`dense_twin` loads the same file with every weight dequantized to plain tensors: the same model in bf16.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np

from . import gguf_mix, realscale

HERE = Path(__file__).resolve().parent
DEMO = HERE.parent / "tests" / "fixtures" / "gguf" / "demo-f32.gguf"
REAL_INDEX = {0: 4, 1: 5}  # slice layer -> the real layer whose types it takes (sliding, full)
SCALE = {"Q4_K": (0, 2, 4e-5), "Q6_K": (208, 210, 2e-5), "Q5_0": (0, 2, 2.5e-3), "Q8_0": (0, 2, 3e-4)}
P = "diffusion-gemma."


def path(mix: str = "Q4_K_M", base: Path | None = None) -> Path:
    import gguf

    sources = b"".join((HERE / f).read_bytes() for f in ("gguf_slice.py", "gguf_mix.py", "realscale.py"))
    key = hashlib.sha256(sources + gguf.__file__.encode()).hexdigest()[:12]
    if base is None:
        base = Path(os.environ.get("DGEMMA_REAL_SLICE_CACHE", Path.home() / ".cache" / "dgemma-real-slice"))
    out = Path(base) / f"gguf-{key}" / f"slice-{mix}.gguf"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
        build(tmp, mix)
        tmp.rename(out)
    return out


def _metadata(writer, config) -> None:
    """The demo's keys, the real hyperparameters over them, the vocabulary padded to the real size."""
    import gguf

    text = config.text_config
    reader = gguf.GGUFReader(DEMO)
    own = {
        "block_count": (2, "uint32"), "embedding_length": (text.hidden_size, "uint32"),
        "feed_forward_length": (text.intermediate_size, "uint32"), "attention.head_count": (16, "uint32"),
        "attention.head_count_kv": ([8, 2], "array"), "attention.key_length": (512, "uint32"),
        "attention.key_length_swa": (256, "uint32"), "attention.value_length": (512, "uint32"),
        "attention.value_length_swa": (256, "uint32"), "rope.dimension_count": (512, "uint32"),
        "rope.dimension_count_swa": (256, "uint32"), "expert_count": (128, "uint32"),
        "expert_used_count": (8, "uint32"), "expert_feed_forward_length": (704, "uint32"),
        "attention.sliding_window": (1024, "uint32"), "context_length": (262_144, "uint32"),
        "attention.sliding_window_pattern": ([True, False], "array"),
    }
    tokens = list(reader.fields["tokenizer.ggml.tokens"].contents())
    extra = text.vocab_size - len(tokens)
    padded = {"tokenizer.ggml.tokens": tokens + [f"<slice{i}>" for i in range(extra)],
              "tokenizer.ggml.scores": list(reader.fields["tokenizer.ggml.scores"].contents()) + [0.0] * extra,
              "tokenizer.ggml.token_type": list(reader.fields["tokenizer.ggml.token_type"].contents()) + [1] * extra}
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        short = name.removeprefix(P)
        if short in own:
            value, kind = own[short]
            writer.add_array(name, value) if kind == "array" else writer.add_uint32(name, value)
        elif name in padded:
            writer.add_array(name, padded[name])
        elif name == "diffusion.canvas_length":
            writer.add_uint32(name, 256)
        else:
            sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(name, field.contents(), field.types[0], sub_type=sub)


def _data(name: str, shape: tuple[int, ...], qtype: int, rng) -> np.ndarray:
    from ..dgemma.loading.gguf_quants import TYPES, row_bytes

    type_name = TYPES[qtype][0]
    if type_name == "F32":
        if name == "rope_freqs.weight":  # proportional rope: a quarter of the pairs rotated
            return np.array([1.0] * (shape[0] // 4) + [1e30] * (shape[0] - shape[0] // 4), np.float32)
        if len(shape) >= 2:
            return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float32)
        return np.ones(shape, np.float32)
    rows = int(np.prod(shape[:-1]))
    raw = rng.integers(0, 256, size=(rows, row_bytes(qtype, shape[-1])), dtype=np.uint8)
    start, stop, scale = SCALE[type_name]
    block = TYPES[qtype][2]
    blocks = raw.reshape(-1, block)
    blocks[:, start:stop] = np.frombuffer(np.float16(scale).tobytes(), np.uint8)
    if type_name == "Q4_K":
        blocks[:, 2:4] = np.frombuffer(np.float16(scale).tobytes(), np.uint8)  # dmin too
    return raw.reshape(*shape[:-1], -1)


def build(out: Path, mix: str = "Q4_K_M", seed: int = 0) -> Path:
    import gguf

    config = realscale.real_config(2)
    types = gguf_mix.types(config, mix, layers=realscale.REAL_LAYERS, real_index=REAL_INDEX)
    writer = gguf.GGUFWriter(out, arch="diffusion-gemma")
    _metadata(writer, config)
    rng = np.random.default_rng(seed)
    for name, shape in gguf_mix.tensors(config):
        data = _data(name, shape, types[name], rng)
        writer.add_tensor(name, data, raw_dtype=gguf.GGMLQuantizationType(types[name]))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def dense_twin(gguf_path: Path, dtype):
    """The slice with every weight a plain tensor of `dtype` (ties kept): what the same model is in bf16."""
    from ..dgemma.inputs.tokens import channel_ids, eos_ids
    from ..dgemma.loading import gguf_config, gguf_file, gguf_load
    from ..dgemma.payloads import DGemmaModel

    class Dense(gguf_load._Filler):
        def place(self, target: str, name: str) -> None:
            owner_name, _, attr = name.rpartition(".")
            owner = self.model.get_submodule(owner_name)
            if attr == "layer_scalar":
                owner._buffers[attr] = self.plain(target)
            else:
                owner._parameters[attr] = self.param(target)

    g = gguf_file.read(gguf_path)
    config = gguf_config.model_config(g)
    tokenizer = gguf_config.tokenizer(g)
    model = gguf_load.skeleton(config)
    Dense(model, gguf_load.tensor_plan(g, model), dtype, "cpu", None).fill(gguf_load.owners(model))
    model.eval()
    model.generation_config = gguf_config.generation_config(g)
    return DGemmaModel(model=model, tokenizer=tokenizer, processor=tokenizer, source=str(gguf_path), quant="none",
                       device="cpu", dtype=str(dtype).removeprefix("torch."), eos_ids=eos_ids(model, tokenizer),
                       channel_ids=channel_ids(tokenizer))
