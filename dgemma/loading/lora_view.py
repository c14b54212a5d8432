"""A model as adapters see it: low-rank deltas added to its forwards while an adapted payload runs.

The base model's weights are never copied or written. Each module an adapter targets gets, once, a hook
that reads the running payload's deltas from a context variable: a run sets the variable only for its
own thread and only while it runs, so a plain run (the variable unset) computes exactly the base's
arithmetic even while an adapted run of the same model goes on in another thread. Deltas are keyed by
stack (encoder or decoder) as well as module, because quantized and GGUF models share one module
between the two stacks while a PEFT adapter trains each stack's copy apart.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .weightquant import QuantizedExperts

_ACTIVE: ContextVar = ContextVar("dgemma_lora_view", default=None)  # the running payload's View
_STACK: ContextVar = ContextVar("dgemma_lora_stack", default="")    # "encoder", "decoder" or "" (the head)
_lock = threading.Lock()
_hooked: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()     # model -> ids of the modules it hooked
EXPERT_PARAMS = ("gate_up_proj", "down_proj")
# A fused experts' delta weight up to this size is kept between forwards (the demo's: 32 K); a real layer's
# (500 M weights) is made at each forward instead, so an adapter never holds a second copy of the experts.
KEEP_DELTA_ELEMENTS = 1 << 22


def stack_of(path: str) -> str:
    if path.startswith("model.encoder."):
        return "encoder"
    return "decoder" if path.startswith("model.decoder.") else ""


@dataclass(eq=False)
class Delta:
    """One adapter's factors on one weight, with its scale (alpha / r, times the strength)."""

    a: torch.Tensor        # (r, in) for a linear; (r * experts, in) for fused experts, as PEFT stores them
    b: torch.Tensor        # (out, r) or (out, r * experts)
    scale: float
    experts: int = 0       # fused experts: their count; 0 for a linear
    _cast: dict = field(default_factory=dict, repr=False)

    def factors(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The factors on `like`'s device and dtype, cast once per device and dtype."""
        key = (like.device, like.dtype)
        if key not in self._cast:
            self._cast[key] = (self.a.to(like.device, like.dtype), self.b.to(like.device, like.dtype))
        return self._cast[key]

    def weight(self, like: torch.Tensor) -> torch.Tensor:
        """The fused experts' delta weight (experts, out, in), PEFT's einsum for weights stored out by in."""
        key = ("weight", like.device, like.dtype)
        if key in self._cast:
            return self._cast[key]
        a, b = self.factors(like)
        e = self.experts
        delta = torch.einsum("ore,eri->eoi", b.reshape(b.shape[0], -1, e), a.reshape(e, -1, a.shape[-1])) * self.scale
        if delta.numel() <= KEEP_DELTA_ELEMENTS:
            self._cast[key] = delta
        return delta


@dataclass(frozen=True, eq=False)
class View:
    """Every delta of a payload's adapters: (stack, module id) -> deltas (linears) or param -> deltas."""

    linears: dict = field(default_factory=dict)
    experts: dict = field(default_factory=dict)


def _current(table: str, module):
    view = _ACTIVE.get()
    if view is None:
        return None
    return getattr(view, table).get((_STACK.get(), id(module)))


def _linear_hook(module, args, output):
    deltas = _current("linears", module)
    if not deltas:
        return None  # the base's output object itself: a plain run is the base bit for bit
    x = args[0]
    for delta in deltas:
        a, b = delta.factors(x)
        # PEFT's arithmetic (B(A(x)) * scale, then added), in place: the linear's output is this call's own
        output.add_(F.linear(F.linear(x, a), b).mul_(delta.scale))
    return output


def _stack_hook(name: str):
    def enter(module, args, kwargs=None):
        _STACK.set(name)

    def leave(module, args, output):
        _STACK.set("")

    return enter, leave


class LoraExperts:
    """Mixed into a fused experts class: its two weights read as base + the running payload's deltas.

    A property is found before nn.Module's parameter lookup, so every reader (transformers' experts
    functions, the batch's row-by-row experts) sees the adapted weight; with no payload running it returns
    the stored parameter itself. Quantized experts hold bytes there: their dequantized tensor gets the
    deltas through `lora_delta`, which weightquant's dense view calls.
    """

    def lora_delta(self, name: str, dense: torch.Tensor) -> torch.Tensor:
        per_param = _current("experts", self)
        for delta in (per_param or {}).get(name, ()):
            dense = dense + delta.weight(dense).to(dense.dtype)
        return dense


def _stored(module, name: str):
    for klass in type(module).__mro__[1:]:
        found = klass.__dict__.get(name)
        if isinstance(found, property):
            return found.__get__(module)
    return module._parameters[name]


def _adapted(name: str):
    def get(self):
        base = _stored(self, name)
        if isinstance(self, QuantizedExperts):
            return base  # bytes: the dense view adds the deltas after dequantizing
        return self.lora_delta(name, base) if _current("experts", self) else base

    return property(get)


_CLASSES: dict = {}


def _lora_class(cls):
    if cls not in _CLASSES:
        _CLASSES[cls] = type(f"Lora{cls.__name__}", (LoraExperts, cls), {n: _adapted(n) for n in EXPERT_PARAMS})
    return _CLASSES[cls]


def install(model, linears, experts) -> None:
    """Hook `linears` and the fused `experts` modules of `model`, each once for the model's life."""
    with _lock:
        done = _hooked.setdefault(model, set())
        if not done:
            for name in ("encoder", "decoder"):
                stack = getattr(model.model, name)
                enter, leave = _stack_hook(name)
                stack.register_forward_pre_hook(enter)
                stack.register_forward_hook(leave)
        for module in linears:
            if id(module) not in done:
                module.register_forward_hook(_linear_hook)
                done.add(id(module))
        for module in experts:
            if id(module) not in done:
                module.__class__ = _lora_class(type(module))
                done.add(id(module))


@contextlib.contextmanager
def applied(view: View | None):
    """While a payload computes: its deltas (None: none) in this thread's context, and no other's."""
    token = _ACTIVE.set(view)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def active() -> bool:
    return _ACTIVE.get() is not None
