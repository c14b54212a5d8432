"""Every change this pack makes to another library's behaviour, in one place.

- transformers: the loader gives each checkpoint key its own renaming rule and compiles a regex
  for it (71,494 keys in the real AutoRound checkpoint, about 20 CPU seconds), though a rule made
  for one exact key is never matched against anything. Its module gets a view of `re` whose
  `compile` compiles on first use: same patterns, same results, compiled only when used.
- diffusers: EntropyBoundScheduler computes the per-position entropy it accepts by (over the
  whole vocabulary) but does not return it; its module gets a view of torch whose
  `distributions.Categorical` keeps that entropy for the calling thread (`step_with_entropy`),
  so the trace does not pay for a second one. Every other caller sees the very same values.
- auto-round: while loading, its keep-in-full-precision patterns arrive as one alternation
  (`merged_tie_patterns`).
- transformers: its sdpa attention gets a row-by-row path for a batch whose rows hold different
  numbers of keys (`RowKeys`, `rows_attention`); every other call is sdpa's own.

Each applies only to the versions whose code it was checked against (it looks at the code, not
just the number), is logged once, and edits no installed file.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
import threading
import types

import torch

log = logging.getLogger("dgemma")
_logged: set[str] = set()


def _note(name: str, applied: bool, why: str) -> None:
    if name not in _logged:
        _logged.add(name)
        log.info("patch %s: %s (%s)", name, "applied" if applied else "not applied", why)


class LazyPattern:
    """A compiled regex that compiles on first use; behaves as the compiled pattern otherwise."""

    __slots__ = ("_args", "_compiled")

    def __init__(self, pattern, flags=0):
        self._args, self._compiled = (pattern, flags), None

    def __getattr__(self, name):
        if self._compiled is None:
            self._compiled = re.compile(*self._args)
        return getattr(self._compiled, name)


class _LazyRe(types.ModuleType):
    """`re`, except that compile() defers its work to the pattern's first use."""

    def __init__(self):
        super().__init__("re")

    @staticmethod
    def compile(pattern, flags=0):
        return LazyPattern(pattern, flags)

    def __getattr__(self, name):
        return getattr(re, name)


_install_lock = threading.Lock()


def lazy_key_patterns() -> bool:
    """Give transformers' core_model_loading the lazy `re`; False where its code is not the checked kind."""
    try:
        from transformers import core_model_loading as cml
    except ImportError:
        return False
    init = getattr(getattr(cml, "WeightTransform", None), "__init__", None)
    names = set(getattr(getattr(init, "__code__", None), "co_names", ()))
    fits = {"compile", "re"} <= names and "WeightRenaming" in vars(cml)
    with _install_lock:
        if fits and getattr(cml, "re", None) is re:
            cml.re = _LazyRe()
        applied = isinstance(getattr(cml, "re", None), _LazyRe)
    _note("transformers per-key regex", applied, "lazy compile" if applied else "loader code differs")
    return applied


_PATCH_LOCK = threading.Lock()  # the wrapped auto-round attribute is module-global
_MERGE_TESTED = ("0.16",)  # auto-round versions whose pattern use the merge was checked against
_PLAIN_NAME = re.compile(r"[\w.\-]+")


@contextlib.contextmanager
def for_load(quant: str):
    """Everything a load of this quant mode runs under."""
    lazy_key_patterns()
    with merged_tie_patterns(quant):
        yield


@contextlib.contextmanager
def merged_tie_patterns(quant: str):
    """While loading, hand auto-round its keep-in-full-precision patterns as one regex.

    auto-round searches every linear name (23,705 at the real geometry) with every such pattern
    (726: each kept tie's two ends) through `re.search(re.compile(p), name)`; past re's 512-entry
    cache every call recompiles, about 11 minutes of one core before any weight is read. One
    alternation of the plain-name patterns matches exactly the names one of them matches and
    compiles once. Applied only to the tested versions, by wrapping the module attribute for the
    length of our call; nothing installed is edited.
    """
    convert = _autoround_convert_module() if quant == "autoround" else None
    if quant == "autoround":
        _note("auto-round tie patterns", convert is not None,
              "merged into one regex" if convert is not None else "auto-round version or code differs")
    if convert is None:
        yield
        return
    original = convert.get_modules_to_not_convert

    def merged(*args, **kwargs):
        return merge_patterns(original(*args, **kwargs))

    with _PATCH_LOCK:
        convert.get_modules_to_not_convert = merged
        try:
            yield
        finally:
            convert.get_modules_to_not_convert = original


def merge_patterns(patterns) -> list[str]:
    """The plain-name patterns (letters, digits, `_.-`) as one alternation, any other pattern kept as is.

    re.search with `a|b` finds a match exactly when re.search with `a` or with `b` does.
    """
    patterns = sorted(set(patterns or ()))
    plain = [p for p in patterns if _PLAIN_NAME.fullmatch(p)]
    rest = [p for p in patterns if not _PLAIN_NAME.fullmatch(p)]
    return (["|".join(plain)] if plain else []) + rest


def _autoround_convert_module():
    """auto-round's convert_model module, if its pattern use is the one the merge was checked against."""
    try:
        import auto_round
        from auto_round.inference import convert_model
    except ImportError:
        return None
    names = _code_names(getattr(getattr(convert_model, "skip_not_convert_modules", None), "__code__", None))
    version = ".".join(str(getattr(auto_round, "__version__", "")).split(".")[:2])
    if version not in _MERGE_TESTED or not {"get_modules_to_not_convert", "search", "compile"} <= names:
        return None
    return convert_model if callable(getattr(convert_model, "get_modules_to_not_convert", None)) else None


def _code_names(code) -> set[str]:
    """Global and attribute names a function's code (and the code nested in it) uses."""
    if code is None:
        return set()
    nested = [c for c in code.co_consts if hasattr(c, "co_names")]
    return set(code.co_names).union(*(_code_names(c) for c in nested))


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
    with _install_lock:
        if getattr(module, "torch", None) is torch:
            module.torch = _TorchView()
        applied = isinstance(getattr(module, "torch", None), _TorchView)
    _note("diffusers scheduler entropy", applied, "kept from its step" if applied else "module has no torch")
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


class RowKeys:
    """The attention "mask" of a batch whose rows hold different numbers of keys: row r's first
    `pads[r]` keys are padding."""

    def __init__(self, pads):
        self.pads = tuple(int(p) for p in pads)


def _rows_alone(sdpa):
    def attention(module, query, key, value, attention_mask, **kwargs):
        if not isinstance(attention_mask, RowKeys):
            return sdpa(module, query, key, value, attention_mask, **kwargs)
        rows = [sdpa(module, query[r:r + 1], key[r:r + 1, :, p:], value[r:r + 1, :, p:], None, **kwargs)[0]
                for r, p in enumerate(attention_mask.pads)]
        return torch.cat(rows), None

    attention.rows_alone = True
    return attention


def rows_attention() -> bool:
    """Give transformers' sdpa attention a path for `RowKeys`: each row attends over its own keys alone,
    with a solo run's very arithmetic (a masked batch rounds differently, which moves tokens at half
    precision). False where the registry or sdpa's signature is not the kind this was checked against."""
    try:
        import inspect

        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    except ImportError:
        return False
    with _install_lock:
        sdpa = ALL_ATTENTION_FUNCTIONS["sdpa"] if "sdpa" in ALL_ATTENTION_FUNCTIONS else None
        if sdpa is not None and not getattr(sdpa, "rows_alone", False):
            names = list(inspect.signature(sdpa).parameters)[:5]
            if names == ["module", "query", "key", "value", "attention_mask"]:
                ALL_ATTENTION_FUNCTIONS["sdpa"] = _rows_alone(sdpa)
        applied = getattr(ALL_ATTENTION_FUNCTIONS["sdpa"] if "sdpa" in ALL_ATTENTION_FUNCTIONS else None,
                          "rows_alone", False)
    _note("transformers sdpa rows", applied, "a padded batch attends row by row" if applied else "sdpa differs")
    return applied
