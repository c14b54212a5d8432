"""Patches of other libraries: same results as the library's own code, applied to the checked code only."""

from __future__ import annotations

import re
import struct

import pytest

from diffusiongemma.dgemma.loading import patches, patches_autoround
from diffusiongemma.dgemma.loading.quant import shared_copy_bytes
from diffusiongemma.testing import realslice


@pytest.mark.parametrize("pattern, text", [(r"(?P<g0>model\.a\.weight(?!\w))", "model.a.weight_scale model.a.weight"),
                                           (r"^a|b$", "xb"), ("x.y", "xzy")])
def test_a_lazy_pattern_answers_as_the_compiled_one(pattern, text):
    lazy, real = patches.LazyPattern(pattern), re.compile(pattern)
    assert lazy._compiled is None  # nothing compiled until used
    assert lazy.search(text).span() == real.search(text).span()
    assert lazy.groupindex == real.groupindex and lazy.pattern == real.pattern
    assert lazy.sub("-", text) == real.sub("-", text)


def test_an_exact_key_renaming_is_built_as_the_general_constructor_builds_it():
    from transformers import core_model_loading as cml

    assert patches.plain_key_renamings()
    assert patches.plain_key_renamings()  # installed once, still reported
    keys = [("model.layers.0.weight", "model.layers.0.weight"), ("model.a-b.norm_", "model.c.norm"),
            ("model.layers.0.weight_scale", "model.x.7")]
    slots = {n for k in cml.WeightRenaming.__mro__ for n in getattr(k, "__slots__", ())}
    for source, target in keys:
        fast = cml.WeightRenaming(source, target)
        general = cml.WeightRenaming.__new__(cml.WeightRenaming)
        cml.WeightTransform.__init__(general, source, target)
        assert isinstance(fast.compiled_sources, patches.LazyPattern)
        assert {n: patches._field(fast, n) for n in slots} == {n: patches._field(general, n) for n in slots}
        for key in (source, source + "_scale", "x." + source, "other"):
            assert fast.rename_source_key(key) == general.rename_source_key(key)


def test_a_renaming_that_is_not_one_plain_key_to_another_takes_the_general_constructor():
    from transformers import core_model_loading as cml

    patches.plain_key_renamings()
    rule = cml.WeightRenaming(r"^model\.(.+)", r"base.\1")  # a pattern, not a key
    assert not isinstance(rule.compiled_sources, patches.LazyPattern)
    assert rule.rename_source_key("model.a.weight")[0] == "base.a.weight"
    group = cml.GroupWeightRename(["a.b", "a.c"], ["a.c", "a.d"])  # a subclass keeps its own constructor
    assert not isinstance(group.compiled_sources, patches.LazyPattern)


def test_searching_with_a_compiled_pattern_answers_as_re_does():
    view = patches_autoround._PatternSearchRe()
    pattern = re.compile(patches_autoround.merge_patterns(["a.b", "a.b.c", "q"])[0])
    for text in ("xa.bz", "q", "", "a.c", "azb"):
        got, want = view.search(pattern, text), re.search(pattern, text)
        assert (got and got.span()) == (want and want.span())
    assert view.search("a+", "caab").span() == (1, 3) and view.escape is re.escape


def test_identical_encoder_copies_are_budgeted_as_dropped(tmp_path):
    """The small twin is quantized by rounding alone: every encoder packed copy equals the decoder's."""
    from conftest import cache_base

    from diffusiongemma.dgemma.loading import preflight

    folder = realslice.int4_dir(realslice.SMALL, cache_base())
    headers = preflight.read_headers(folder)
    encoder = sum(i["data_offsets"][1] - i["data_offsets"][0] for h in headers.values() for n, i in h.items()
                  if n.startswith("model.encoder.language_model.layers.") and n.endswith(("qweight", "qzeros",
                                                                                          "scales")))
    assert shared_copy_bytes(headers) == encoder > 0
    # one differing sample is enough to budget every copy
    path, header = next((p, h) for p, h in headers.items() if any(n.endswith(".scales") for n in h))
    name = sorted(n for n in header if n.startswith("model.encoder.language_model.layers.")
                  and n.endswith(".scales"))[0]
    copy = tmp_path / path.name
    data = bytearray(path.read_bytes())
    (length,) = struct.unpack("<Q", data[:8])
    data[8 + length + header[name]["data_offsets"][0]] ^= 0xFF
    copy.write_bytes(bytes(data))
    assert shared_copy_bytes({(copy if p == path else p): h for p, h in headers.items()}) == 0


def test_the_collector_pauses_for_a_load_and_comes_back_as_it_was(tmp_path):
    import gc

    from diffusiongemma.dgemma import load_model

    assert gc.isenabled()
    with patches.paused_gc():
        assert not gc.isenabled()
        with patches.paused_gc():  # an overlapping load shares the pause
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()  # a host that runs without the collector keeps it off
    try:
        with patches.paused_gc():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
    with pytest.raises(ValueError, match="config.json"):  # a refused load gives it back too
        load_model(str(tmp_path))
    assert gc.isenabled()


def test_auto_round_schemes_answer_the_same_from_cached_fields():
    import dataclasses

    from auto_round import schemes

    plain = schemes.QuantizationScheme(bits=4, group_size=64)
    before = (plain.get_attributes(), list(plain.items()), plain["group_size"], plain.get("act_bits", "none"))
    with patches_autoround.cached_scheme_fields("autoround"):
        assert schemes.fields is not dataclasses.fields  # the tested auto-round is patched
        assert schemes.fields(plain) is schemes.fields(schemes.QuantizationScheme)  # one tuple per class
        during = (plain.get_attributes(), list(plain.items()), plain["group_size"], plain.get("act_bits", "none"))
    assert during == before
    assert schemes.fields is dataclasses.fields
    with patches_autoround.cached_scheme_fields("none"):  # a plain load leaves auto-round alone
        assert schemes.fields is dataclasses.fields


def test_a_load_gives_auto_round_its_own_attributes_back():
    from auto_round.inference import convert_model

    before = (convert_model.re, convert_model.get_modules_to_not_convert)
    with patches.for_load("autoround"):
        assert isinstance(convert_model.re, patches_autoround._PatternSearchRe)
        assert convert_model.get_modules_to_not_convert is not before[1]
    assert (convert_model.re, convert_model.get_modules_to_not_convert) == before
    with pytest.raises(RuntimeError), patches.for_load("autoround"):  # also when the load fails
        raise RuntimeError
    assert (convert_model.re, convert_model.get_modules_to_not_convert) == before


def test_packed_layers_of_one_kind_are_copies_with_their_own_containers():
    import torch
    from auto_round.inference import convert_model

    build = convert_model._create_quant_layer
    config = {"bits": 4, "group_size": 64, "sym": True, "data_type": "int", "act_bits": 16}
    with torch.device("meta"):
        linear = torch.nn.Linear(128, 64, bias=False)
    args = (linear, "auto_round:torch_zp", config, 128, 64, "auto_round:auto_gptq")
    with patches_autoround.copied_quant_layers("autoround"), torch.device("meta"):
        assert convert_model._create_quant_layer is not build  # applied to the installed auto-round
        a, b, c = (convert_model._create_quant_layer(*args) for _ in range(3))
    assert convert_model._create_quant_layer is build
    with torch.device("meta"):
        fresh = build(*args)
    for layer in (b, c):
        assert layer is not a and layer._buffers is not a._buffers and layer._forward_hooks is not a._forward_hooks
        assert patches_autoround._alike(layer, fresh)
    b.qweight = torch.ones(2, 64, dtype=torch.int32)  # the load replaces a copy's tensors, never another's
    assert a.qweight.device.type == "meta" and c.qweight.device.type == "meta"


def _pack_imports(root, path) -> set[str]:
    """The dgemma modules (dotted below dgemma/, like `loading.patches`) a dgemma module imports, at its top
    or inside a function."""
    import ast

    package = list(path.relative_to(root).parent.parts)
    modules = {".".join(q.relative_to(root).with_suffix("").parts) for q in root.rglob("*.py")}
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level:
            base = package[:len(package) - node.level + 1] + (node.module.split(".") if node.module else [])
            for alias in node.names:
                name = ".".join(base + [alias.name])
                out.add(name if name in modules else ".".join(base))
    return out


def test_every_patch_goes_through_one_module_and_no_patch_module_imports_its_importer():
    from pathlib import Path

    root = Path(patches.__file__).parents[1]
    graph = {".".join(p.relative_to(root).with_suffix("").parts): _pack_imports(root, p) for p in root.rglob("*.py")}
    reach = {}

    def reached(name, seen=()):
        if name not in reach:
            reach[name] = set()
            for dep in graph.get(name, ()):
                reach[name] |= {dep} | reached(dep)
        return reach[name]

    mine = ("loading.patching", "loading.patches", "loading.patches_autoround", "loading.load")
    for name in mine:
        assert name not in reached(name), f"{name} imports itself through {reached(name) & set(graph)}"
    assert graph["loading.patching"] == set()  # the mechanism depends on nothing in the pack
    assert {"loading.patching"} <= graph["loading.patches_autoround"]
    assert "loading.patches" not in graph["loading.patches_autoround"]
    for name in mine[1:]:  # patching's lock and swap only
        text = (root / f"{name.replace('.', '/')}.py").read_text(encoding="utf-8")
        assert "setattr(" not in text and "_PATCH_LOCK" not in text and "_swapped" not in text


def test_a_swap_restores_its_attributes_also_when_the_block_fails():
    import types

    from diffusiongemma.dgemma.loading import patching

    target = types.SimpleNamespace(a=1, b=2)
    with patching.swap(target, a=10):
        with patching.swap(target, a=20, b=30):  # a load's nested swaps share the one lock
            assert (target.a, target.b) == (20, 30)
        assert (target.a, target.b) == (10, 2)
    assert (target.a, target.b) == (1, 2)
    with pytest.raises(KeyError), patching.swap(target, b=5):
        raise KeyError
    assert target.b == 2
    with pytest.raises(AttributeError), patching.swap(target, missing=1):  # nothing to restore: refused
        pass
    assert not hasattr(target, "missing")
