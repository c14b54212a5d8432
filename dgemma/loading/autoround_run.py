"""An AutoRound model's packed INT4 layers, run in torch with no host wait.

auto-round runs each expert as a linear of its own and finds its tokens with `nonzero` and `tolist`: a
host wait per expert and layer, about 263 a step at the real geometry. Here each mixture-of-experts
layer's experts become two stacked packed tensors that transformers' grouped experts forward reads
dequantized, as it reads the bf16 model's; every other packed linear dequantizes and multiplies as
auto-round's torch kernel does (the same values, the same matmul). A kind of packed layer is converted
only where its own forward, given the identity, returns the dequantized weight bit for bit: a backend
that repacks its weights keeps auto-round's forward, and the load log says so.
"""

from __future__ import annotations

import torch
from torch import nn

from .held import DenseExperts, HeldLinear, HeldWeight, make_experts
from .patching import note_once

BITS = 4
CHUNK_BYTES = 64 << 20  # the intermediates of one dequantization step; bounds stacked experts' transient
_SHIFTS: dict = {}  # device -> the nibble shifts, made once per device


class PackedInt4(HeldWeight):
    """GPTQ-packed INT4 weights (auto-round's `auto_gptq` format), stacked over leading dims: `qweight`
    [..., in/8, out], `qzeros` [..., in/group, out/8] (each stored minus one), `scales` [..., in/group, out]
    float16. Dense, they are [..., in, out]: x @ W."""

    def __init__(self, qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group: int):
        super().__init__((*qweight.shape[:-2], qweight.shape[-2] * 32 // BITS, qweight.shape[-1]))
        self.register_buffer("qweight", qweight)
        self.register_buffer("qzeros", qzeros)
        self.register_buffer("scales", scales)
        self.group = group

    def make(self, dtype: torch.dtype, out: torch.Tensor | None = None) -> torch.Tensor:
        if self.qweight.dim() == 2:
            dense = dequantize(self.qweight, self.qzeros, self.scales, self.group).to(dtype)
            return dense if out is None else out.copy_(dense)
        lead = self.qweight.shape[0]
        per = max(1, CHUNK_BYTES // (8 * self.qweight[0].numel() * 32 // BITS))  # int32, int8 ×2, float16 per value
        out = torch.empty(self.shape, dtype=dtype, device=self.qweight.device) if out is None else out
        for a in range(0, lead, per):
            out[a:a + per] = dequantize(self.qweight[a:a + per], self.qzeros[a:a + per], self.scales[a:a + per],
                                        self.group)
        return out


def _shifts(device: torch.device) -> torch.Tensor:
    if device not in _SHIFTS:
        _SHIFTS[device] = torch.arange(0, 32, BITS, dtype=torch.int32, device=device)
    return _SHIFTS[device]


def dequantize(qweight, qzeros, scales, group: int) -> torch.Tensor:
    """float16 [..., in, out]: scale × (q − (z + 1)) per group, as auto-round's torch kernel computes it (the
    int8 difference times the float16 scale, one rounding)."""
    shifts = _shifts(qweight.device)
    q = ((qweight.unsqueeze(-2) >> shifts[:, None]).to(torch.int8) & 15).flatten(-3, -2)  # [..., in, out]
    z = ((qzeros.unsqueeze(-1) >> shifts).to(torch.int8) & 15).flatten(-2) + 1  # [..., groups, out]
    rows, out = q.shape[-2:]
    q = q.unflatten(-2, (rows // group, group))
    return (scales.unsqueeze(-2) * (q - z.unsqueeze(-2))).flatten(-3, -2)


class PackedLinear(HeldLinear):
    """A packed linear (no bias) that multiplies as auto-round's torch kernel does: x @ W, W [in, out]."""

    def __init__(self, source: PackedInt4):
        super().__init__(source)
        self.in_features, self.out_features = source.shape  # stored [in, out], not nn.Linear's [out, in]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.matmul(x.reshape(-1, x.shape[-1]), self.source.dense(x.dtype))
        return out.reshape(*x.shape[:-1], self.out_features)


def _fields(module) -> tuple | None:
    """(qweight, qzeros, scales, group) of a 4-bit packed linear without bias in the layout dequantize reads;
    None for anything else."""
    qweight, qzeros, scales = (getattr(module, n, None) for n in ("qweight", "qzeros", "scales"))
    group = getattr(module, "group_size", None)
    if not all(isinstance(t, torch.Tensor) and t.dim() == 2 for t in (qweight, qzeros, scales)):
        return None
    if getattr(module, "bits", None) != BITS or getattr(module, "bias", None) is not None or not isinstance(group, int):
        return None
    rows, out = qweight.shape[0] * 32 // BITS, qweight.shape[1]
    dtypes = (qweight.dtype, qzeros.dtype, scales.dtype) == (torch.int32, torch.int32, torch.float16)
    if not dtypes or group <= 0 or rows % group or scales.shape != (rows // group, out) \
            or qzeros.shape != (rows // group, out * BITS // 32):
        return None
    return qweight, qzeros, scales, group


def _probe(module, fields, dtype) -> bool:
    """Whether the layer's own forward is x @ dequantize(...): given the identity it returns the weight."""
    weight = dequantize(*fields).to(dtype)
    eye = torch.eye(fields[0].shape[0] * 32 // BITS, dtype=dtype, device=fields[0].device)
    with torch.no_grad():
        return torch.equal(module(eye), weight)


def _experts(module) -> list | None:
    """The (gate, up, down) packed linears of each expert of an auto-round-unfused experts module."""
    count = getattr(module, "num_experts", None)
    if not isinstance(count, int) or not getattr(module, "has_gate", False) or getattr(module, "has_bias", True):
        return None
    children = [module._modules.get(str(e)) for e in range(count)]
    triples = [tuple(getattr(c, n, None) for n in ("gate_proj", "up_proj", "down_proj")) for c in children]
    return triples if all(all(p is not None for p in t) for t in triples) else None


def _stack(parts) -> PackedInt4:
    """One PackedInt4 over the experts (`parts`: each expert's linears, joined along the output if several)."""
    fields = [[_fields(p) for p in expert] for expert in parts]
    joined = [[torch.cat([f[i] for f in expert], dim=-1) for i in range(3)] for expert in fields]
    return PackedInt4(*(torch.stack([e[i] for e in joined]) for i in range(3)), fields[0][0][3])


def convert(model: nn.Module, dtype: torch.dtype) -> bool:
    """Give every packed linear and every experts layer of an AutoRound model the sync-free forward, where each
    kind of packed layer passes the probe; False (auto-round's forward kept, logged) where one does not."""
    # every name, so a linear the encoder shares with the decoder is replaced under both
    packed = [(name, m) for name, m in model.named_modules(remove_duplicate=False)
              if isinstance(getattr(m, "qweight", None), torch.Tensor)]
    ok = _convertible(model, [m for _, m in packed], dtype)
    note_once("auto-round forward", ok, "packed layers dequantized in torch, experts grouped: no host wait" if ok else
              "auto-round's own forward kept (a packed layer of another layout, or offloaded)")
    if not ok:
        return False
    in_experts = _stack_experts(model, dtype)
    linears: dict = {}
    for name, m in packed:
        if id(m) not in in_experts:
            parent, _, leaf = name.rpartition(".")
            if id(m) not in linears:
                linears[id(m)] = PackedLinear(PackedInt4(*_fields(m)))
                linears[id(m)].source.compute_dtype = dtype
            setattr(model.get_submodule(parent), leaf, linears[id(m)])
    configs = [model.config, *(m.config for m in model.modules() if isinstance(m, DenseExperts))]
    for config in {id(c): c for c in configs}.values():
        config._experts_implementation = "grouped_mm"
    return True


def _convertible(model, packed: list, dtype) -> bool:
    """Whether transformers has the grouped experts forward, the model sits on one device, and each kind of
    packed layer passes the probe."""
    try:
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
    except ImportError:
        return False
    if "grouped_mm" not in getattr(ALL_EXPERTS_FUNCTIONS, "_global_mapping", {}):
        return False
    if len({str(d) for d in (getattr(model, "hf_device_map", None) or {}).values()}) > 1:
        return False  # offloaded: accelerate's hooks bring each packed layer in
    kinds: dict = {}
    for m in packed:
        fields = _fields(m)
        kind = (type(m), None if fields is None else tuple(t.shape for t in fields[:3]))
        if kind not in kinds:
            kinds[kind] = fields is not None and _probe(m, fields, dtype)
    return bool(kinds) and all(kinds.values())


def _stack_experts(model, dtype) -> set[int]:
    """Each experts layer reads two stacks of its experts' packed weights; the ids of the linears stacked.
    Linears the encoder shares with the decoder give one stack, shared too."""
    stacks: dict = {}
    stacked: set = set()
    for module in list(model.modules()):  # each module once, listed before any is changed
        triples = _experts(module)
        if triples is None:
            continue
        stacked.update(id(p) for t in triples for p in t)
        weights = []
        for part in ([t[:2] for t in triples], [t[2:] for t in triples]):
            key = tuple(id(p) for t in part for p in t)
            if key not in stacks:
                stacks[key] = _stack(part)
                stacks[key].compute_dtype = dtype
            weights.append(stacks[key])
        for e in range(module.num_experts):
            del module._modules[str(e)]
        make_experts(module, *weights)
        module.is_transposed = True  # stacked [experts, in, out]
    return stacked
