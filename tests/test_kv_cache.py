"""KV context: incremental encoding equals one-shot, composed runs equal the plain loop over the
concatenated sequence, and a cache is never changed by the runs that use it."""

from __future__ import annotations

import dataclasses
import shutil

import fakecomfy
import pytest
import torch
from executor import call

from diffusiongemma import NODE_CLASS_MAPPINGS
from diffusiongemma.dgemma import Knobs, generate, load_model
from diffusiongemma.dgemma.denoising.cache import encode_ids, new_cache
from diffusiongemma.dgemma.denoising.context import KVCache, encode_context
from diffusiongemma.dgemma.denoising.loop import denoise_blocks
from diffusiongemma.dgemma.inputs.tokens import frame_texts, prompt_ids
from diffusiongemma.dgemma.readouts.runlog import records
from diffusiongemma.dgemma.readouts.trace import Recorder
from diffusiongemma.runner.execute import run_graph
from diffusiongemma.testing.tiny_tokenizer import context_ids

CONTEXT = "The quick brown fox jumps over the lazy dog. " * 14  # 630 tokens: past the 512 sliding window
FAST = dict(num_inference_steps=3, confidence=0.0)


def snapshot(kv: KVCache) -> list[torch.Tensor]:
    return [t.clone() for layer in kv.cache.layers for t in (layer.keys, layer.values)]


def unchanged(kv: KVCache, before) -> bool:
    now = [t for layer in kv.cache.layers for t in (layer.keys, layer.values)]
    return len(now) == len(before) and all(torch.equal(a, b) for a, b in zip(now, before))


@pytest.fixture(scope="module")
def context(tiny_model):
    return encode_context(tiny_model, CONTEXT)


def test_incremental_encoding_equals_one_pass(tiny_model, context):
    turn = prompt_ids(tiny_model, "What is 3+4?", thinking=False, with_bos=False)
    incremental = context.fork_for(tiny_model)
    encode_ids(tiny_model.model, incremental, turn)
    at_once = new_cache(tiny_model.model)
    encode_ids(tiny_model.model, at_once, context_ids(tiny_model, CONTEXT) + turn)
    assert incremental.get_seq_length() == at_once.get_seq_length() == context.length + len(turn)
    for a, b in zip(incremental.layers, at_once.layers):
        assert a.keys.shape == b.keys.shape
        assert torch.allclose(a.keys, b.keys, atol=1e-4) and torch.allclose(a.values, b.values, atol=1e-4)


@pytest.mark.parametrize("gen_length, blocks", [(400, 2), (700, 3)])
def test_composed_runs_equal_the_plain_loop_over_the_concatenation(tiny_model, context, gen_length, blocks):
    tiny_model = dataclasses.replace(tiny_model, eos_ids=())  # random weights emit EOS often; run every block
    knobs = Knobs(seed=blocks, gen_length=gen_length, **FAST)
    composed = generate(tiny_model, "What is 3+4?", knobs, context=context)
    cache = new_cache(tiny_model.model)
    encode_ids(tiny_model.model, cache, context_ids(tiny_model, CONTEXT) +
               prompt_ids(tiny_model, "What is 3+4?", thinking=False, with_bos=False))
    generator = torch.Generator().manual_seed(knobs.seed)
    plain = denoise_blocks(tiny_model.model, cache, knobs, generator, tiny_model.eos_ids,
                           Recorder(knobs, tiny_model.canvas_length))
    assert list(composed.state.raw_ids) == plain[0].tolist()
    assert composed.state.blocks == blocks


def test_one_cache_reused_ten_times_gives_one_result_and_stays_bitwise_intact(tiny_model, context):
    before = snapshot(context)
    knobs = Knobs(seed=5, gen_length=300, **FAST)
    results = {generate(tiny_model, "hello", knobs, context=context).state.raw_ids for _ in range(10)}
    pure = {generate(tiny_model, "", knobs, context=context).state.raw_ids for _ in range(2)}
    assert len(results) == 1 and len(pure) == 1
    assert unchanged(context, before) and context.cache.get_seq_length() == context.length


def test_fan_out_to_two_denoise_nodes_in_one_graph(tmp_path, monkeypatch, demo_model):
    monkeypatch.setenv("DGEMMA_OUTPUT_DIR", str(tmp_path))
    knobs = dict(seed=1, num_inference_steps=8, t_min=0.4, t_max=0.8, entropy_bound=0.1, confidence=0.0,
                 gen_length=32, thinking=False)
    graph = {"1": {"class_type": "DGemmaLoader", "inputs": {"quant": "none", "model": "diffusiongemma-demo"}},
             "2": {"class_type": "DGemmaEncode", "inputs": {"model": ["1", 0], "text": "a=3, b=4."}}}
    for a, b in (("3", "4"), ("5", "6")):
        graph[a] = {"class_type": "DGemmaDenoise", "inputs": {"model": ["1", 0], "prompt": "What is a+b?",
                                                              "kv_cache": ["2", 0], **knobs}}
        graph[b] = {"class_type": "PreviewAny", "inputs": {"source": [a, 1]}}
    uis = run_graph(graph)
    first, second = (uis[n]["text"][0] for n in ("4", "6"))  # canvas_state's summary, as PreviewAny shows it
    assert first == second and "8 steps" in first and first.startswith('answer: "seven"')


def test_advanced_context_continues_and_input_is_untouched(tiny_model, context):
    before = snapshot(context)
    result = generate(tiny_model, "Go on.", Knobs(seed=2, gen_length=256, **FAST), context=context,
                      advance_context=True)
    turn = prompt_ids(tiny_model, "Go on.", thinking=False, with_bos=False)
    advanced = result.context
    assert advanced.length == context.length + len(turn) + 256 == advanced.cache.get_seq_length()
    assert advanced.token_ids[:context.length] == context.token_ids and unchanged(context, before)
    more = encode_context(tiny_model, " And then?", onto=advanced)
    assert more.length > advanced.length and advanced.cache.get_seq_length() == advanced.length


def test_encode_advance_equals_minting_the_whole_text(tiny_model):
    first = encode_context(tiny_model, "Alpha beta. ")
    before = snapshot(first)
    advanced = encode_context(tiny_model, "Gamma delta.", onto=first)
    whole = encode_context(tiny_model, "Alpha beta. Gamma delta.")
    assert advanced.token_ids == whole.token_ids and unchanged(first, before)
    for a, b in zip(advanced.cache.layers, whole.cache.layers):
        assert torch.allclose(a.keys, b.keys, atol=1e-4)


def test_a_cache_from_another_model_is_refused_before_any_work(tiny_model, demo_model, context, tmp_path,
                                                               tiny_dir, monkeypatch):
    import diffusiongemma.dgemma.denoising.run as run

    monkeypatch.setattr(run, "encode_ids", lambda *a, **k: pytest.fail("model ran"))
    with pytest.raises(ValueError, match="another geometry"):
        generate(demo_model, "hi", Knobs(), context=context)
    copy = shutil.copytree(tiny_dir, tmp_path / "copy")
    other = load_model(str(copy))
    with pytest.raises(ValueError, match="was encoded by"):
        generate(other, "hi", Knobs(), context=context)
    with pytest.raises(ValueError, match="must be an encoded context"):
        encode_context(tiny_model, "more", onto="not a cache")
    with pytest.raises(ValueError, match="text is empty"):
        encode_context(tiny_model, "")


def test_a_float32_cache_works_on_the_bfloat16_model(tiny_dir, context):
    half = load_model(str(tiny_dir), dtype="bfloat16")
    before = snapshot(context)
    result = generate(half, "hello", Knobs(seed=0, gen_length=20, **FAST), context=context)
    assert result.state.steps_used == 3 and unchanged(context, before)
    assert context.cache.layers[0].keys.dtype == torch.float32


def test_interrupt_reaches_encode_and_denoise(tmp_path, demo_model):
    Encode, Denoise = NODE_CLASS_MAPPINGS["DGemmaEncode"], NODE_CLASS_MAPPINGS["DGemmaDenoise"]
    with fakecomfy.installed(tmp_path) as comfy:
        comfy.interrupt = True
        with pytest.raises(fakecomfy.InterruptProcessingException):
            call(Encode, model=demo_model, text="a=1, b=2.")
        (cache,), _ = call(Encode, model=demo_model, text="a=1, b=2.")
        comfy.interrupt_after_steps = 2
        with pytest.raises(fakecomfy.InterruptProcessingException):
            call(Denoise, model=demo_model, prompt="What is a+b?", kv_cache=cache, seed=0, num_inference_steps=9,
                 t_min=0.4, t_max=0.8, entropy_bound=0.1, confidence=0.0, gen_length=32, thinking=False)
        assert len(comfy.steps()) == 2


def test_run_log_header_names_the_injected_context(tiny_model, context):
    result = generate(tiny_model, "hi", Knobs(seed=0, gen_length=10, **FAST), context=context)
    header = records(result.trace, result.config, result.state, frame_texts(result.trace, tiny_model.token_strings))[0]
    assert header["injection_present"] is True
    assert header["injected_cache_provenance"]["length"] == context.length
    assert set(header["injected_cache_provenance"]) == {"length", "model_source", "tokenizer_fingerprint",
                                                        "token_ids_sha256"}
