"""quant="autoround": a tiny checkpoint quantized by auto-round loads through load_model and generates.

Imports auto_round up front: without it this file fails instead of skipping, so CI cannot pass
while the AutoRound path goes untested.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import auto_round  # noqa: F401
import pytest
import torch
from conftest import REPO, checkpoint, quantized
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from diffusiongemma.dgemma import Knobs, generate, load_model
from diffusiongemma.dgemma.demo import DEMO_DIR, DEMO_KNOBS, WORDS, demo_available
from diffusiongemma.testing import tiny
from diffusiongemma.testing.realscale import packed_names

_spec = importlib.util.spec_from_file_location("quantize_tiny", REPO / "tools" / "quantize_tiny.py")
quantize_tiny = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(quantize_tiny)

ENC, DEC = "model.encoder.language_model.layers", "model.decoder.layers"


@pytest.fixture(scope="module")
def int4_dir():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # for this module's tests only: the rest of the session keeps its threads
    yield quantized(checkpoint("random"), "random")
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def int4_model(int4_dir):
    return load_model(str(int4_dir), quant="autoround")


def file_tensors(folder: Path) -> dict:
    out = {}
    for path in folder.glob("*.safetensors"):
        with safe_open(path, "pt") as fh:
            out.update({k: fh.get_tensor(k) for k in fh.keys()})
    return out


def logits(model, vocab: int):
    ids = torch.tensor([[2, 10, 20, 30, 40, 50, 60, 70]])
    canvas = torch.randint(0, vocab, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return model(input_ids=ids, decoder_input_ids=canvas).logits.float().flatten()


def cosine(a, b) -> float:
    return torch.nn.functional.cosine_similarity(a, b, dim=0).item()


def test_checkpoint_is_autoround_int4(int4_dir):
    qc = json.loads((int4_dir / "config.json").read_text())["quantization_config"]
    assert (qc["quant_method"], qc["bits"], qc["group_size"]) == ("auto-round", 4, 32)
    info = quantize_tiny.describe(int4_dir)
    packed, full = info["packed"], info["full_precision"]
    # attention, dense MLP and every fused MoE expert (split per expert) of both copies are INT4
    for prefix in (ENC, DEC):
        assert f"{prefix}.0.self_attn.v_proj" in packed and f"{prefix}.1.self_attn.v_proj" not in packed  # K=V
        assert f"{prefix}.1.mlp.down_proj" in packed and f"{prefix}.1.experts.3.gate_proj" in packed
        assert f"{prefix}.0.router.proj.weight" in full
    assert len(packed) == 2 * (19 + 18)
    for kept in ("model.decoder.embed_tokens.weight", "model.decoder.self_conditioning.gate_proj.weight",
                 "model.encoder.vision_tower.patch_embedder.input_proj.weight"):
        assert kept in full
    assert not any(k.startswith("lm_head") for k in file_tensors(int4_dir))  # tied to the embedding
    # the release config format (5.13 cannot read per_layer_config)
    text = json.loads((int4_dir / "config.json").read_text())["text_config"]
    assert "per_layer_config" not in text and text["global_head_dim"] == 64


def loaded(layer, name: str, field: str) -> torch.Tensor:
    """A packed tensor under the checkpoint's name, read from the loaded model: linears keep theirs in `source`,
    each experts layer stacks its experts (gate beside up along the output)."""
    parts = name.split(".")
    if parts[0] != "experts":
        return getattr(layer.get_submodule(name).source, field)
    stack = layer.experts.held_down if parts[2] == "down_proj" else layer.experts.held_gate_up
    tensor = getattr(stack, field)[int(parts[1])]
    if parts[2] == "down_proj":
        return tensor
    half = tensor.shape[-1] // 2
    return tensor[..., :half] if parts[2] == "gate_proj" else tensor[..., half:]


def test_loads_the_packed_layers_the_checkpoint_holds(int4_model, int4_dir):
    model = int4_model.model
    assert type(model).__name__ == "AutoRoundDiffusionGemma" and int4_model.quant == "autoround"
    assert model._dgemma_load_report.missing_keys == set()
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        assert tensor.device.type != "meta", name
    stored = file_tensors(int4_dir)
    for prefix in (ENC, DEC):
        for i, layer in enumerate(model.get_submodule(prefix)):
            names = {k.removeprefix(f"{prefix}.{i}.").rsplit(".", 1)[0] for k in stored
                     if k.startswith(f"{prefix}.{i}.") and k.endswith(".qweight")}
            assert len(names) == (19 if i == 0 else 18)
            for n in names:
                for t in ("qweight", "qzeros", "scales"):
                    assert torch.equal(loaded(layer, n, t), stored[f"{prefix}.{i}.{n}.{t}"]), (prefix, i, n, t)


def test_encoder_and_decoder_share_weights(int4_model):
    model = int4_model.model
    enc, dec = model.get_submodule(ENC), model.get_submodule(DEC)
    assert model._dgemma_shared_layers == (37, 0)  # round-to-nearest: both copies are bit-identical
    for e, d in zip(enc, dec):
        assert all(e.get_submodule(n) is d.get_submodule(n) for n in packed_names(d))
        assert e.router.scale is d.router.scale and e.input_layernorm.weight is d.input_layernorm.weight
    embed = model.model.decoder.embed_tokens.weight
    assert model.lm_head.weight is embed and model.model.encoder.language_model.embed_tokens.weight is embed


def test_logits_close_to_the_unquantized_model_far_from_a_random_one(int4_model, tiny_model):
    vocab = len(tiny_model.tokenizer)
    plain, int4 = logits(tiny_model.model, vocab), logits(int4_model.model, vocab)
    other = logits(tiny.build_model("random", seed=1)[0].eval(), vocab)
    assert not torch.equal(int4, plain)
    assert cosine(int4, plain) > 0.8 and abs(cosine(other, plain)) < 0.2


def test_generates_through_the_engine(int4_model):
    knobs = Knobs(seed=3, gen_length=300, num_inference_steps=4, confidence=0.0)  # two blocks
    a, b = generate(int4_model, "hello", knobs), generate(int4_model, "hello", knobs)
    assert len(a.state.raw_ids) > 0 and a.state.raw_ids == b.state.raw_ids
    assert all(0 <= t < len(int4_model.tokenizer) for t in a.state.raw_ids)


def test_copies_that_differ_stay_separate(int4_dir, tmp_path):
    folder = Path(shutil.copytree(int4_dir, tmp_path / "ckpt"))
    key = f"{ENC}.0.mlp.up_proj.qweight"
    shard = next(p for p in folder.glob("*.safetensors") if key in safe_open(p, "pt").keys())
    tensors = load_file(shard)
    tensors[key] = tensors[key] ^ 1  # one rounding differs, as a tuned quantization can make it
    save_file(tensors, shard, metadata={"format": "pt"})
    model = load_model(str(folder), quant="autoround").model
    assert model._dgemma_shared_layers == (36, 1)
    enc, dec = model.get_submodule(ENC)[0], model.get_submodule(DEC)[0]
    assert enc.mlp.up_proj is not dec.mlp.up_proj and torch.equal(enc.mlp.up_proj.source.qweight, tensors[key])
    assert enc.mlp.gate_proj is dec.mlp.gate_proj


def test_a_weight_missing_from_the_checkpoint_is_refused(int4_dir, tmp_path):
    folder = Path(shutil.copytree(int4_dir, tmp_path / "ckpt"))
    key = "model.decoder.self_conditioning.gate_proj.weight"
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    shard = folder / index["weight_map"].pop(key)
    tensors = load_file(shard)
    del tensors[key]
    save_file(tensors, shard, metadata={"format": "pt"})
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match="1 weights missing from the checkpoint.*self_conditioning"):
        load_model(str(folder), quant="autoround")


def test_quant_and_checkpoint_mismatch_is_refused(int4_dir, tiny_dir):
    with pytest.raises(ValueError, match="is a auto-round quantized checkpoint but quant is 'none'"):
        load_model(str(int4_dir))
    with pytest.raises(ValueError, match="needs an AutoRound checkpoint.*has no quantization_config"):
        load_model(str(tiny_dir), quant="autoround")


@pytest.mark.skipif(not demo_available(), reason="the trained demo model is not in this checkout")
def test_int4_demo_model_still_answers():
    model = load_model(str(quantized(DEMO_DIR, "demo")), quant="autoround")
    pairs = [(a, (3 * a + 1) % 10) for a in range(10)]
    right = sum(generate(model, f"What is {a}+{b}?", Knobs(**{**DEMO_KNOBS.asdict(), "seed": i})).text
                == WORDS[a + b] for i, (a, b) in enumerate(pairs))
    assert right >= 7, f"{right}/10 exact answers after INT4 round-to-nearest"


def test_dropped_copies_are_compared_in_the_files_not_through_their_tensors(int4_dir, monkeypatch):
    """On the CPU the weights are mapped from the files: reading an encoder copy the load then drops, through
    its tensors, would keep its pages resident (the whole copy, at the real size)."""
    from diffusiongemma.dgemma.loading import quant

    def through_memory(a, b):
        raise AssertionError("compared through the tensors")

    monkeypatch.setattr(quant, "_same_tensors", through_memory)
    model = load_model(str(int4_dir), quant="autoround", device="cpu").model
    assert model._dgemma_shared_layers == (37, 0)


def test_packed_layers_compute_as_auto_rounds_own_and_the_experts_grouped(int4_dir, int4_model, monkeypatch):
    """Linears: auto-round's torch kernel's very values and matmul, bit for bit. Experts: transformers' grouped
    forward over the same dequantized weights, close to auto-round's loop of per-expert matmuls."""
    from diffusiongemma.dgemma.loading import autoround_run

    monkeypatch.setattr(autoround_run, "convert", lambda model, dtype: False)
    own = load_model(str(int4_dir), quant="autoround").model
    ours = int4_model.model
    assert ours.config._experts_implementation == "grouped_mm" and own.config._experts_implementation != "grouped_mm"
    gen = torch.Generator().manual_seed(0)
    layer, twin = ours.get_submodule(DEC)[0], own.get_submodule(DEC)[0]
    for name in ("self_attn.q_proj", "self_attn.o_proj", "mlp.down_proj"):
        a, b = layer.get_submodule(name), twin.get_submodule(name)
        x = torch.randn(3, 5, b.infeatures, generator=gen).to(torch.bfloat16)
        assert torch.equal(a(x), b(x)), name
    hidden = torch.randn(12, layer.experts.held_gate_up.shape[1], generator=gen).to(torch.bfloat16)
    top = torch.rand(12, layer.experts.num_experts, generator=gen).topk(2, dim=-1)
    with torch.no_grad():
        got, want = layer.experts(hidden, top.indices, top.values), twin.experts(hidden, top.indices, top.values)
    assert torch.allclose(got.float(), want.float(), rtol=0.02, atol=0.02)
    vocab = len(int4_model.tokenizer)
    assert cosine(logits(ours, vocab), logits(own, vocab)) > 0.999


def test_a_packed_layout_the_probe_does_not_know_keeps_auto_rounds_forward(int4_dir, monkeypatch):
    """A backend that repacks its weights fails the identity probe: nothing is converted, and the model runs
    auto-round's own forward."""
    from diffusiongemma.dgemma.loading import autoround_run

    real = autoround_run.dequantize
    monkeypatch.setattr(autoround_run, "dequantize", lambda *a: real(*a).transpose(-2, -1).contiguous())
    model = load_model(str(int4_dir), quant="autoround")
    assert not any(isinstance(m, autoround_run.PackedInt4) for m in model.model.modules())
    assert model.model.config._experts_implementation != "grouped_mm"
    assert generate(model, "hello", Knobs(seed=3, gen_length=32, num_inference_steps=2)).state.raw_ids


@pytest.mark.skipif(not demo_available(), reason="the trained demo model is not in this checkout")
def test_a_batch_item_equals_its_solo_run():
    """The stacked experts ([experts, in, out]) take the batch path's row-by-row grouped matmuls, as the bf16
    model's do."""
    from diffusiongemma.dgemma.denoising import batch_experts
    from diffusiongemma.dgemma.denoising.run import prepare, run, run_batch
    from diffusiongemma.testing.batchcheck import differences, entropy_exact

    model = load_model(str(quantized(DEMO_DIR, "demo")), quant="autoround")
    requests = [prepare(model, f"What is {i}+{i + 1}?", Knobs(seed=i, gen_length=32, num_inference_steps=3))
                for i in range(4)]
    batched = run_batch(requests, max_batch=4)
    for request, item in zip(requests, batched):
        solo = run(request)
        assert not differences(solo, item) and entropy_exact(solo, item)
    assert all(batch_experts._fast.get(layer.experts) for layer in model.model.model.decoder.layers)
