"""A real-geometry slice of DiffusionGemma and its AutoRound INT4 twin, built on the CPU and cached.

The slice (REAL) has every tensor at the released shape (hidden 2816, 128 experts, vocabulary
262,144, the vision tower's width) but only a sliding and a full-attention text layer and one vision
layer. It is written module by module (random init by the model's own _init_weights, bf16), one
shard at a time, so building it holds about one shard in memory. The twin is made by auto-round
itself at the published layout: group size 64, bf16, auto-round's own shard and extra-file names.
SMALL is the same build with narrower widths and shards scaled to match, so tests can check the
published layout in seconds. Both live under <base>/<key of the builder's sources and library
versions>/<size>, base ~/.cache/dgemma-real-slice unless given, never in the repository.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from . import realscale

LAYERS, VISION_LAYERS = 2, 1
HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Size:
    """A slice's geometry: the real config with `text`/`vision` fields replaced, and its shard sizes.

    auto-round writes the packed blocks as it goes and everything else last; it saves a tied tensor
    once per shard and puts the dropped copy (the decoder's embedding and norm) in
    model_extra_tensors.safetensors. `int4_shard` must hold everything outside the layers with both
    embeddings, and be less than the layers plus one embedding, so that the packed layers and the
    two embeddings land as in the published checkpoint.
    """

    name: str
    text: dict = field(default_factory=dict)
    vision: dict = field(default_factory=dict)
    shard_bytes: int = 1 << 30  # the bf16 slice's shards
    int4_shard: str = "3050MB"  # auto-round's max_shard_size

    def config(self):
        return realscale.real_config(LAYERS, VISION_LAYERS, text=self.text, vision=self.vision)

    def text_field(self, name: str):
        return self.text.get(name, realscale.REAL_TEXT[name])


# auto-round's MB is MiB. Layers 1,692 MiB, the rest 2,940 MiB with both embeddings (1,408 MiB each).
REAL = Size("real")
# Every quantized width a multiple of the group size (64), as at the real size; 128 experts top-8.
# Layers 15.0 MiB, the rest 14.0 MiB with both embeddings (4 MiB each).
SMALL = Size("small", text=dict(hidden_size=256, intermediate_size=192, moe_intermediate_size=64, head_dim=32,
                                global_head_dim=64, vocab_size=8192),
             vision=dict(hidden_size=128, intermediate_size=480, head_dim=8),
             shard_bytes=4 << 20, int4_shard="16MB")


def cache_root(base: Path | None = None) -> Path:
    import auto_round
    import torch
    import transformers

    sources = b"".join((HERE / f).read_bytes() for f in ("realslice.py", "realscale.py", "tiny.py",
                                                          "tiny_tokenizer.py"))
    versions = f"{torch.__version__}|{transformers.__version__}|{auto_round.__version__}".encode()
    key = hashlib.sha256(sources + versions).hexdigest()[:12]
    if base is None:
        base = Path(os.environ.get("DGEMMA_REAL_SLICE_CACHE", Path.home() / ".cache" / "dgemma-real-slice"))
    return Path(base) / key


def slice_dir(size: Size = REAL, base: Path | None = None) -> Path:
    """The bf16 slice, built on first use."""
    return _cached(cache_root(base) / size.name / "bf16", lambda out: build_slice(out, size=size))


def int4_dir(size: Size = REAL, base: Path | None = None) -> Path:
    """The slice quantized by auto-round (W4A16, group 64), built on first use."""
    return _cached(cache_root(base) / size.name / "int4",
                   lambda out: quantize_slice(slice_dir(size, base), out, size=size))


def _cached(out: Path, build) -> Path:
    if not (out / "config.json").is_file():
        tmp = out.with_name(f"{out.name}.tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        build(tmp)
        try:
            tmp.rename(out)
        except OSError:  # another process finished the same build first
            if not (out / "config.json").is_file():
                raise
            shutil.rmtree(tmp)
    return out


def build_slice(out: Path, seed: int = 0, size: Size = REAL) -> Path:
    """Write the bf16 slice to `out`, one module's tensors at a time."""
    import torch
    from safetensors.torch import save_file

    from .tiny import _edit_json, generation_config
    from .tiny_tokenizer import build_tokenizer

    config = size.config()
    config.dtype = torch.bfloat16
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        model = realscale.meta_model(config)
    finally:
        torch.set_default_dtype(previous)
    stored = set(model.state_dict()) - set(model.all_tied_weights_keys)
    torch.manual_seed(seed)
    shards, pending, written = [], {}, 0
    for prefix, module in model.named_modules():
        own = {f"{prefix}.{n}" if prefix else n: t for n, t in
               [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]}
        if not stored.intersection(own):
            continue
        module.to_empty(device="cpu", recurse=False)
        for t in [*module.parameters(recurse=False), *module.buffers(recurse=False)]:
            t.data.fill_(1)  # what _init_weights leaves alone (a layer's scalar) is 1, never the memory's garbage
        model._init_weights(module)
        for n, t in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]:
            full = f"{prefix}.{n}" if prefix else n
            if full in stored:
                pending[full] = t.detach().to(torch.bfloat16).contiguous()
                written += pending[full].nbytes
        module.to_empty(device="meta", recurse=False)
        if written >= size.shard_bytes:
            shards.append(pending)
            _write(out, len(shards), pending, save_file)
            pending, written = {}, 0
    if pending:
        shards.append(pending)
        _write(out, len(shards), pending, save_file)
    _finish_shards(out, len(shards))
    model.config.save_pretrained(out)
    generation_config().save_pretrained(out)
    tok = build_tokenizer(size.text_field("vocab_size"), seed=seed)
    tok.save_pretrained(out)
    _edit_json(out / "tokenizer_config.json", lambda d: d.update(processor_class="GemmaTokenizer"))
    _release_config(out / "config.json", size)
    return out


def _write(out: Path, number: int, tensors: dict, save_file) -> None:
    save_file(tensors, out / f"shard-{number}.safetensors", metadata={"format": "pt"})
    names = {k: number for k in tensors}
    index = out / "names.json"
    known = json.loads(index.read_text()) if index.is_file() else {}
    index.write_text(json.dumps({**known, **names}))
    tensors.clear()


def _finish_shards(out: Path, count: int) -> None:
    """Rename the shards as save_pretrained names them and write the index."""
    names = json.loads((out / "names.json").read_text())
    (out / "names.json").unlink()
    final = {i: f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)}
    total = 0
    for i, name in final.items():
        (out / f"shard-{i}.safetensors").rename(out / name)
        total += _tensor_bytes(out / name)
    index = {"metadata": {"total_size": total}, "weight_map": {k: final[v] for k, v in sorted(names.items())}}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")


def _tensor_bytes(path: Path) -> int:
    from ..dgemma.loading.preflight import safetensors_bytes

    return safetensors_bytes(path)[0]


def _release_config(path: Path, size: Size) -> None:
    """The released config.json's fields (readable by every supported transformers)."""
    from .tiny import _edit_json

    def edit(data):
        tc = data["text_config"]
        tc.pop("per_layer_config", None)
        tc.update(global_head_dim=size.text_field("global_head_dim"), attention_k_eq_v=True,
                  num_global_key_value_heads=size.text_field("num_global_key_value_heads"))
        data["vision_config"].pop("rope_parameters", None)
    _edit_json(path, edit)


def quantize_slice(source: Path, out: Path, size: Size = REAL) -> Path:
    """auto-round's RTN W4A16 at group size 64, saved in its own format and file names."""
    import torch
    from auto_round import AutoRound
    from auto_round.algorithms.quantization.rtn.config import RTNConfig
    from transformers import AutoTokenizer, DiffusionGemmaForBlockDiffusion

    torch.set_num_threads(min(2, torch.get_num_threads()))
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(source, dtype=torch.bfloat16, use_kernels=False)
    tokenizer = AutoTokenizer.from_pretrained(source)
    staging = out / "autoround"
    routers = {name: {"bits": 16, "data_type": "fp"} for name in realscale.quantization_config(LAYERS)["extra_config"]
               if name.endswith("router.proj")}  # the published checkpoint keeps them at 16 bits
    ar = AutoRound(model, tokenizer=tokenizer, scheme="W4A16", device_map="cpu", layer_config=routers,
                   alg_configs=RTNConfig(disable_opt_rtn=True, group_size=realscale.GROUP_SIZE))
    ar.quantize_and_save(str(staging), format="auto_round", max_shard_size=size.int4_shard)
    del ar, model
    written = next(p.parent for p in staging.rglob("config.json"))
    for path in written.iterdir():
        shutil.move(str(path), out / path.name)
    shutil.rmtree(staging)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        if (source / name).is_file():
            shutil.copy2(source / name, out / name)
    _release_config(out / "config.json", size)
    return out
