"""auto-round's load path, faster: its tie patterns, its schemes' fields and its packed layers.

Each applies to the auto-round versions whose code it was checked against (it looks at the code,
not just the number), for the length of one load, is logged once, and edits no installed file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import re
import types

import torch

from .patching import note_once, swap

_MERGE_TESTED = ("0.16",)  # auto-round versions whose pattern use the merge was checked against
_PLAIN_NAME = re.compile(r"[\w.\-]+")


class _PatternSearchRe(types.ModuleType):
    """`re`, except that search() with a compiled pattern asks the pattern directly.

    re.search(compiled, text) first looks the pattern up in re's cache, which hashes its whole
    compiled code on every call: for the merged tie pattern that is most of the cost. The answer
    is the same, since re never caches compiled patterns and returns them as they are.
    """

    def __init__(self):
        super().__init__("re")

    @staticmethod
    def search(pattern, string, flags=0):
        if isinstance(pattern, re.Pattern) and not flags:
            return pattern.search(string)
        return re.search(pattern, string, flags)

    def __getattr__(self, name):
        return getattr(re, name)


@contextlib.contextmanager
def merged_tie_patterns(quant: str):
    """While loading, hand auto-round its keep-in-full-precision patterns as one regex.

    auto-round searches every linear name (23,705 at the real geometry) with every such pattern
    (726: each kept tie's two ends) through `re.search(re.compile(p), name)`; past re's 512-entry
    cache every call recompiles, about 11 minutes of one core before any weight is read. One
    alternation of the plain-name patterns matches exactly the names one of them matches and
    compiles once, and the module's `re` searches with it directly (`_PatternSearchRe`). Applied
    only to the tested versions, by wrapping the module attributes for the length of our call;
    nothing installed is edited.
    """
    convert = _tested(quant, "auto-round tie patterns", "merged into one regex", _autoround_convert_module)
    if convert is None:
        yield
        return
    original = convert.get_modules_to_not_convert

    def merged(*args, **kwargs):
        return merge_patterns(original(*args, **kwargs))

    with swap(convert, get_modules_to_not_convert=merged, re=_PatternSearchRe()):
        yield


def merge_patterns(patterns) -> list[str]:
    """The plain-name patterns (letters, digits, `_.-`) as one alternation, any other pattern kept as is.

    re.search with `a|b` finds a match exactly when re.search with `a` or with `b` does. The
    alternation shares common leading segments (`x.(?:a|b)` for `x.a|x.b`, the same strings), so a
    search rejects a position after a character or two instead of trying all 726 names there.
    """
    patterns = sorted(set(patterns or ()))
    plain = [p for p in patterns if _PLAIN_NAME.fullmatch(p)]
    rest = [p for p in patterns if not _PLAIN_NAME.fullmatch(p)]
    trie: dict = {}
    for p in plain:
        node = trie
        for segment in p.split("."):
            node = node.setdefault(segment, {})
        node[None] = {}  # a pattern ends here
    return ([_alternation(trie)] if plain else []) + rest


def _alternation(node: dict) -> str:
    """Regex for every dot-joined path below `node` (segments keep their regex meaning, as the dots do)."""
    branches = []
    for segment in sorted(k for k in node if k is not None):
        child = node[segment]
        more = {k: v for k, v in child.items() if k is not None}
        if not more:
            branches.append(segment)
            continue
        tail = _alternation(more)
        tail = f"(?:{tail})" if "|" in tail else tail
        branches.append(f"{segment}(?:.{tail})?" if None in child else f"{segment}.{tail}")
    return "|".join(branches)


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


@contextlib.contextmanager
def cached_scheme_fields(quant: str):
    """While loading, auto-round's quantization schemes list their dataclass fields once per class.

    Every `scheme["bits"]` asks `dataclasses.fields` anew (187,807 times at the published layout);
    a class's fields do not change, so its module gets the same tuple from a cache for the length of
    our call. Applied only to the tested versions.
    """
    schemes = _tested(quant, "auto-round scheme fields", "cached per class", _autoround_schemes_module)
    if schemes is None:
        yield
        return
    known: dict[type, tuple] = {}

    def cached(class_or_instance):
        cls = class_or_instance if isinstance(class_or_instance, type) else type(class_or_instance)
        if cls not in known:
            known[cls] = dataclasses.fields(cls)
        return known[cls]

    with swap(schemes, fields=cached):
        yield


def _autoround_schemes_module():
    """auto-round's schemes module, if its schemes look their fields up as the cache was checked against."""
    if _autoround_convert_module() is None:  # not a tested auto-round
        return None
    from auto_round import schemes

    scheme = getattr(schemes, "QuantizationScheme", None)
    names = _code_names(getattr(getattr(scheme, "get_attributes", None), "__code__", None))
    return schemes if "fields" in names and getattr(schemes, "fields", None) is dataclasses.fields else None


def _tested(quant: str, patch: str, done: str, find):
    """What `patch` changes in auto-round for this load (`find()`; None: not an auto-round load, or code
    other than the one it was checked against), logged once either way."""
    if quant != "autoround":
        return None
    found = find()
    note_once(patch, found is not None, done if found is not None else "auto-round version or code differs")
    return found


def _code_names(code) -> set[str]:
    """Global and attribute names a function's code (and the code nested in it) uses."""
    if code is None:
        return set()
    nested = [c for c in code.co_consts if hasattr(c, "co_names")]
    return set(code.co_names).union(*(_code_names(c) for c in nested))


@contextlib.contextmanager
def for_autoround_load(quant: str):
    """Every auto-round patch, for one load of this quant mode."""
    with merged_tie_patterns(quant), cached_scheme_fields(quant), copied_quant_layers(quant):
        yield


@contextlib.contextmanager
def copied_quant_layers(quant: str):
    """While loading, auto-round's packed layers of one kind and shape are copies of the first one built.

    At the published layout auto-round builds 23,450 packed layers under transformers' meta device,
    where every tensor call of their constructor goes through Python: about 1.8 s of one core before
    the first weight. Layers of one kind differ only in the tensors the load then puts in them, so
    the rest are copies of the first, each with its own containers (buffers, hooks) holding the same
    empty meta tensors. A kind is copied only where its copy equals a second layer built afresh.
    """
    build = _tested(quant, "auto-round packed layers", "copied per kind", _autoround_layer_builder)
    if build is None:
        yield
        return
    firsts: dict = {}

    def copied(layer, backend, config, in_features, out_features, packing_format=None):
        weight = getattr(layer, "weight", None)
        kind = (backend, tuple(sorted((k, repr(v)) for k, v in config.items())), in_features, out_features,
                packing_format, getattr(layer, "bias", None) is not None, getattr(weight, "dtype", None),
                getattr(weight, "device", None))
        if kind not in firsts:
            first = build(layer, backend, config, in_features, out_features, packing_format)
            fresh = build(layer, backend, config, in_features, out_features, packing_format)
            firsts[kind] = first if _all_meta(first) and _alike(_copy(first), fresh) else None
            return first
        if firsts[kind] is None:
            return build(layer, backend, config, in_features, out_features, packing_format)
        return _copy(firsts[kind])

    with swap(_autoround_convert_module(), _create_quant_layer=copied):
        yield


_BUILD_ARGS = ("layer", "layer_backend", "config", "in_features", "out_features", "packing_format")


def _autoround_layer_builder():
    """auto-round's packed-layer constructor, if its signature is the one the copies were checked against."""
    build = getattr(_autoround_convert_module(), "_create_quant_layer", None)
    return build if build is not None and list(inspect.signature(build).parameters) == list(_BUILD_ARGS) else None


def _copy(module):
    new = type(module).__new__(type(module))
    new.__dict__.update({k: v.copy() if isinstance(v, (dict, set)) else v for k, v in module.__dict__.items()})
    return new


def _all_meta(module) -> bool:
    tensors = [v for v in module.__dict__.values() if isinstance(v, torch.Tensor)]
    tensors += [v for v in module._buffers.values() if v is not None] + list(module._parameters.values())
    return not module._modules and all(t is None or t.device.type == "meta" for t in tensors)


def _alike(a, b) -> bool:
    """Same class, attributes and containers, and tensors of the same kind (meta tensors hold no values)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape
                and a.dtype == b.dtype and a.device == b.device)
    if isinstance(a, dict) and isinstance(b, dict):
        return type(a) is type(b) and a.keys() == b.keys() and all(_alike(a[k], b[k]) for k in a)
    if isinstance(a, torch.nn.Module):
        return type(a) is type(b) and _alike(a.__dict__, b.__dict__)
    return type(a) is type(b) and a == b
