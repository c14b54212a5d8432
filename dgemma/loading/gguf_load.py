"""Load a DiffusionGemma GGUF in-process: the same DGemmaModel the safetensors loader returns, quant "gguf".

Order: read and check the file (memory-mapped), build the config and tokenizer from its metadata, build
the model with every weight on the meta device, check that each parameter has exactly one tensor of the
right shape, and only then allocate: block tensors for the linears and the experts (gguf_modules), plain
tensors for norms, scales and routers, and the token embedding dense (tied to the output head, it is
multiplied whole twice a step: dequantizing it each step would cost more than all the layers' compute).
No vision tower is built.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import numpy as np
import torch

from ..errors import LoadCancelled
from ..inputs.tokens import channel_ids, check_template, eos_ids, tokenizer_fingerprint
from ..payloads import DGemmaModel
from . import gguf_config, gguf_file, gguf_numba, gguf_plan, machine
from .gguf_file import ROPE_FREQS, TOP_NAMES, checkpoint_name
from .gguf_modules import GGUFWeight, chunk_rows
from .gguf_quants import TYPES, dequantize, row_bytes
from .held import HeldLinear, Scratch, make_experts
from .load_options import resolve_dtype

log = logging.getLogger("dgemma")
DECODER = "model.decoder."
EMBEDDING = TOP_NAMES["token_embd.weight"]


def skeleton(config):
    """The model with its parameters on the meta device (nothing allocated) and its small computed buffers
    (rope frequencies, embedding scale) real; the vision tower dropped."""
    from transformers import DiffusionGemmaForBlockDiffusion

    with torch.device("meta"):  # keeps the checkpoint's ties (the encoder's weights are the decoder's)
        model = DiffusionGemmaForBlockDiffusion(config)
    model.model.encoder.vision_tower = None
    model.model.encoder.embed_vision = None
    for name, module in list(model.named_modules()):
        if name.endswith("rotary_emb"):
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent), child, type(module)(config.get_text_config(decoder=True)))
        elif hasattr(module, "scalar_embed_scale"):
            module.embed_scale = torch.tensor(module.scalar_embed_scale)
    return model


def owners(model) -> dict[str, list[str]]:
    """Each parameter and loaded buffer of the text model by its checkpoint name (the decoder's, for a weight
    the encoder shares), with every name it is reachable under."""
    groups: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
    found = {min(names, key=lambda n: (not n.startswith(DECODER), n)): names for names in groups.values()}
    for name, _ in model.named_buffers():
        if name.endswith(".layer_scalar"):
            found[name] = [name]
    return found


def tensor_plan(g: gguf_file.GGUF, model) -> dict[str, gguf_file.Tensor]:
    """Checkpoint name -> the one GGUF tensor that fills it; every name and shape checked, nothing allocated."""
    expected = owners(model)
    plan: dict[str, gguf_file.Tensor] = {}
    for name, t in g.tensors.items():
        if name == ROPE_FREQS:
            continue  # checked against the config's rope by gguf_config.partial_rotary
        target = checkpoint_name(name)
        if target is None or target not in expected:
            raise ValueError(f"GGUF {g.path.name}: tensor {name!r} has no place in this DiffusionGemma "
                             f"({'an unknown name' if target is None else f'no {target}'}); an extra tensor, "
                             "the metadata disagree with the tensors")
        want = tuple(_shape_of(model, expected[target][0]))
        if t.shape != want:
            raise ValueError(f"GGUF {g.path.name}: tensor {name!r} has shape {list(t.shape)} but the metadata make "
                             f"{target} {list(want)}; the metadata disagree with the tensors")
        plan[target] = t
    missing = sorted(set(expected) - set(plan))
    if missing:
        raise ValueError(f"GGUF {g.path.name}: {len(missing)} weight(s) have no tensor, e.g. {missing[0]}; the file "
                         "is incomplete, convert the checkpoint again")
    return plan


def _shape_of(model, name: str):
    owner, _, attr = name.rpartition(".")
    module = model.get_submodule(owner)
    found = module._parameters.get(attr)
    return (found if found is not None else module._buffers[attr]).shape


def _blocks(t: gguf_file.Tensor, device) -> torch.Tensor:
    raw = np.ascontiguousarray(t.data).view(np.uint8).reshape(*t.shape[:-1], row_bytes(t.qtype, t.shape[-1]))
    return torch.from_numpy(raw.copy()).to(device)


class _Filler:
    """Puts each planned tensor into the skeleton: block modules for weights that are multiplied, plain
    tensors for the rest. One GGUFWeight per GGUF tensor, shared wherever the checkpoint ties it."""

    def __init__(self, model, plan, dtype, device, should_cancel):
        self.model, self.plan, self.dtype, self.device, self.should_cancel = model, plan, dtype, device, should_cancel
        self.weights: dict[str, GGUFWeight] = {}
        self.scratch = Scratch()

    def weight(self, target: str) -> GGUFWeight:
        t = self.plan[target]
        if t.name not in self.weights:
            if self.should_cancel is not None and self.should_cancel():
                raise LoadCancelled(f"loading cancelled after {len(self.weights)} tensors")
            w = GGUFWeight(_blocks(t, self.device), t.qtype, t.shape, t.name)
            w.compute_dtype = self.dtype
            self.weights[t.name] = w
        return self.weights[t.name]

    def plain(self, target: str) -> torch.Tensor:
        t = self.plan[target]
        return dequantize(_blocks(t, self.device), t.qtype, t.shape, self.dtype, chunk_rows=chunk_rows(t.shape))

    def fill(self, names: dict[str, list[str]]) -> None:
        for target, reachable in names.items():
            for name in reachable:
                self.place(target, name)
        if self.scratch._buffers:
            self.model.gguf_scratch = self.scratch

    def place(self, target: str, name: str) -> None:
        owner_name, _, attr = name.rpartition(".")
        owner = self.model.get_submodule(owner_name)
        if target == EMBEDDING:  # the embedding and the head it is tied to: one dense parameter
            first = "param:" + target not in self.weights
            owner._parameters[attr] = self.param(target)
            if first:
                t, held = self.plan[target], owner._parameters[attr]
                log.info("GGUF %s: the token embedding (%s) dequantized once at load, %.1f MiB as %s (the output "
                         "head and the self-conditioning read all of it every step)", t.name,
                         TYPES[t.qtype][0], held.nbytes / 2**20, str(held.dtype).removeprefix("torch."))
        elif isinstance(owner, torch.nn.Linear) and attr == "weight":
            parent_name, _, child = owner_name.rpartition(".")
            setattr(self.model.get_submodule(parent_name), child, self.linear(target))
        elif attr in ("gate_up_proj", "down_proj"):
            if "gate_up_proj" in owner._parameters:
                base = target.rpartition(".")[0]
                make_experts(owner, self.weight(base + ".gate_up_proj"), self.weight(base + ".down_proj"),
                             self.scratch)
        elif attr == "layer_scalar":
            owner._buffers[attr] = self.plain(target)
        else:
            owner._parameters[attr] = self.param(target)

    def linear(self, target: str) -> HeldLinear:
        key = "linear:" + target
        if key not in self.weights:
            self.weights[key] = HeldLinear(self.weight(target))
        return self.weights[key]

    def param(self, target: str) -> torch.nn.Parameter:
        key = "param:" + target
        if key not in self.weights:
            self.weights[key] = torch.nn.Parameter(self.plain(target), requires_grad=False)
        return self.weights[key]


def identity(path: Path, stored: int, fingerprint: str) -> str:
    st = path.stat()
    digest = hashlib.sha256(f"{stored}\n{fingerprint}\n{path.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return f"{stored}:{digest.hexdigest()[:16]}"


def load_gguf(path, dtype: str = "auto", device: str = "auto", should_cancel=None) -> DGemmaModel:
    """Load a DiffusionGemma GGUF; every check runs before a weight is allocated."""
    path = Path(path)
    host, device = machine.on_device(device)
    chosen = resolve_dtype(dtype)
    g = gguf_file.read(path)
    config = gguf_config.model_config(g)
    tokenizer = gguf_config.tokenizer(g)
    check_template(tokenizer, tokenizer, str(path))
    model = skeleton(config)
    plan = tensor_plan(g, model)
    place, torch_dtype = gguf_plan.place(plan, config, device, chosen, host)
    if torch.device(place).type == "cpu":
        log.info("GGUF %s on the CPU: blocks made dense by %s", path.name, "numba's one-pass kernels"
                 if gguf_numba.KERNELS else "torch (`pip install numba` makes that about 3x faster)")
    filler = _Filler(model, plan, torch_dtype, place, should_cancel)
    filler.fill(owners(model))
    model.to(place)
    model.eval()
    model.generation_config = gguf_config.generation_config(g)
    model._dgemma_gguf_bytes = g.tensor_bytes
    return DGemmaModel(model=model, tokenizer=tokenizer, processor=tokenizer, source=str(path), quant="gguf",
                       device=place, dtype=str(torch_dtype).removeprefix("torch."),
                       eos_ids=eos_ids(model, tokenizer), channel_ids=channel_ids(tokenizer),
                       image_processor=None, identity=identity(path, g.tensor_bytes, tokenizer_fingerprint(tokenizer)))
