"""The real geometry without weights: the AutoRound layout, the work before weights, the device plan.

Everything here runs on the meta device at the released model's full shape (30 layers, 128
experts, 262,144 tokens), so it costs seconds and no memory, and is counted against the published
Intel/diffusiongemma-26B-A4B-it-int4-AutoRound index.
"""

from __future__ import annotations

import logging
import re
import time

import auto_round  # noqa: F401
import pytest

from diffusiongemma.dgemma import preflight
from diffusiongemma.dgemma.quant import merge_patterns, model_class, packed_names
from diffusiongemma.testing import realscale as rs

GB, GIB = 10**9, 1024**3


@pytest.fixture(scope="module")
def prepared():
    """(the AutoRound model at full geometry as from_pretrained has it before weights, CPU seconds)."""
    logging.getLogger("auto_round").setLevel(logging.ERROR)
    rs.prepare_autoround(1)  # imports and backend selection, paid once by any load
    start = time.process_time()
    model = rs.prepare_autoround()
    return model, time.process_time() - start


@pytest.fixture(scope="module")
def layout():
    return rs.autoround_layout(rs.meta_model(rs.real_config()))


def test_layout_is_the_published_checkpoint(layout):
    packed = {k.rsplit(".", 1)[0] for k in layout if k.endswith(".qweight")}
    assert (len(packed), len(layout), rs.layout_bytes(layout)) == (
        rs.REAL_PACKED_MODULES, rs.REAL_TENSORS, rs.REAL_TOTAL_SIZE)
    assert {d for d, _ in layout.values()} == {"I32", "F16", "BF16"}
    assert "model.decoder.layers.29.experts.127.down_proj.qweight" in layout
    assert "lm_head.weight" not in layout


def test_prepared_model_expects_exactly_the_published_tensors(prepared, layout):
    model, _ = prepared
    assert len(packed_names(model)) == rs.REAL_PACKED_MODULES
    expected = set(model.state_dict()) - {"lm_head.weight"}  # tied to the decoder embedding, not stored
    assert expected == set(layout)
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items() if k in layout}
    assert shapes == {k: s for k, (_, s) in layout.items()}


def test_work_before_weights_takes_seconds(prepared):
    _, seconds = prepared
    assert seconds < 60, f"{seconds:.1f} CPU seconds before any weight is read"


def test_merged_patterns_match_what_each_pattern_matches():
    from transformers.quantizers.base import get_keys_to_not_convert

    config = rs.real_config()
    config.quantization_config = rs.quantization_config()
    patterns = get_keys_to_not_convert(rs.meta_model(config, model_class("autoround")))
    assert len(patterns) > 512  # past re's cache: the reason for the merge
    merged = merge_patterns(patterns)
    assert len(merged) == 1
    names = sorted({k.rsplit(".", 1)[0] for k in rs.autoround_layout(rs.meta_model(rs.real_config()))
                    if k.endswith((".qweight", "router.proj.weight"))})
    names = [n.removesuffix(".weight") for n in names]
    compiled = [re.compile(p) for p in patterns]
    each = [n for n in names if any(c.search(n) for c in compiled)]
    one = re.compile(merged[0])
    assert [n for n in names if one.search(n)] == each
    assert len(each) == 2 * rs.REAL_LAYERS  # the routers: kept ties, full precision


def test_the_merge_applies_to_the_installed_auto_round():
    """A version or code change in auto-round turns the merge off; the pack then needs a fresh check."""
    from diffusiongemma.dgemma import quant

    assert quant._autoround_convert_module() is not None


def test_merge_keeps_patterns_that_are_not_plain_names():
    assert merge_patterns(["b.c", "a", "x(?=y)", "a"]) == ["a|b.c", "x(?=y)"]
    assert merge_patterns([]) == []


BF16 = sum(2 * p.numel() for p in rs.meta_model(rs.real_config()).parameters())
INT4 = rs.REAL_TOTAL_SIZE
RAM = 64 * GB
# free VRAM -> where the whole real model goes: bf16 and AutoRound INT4, device auto
TABLE = {
    16: ("split", "refused"),
    24: ("split", "refused"),
    34: ("split", "gpu"),
    48: ("split", "gpu"),
    80: ("gpu", "gpu"),
}


def where(weight_bytes, vram_gb, quant, device="auto"):
    try:
        p = preflight.plan(weight_bytes, device, ram=RAM, vram=vram_gb * GB, quant=quant)
    except ValueError as exc:
        return "refused", str(exc)
    return ("gpu" if p.device_map == {"": 0} else "split" if p.device_map == "auto" else p.device), p


@pytest.mark.parametrize("vram", sorted(TABLE))
def test_device_plan_at_full_geometry(vram):
    bf16, int4 = TABLE[vram]
    assert where(BF16, vram, "none")[0] == bf16
    got, detail = where(INT4, vram, "autoround")
    assert got == int4
    if got == "refused":  # never a GPU/CPU split for AutoRound: say what to do instead
        assert "cannot be split between GPU and CPU" in detail and "choose device cpu" in detail
    assert where(INT4, vram, "autoround", "cpu")[0] == "cpu"
    if bf16 == "split":
        plan = where(BF16, vram, "none")[1]
        assert plan.max_memory == {0: int(vram * GB * preflight.HEADROOM), "cpu": int(RAM * preflight.HEADROOM)}
