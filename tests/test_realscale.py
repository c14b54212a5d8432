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

from diffusiongemma.dgemma.loading import deviceplan
from diffusiongemma.dgemma.loading.patches_autoround import merge_patterns
from diffusiongemma.dgemma.loading.quant import model_class
from diffusiongemma.testing import realscale as rs
from diffusiongemma.testing.realscale import packed_names

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
    from diffusiongemma.dgemma.loading import patches_autoround

    assert patches_autoround._autoround_convert_module() is not None


def test_merge_keeps_patterns_that_are_not_plain_names():
    assert merge_patterns(["b.c", "a", "x(?=y)", "a"]) == ["a|b.c", "x(?=y)"]
    assert merge_patterns([]) == []


BF16 = sum(2 * p.numel() for p in rs.meta_model(rs.real_config()).parameters())
INT4 = rs.REAL_TOTAL_SIZE
TEXT = rs.real_config().get_text_config(decoder=True)
CARDS, RAMS = (12, 16, 24, 32, 48, 80, 141), (32, 64, 128)
# card GiB -> where the whole real model goes with device auto (bf16, AutoRound INT4), per RAM size
TABLE = {
    12: {32: ("refused", "refused"), 64: ("split", "refused"), 128: ("split", "refused")},
    16: {32: ("refused", "refused"), 64: ("split", "refused"), 128: ("split", "refused")},
    24: {32: ("refused", "refused"), 64: ("split", "refused"), 128: ("split", "refused")},
    32: {32: ("split", "gpu"), 64: ("split", "gpu"), 128: ("split", "gpu")},
    48: {32: ("split", "gpu"), 64: ("split", "gpu"), 128: ("split", "gpu")},
    80: {32: ("gpu", "gpu"), 64: ("gpu", "gpu"), 128: ("gpu", "gpu")},
    141: {32: ("gpu", "gpu"), 64: ("gpu", "gpu"), 128: ("gpu", "gpu")},
}
# card GiB -> what quant auto picks for the bf16 checkpoint, per RAM size: (mode, where)
AUTO = {
    12: {32: ("4bit", "cpu"), 64: ("none", "split"), 128: ("none", "split")},
    16: {32: ("4bit", "cpu"), 64: ("none", "split"), 128: ("none", "split")},
    24: {32: ("4bit", "gpu"), 64: ("4bit", "gpu"), 128: ("4bit", "gpu")},
    32: {32: ("8bit", "gpu"), 64: ("8bit", "gpu"), 128: ("8bit", "gpu")},
    48: {32: ("8bit", "gpu"), 64: ("8bit", "gpu"), 128: ("8bit", "gpu")},
    80: {32: ("none", "gpu"), 64: ("none", "gpu"), 128: ("none", "gpu")},
    141: {32: ("none", "gpu"), 64: ("none", "gpu"), 128: ("none", "gpu")},
}


def machine(card: int, ram: int) -> dict:
    """Free memory on a machine: the desktop holds 0.4 GiB of the card, the OS 3 GiB of RAM."""
    return dict(vram=int((card - 0.4) * GIB), total_vram=card * GIB, ram=(ram - 3) * GIB)


def all_needs(stored: str = "none") -> dict:
    """Every mode's Need at the real geometry, as the loader works them out for the bf16 (or INT4) checkpoint."""
    from diffusiongemma.dgemma.loading.load import mode_needs

    # no shared copies: a tuned checkpoint's worst case
    return mode_needs(rs.real_config(), INT4 if stored == "autoround" else BF16, stored)


def placed(p) -> str:
    return "gpu" if p.device_map == {"": 0} else "split" if p.device_map == "sequential" else p.device


def where(card: int, ram: int, quant: str, device: str = "auto"):
    needs = all_needs("autoround" if quant == "autoround" else "none")
    try:
        p = deviceplan.plan(needs[quant], device, quant=quant, others=needs, **machine(card, ram))
    except deviceplan.Refusal as exc:
        return "refused", exc
    return placed(p), p


def test_the_table_covers_every_card_and_ram():
    assert set(TABLE) == set(CARDS) == set(AUTO) and all(set(row) == set(RAMS) for row in TABLE.values())


@pytest.mark.parametrize("card", CARDS)
@pytest.mark.parametrize("ram", RAMS)
def test_device_plan_at_full_geometry(card, ram):
    for quant, expected in zip(("none", "autoround"), TABLE[card][ram]):
        got, detail = where(card, ram, quant)
        assert got == expected, (quant, str(detail))
        if got == "split":
            assert quant == "none" and detail.streamed > 0
            assert "cross PCIe every step" in detail.note and "s per step" in detail.note
            assert detail.max_memory[0] + detail.streamed >= detail.weight_bytes
        if got == "gpu":
            assert not detail.note


@pytest.mark.parametrize("card", CARDS)
@pytest.mark.parametrize("ram", RAMS)
def test_auto_picks_the_best_mode_that_fits_each_card(card, ram):
    p = deviceplan.choose(all_needs(), ("none", "8bit", "4bit"), "auto", **machine(card, ram))
    assert (p.quant, placed(p)) == AUTO[card][ram]
    if placed(p) == "gpu":
        assert all(where(card, ram, q, "cuda")[0] == "refused" for q in ("none", "8bit", "4bit")
                   if ("none", "8bit", "4bit").index(q) < ("none", "8bit", "4bit").index(p.quant))


def test_a_split_names_the_mode_that_runs_whole():
    got, p = where(24, 64, "none")
    assert got == "split" and "quant 4bit runs whole on this GPU (19.7 GiB)" in p.note


@pytest.mark.parametrize("card", CARDS)
@pytest.mark.parametrize("ram", RAMS)
@pytest.mark.parametrize("quant, device", [("none", "auto"), ("none", "cuda"), ("autoround", "auto"),
                                           ("autoround", "cuda"), ("none", "cpu"), ("autoround", "cpu"),
                                           ("4bit", "cuda"), ("8bit", "auto"), ("4bit", "cpu")])
def test_every_refusal_names_routes_that_work_on_that_card(card, ram, quant, device):
    got, detail = where(card, ram, quant, device)
    if got != "refused":
        return
    text = str(detail)
    assert "what works on this machine" in text and "a remote engine" in text
    assert detail.routes[-1].quant == "remote"
    for route in detail.routes[:-1]:
        assert f"quant {route.quant} with device {route.device}" in text
        assert "s per step" in route.cost if route.device != "cuda" else "whole on the GPU in" in route.cost
        assert (route.quant, route.device) != (quant, device)
        assert where(card, ram, route.quant, route.device)[0] != "refused", route


def test_a_24_gb_card_is_told_what_works_not_to_free_memory_it_does_not_have():
    got, detail = where(24, 64, "autoround")
    text = str(detail)
    assert got == "refused" and "free GPU memory" not in text
    assert "cannot be split between GPU and CPU" in text and "a 24.0 GiB card" in text
    assert [(r.quant, r.device) for r in detail.routes] == [
        ("none", "auto"), ("none", "cpu"), ("8bit", "cpu"), ("4bit", "cuda"), ("4bit", "cpu"), ("autoround", "cpu"),
        ("remote", "")]
    assert "over PCIe every step" in detail.routes[0].cost
    assert "quant 4bit with device cuda (whole on the GPU in 19.7 GiB)" in text


def test_a_card_too_small_for_every_mode_is_sent_to_a_remote_engine():
    small = dict(vram=int(7.6 * GIB), total_vram=8 * GIB, ram=13 * GIB)
    with pytest.raises(deviceplan.Refusal) as caught:
        deviceplan.choose(all_needs(), ("none", "8bit", "4bit"), "auto", **small)
    text = str(caught.value)
    assert [r.quant for r in caught.value.routes] == ["remote"]
    assert "none 50.1 GiB, 8bit 29.4 GiB, 4bit 19.7 GiB" in text and "a 8.0 GiB card" in text
    assert "a remote engine (`python -m serve` on a bigger GPU" in text


def test_int4_fits_a_32_gb_card_with_the_step_it_runs():
    need = all_needs("autoround")["autoround"]
    assert need.peak < 31 * GIB < need.peak + deviceplan.CUDA_RESERVE + GIB
    assert where(32, 64, "autoround")[0] == "gpu"


def test_the_modes_made_at_load_fit_their_cards_at_a_real_step():
    needs = all_needs()
    assert needs["4bit"].peak < 20 * GIB
    assert needs["4bit"].peak + deviceplan.CUDA_RESERVE + 2 * GIB < 24 * GIB  # a 24 GB card, 2 GiB taken by a desktop
    assert needs["8bit"].peak + deviceplan.CUDA_RESERVE < 30 * GIB  # a 32 GB card


def test_kv_cache_per_context_token_at_the_real_geometry():
    per_token = deviceplan.kv_bytes(TEXT, 1)
    assert per_token == 2 * 2 * (25 * 8 * 256 + 5 * 2 * 512)  # K and V, bf16; sliding and full layers
    beyond = deviceplan.kv_bytes(TEXT, 4096) - deviceplan.kv_bytes(TEXT, 4095)
    assert beyond == 2 * 2 * 5 * 2 * 512  # past the window only the full layers grow
