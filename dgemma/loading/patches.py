"""Every change this pack makes to another library's behaviour: the list, and all but auto-round's.

- transformers: the loader gives each checkpoint key its own renaming rule (71,494 keys in the
  real AutoRound checkpoint), and the general rule's constructor runs several regexes per key and
  compiles one, though a rule made for one exact key is never matched against anything. A rule
  from one plain key to another is built directly, with the same fields and its regex compiled on
  first use (checked against the general constructor when installed).
- diffusers: EntropyBoundScheduler computes the per-position entropy it accepts by (over the
  whole vocabulary) but does not return it; its module gets a view of torch whose
  `distributions.Categorical` keeps that entropy for the calling thread (`step_with_entropy`),
  so the trace does not pay for a second one. Every other caller sees the very same values.
- auto-round (dgemma/loading/patches_autoround.py): while loading, its keep-in-full-precision patterns
  arrive as one alternation (`merged_tie_patterns`), searched as the compiled pattern it is, its
  quantization schemes list their dataclass fields from a cache (`cached_scheme_fields`), and its
  packed layers of one kind and shape are copies of the first one built (`copied_quant_layers`).
- transformers: while a load with a cancel check runs, each tensor it places first asks the check
  (`set_param_for_module`, `loading.cancel_checks`).
- Python: the cyclic garbage collector pauses while a load builds its model (`paused_gc`).
- transformers: its sdpa attention gets a row-by-row path for a batch whose rows hold different
  numbers of keys (`RowKeys`, `rows_attention`, kept beside the batch they serve in dgemma/denoising/batch.py);
  every other call is sdpa's own.
- transformers: a loaded model's decoder experts (the module instances, not their class), on every device,
  group each row of a batched forward's tokens alone while dgemma/denoising/batch.py runs one (`experts_by_row`
  in dgemma/denoising/batch_experts.py); every other call is the experts' own.

Each applies only to the versions whose code it was checked against (it looks at the code, not
just the number), is logged once, and edits no installed file: all through dgemma/loading/patching.py.
"""

from __future__ import annotations

import contextlib
import gc
import re
import sys
import threading
import types
from collections import defaultdict

import torch

from .patches_autoround import for_autoround_load
from .patching import LOCK, note_once


class LazyPattern:
    """A compiled regex that compiles on first use; behaves as the compiled pattern otherwise."""

    __slots__ = ("_args", "_compiled")

    def __init__(self, pattern, flags=0):
        self._args, self._compiled = (pattern, flags), None

    def __getattr__(self, name):
        if self._compiled is None:
            self._compiled = re.compile(*self._args)
        return getattr(self._compiled, name)


_PLAIN_KEY = re.compile(r"[\w.\-]+", re.ASCII)  # a key with no regex syntax but the dot
_ALNUM_END = re.compile(r"[a-zA-Z0-9]$")
_PROBES = (("model.layers.0.mlp.down_proj.weight", "model.layers.0.mlp.down_proj.weight"),
           ("model.encoder.language_model.layers.1.experts.7.up_proj.qzeros", "lm-head.9"),
           ("a.b_", "a.c"))


def _plain(key) -> bool:
    return isinstance(key, str) and _PLAIN_KEY.fullmatch(key) is not None


def _key_ends(cls, general) -> dict[bool, str]:
    """What `general` puts after a plain key in its regex, for a key ending in a letter or digit or not
    (newer transformers add a name boundary)."""
    ends = {}
    for key in ("a.b", "a.b_"):
        probe = cls.__new__(cls)
        general(probe, key, key)
        ends[key[-1].isalnum()] = probe.compiled_sources.pattern.removeprefix(f"(?P<g0>{key}").removesuffix(")")
    return ends


def _plain_init(cls, general, ends: dict[bool, str]):
    """WeightRenaming's constructor: for one plain key to another, the fields `general` would set, regex deferred."""

    def __init__(self, source_patterns, target_patterns):
        if type(self) is not cls or not (_plain(source_patterns) and _plain(target_patterns)):
            return general(self, source_patterns, target_patterns)
        boundary = ends[_ALNUM_END.search(source_patterns) is not None]
        fields = dict(source_patterns=[source_patterns], target_patterns=[target_patterns],
                      _original_source_patterns=[source_patterns], _original_target_patterns=[target_patterns],
                      distributed_operation=None, quantization_operation=None, collected_tensors=defaultdict(list),
                      layer_targets=defaultdict(set), _was_used=False, scope_prefix=None, base_model_prefix=None,
                      compiled_sources=LazyPattern(f"(?P<g0>{source_patterns}{boundary})"))
        for name, value in fields.items():
            object.__setattr__(self, name, value)

    __init__.dgemma_plain = True
    return __init__


def _field(obj, name):
    value = getattr(obj, name, None)
    if hasattr(value, "groupindex"):
        return value.pattern, value.flags
    return type(value), getattr(value, "default_factory", None), value


def _builds_alike(cls, general, init) -> bool:
    """Whether `init` leaves every slot as `general` does, on the probe keys."""
    slots = {n for k in cls.__mro__ for n in getattr(k, "__slots__", ())}
    for source, target in _PROBES:
        a, b = cls.__new__(cls), cls.__new__(cls)
        try:
            general(a, source, target)
            init(b, source, target)
        except Exception:  # noqa: BLE001 - any surprise means the constructor is not the checked kind
            return False
        if not slots or any(_field(a, n) != _field(b, n) for n in slots):
            return False
    return True


def plain_key_renamings() -> bool:
    """Build transformers' exact-key renaming rules directly; False where its constructor is not the checked kind."""
    try:
        from transformers import core_model_loading as cml
    except ImportError:
        return False
    cls, base = getattr(cml, "WeightRenaming", None), getattr(cml, "WeightTransform", None)
    applied = _plain_installed(cls)
    if not applied:  # installed once; a load after that takes no lock
        with LOCK:
            applied = _plain_installed(cls) or _install_plain(cls, base)
    note_once("transformers per-key renaming", applied,
              "exact keys built directly" if applied else "loader code differs")
    return applied


def _plain_installed(cls) -> bool:
    return getattr(vars(cls).get("__init__") if cls else None, "dgemma_plain", False)


def _install_plain(cls, base) -> bool:
    """Give `cls` the plain-key constructor where it builds every slot as the general one does."""
    if base is None or "__init__" in vars(cls):
        return False
    try:
        init = _plain_init(cls, base.__init__, _key_ends(cls, base.__init__))
    except Exception:  # noqa: BLE001 - any surprise means the constructor is not the checked kind
        return False
    if not _builds_alike(cls, base.__init__, init):
        return False
    cls.__init__ = init
    return True


@contextlib.contextmanager
def for_load(quant: str):
    """Everything a load of this quant mode runs under."""
    plain_key_renamings()
    with for_autoround_load(quant):
        yield


_gc_lock = threading.Lock()  # guards the count of overlapping loads (no library attribute), held for no load
_gc_state = {"pausers": 0, "was_enabled": False}


@contextlib.contextmanager
def paused_gc():
    """Python's cyclic garbage collector off while a load reads headers, builds and fills its model.

    Every collection of the oldest generation walks every live object, and building the AutoRound
    model makes hundreds of thousands (modules, buffers, renaming rules), so the collections it
    triggers cost about a third of the CPU time before the first weight at the published layout.
    Reference counting still frees everything not in a cycle. Overlapping loads share one pause;
    the collector's previous state comes back when the last one ends.
    """
    with _gc_lock:
        if _gc_state["pausers"] == 0:
            _gc_state["was_enabled"] = gc.isenabled()
            gc.disable()
        _gc_state["pausers"] += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_state["pausers"] -= 1
            if _gc_state["pausers"] == 0 and _gc_state["was_enabled"]:
                gc.enable()


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


def _installed(scheduler) -> bool:
    """Give the scheduler's module the torch view once; False where its step has no Categorical to watch."""
    module = sys.modules.get(type(scheduler).step.__module__)
    step_names = getattr(type(scheduler).step, "__code__", None)
    if module is None or step_names is None or "Categorical" not in step_names.co_names:
        return False
    applied = isinstance(getattr(module, "torch", None), _TorchView)
    if not applied:  # installed once; a step after that takes no lock
        with LOCK:
            if getattr(module, "torch", None) is torch:
                module.torch = _TorchView()
            applied = isinstance(getattr(module, "torch", None), _TorchView)
    note_once("diffusers scheduler entropy", applied, "kept from its step" if applied else "module has no torch")
    return applied


def step_with_entropy(scheduler, logits, step: int, canvas, generator):
    """(scheduler output, (B, L) float entropy of logits / T that it committed by)."""
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

