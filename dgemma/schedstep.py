"""One EntropyBoundScheduler step, with the per-position entropy the scheduler accepted by.

The scheduler computes that entropy (of logits / T, over the whole vocabulary) to choose what to
accept, but does not return it; computing it again would make the per-step capture cost grow
with the vocabulary (262,144 at the real model). The scheduler's module is given a view of torch
whose `distributions.Categorical` keeps the entropy it computes for the calling thread, and
returns the very same values, so every other caller of the scheduler sees no difference.
"""

from __future__ import annotations

import threading
import types

import torch

_kept = threading.local()


class _KeptCategorical(torch.distributions.Categorical):
    """Categorical whose entropy() is also kept for the thread that asked for it."""

    def entropy(self):
        value = super().entropy()
        if getattr(_kept, "listening", False):
            _kept.value = value
        return value


class _TorchView(types.ModuleType):
    """torch, except that `distributions.Categorical` keeps its entropy."""

    def __init__(self):
        super().__init__("torch")
        self.distributions = types.SimpleNamespace(**vars(torch.distributions))
        self.distributions.Categorical = _KeptCategorical

    def __getattr__(self, name):
        return getattr(torch, name)


_install_lock = threading.Lock()


def _installed(scheduler) -> bool:
    """Give the scheduler's module the torch view once; False where its step has no Categorical to watch."""
    import sys

    module = sys.modules.get(type(scheduler).step.__module__)
    step_names = getattr(type(scheduler).step, "__code__", None)
    if module is None or step_names is None or "Categorical" not in step_names.co_names:
        return False
    with _install_lock:
        if getattr(module, "torch", None) is torch:
            module.torch = _TorchView()
    return isinstance(getattr(module, "torch", None), _TorchView)


def step_with_entropy(scheduler, logits, step: int, canvas, generator):
    """(scheduler output, (B, L) float entropy of logits / T that it accepted by)."""
    if not _installed(scheduler):
        out = scheduler.step(logits, step, canvas, generator=generator)
        return out, torch.distributions.Categorical(logits=out.pred_logits.float()).entropy()
    _kept.listening, _kept.value = True, None
    try:
        out = scheduler.step(logits, step, canvas, generator=generator)
        entropy = _kept.value
    finally:
        _kept.listening, _kept.value = False, None
    if entropy is None or entropy.shape != canvas.shape:  # not the acceptance entropy: measure it ourselves
        entropy = torch.distributions.Categorical(logits=out.pred_logits.float()).entropy()
    return out, entropy
