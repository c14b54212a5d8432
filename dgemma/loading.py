"""Load a DiffusionGemma checkpoint (folder or hub id) into a DGemmaModel."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from . import preflight
from .payloads import DGemmaModel
from .quant import QUANTS, after_load, check_quant, model_class
DTYPES = ("auto", "bfloat16", "float16", "float32")
DEVICES = ("auto", "cuda", "cpu")
DEFAULT_HUB_ID = "google/diffusiongemma-26B-A4B-it"


def resolve_device(device: str) -> None:
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device is 'cuda' but this torch sees no CUDA GPU; choose device 'cpu' or 'auto', "
                         "or install a CUDA build of torch")


def resolve_dtype(dtype: str):
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    return "auto" if dtype == "auto" else getattr(torch, dtype)


def check_source(source: str) -> Path | None:
    """A local folder must hold config.json; anything else is taken as a hub id."""
    if not source or not str(source).strip():
        raise ValueError("model source is empty; give a checkpoint folder or a hub id such as "
                         f"{DEFAULT_HUB_ID!r}")
    path = Path(os.path.expanduser(str(source)))
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"model folder {str(path)!r} has no config.json; point the loader at the folder "
                             "that holds config.json and the *.safetensors files")
        return path
    if path.exists() or str(source).startswith((".", "/", "~")) or str(source).count("/") != 1:
        raise ValueError(f"model source {source!r} is neither a checkpoint folder nor a hub id like "
                         f"{DEFAULT_HUB_ID!r}; check the path")
    return None


def load_tokenizer(source, local_files_only: bool, vocab_size: int):
    """AutoProcessor first (the real checkpoint's needs torchvision), then AutoTokenizer."""
    from transformers import AutoProcessor, AutoTokenizer

    try:
        processor = AutoProcessor.from_pretrained(source, local_files_only=local_files_only)
    except (ImportError, OSError, ValueError, TypeError, KeyError, AttributeError):
        processor = None
    tokenizer = getattr(processor, "tokenizer", processor)
    if tokenizer is None or not hasattr(tokenizer, "convert_ids_to_tokens"):
        try:
            tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=local_files_only)
        except (OSError, ValueError) as exc:
            raise ValueError(f"no tokenizer could be loaded from {str(source)!r} ({exc}); the checkpoint needs "
                             "tokenizer.json and tokenizer_config.json beside config.json") from exc
        processor = processor or tokenizer
    renders = getattr(processor, "chat_template", None) or getattr(tokenizer, "chat_template", None)
    if len(tokenizer) < 0.9 * vocab_size or not renders:
        # transformers can build a placeholder tokenizer from config.json alone; that is not this model's
        raise ValueError(f"no tokenizer matching the model was found in {str(source)!r} ({len(tokenizer)} tokens "
                         f"for a {vocab_size}-token model, chat template {'present' if renders else 'missing'}); "
                         "the checkpoint needs tokenizer.json, tokenizer_config.json and its chat template")
    return tokenizer, processor


def _eos_ids(model, tokenizer) -> tuple[int, ...]:
    eos = getattr(model.generation_config, "eos_token_id", None)
    ids = set(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
    for token in (tokenizer.eos_token, "<turn|>"):
        tid = tokenizer.convert_tokens_to_ids(token) if token else None
        if tid is not None and tid != tokenizer.unk_token_id:
            ids.add(tid)
    return tuple(sorted(ids))


def _channel_ids(tokenizer) -> tuple[int, int] | None:
    ids = [tokenizer.convert_tokens_to_ids(t) for t in ("<|channel>", "<channel|>")]
    if any(i is None or i == tokenizer.unk_token_id for i in ids):
        return None
    return ids[0], ids[1]


def load_model(source: str, quant: str = "none", dtype: str = "auto", device: str = "auto",
               local_files_only: bool = False) -> DGemmaModel:
    """Load weights (safetensors only, no remote code) and the tokenizer; every check runs first."""
    from transformers import AutoConfig

    folder = check_source(source)
    resolve_device(device)
    torch_dtype = resolve_dtype(dtype)
    where = str(folder) if folder else source
    local = local_files_only or folder is not None
    try:
        config = AutoConfig.from_pretrained(where, local_files_only=local)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read the config of {where!r} ({exc}); check the name, or download it first "
                         "and set local_files_only") from exc
    check_quant(quant, config, where)
    if folder is not None:
        stored, per_dtype = preflight.checkpoint_bytes(folder)
    else:
        stored, per_dtype = preflight.hub_bytes(where, local) or 0, {}
    placement = preflight.plan(preflight.loaded_bytes(stored, per_dtype, torch_dtype), device)
    vocab_size = config.get_text_config(decoder=True).vocab_size
    tokenizer, processor = load_tokenizer(where, local, vocab_size)  # cheap: errors come before the weights
    model = model_class(quant).from_pretrained(
        where, config=config, dtype=torch_dtype, use_safetensors=True, local_files_only=local, use_kernels=False,
        device_map=placement.device_map, max_memory=placement.max_memory)
    if placement.device_map is None:
        model.to(placement.device)
    model.eval()
    after_load(model, quant)
    dtype_name = str(next(model.parameters()).dtype).removeprefix("torch.")
    return DGemmaModel(model=model, tokenizer=tokenizer, processor=processor, source=where, quant=quant,
                       device=placement.device, dtype=dtype_name, eos_ids=_eos_ids(model, tokenizer),
                       channel_ids=_channel_ids(tokenizer))
