"""Load a DiffusionGemma checkpoint (folder or hub id) into a DGemmaModel."""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path

from ..errors import LoadCancelled, short
from ..inputs.tokens import channel_ids, check_template, eos_ids, tokenizer_fingerprint
from ..payloads import DGemmaModel
from . import autoround_run, deviceplan, machine, patches, patching, preflight, quant_at_load
from .identity import checkpoint_identity
from .load_options import resolve_dtype
from .quant import MADE_AT_LOAD, after_load, check_packed, check_quant, model_class, quant_method, shared_copy_bytes
from .quant_at_load import quantization_config
from .weightquant import has_bitsandbytes

DEFAULT_HUB_ID = "google/diffusiongemma-26B-A4B-it"


def check_source(source: str) -> Path | None:
    """A local folder must hold config.json; anything else is taken as a hub id."""
    if source is not None and not isinstance(source, str):
        raise ValueError(f"model source must be text (a checkpoint folder or a hub id), got {short(source)} "
                         f"({type(source).__name__}); give a folder path or a hub id such as {DEFAULT_HUB_ID!r}")
    if not source or not str(source).strip():
        raise ValueError("model source is empty; give a checkpoint folder or a hub id such as "
                         f"{DEFAULT_HUB_ID!r}")
    path = Path(os.path.expanduser(str(source)))
    try:
        is_dir, exists = path.is_dir(), path.exists()
    except (OSError, ValueError):  # a name too long for the file system, a NUL byte
        is_dir, exists = False, False
    if is_dir:
        if not (path / "config.json").is_file():
            raise ValueError(f"model folder {short(str(path))} has no config.json; point the loader at the folder "
                             "that holds config.json and the *.safetensors files")
        return path
    if exists or str(source).startswith((".", "/", "~")) or str(source).count("/") != 1:
        raise ValueError(f"model source {short(source)} is neither a checkpoint folder nor a hub id like "
                         f"{DEFAULT_HUB_ID!r}; check the path")
    return None


def load_tokenizer(source, local_files_only: bool, vocab_size: int):
    """AutoProcessor first (the real checkpoint's needs torchvision), then AutoTokenizer."""
    from transformers import AutoProcessor, AutoTokenizer

    try:
        processor = AutoProcessor.from_pretrained(source, local_files_only=local_files_only,
                                                  trust_remote_code=False)
    except (ImportError, OSError, ValueError, TypeError, KeyError, AttributeError):
        processor = None
    tokenizer = getattr(processor, "tokenizer", processor)
    if tokenizer is None or not hasattr(tokenizer, "convert_ids_to_tokens"):
        try:
            tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=local_files_only,
                                                      trust_remote_code=False)
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


def load_image_processor(source, local_files_only: bool, processor):
    """The processor's image half: Gemma4Processor's own, else the checkpoint's preprocessor_config.json
    (tiny checkpoints, or the real one without torchvision). None: images are refused at run time."""
    found = getattr(processor, "image_processor", None)
    if found is not None:
        return found
    from transformers import AutoImageProcessor

    failures = (ImportError, OSError, ValueError, TypeError, KeyError, AttributeError)
    try:
        return AutoImageProcessor.from_pretrained(source, local_files_only=local_files_only, trust_remote_code=False)
    except ImportError:
        pass  # older transformers want torchvision for Gemma 4's default class; its PIL twin needs none
    except failures:
        return None
    try:
        from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

        return Gemma4ImageProcessorPil.from_pretrained(source, local_files_only=local_files_only)
    except failures:
        return None


@contextlib.contextmanager
def cancel_checks(should_cancel):
    """Call `should_cancel` before each tensor transformers puts into the model; True stops the load.

    transformers 5.x opens every shard lazily and materialises tensor by tensor, handing each one to
    core_model_loading.set_param_for_module; wrapping that module attribute for the length of our
    call needs no edit of installed files. Where it is absent (or called off our thread) the load
    runs without checks.
    """
    try:
        from transformers import core_model_loading as cml
    except ImportError:
        cml = None
    original = getattr(cml, "set_param_for_module", None)
    if should_cancel is None or not callable(original):
        yield
        return
    placed, owner = 0, threading.get_ident()

    def checked(*args, **kwargs):
        nonlocal placed
        # Only our own load is checked: another thread's load passes through untouched.
        if threading.get_ident() == owner and should_cancel():  # ComfyUI's check raises instead
            raise LoadCancelled(f"loading cancelled after {placed} tensors")
        placed += 1
        return original(*args, **kwargs)

    with patching.swap(cml, set_param_for_module=checked):
        yield


def vetted_config(folder: Path | None, where: str, local: bool) -> dict:
    """config.json as plain JSON, refused if it asks for checkpoint code, before transformers reads it."""
    if folder is not None:
        return preflight.check_folder(folder)
    from huggingface_hub import hf_hub_download

    try:
        path = Path(hf_hub_download(where, "config.json", local_files_only=local))
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read the config of {where!r} ({exc}); check the name, or download it first "
                         "and set local_files_only") from exc
    config = preflight.read_json(path)
    preflight.check_config(config, where)
    return config


def stored_bytes(folder: Path | None, where: str, local: bool, config) -> tuple[int, dict[str, int], int, dict]:
    """The checkpoint's size, per dtype, the duplicate packed bytes the load drops, and its headers (a local
    folder's; else None), from its headers (or hub index), once its tensors match its config."""
    if folder is not None:
        headers = preflight.read_headers(folder)
        check_packed(config, {n for h in headers.values() for n in h if n != "__metadata__"}, where)
        return (*preflight.checkpoint_bytes(folder, headers), shared_copy_bytes(headers), headers)
    index = preflight.hub_index(where, local) or {}
    weight_map = index.get("weight_map")
    check_packed(config, set(weight_map) if isinstance(weight_map, dict) else None, where)
    return preflight.hub_bytes(where, local) or 0, {}, 0, None


def mode_needs(config, weights: int, stored_mode: str, shared: int = 0) -> dict[str, deviceplan.Need]:
    """Every mode's Need for a checkpoint of `config` whose weights load as `weights` bytes, stored in
    `stored_mode` (none or autoround) with `shared` duplicate bytes the load drops (see deviceplan)."""
    text, canvas = config.get_text_config(decoder=True), config.canvas_length
    shape = quant_at_load.geometry(config)
    element = max(1, round(weights / shape.total_numel)) if stored_mode == "none" else 2
    step = deviceplan.step_bytes(text, canvas, deviceplan.LOAD_CONTEXT)
    made = {q: deviceplan.made_need(shape.total_numel * element, sum(shape.quantized), shape.packed_bytes(q),
                                    shape.dense_numel, max(shape.quantized, default=0), step, element,
                                    deviceplan.logit_bytes(text, canvas), deviceplan.kept_bytes(text, canvas))
            for q in MADE_AT_LOAD}
    dense = shape.dense_numel * 2 + autoround_run.CHUNK_BYTES  # bf16 experts of one layer, and their making
    return deviceplan.need_for(weights, text, canvas, stored_mode, shared, made, dense)


def place(config, stored: int, per_dtype: dict, shared: int, torch_dtype, device: str, quant: str,
          host: machine.Machine):
    """The device plan for what a run of this checkpoint needs on `host`, in `quant` or (auto) the best mode that
    fits (see deviceplan), on the host's accelerator by name; the host first frees room for it there."""
    weights = preflight.loaded_bytes(stored, per_dtype, torch_dtype)
    stored_mode = "autoround" if quant_method(config) == "auto-round" else "none"
    needs = mode_needs(config, weights, stored_mode, shared)
    own = (stored_mode,) if stored_mode == "autoround" else ("none", *(MADE_AT_LOAD if has_bitsandbytes() else ()))
    figures = host.room(device, needs[quant if quant != "auto" else own[0]].peak)
    if quant == "auto":
        return machine.bind(deviceplan.choose(needs, own, device, **figures), host.accelerator)
    return machine.bind(deviceplan.plan(needs[quant], device, quant=quant, others=needs, **figures), host.accelerator)


def is_gguf(source) -> bool:
    return isinstance(source, (str, os.PathLike)) and str(source).lower().endswith(".gguf")


def _load_gguf(source, quant: str, dtype: str, device: str, should_cancel) -> DGemmaModel:
    from .gguf_load import load_gguf

    if quant not in ("auto", "gguf"):
        raise ValueError(f"{Path(source).name} is a GGUF file, which loads with quant 'gguf' (or 'auto'), not "
                         f"{short(quant)}; set quant to 'gguf'")
    path = Path(os.path.expanduser(str(source)))
    if not path.is_file():
        raise ValueError(f"GGUF file {short(str(source))} does not exist; put it under models/diffusiongemma")
    return load_gguf(path, dtype=dtype, device=device, should_cancel=should_cancel)


@patches.paused_gc()
def load_model(source: str, quant: str = "none", dtype: str = "auto", device: str = "auto",
               local_files_only: bool = False, should_cancel=None) -> DGemmaModel:
    """Load weights (safetensors only, never checkpoint code) and the tokenizer; every check runs first.

    `should_cancel` is called between tensors while the weights load; returning True (or raising)
    stops the load.
    """
    from transformers import AutoConfig

    if not isinstance(local_files_only, bool):
        raise ValueError(f"local_files_only must be true or false, got {short(local_files_only)} "
                         f"({type(local_files_only).__name__}); set it to true or false")
    if is_gguf(source):
        return _load_gguf(source, quant, dtype, device, should_cancel)
    folder = check_source(source)
    host, device = machine.on_device(device)
    torch_dtype = resolve_dtype(dtype)
    where = str(folder) if folder else source
    local = local_files_only or folder is not None
    vetted_config(folder, where, local)
    try:
        config = AutoConfig.from_pretrained(where, local_files_only=local, trust_remote_code=False)
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read the config of {where!r} ({exc}); check the name, or download it first "
                         "and set local_files_only") from exc
    check_quant(quant, config, where)
    stored, per_dtype, shared, headers = stored_bytes(folder, where, local, config)
    placement = place(config, stored, per_dtype, shared, torch_dtype, device, quant, host)
    if quant != placement.quant:  # auto picked it
        quant = placement.quant
        check_quant(quant, config, where)
    vocab_size = config.get_text_config(decoder=True).vocab_size
    tokenizer, processor = load_tokenizer(where, local, vocab_size)  # cheap: errors come before the weights
    check_template(tokenizer, processor, where)
    image_processor = load_image_processor(where, local, processor)
    extra = {"quantization_config": quantization_config(quant)} if quant in MADE_AT_LOAD else {}
    with cancel_checks(should_cancel), patches.for_load(quant):
        model = model_class(quant).from_pretrained(
            where, config=config, dtype=torch_dtype, use_safetensors=True, local_files_only=local,
            use_kernels=False, trust_remote_code=False, device_map=placement.device_map,
            max_memory=placement.max_memory, **extra)
    if placement.device_map is None:
        model.to(placement.device)
    model.eval()
    after_load(model, quant, headers)
    dtype_name = str(next(p for p in model.parameters() if p.is_floating_point()).dtype).removeprefix("torch.")
    identity = checkpoint_identity(folder, where, stored, tokenizer_fingerprint(tokenizer))
    return DGemmaModel(model=model, tokenizer=tokenizer, processor=processor, source=where, quant=quant,
                       device=placement.device, dtype=dtype_name, eos_ids=eos_ids(model, tokenizer),
                       channel_ids=channel_ids(tokenizer), image_processor=image_processor, identity=identity,
                       placement_note=placement.note)
