"""quant 4bit and 8bit: the bf16 checkpoint quantized tensor by tensor while it loads, one copy for both stacks.

The tiny checkpoint, the shipped demo model and the small real-geometry twin (128 experts, group-aligned
widths) run everywhere; the real-size slice (testing/realslice.py) only where it is cached.
"""

from __future__ import annotations

import pytest
import torch
from conftest import cache_base

from diffusiongemma.dgemma import Knobs, generate, load_model
from diffusiongemma.dgemma.loading import quant_at_load as qal
from diffusiongemma.dgemma.loading import weightquant as wq
from diffusiongemma.testing import fitcheck, realslice

MODES = ("4bit", "8bit")


def layers(dm):
    return dm.model.model.encoder.language_model.layers, dm.model.model.decoder.layers


def real_slice_cached() -> bool:
    return (realslice.cache_root() / realslice.REAL.name / "bf16" / "config.json").is_file()


@pytest.fixture(scope="module")
def small_slice():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # 128 tiny experts: a second thread only spins (this module's tests only)
    yield realslice.slice_dir(realslice.SMALL, cache_base())
    torch.set_num_threads(threads)


@pytest.mark.parametrize("quant", MODES)
def test_every_experts_weight_is_quantized_once_for_both_stacks(tiny_dir, quant):
    dm = load_model(str(tiny_dir), quant=quant, device="cpu")
    assert dm.quant == quant and dm.dtype == "float32"
    encoder, decoder = layers(dm)
    for enc, dec in zip(encoder, decoder):
        assert wq.quantized_names(dec.experts) == ("gate_up_proj", "down_proj")
        assert enc.experts is dec.experts  # the encoder runs the decoder's one quantized copy
        assert all(getattr(dec.experts, n).dtype == torch.uint8 for n in wq.quantized_names(dec.experts))
        for name in ("router.proj", "self_attn.q_proj", "self_attn.o_proj", "mlp.down_proj"):
            kept = dec.get_submodule(name).weight  # as stored, in the compute dtype, one copy for both stacks
            assert kept.dtype == torch.float32 and enc.get_submodule(name).weight is kept, name
    assert isinstance(decoder[0].experts, wq.QuantizedExperts)
    assert not [n for n, p in dm.model.named_parameters() if p.device.type == "meta"]
    assert qal.check_loaded(dm.model)[0] == len(qal.geometry(dm.model.config).quantized)
    result = generate(dm, "What is 3+4?", Knobs(seed=3, num_inference_steps=2))
    assert len(result.trace) == 2


@pytest.mark.parametrize("quant", MODES)
def test_a_step_computes_exactly_what_the_dequantized_weights_give(tiny_dir, quant):
    """The quantized layers equal the bf16 model with each weight replaced by its quantize/dequantize round trip."""
    ref = load_model(str(tiny_dir), device="cpu")
    with torch.no_grad():
        for layer in ref.model.model.decoder.layers:
            for module in qal.targets(layer).values():
                for p in module.parameters(recurse=False):
                    if p.dim() > 1:
                        mode = wq.MODES[quant]
                        p.data = wq.dequantize(wq.quantize(p.data, mode), tuple(p.shape), mode, p.dtype)
    dm = load_model(str(tiny_dir), quant=quant, device="cpu")
    assert torch.equal(fitcheck.step_logits(dm), fitcheck.step_logits(ref))


def test_chunked_quantization_is_the_whole_tensor_quantization(monkeypatch):
    weight = torch.randn(5, 96, 64, dtype=torch.bfloat16)
    for mode in wq.MODES.values():
        whole = wq.quantize(weight, mode)
        monkeypatch.setattr(wq, "CHUNK_ELEMENTS", 1000)
        assert torch.equal(wq.quantize(weight, mode), whole)
        monkeypatch.undo()
        back = wq.dequantize(whole, tuple(weight.shape), mode, torch.bfloat16)
        assert fitcheck.cosine(back.float(), weight.float()) > (0.99 if mode.bits == 4 else 0.9999)
        assert whole.numel() == mode.packed_bytes(weight.numel())


def test_the_demo_still_answers_in_4bit():
    from diffusiongemma.dgemma.demo import DEMO_DIR

    right, asked, wrong = fitcheck.demo_accuracy(load_model(str(DEMO_DIR), quant="4bit", device="cpu"))
    assert right >= 0.9 * asked, wrong


@pytest.mark.parametrize("quant", MODES)
def test_the_small_real_geometry_twin_loads_and_runs(small_slice, quant):
    dm = load_model(str(small_slice), quant=quant, device="cpu")
    assert isinstance(layers(dm)[1][0].experts, wq.QuantizedExperts)
    assert dm.model.model.decoder.layers[0].experts.gate_up_proj.numel() == wq.MODES[quant].packed_bytes(
        128 * 2 * 64 * 256)
    result = generate(dm, "What is 3+4?", Knobs(seed=3, num_inference_steps=1, gen_length=256, confidence=0.0))
    assert result.trace.ids.shape == (1, 256)


@pytest.mark.skipif(not real_slice_cached(), reason="real-geometry slice not built (python benchmarks/fit.py)")
@pytest.mark.parametrize("quant", MODES)
def test_the_real_size_slice_loads_in_the_modes(quant):
    dm = load_model(str(realslice.slice_dir()), quant=quant, device="cpu")
    experts = layers(dm)[1][0].experts
    assert layers(dm)[0][0].experts is experts
    assert experts.gate_up_proj.numel() == wq.MODES[quant].packed_bytes(128 * 1408 * 2816)
    assert fitcheck.step_logits(dm).shape == (256, 262_144)


def test_a_forced_split_of_the_slice_leaves_nothing_on_meta(small_slice, tmp_path):
    """The plan's split (accelerate's sequential map under its budgets) keeps both ends of every encoder/decoder
    tie served: no parameter is left on the meta device without an offload hook holding its value."""
    model = fitcheck.forced_split(small_slice, 20 << 20, tmp_path)
    assert {"cpu", "disk"} <= set(model.hf_device_map.values())
    assert fitcheck.unserved_meta(model) == []
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config.get_text_config(decoder=True))
    with torch.no_grad():
        model.model.encoder(input_ids=torch.tensor([[2, 5, 6, 7]]), past_key_values=cache)
        logits = model(decoder_input_ids=torch.randint(0, 100, (1, 256)), past_key_values=cache).logits
    assert torch.isfinite(logits).all()


def test_a_quantized_checkpoint_is_not_quantized_again(small_slice):
    int4 = realslice.int4_dir(realslice.SMALL, cache_base())
    for quant in MODES:
        with pytest.raises(ValueError, match=f"auto-round quantized checkpoint but quant is '{quant}'"):
            load_model(str(int4), quant=quant, device="cpu")


def test_without_bitsandbytes_the_modes_say_what_to_install(tiny_dir, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_bnb(name, *args, **kwargs):
        if name.startswith("bitsandbytes"):
            raise ImportError("no bitsandbytes here")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_bnb)
    with pytest.raises(ValueError, match="quant '4bit' needs the bitsandbytes package.*pip install"):
        load_model(str(tiny_dir), quant="4bit", device="cpu")
    monkeypatch.setattr(wq, "has_bitsandbytes", lambda: False)
    assert load_model(str(tiny_dir), quant="auto", device="cpu").quant == "none"


def test_auto_loads_a_small_model_unquantized_and_an_autoround_one_as_autoround(tiny_dir, small_slice):
    assert load_model(str(tiny_dir), quant="auto", device="cpu").quant == "none"
    int4 = realslice.int4_dir(realslice.SMALL, cache_base())
    assert load_model(str(int4), quant="auto", device="cpu").quant == "autoround"
