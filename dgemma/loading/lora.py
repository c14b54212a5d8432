"""LoRA adapters in PEFT's format: read, checked against a loaded model, and applied as a view over it.

An adapter is a folder (adapter_config.json + adapter_model.safetensors, as PEFT's save_pretrained
writes it) or one .safetensors file with PEFT's keys and its config in the file's metadata
("adapter_config"). Everything is checked before anything runs, and each refusal names the file and the
key. The adapted model is a new payload over the same weights (lora_view.py): the base payload stays as
it was, and chaining adapters adds their deltas.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import InputError, short
from . import lora_view
from .lora_view import EXPERT_PARAMS, Delta, View, stack_of

CONFIG, WEIGHTS = "adapter_config.json", "adapter_model.safetensors"
PREFIX = "base_model.model."
KEY = re.compile(r"^(?P<path>.+?)(?P<nest>(\.base_layer)*)\.lora_(?P<side>[AB])\.weight$")
REFUSED_OPTIONS = {"use_dora": "DoRA", "lora_bias": "a LoRA bias", "modules_to_save": "modules_to_save (whole "
                   "replaced modules)", "trainable_token_indices": "trainable tokens", "layer_replication":
                   "layer replication", "alora_invocation_tokens": "aLoRA"}


@dataclass(frozen=True, eq=False)
class Adapter:
    """One adapter as read: its name, config (peft's LoraConfig) and factors per PEFT key stem."""

    name: str
    path: str
    config: object
    factors: dict            # key stem (the module path, with PEFT's ".base_layer" nesting) -> (A, B)
    digest: str              # the weights' and config's content, for a cache's identity
    prefix: str = PREFIX     # what the file's keys start with before the stem

    def key(self, stem: str) -> str:
        """A stem's A key as the file names it."""
        return f"{self.prefix}{stem}.lora_A.weight"


def _refuse(path, key: str, message: str):
    where = f"{Path(path).name}" + (f", key {short(key)}" if key else "")
    raise InputError("lora", f"LoRA {where}: {message}")


def _files(path: Path) -> tuple[Path, dict | None]:
    """The weights file and the config (None: read from the file's metadata)."""
    if path.is_dir():
        if not (path / CONFIG).is_file():
            _refuse(path, "", f"the folder has no {CONFIG}; an adapter needs PEFT's config beside its weights")
        if not (path / WEIGHTS).is_file():
            _refuse(path, "", f"the folder has no {WEIGHTS}; save the adapter with PEFT's save_pretrained")
        try:
            return path / WEIGHTS, json.loads((path / CONFIG).read_text())
        except (OSError, ValueError) as exc:
            _refuse(path, "", f"{CONFIG} is not readable JSON ({short(str(exc))})")
    if path.suffix.lower() != ".safetensors" or not path.is_file():
        _refuse(path, "", "is neither an adapter folder nor a .safetensors file")
    return path, None


def _config(path: Path, raw: dict | None, metadata: dict | None):
    try:
        from peft import LoraConfig
    except ImportError:
        raise InputError("lora", "LoRA adapters need the peft package in the Python that runs ComfyUI: "
                                 "pip install 'peft>=0.17'") from None

    if raw is None:
        text = (metadata or {}).get("adapter_config")
        if text is None:
            _refuse(path, "", "has no config: a single file needs PEFT's adapter config in its metadata "
                              "('adapter_config'); or use the adapter folder PEFT saved")
        raw = json.loads(text)
    if str(raw.get("peft_type", "LORA")).upper() != "LORA":
        _refuse(path, "peft_type", f"is a {short(raw.get('peft_type'))} adapter; only LoRA adapters load here")
    known = {f.name for f in dataclasses.fields(LoraConfig)}
    try:
        config = LoraConfig(**{k: v for k, v in raw.items() if k in known})
    except (TypeError, ValueError) as exc:
        _refuse(path, "", f"its config is not a LoRA config PEFT accepts ({short(str(exc))})")
    for option, what in REFUSED_OPTIONS.items():
        if getattr(config, option, None):
            _refuse(path, option, f"uses {what}, which this view cannot apply; train a plain LoRA")
    if not config.r or config.r <= 0:
        _refuse(path, "r", f"has rank {config.r}; a LoRA's rank must be at least 1")
    return config


def _factors(path: Path, tensors: dict) -> dict:
    pairs: dict = {}
    for key, value in tensors.items():
        stem = key[len(PREFIX):] if key.startswith(PREFIX) else key
        match = KEY.match(stem)
        if match is None:
            _refuse(path, key, "is not a PEFT LoRA key (<module>.lora_A.weight / .lora_B.weight); nothing is skipped")
        if not value.is_floating_point() or not torch.isfinite(value).all():
            _refuse(path, key, "holds NaN or infinite values (or is not a float tensor)")
        if value.dim() != 2 or 0 in value.shape:
            _refuse(path, key, f"has shape {list(value.shape)}; a LoRA factor is a non-empty matrix (rank 0?)")
        pairs.setdefault(match["path"] + match["nest"], {})[match["side"]] = value
    for stem, sides in pairs.items():
        if set(sides) != {"A", "B"}:
            missing = "B" if "A" in sides else "A"
            prefix = PREFIX if any(k.startswith(PREFIX) for k in tensors) else ""
            _refuse(path, f"{prefix}{stem}.lora_{missing}.weight", "is missing: each target needs both factors")
    if not pairs:
        _refuse(path, "", "holds no LoRA weights")
    return {stem: (sides["A"], sides["B"]) for stem, sides in pairs.items()}


def read_adapter(path, name: str | None = None) -> Adapter:
    """Read and check an adapter on its own (its fit to a model is checked by `adapt`); `name` is what
    headers call it (default: the folder's or file's name)."""
    from safetensors import safe_open

    path = Path(path)
    weights, raw = _files(path)
    try:
        with safe_open(str(weights), framework="pt") as f:
            metadata = f.metadata()
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except (OSError, ValueError, RuntimeError) as exc:
        _refuse(path, "", f"is not a readable safetensors file ({short(str(exc))})")
    config = _config(path, raw, metadata)
    factors = _factors(path, tensors)
    digest = hashlib.sha256(json.dumps(config.to_dict(), sort_keys=True, default=str).encode())
    for stem in sorted(factors):
        for t in factors[stem]:
            digest.update(stem.encode() + t.float().numpy().tobytes())
    prefix = PREFIX if all(k.startswith(PREFIX) for k in tensors) else ""
    return Adapter(name or path.name, str(path), config, factors, digest.hexdigest()[:12], prefix)


def _rank_alpha(adapter: Adapter, module_path: str) -> tuple[int, float]:
    from peft.utils.other import get_pattern_key

    c = adapter.config
    r = c.rank_pattern.get(get_pattern_key(list(c.rank_pattern), module_path), c.r) if c.rank_pattern else c.r
    alpha = (c.alpha_pattern.get(get_pattern_key(list(c.alpha_pattern), module_path), c.lora_alpha)
             if c.alpha_pattern else c.lora_alpha)
    return int(r), float(alpha)


def _expert_shape(module, name: str) -> tuple[int, ...]:
    shapes = getattr(module, "_dgemma_shapes", None)  # quantized: the logical shape, not the bytes'
    if shapes is not None:
        return tuple(shapes[name])
    held = getattr(module, {"gate_up_proj": "held_gate_up", "down_proj": "held_down"}[name], None)
    return tuple(held.shape) if held is not None else tuple(module._parameters[name].shape)


def _expert_param(adapter: Adapter, stem: str, path: str, module) -> str:
    """Which fused weight a key stem adapts: PEFT nests one wrapper per targeted parameter, the first
    listed innermost, so each '.base_layer' is one step further in."""
    names = [t.rsplit(".", 1)[-1] for t in (adapter.config.target_parameters or ())
             if t.rsplit(".", 1)[-1] in EXPERT_PARAMS and path.endswith(t.rsplit(".", 1)[0])]
    depth = stem.count(".base_layer")
    if depth >= len(names):
        _refuse(adapter.path, adapter.key(stem), f"adapts a fused experts weight the config's "
                                                       f"target_parameters do not name ({names or 'none'})")
    return names[len(names) - 1 - depth]


def _delta(adapter: Adapter, stem: str, module, strength: float) -> tuple[str, Delta]:
    """The delta of one key stem on `module`, its shapes checked; the param name for fused experts."""
    path = stem.replace(".base_layer", "")
    a, b = adapter.factors[stem]
    r, alpha = _rank_alpha(adapter, path)
    scale = strength * (alpha / math.sqrt(r) if adapter.config.use_rslora else alpha / r)
    if hasattr(module, "in_features") and hasattr(module, "out_features"):
        param, experts, (out, inn) = "", 1, (module.out_features, module.in_features)
    elif all(hasattr(module, n) or n in module._parameters for n in EXPERT_PARAMS) and hasattr(module, "num_experts"):
        param = _expert_param(adapter, stem, path, module)
        experts, out, inn = _expert_shape(module, param)
    else:
        _refuse(adapter.path, adapter.key(stem), f"targets {path}, a {type(module).__name__}: neither a "
                                                       "linear nor fused experts")
    if a.shape != (r * experts, inn) or b.shape != (out, r * experts):
        _refuse(adapter.path, adapter.key(stem), f"shapes A {list(a.shape)} / B {list(b.shape)} disagree "
                f"with {path} ({out} x {inn}{f', {experts} experts' if param else ''}, rank {r}): an adapter "
                "for another base model")
    return param, Delta(a, b, scale, experts if param else 0)


def _bind(model, adapter: Adapter, strength: float, linears: dict, experts: dict) -> None:
    for stem in sorted(adapter.factors):
        path = stem.replace(".base_layer", "")
        try:
            module = model.get_submodule(path)
        except AttributeError:
            _refuse(adapter.path, adapter.key(stem), f"names {path}, which this model does not have "
                                                           "(target modules absent: an adapter for another model)")
        param, delta = _delta(adapter, stem, module, strength)
        key = (stack_of(path), id(module))
        if param:
            per = experts.setdefault(key, (module, {}))[1]
            per[param] = per.get(param, ()) + (delta,)
        else:
            linears[key] = (module, linears.get(key, (module, ()))[1] + (delta,))


def check_strength(strength) -> float:
    if isinstance(strength, bool) or not isinstance(strength, (int, float)) or not math.isfinite(strength) \
            or not -4 <= strength <= 4:
        raise InputError("strength", f"strength must be a number from -4 to 4, got {short(strength)}")
    return float(strength)


def adapt(dm, adapter: Adapter, strength: float = 1.0):
    """`dm` with `adapter` at `strength` added to its adapters: a new payload over the same weights."""
    strength = check_strength(strength)
    if dm.quant == "autoround":
        raise InputError("lora", f"LoRA {adapter.name}: AutoRound INT4 weights take no adapter here (their "
                                 "linears are packed kernels); load the bf16 checkpoint with quant 4bit for QLoRA")
    base = dm.base if dm.base is not None else dm
    stacked = dm.adapters + ((adapter, strength),)
    linears, experts = {}, {}
    for each, s in stacked:
        if s != 0:  # strength 0 adds nothing, not a delta of zeros: the base's tokens bit for bit
            _bind(base.model, each, s, linears, experts)
    lora_view.install(base.model, [m for m, _ in linears.values()], [m for m, _ in experts.values()])
    view = View({k: d for k, (_, d) in linears.items()}, {k: d for k, (_, d) in experts.items()}) \
        if linears or experts else None
    identity = f"{base.identity} + lora[{'; '.join(f'{a.name}:{a.digest}@{s:g}' for a, s in stacked)}]"
    return dataclasses.replace(base, adapters=stacked, base=base, view=view, identity=identity)


def applied(dm):
    """The context a payload's forwards run in: its adapters' deltas, or none (a plain payload)."""
    return lora_view.applied(getattr(dm, "view", None))


def describe(dm) -> list[dict]:
    """The adapters of a payload and their strengths, as a run's config records them."""
    return [{"name": a.name, "strength": s, "rank": a.config.r, "digest": a.digest}
            for a, s in getattr(dm, "adapters", ())]
