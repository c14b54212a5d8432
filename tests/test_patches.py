"""Patches of other libraries: same results as the library's own code, applied to the checked code only."""

from __future__ import annotations

import re
import struct

import pytest

from diffusiongemma.dgemma import patches
from diffusiongemma.dgemma.quant import shared_copy_bytes
from diffusiongemma.testing import realslice


@pytest.mark.parametrize("pattern, text", [(r"(?P<g0>model\.a\.weight(?!\w))", "model.a.weight_scale model.a.weight"),
                                           (r"^a|b$", "xb"), ("x.y", "xzy")])
def test_a_lazy_pattern_answers_as_the_compiled_one(pattern, text):
    lazy, real = patches.LazyPattern(pattern), re.compile(pattern)
    assert lazy._compiled is None  # nothing compiled until used
    assert lazy.search(text).span() == real.search(text).span()
    assert lazy.groupindex == real.groupindex and lazy.pattern == real.pattern
    assert lazy.sub("-", text) == real.sub("-", text)


def test_the_per_key_regex_patch_applies_to_the_installed_transformers():
    from transformers import core_model_loading as cml

    assert patches.lazy_key_patterns()
    renaming = cml.WeightRenaming("model.layers.0.weight", "model.layers.0.weight")
    assert isinstance(renaming.compiled_sources, patches.LazyPattern)
    assert renaming.rename_source_key("model.layers.0.weight")[0] == "model.layers.0.weight"
    assert cml.re.escape is re.escape  # everything else is re itself


def test_identical_encoder_copies_are_budgeted_as_dropped(tmp_path):
    """The small twin is quantized by rounding alone: every encoder packed copy equals the decoder's."""
    from conftest import cache_base

    from diffusiongemma.dgemma import preflight

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
