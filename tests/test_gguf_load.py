"""The demo's GGUF files load in-process: the mapping undoes the converter exactly, and runs match safetensors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from diffusiongemma.dgemma import Knobs, generate
from diffusiongemma.dgemma.demo import DEMO_DIR, DEMO_KNOBS, colour_image
from diffusiongemma.dgemma.errors import InputError

pytest.importorskip("gguf")
from diffusiongemma.dgemma.loading import gguf_config, gguf_file, gguf_load  # noqa: E402
from diffusiongemma.dgemma.loading.gguf_modules import GGUFWeight  # noqa: E402
from diffusiongemma.dgemma.loading.gguf_quants import dequantize  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "gguf"
F32, Q8, Q4 = (FIXTURES / f"demo-{k}.gguf" for k in ("f32", "Q8_0", "Q4_K_M"))


@pytest.fixture(scope="module")
def gguf_f32():
    return gguf_load.load_gguf(F32)


def test_every_f32_tensor_is_the_checkpoints_tensor_exactly():
    g = gguf_file.read(F32)
    plan = gguf_load.tensor_plan(g, gguf_load.skeleton(gguf_config.model_config(g)))
    stored = {k: v for k, v in load_file(DEMO_DIR / "model.safetensors").items() if "vision" not in k}
    assert set(plan) == set(stored)  # each parameter from exactly one tensor, none left over
    for name, t in plan.items():
        raw = torch.from_numpy(np.ascontiguousarray(t.data).view(np.uint8).copy())
        assert torch.equal(dequantize(raw, t.qtype, t.shape), stored[name]), name


def test_config_and_tokenizer_are_the_checkpoints():
    from transformers import AutoConfig, AutoTokenizer

    g = gguf_file.read(F32)
    ours, ref = gguf_config.model_config(g), AutoConfig.from_pretrained(DEMO_DIR)
    a, b = ours.text_config.to_dict(), ref.text_config.to_dict()
    assert {k for k in set(a) | set(b) if a.get(k) != b.get(k)} <= {"dtype"}
    assert (ours.canvas_length, ours.image_token_id) == (ref.canvas_length, ref.image_token_id)
    tok, rtok = gguf_config.tokenizer(g), AutoTokenizer.from_pretrained(DEMO_DIR)
    ids = list(range(len(rtok)))
    assert tok.convert_ids_to_tokens(ids) == rtok.convert_ids_to_tokens(ids)
    assert set(tok.all_special_ids) == set(rtok.all_special_ids)
    for text in ("What is 3+4?", "  two  spaces\n\n<|turn>ünï 😀<eos>", "<|channel>x<channel|>y"):
        assert tok(text).input_ids == rtok(text).input_ids
    turn = [{"role": "user", "content": "What is 3+4?"}]
    for thinking in (False, True):
        assert tok.apply_chat_template(turn, tokenize=False, add_generation_prompt=True, enable_thinking=thinking) == \
            rtok.apply_chat_template(turn, tokenize=False, add_generation_prompt=True, enable_thinking=thinking)
    gen = gguf_config.generation_config(g).to_dict()
    got = (gen["t_min"], gen["t_max"], gen["max_denoising_steps"], gen["confidence_threshold"])
    assert got == (0.4, 0.8, 48, 0.005)
    assert gen["sampler_config"]["entropy_bound"] == 0.1


@pytest.mark.parametrize("thinking", [False, True])
def test_f32_gguf_runs_exactly_as_the_safetensors_demo(gguf_f32, demo_model, thinking):
    for i, (a, b) in enumerate([(3, 4), (9, 9), (0, 0), (5, 8)]):
        knobs = Knobs(**{**DEMO_KNOBS.asdict(), "seed": i, "thinking": thinking})
        ours, ref = (generate(dm, f"What is {a}+{b}?", knobs) for dm in (gguf_f32, demo_model))
        assert ours.text == ref.text and ours.state == ref.state
        for field in ("ids", "entropy", "committed"):
            assert np.array_equal(getattr(ours.trace, field), getattr(ref.trace, field)), field


def test_the_payload_is_a_gguf_model_held_in_blocks(gguf_f32):
    assert gguf_f32.quant == "gguf" and gguf_f32.device == "cpu" and gguf_f32.dtype == "float32"
    model = gguf_f32.model
    assert not any(t.is_meta for t in [*model.parameters(), *model.buffers()])
    assert model.model.decoder.embed_tokens.weight is model.lm_head.weight  # the tie kept, held once (dense)
    encoder, decoder = model.model.encoder.language_model, model.model.decoder
    assert encoder.layers[0].self_attn.q_proj is decoder.layers[0].self_attn.q_proj
    blocks = {m.gguf_name for m in model.modules() if isinstance(m, GGUFWeight)}
    assert "blk.0.ffn_gate_up_exps.weight" in blocks and "token_embd.weight" not in blocks
    held = sum({id(m.blocks): m.blocks.nbytes for m in model.modules() if isinstance(m, GGUFWeight)}.values())
    assert held < gguf_file.read(F32).tensor_bytes
    assert model.generation_config.t_min == 0.4


@pytest.mark.parametrize("path", [Q8, Q4], ids=["Q8_0", "Q4_K_M"])
def test_quantized_files_answer(path):
    dm = gguf_load.load_gguf(path)
    assert generate(dm, "What is 3+4?", DEMO_KNOBS).text == "seven"
    types = {m.qtype for m in dm.model.modules() if isinstance(m, GGUFWeight)}
    assert types - {0}  # quantized blocks, not floats


def test_an_image_is_refused_by_name(gguf_f32):
    with pytest.raises(InputError, match="GGUF.*no vision tower.*safetensors"):
        generate(gguf_f32, "What colour is this?", DEMO_KNOBS, image=colour_image("red", 64, 64))


def test_the_loader_lists_and_loads_a_gguf_under_the_models_folder(tmp_path, monkeypatch):
    import shutil

    from diffusiongemma.nodes.loader import DGemmaLoader, model_choices

    shutil.copy(Q8, tmp_path / "demo-Q8_0.gguf")
    (tmp_path / "notes.txt").write_text("not a model")
    monkeypatch.setenv("DGEMMA_MODELS_DIR", str(tmp_path))
    assert model_choices()[0] == "demo-Q8_0.gguf" and "notes.txt" not in model_choices()
    (dm,) = DGemmaLoader().load("auto", model="demo-Q8_0.gguf")
    assert dm.quant == "gguf" and Path(dm.source).name == "demo-Q8_0.gguf"
    with pytest.raises(ValueError, match="quant 'gguf'"):
        DGemmaLoader().load("8bit", model="demo-Q8_0.gguf")
