"""Quantization modes: what each expects of a checkpoint, and what loading it needs.

An AutoRound checkpoint of DiffusionGemma stores the encoder's and the decoder's layers as
separate packed copies (qweight, qzeros, scales): auto-round quantizes each block on its own and
packed layers have no `.weight` to tie. Transformers still declares every encoder layer weight
tied to the decoder's, and auto-round refuses to swap in packed layers for tied weights, so a
plain load keeps float layers and re-initialises them. The AutoRound class below drops those ties
before auto-round converts the model, keeps every tie that is still between plain tensors
(norms, routers, embeddings, lm_head), and once loaded makes the encoder reuse the decoder's
packed layers wherever the checkpoint's two copies are bit-identical.
"""

from __future__ import annotations

import functools
import os
import re
import struct

import torch

from ..errors import short
from . import autoround_run

QUANTS = ("auto", "none", "autoround", "4bit", "8bit", "gguf")
MADE_AT_LOAD = ("4bit", "8bit")  # quantized from the unquantized checkpoint while it loads (quant_at_load)
# Fused MoE expert parameters (3D); auto-round splits them into per-expert linears.
_FUSED_EXPERTS = re.compile(r"\.experts\.(gate_up_proj|down_proj)$")
_ENCODER_LAYERS = "model.encoder.language_model.layers"
_DECODER_LAYERS = "model.decoder.layers"


def quant_method(config) -> str | None:
    qc = getattr(config, "quantization_config", None)
    if qc is None:
        return None
    method = qc.get("quant_method") if isinstance(qc, dict) else getattr(qc, "quant_method", None)
    return str(getattr(method, "value", method))


def check_quant(quant: str, config, source: str) -> None:
    """Refuse a quant mode that does not match the checkpoint, before any weight is read."""
    if quant not in QUANTS:
        raise ValueError(f"quant must be one of {QUANTS}, got {short(quant)}; pick one of those")
    method = quant_method(config)
    if quant == "auto":
        return  # the device plan picks a mode this checkpoint loads in, checked again once picked
    if quant in ("none", *MADE_AT_LOAD) and method is not None:
        raise ValueError(f"{source!r} is a {method} quantized checkpoint but quant is {quant!r}; set quant to "
                         "'autoround' for an AutoRound checkpoint, or load an unquantized one")
    if quant == "gguf":
        raise ValueError(f"quant 'gguf' needs a .gguf file, but {source!r} is a safetensors checkpoint; set quant "
                         "to 'auto' or 'none', or pick a .gguf file under models/diffusiongemma")
    if quant == "autoround" and method != "auto-round":
        found = "no quantization_config" if method is None else f"quant_method {method!r}"
        raise ValueError(f"quant 'autoround' needs an AutoRound checkpoint, but {source!r} has {found}; set quant "
                         "to 'none', or pick an AutoRound INT4 checkpoint (e.g. "
                         "Intel/diffusiongemma-26B-A4B-it-int4-AutoRound)")
    if quant == "autoround":
        _require_auto_round()
    if quant in MADE_AT_LOAD:
        from .weightquant import require_bitsandbytes

        require_bitsandbytes(quant)


def check_packed(config, names, source: str) -> None:
    """Refuse a checkpoint whose tensors contradict its quantization_config (read from headers or the index).

    An AutoRound config over plain weights would make auto-round swap in packed layers the files
    cannot fill (random weights); packed tensors under a plain config would be dropped the same way.
    """
    if names is None:  # a hub id without a readable index: transformers' own load report still checks
        return
    method = quant_method(config)
    packed = sorted(n for n in names if n.endswith(".qweight"))
    if method == "auto-round" and not packed:
        raise ValueError(f"config.json of {source!r} says quant_method 'auto-round' but its safetensors hold no "
                         "packed .qweight tensors, so the weights are not quantized; download the AutoRound "
                         "checkpoint again, or use the unquantized one with quant 'none'")
    if method is None and packed:
        raise ValueError(f"{source!r} holds {len(packed)} packed .qweight tensors (e.g. {packed[0]!r}) but its "
                         "config.json has no quantization_config; download the checkpoint's config.json again "
                         "(an AutoRound checkpoint loads with quant 'autoround')")


def _require_auto_round() -> None:
    try:
        import auto_round  # noqa: F401
    except ImportError as exc:
        raise ValueError("quant 'autoround' needs the auto-round package in the Python that runs ComfyUI: "
                         "pip install 'auto-round>=0.16'") from exc


def model_class(quant: str):
    """The class whose from_pretrained loads a checkpoint of this mode."""
    from transformers import DiffusionGemmaForBlockDiffusion

    return _autoround_class() if quant == "autoround" else DiffusionGemmaForBlockDiffusion


def after_load(model, quant: str, headers: dict | None = None) -> None:
    """Checks and repairs a mode needs once the weights are in (`headers`: the checkpoint's, when local)."""
    if quant in MADE_AT_LOAD:
        from .quant_at_load import check_loaded

        check_loaded(model)
        _refuse_meta(model)
        return
    if quant != "autoround":
        return
    report = getattr(model, "_dgemma_load_report", None)
    if report is not None:
        _refuse_bad_load(report)
    _refuse_meta(model)
    head = getattr(model.lm_head, "weight", None)  # absent if a checkpoint packed lm_head too
    if getattr(model.config, "tie_word_embeddings", False) and isinstance(head, torch.nn.Parameter):
        if head is not model.model.decoder.embed_tokens.weight:
            raise ValueError("the AutoRound checkpoint loaded, but lm_head is not tied to the token embedding; "
                             "this transformers/auto-round pair is not supported, see the pack's tested versions")
    model._dgemma_shared_layers = share_identical_layers(model, headers)
    autoround_run.convert(model, next(p for p in model.parameters() if p.is_floating_point()).dtype)


def share_identical_layers(model, headers: dict | None = None) -> tuple[int, int]:
    """Make each encoder layer reuse the decoder's packed layer when the two hold identical tensors.

    The unquantized model ties them, so identical copies are the same weights twice; sharing them
    halves the memory of the quantized layers. Copies that differ (a tuned quantization can round
    the encoder and decoder differently) stay as the checkpoint holds them. Returns (shared, kept).
    On the CPU, with the checkpoint's `headers`, the copies are compared in the files: weights on the
    CPU are mapped from them, and reading a dropped copy through its tensors would keep its pages
    resident.
    """
    if len({str(d) for d in (getattr(model, "hf_device_map", None) or {}).values()}) > 1:
        return 0, 0  # offloaded: accelerate hooks place each copy; leave them where they are
    encoder = model.get_submodule(_ENCODER_LAYERS)
    decoder = model.get_submodule(_DECODER_LAYERS)
    on_cpu = next(model.parameters()).device.type == "cpu"
    with _StoredBytes(headers if on_cpu else None) as files:
        return _share(encoder, decoder, files)


def _share(encoder, decoder, files) -> tuple[int, int]:
    shared = kept = 0
    for i, (enc_layer, dec_layer) in enumerate(zip(encoder, decoder)):
        for name, dec_mod in list(dec_layer.named_modules()):
            if not _is_packed(dec_mod):
                continue
            try:
                enc_mod = enc_layer.get_submodule(name)
            except AttributeError:
                continue
            if enc_mod is dec_mod:
                continue
            same = files.same(f"{_ENCODER_LAYERS}.{i}.{name}", f"{_DECODER_LAYERS}.{i}.{name}", enc_mod)
            if same is None:
                same = _same_tensors(enc_mod, dec_mod)
            if same:
                parent, _, leaf = name.rpartition(".")
                setattr(enc_layer.get_submodule(parent) if parent else enc_layer, leaf, dec_mod)
                shared += 1
            else:
                kept += 1
    return shared, kept


def _is_packed(module) -> bool:
    return isinstance(getattr(module, "qweight", None), torch.Tensor)


def _same_tensors(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return (type(a) is type(b) and sa.keys() == sb.keys()
            and all(sa[k].shape == sb[k].shape and torch.equal(sa[k], sb[k]) for k in sa))


class _StoredBytes:
    """Compares tensors as the checkpoint's files hold them, read through the page cache (no `headers`:
    it knows none)."""

    CHUNK = 1 << 20

    def __init__(self, headers: dict | None):
        self.where = {name: (path, info) for path, header in (headers or {}).items() for name, info in header.items()
                      if name != "__metadata__"}
        self.handles: dict = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for fd, _ in self.handles.values():
            os.close(fd)

    def same(self, a: str, b: str, module) -> bool | None:
        """Whether modules `a` and `b` hold byte-identical tensors in the files; None when the files
        do not hold every tensor of `module` under both names."""
        parts = module.state_dict().keys()
        pairs = [(self.where.get(f"{a}.{k}"), self.where.get(f"{b}.{k}")) for k in parts]
        if not parts or any(x is None or y is None for x, y in pairs):
            return None
        return all(self._equal(x, y) for x, y in pairs)

    def _equal(self, x, y) -> bool:
        (path_x, info_x), (path_y, info_y) = x, y
        if info_x["dtype"] != info_y["dtype"] or info_x["shape"] != info_y["shape"]:
            return False
        (fx, at_x), (fy, at_y) = self._start(path_x, info_x), self._start(path_y, info_y)
        size = info_x["data_offsets"][1] - info_x["data_offsets"][0]
        for done in range(0, size, self.CHUNK):
            n = min(self.CHUNK, size - done)
            if os.pread(fx, n, at_x + done) != os.pread(fy, n, at_y + done):
                return False
        return True

    def _start(self, path, info) -> tuple[int, int]:
        """(descriptor, file offset) of a tensor's bytes."""
        if path not in self.handles:
            fd = os.open(path, os.O_RDONLY)
            (length,) = struct.unpack("<Q", os.pread(fd, 8, 0))
            self.handles[path] = (fd, 8 + length)
        fd, data = self.handles[path]
        return fd, data + info["data_offsets"][0]


def _refuse_bad_load(report) -> None:
    missing = sorted(getattr(report, "missing_keys", ()) or ())
    unexpected = sorted(k for k in (getattr(report, "unexpected_keys", ()) or ())
                        if k.rsplit(".", 1)[-1] in ("qweight", "qzeros", "scales", "g_idx"))
    if missing or unexpected:
        what = (f"{len(missing)} weights missing from the checkpoint (they would be random), e.g. {missing[:3]}"
                if missing else f"{len(unexpected)} packed tensors left unused, e.g. {unexpected[:3]}")
        raise ValueError(f"the AutoRound checkpoint does not match this model: {what}; download it again, or "
                         "use an AutoRound export of DiffusionGemma made with auto-round >= 0.16")


def _refuse_meta(model) -> None:
    offloaded = {k for k, v in (getattr(model, "hf_device_map", None) or {}).items() if str(v) in ("cpu", "disk")}
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if tensor.device.type == "meta" and not any(name == k or name.startswith(k + ".") for k in offloaded):
            raise ValueError(f"{name} was never loaded (still on the meta device); the checkpoint is incomplete "
                             "or does not match this transformers version")


def _quantized_by_config(model, config) -> set[str]:
    """Parameter names auto-round will replace with packed layers, per the checkpoint's config."""
    blocks, extra, bits = _quant_scope(config)
    return {f"{mod_name}.{p_name}"
            for mod_name, module in model.named_modules() if _under(mod_name, blocks)
            for p_name, param in module.named_parameters(recurse=False)
            if _packs(module, mod_name, p_name, param, extra, bits)}


def _quant_scope(config) -> tuple[list[str], dict, int]:
    """The block names a quantization_config covers, its per-layer overrides and its default bits."""
    qc = getattr(config, "quantization_config", None) or {}
    get = qc.get if isinstance(qc, dict) else lambda k, d=None: getattr(qc, k, d)
    blocks = get("block_name_to_quantize") or get("to_quant_block_names") or [_ENCODER_LAYERS, _DECODER_LAYERS]
    blocks = blocks.split(",") if isinstance(blocks, str) else list(_flatten(blocks))
    return blocks, get("extra_config") or {}, get("bits", 4)


def _under(name: str, prefixes) -> bool:
    return any(name == b or name.startswith(b + ".") for b in prefixes)


def _packs(module, mod_name: str, p_name: str, param, extra: dict, bits) -> bool:
    """A linear's weight quantized below 16 bits, or a fused experts tensor auto-round splits."""
    if isinstance(module, torch.nn.Linear) and p_name == "weight":
        return int(extra.get(mod_name, {}).get("bits", bits)) < 16
    return param.dim() == 3 and bool(_FUSED_EXPERTS.search(f"{mod_name}.{p_name}"))


def _flatten(items):
    for item in items:
        if isinstance(item, (list, tuple)):
            yield from _flatten(item)
        else:
            yield str(item)


@functools.cache
def _autoround_class():
    from transformers import DiffusionGemmaForBlockDiffusion

    class AutoRoundDiffusionGemma(DiffusionGemmaForBlockDiffusion):
        """DiffusionGemma whose ties skip the layers an AutoRound checkpoint stores packed."""

        def __init__(self, config):
            super().__init__(config)
            # Runs before from_pretrained hands the model to auto-round, which reads these ties.
            quantized = _quantized_by_config(self, config)
            for owner in (self, self.model):
                ties = getattr(owner, "all_tied_weights_keys", None) or {}
                prefix = "model." if owner is self.model else ""
                owner.all_tied_weights_keys = {
                    t: s for t, s in ties.items() if prefix + t not in quantized and prefix + s not in quantized}

        def mark_tied_weights_as_initialized(self, loading_info):
            self._dgemma_load_report = loading_info  # after_load reads what the checkpoint lacked
            return super().mark_tied_weights_as_initialized(loading_info)

    return AutoRoundDiffusionGemma


_PACKED_PARTS = ("qweight", "qzeros", "scales")


def shared_copy_bytes(headers: dict) -> int:
    """Bytes of encoder packed tensors the load will drop as duplicates of the decoder's (after_load).

    Reads one `.scales` tensor per encoder layer and its decoder twin (kilobytes): a checkpoint
    quantized by rounding alone holds identical copies everywhere, a tuned one nowhere. 0 when a
    sample differs or the checkpoint has no packed encoder layers.
    """
    where = {name: (path, info) for path, header in headers.items() for name, info in header.items()
             if name != "__metadata__"}
    pairs = _decoder_twins(where)
    samples = {}
    for name in sorted(pairs):
        layer = name[len(_ENCODER_LAYERS) + 1:].split(".", 1)[0]
        if name.endswith(".scales"):
            samples.setdefault(layer, name)
    if not samples or any(_raw(*where[a]) != _raw(*where[pairs[a]]) for a in samples.values()):
        return 0
    return sum(info["data_offsets"][1] - info["data_offsets"][0] for _, info in (where[n] for n in pairs))


def _decoder_twins(where: dict) -> dict[str, str]:
    """Each packed encoder tensor named to its decoder twin of the same shape."""
    pairs = {n: n.replace(_ENCODER_LAYERS, _DECODER_LAYERS, 1) for n in where
             if n.startswith(_ENCODER_LAYERS + ".") and n.rsplit(".", 1)[-1] in _PACKED_PARTS}
    return {a: b for a, b in pairs.items() if b in where and where[a][1]["shape"] == where[b][1]["shape"]}


def _raw(path, info) -> bytes:
    start, stop = info["data_offsets"]
    with open(path, "rb") as fh:
        (length,) = struct.unpack("<Q", fh.read(8))
        fh.seek(8 + length + start)
        return fh.read(stop - start)
