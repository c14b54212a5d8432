"""LoRA adapters: trained here on the demo with PEFT (digits instead of words), saved as PEFT saves them,
loaded through DGemmaLoraLoader, and run as a view over the very weights of the loaded model."""

from __future__ import annotations

import dataclasses
import json
import shutil
import threading

import pytest
import torch
from conftest import REPO
from safetensors.torch import load_file, save_file

from diffusiongemma.dgemma import Knobs, generate, load_model
from diffusiongemma.dgemma.demo import DEMO_DIR, DEMO_KNOBS
from diffusiongemma.dgemma.denoising.context import encode_context
from diffusiongemma.dgemma.errors import InputError
from diffusiongemma.dgemma.loading.lora import adapt, read_adapter
from diffusiongemma.nodes.lora_loader import DGemmaLoraLoader, lora_choices
from diffusiongemma.testing import lora_train
from diffusiongemma.testing.lora_train import logits, untied

pytest.importorskip("peft")
HELD = lora_train.HELD_OUT[:6]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The digits adapter trained now (about 30 s on one core), in a models/loras folder as ComfyUI has it."""
    models = tmp_path_factory.mktemp("models")
    torch.set_num_threads(1)
    lora_train.train(models / "loras" / "digits")
    (models / "diffusiongemma").mkdir()
    return models


@pytest.fixture
def loras(trained, monkeypatch):
    monkeypatch.setenv("DGEMMA_MODELS_DIR", str(trained / "diffusiongemma"))
    return trained / "loras"


def answers(dm, pairs=HELD):
    return [generate(dm, f"What is {a}+{b}?", Knobs(**{**DEMO_KNOBS.asdict(), "seed": i})).text
            for i, (a, b) in enumerate(pairs)]


def run_bits(dm, prompt="What is 2+5?"):
    r = generate(dm, prompt, DEMO_KNOBS)
    return r.state.raw_ids, r.trace.entropy.tobytes(), r.trace.ids.tobytes()


def test_the_node_lists_and_loads_a_peft_adapter_and_it_answers_in_digits(demo_model, loras):
    assert "digits" in lora_choices() and "diffusiongemma-demo-digits" in lora_choices()
    spec = DGemmaLoraLoader.INPUT_TYPES()["required"]
    assert all(s[1].get("tooltip") for s in spec.values()) and spec["strength"][1]["min"] == -4
    before = run_bits(demo_model)
    (adapted,) = DGemmaLoraLoader().load(demo_model, "digits", 1.0)
    got = answers(adapted)
    assert sum(g == lora_train.digits_answer(a, b) for g, (a, b) in zip(got, HELD)) >= 5, got
    assert answers(demo_model) == [lora_train.words_answer(a, b) for a, b in HELD]
    assert run_bits(demo_model) == before  # the plain branch, after the adapted one: bit for bit
    assert adapted.model is demo_model.model and adapted.adapters and not demo_model.adapters


def test_strength_zero_is_the_base_bit_for_bit_and_two_halves_add_to_one(demo_model, loras):
    adapter = read_adapter(loras / "digits")
    assert run_bits(adapt(demo_model, adapter, 0.0)) == run_bits(demo_model)
    whole = logits(adapt(demo_model, adapter, 1.0))
    halves = logits(adapt(adapt(demo_model, adapter, 0.5), adapter, 0.5))
    assert torch.allclose(whole, halves, atol=1e-4) and not torch.allclose(whole, logits(demo_model), atol=1e-2)


def test_the_view_matches_a_peft_merged_copy_in_float32(demo_model, loras):
    from peft import PeftModel
    from transformers import DiffusionGemmaForBlockDiffusion

    mine = logits(adapt(demo_model, read_adapter(loras / "digits"), 1.0))
    base = DiffusionGemmaForBlockDiffusion.from_pretrained(DEMO_DIR, dtype=torch.float32)
    unmerged = PeftModel.from_pretrained(base, str(loras / "digits")).base_model.model
    assert torch.equal(mine, logits(dataclasses.replace(demo_model, model=unmerged)))  # PEFT's own forward
    merged = PeftModel.from_pretrained(untied(), str(loras / "digits")).merge_and_unload()
    assert (mine - logits(dataclasses.replace(demo_model, model=merged))).abs().max().item() <= 1e-4


def test_a_plain_run_beside_an_adapted_one_in_another_thread_is_the_base(demo_model, loras):
    adapted = adapt(demo_model, read_adapter(loras / "digits"), 1.0)
    base_bits, lora_bits = run_bits(demo_model), run_bits(adapted)
    got = {}

    def work(name, dm):
        got[name] = [run_bits(dm) for _ in range(3)]

    threads = [threading.Thread(target=work, args=(n, d)) for n, d in (("plain", demo_model), ("lora", adapted))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got["plain"] == [base_bits] * 3 and got["lora"] == [lora_bits] * 3


def test_a_cache_names_its_adapters_and_is_refused_under_others(demo_model, loras):
    adapter = read_adapter(loras / "digits")
    adapted, other = adapt(demo_model, adapter, 1.0), adapt(demo_model, adapter, 0.5)
    cache = encode_context(adapted, "a=3, b=4.")
    assert "digits" in cache.checkpoint and "@1" in cache.checkpoint
    generate(adapted, "What is a+b?", DEMO_KNOBS, context=cache)  # the adapters it was encoded under
    for dm in (demo_model, other):
        with pytest.raises(InputError, match="encode the context again"):
            generate(dm, "What is a+b?", DEMO_KNOBS, context=cache)


def test_run_config_and_log_name_the_adapters(demo_model, loras):
    from diffusiongemma.dgemma.readouts.runlog import records

    result = generate(adapt(demo_model, read_adapter(loras / "digits"), 0.75), "What is 2+5?", DEMO_KNOBS)
    assert "+ LoRA digits @ 0.75" in str(result.config)
    header = records(result.trace, result.config, result.state, [""] * len(result.trace))[0]
    assert header["adapters"][0]["name"] == "digits" and header["adapters"][0]["strength"] == 0.75


def test_decide_prefers_the_adapters_answer(demo_model, loras):
    from diffusiongemma.dgemma.denoising.decide import decide

    adapted = adapt(demo_model, read_adapter(loras / "digits"), 1.0)
    ask = dict(samples=2, knobs=DEMO_KNOBS, trace=False)
    assert decide(adapted, "What is 3+4?", ["7", "seven"], **ask).choice == "7"
    assert decide(demo_model, "What is 3+4?", ["7", "seven"], **ask).choice == "seven"


@pytest.mark.parametrize("quant, source", [("8bit", DEMO_DIR), ("4bit", DEMO_DIR),
                                           ("gguf", REPO / "tests" / "fixtures" / "gguf" / "demo-Q8_0.gguf")])
def test_the_adapter_runs_over_quantized_weights(quant, source, loras):
    if quant != "gguf":
        pytest.importorskip("bitsandbytes")
    dm = load_model(str(source), quant=quant)
    got = answers(adapt(dm, read_adapter(loras / "digits"), 1.0), HELD[:4])
    assert sum(g == lora_train.digits_answer(a, b) for g, (a, b) in zip(got, HELD)) >= 3, got
    assert answers(dm, HELD[:2]) == [lora_train.words_answer(a, b) for a, b in HELD[:2]]


def test_autoround_is_refused_by_name(demo_model, loras):
    with pytest.raises(InputError, match="AutoRound"):
        adapt(dataclasses.replace(demo_model, quant="autoround"), read_adapter(loras / "digits"))


def _single_file(folder, path, edit=None, config=True):
    tensors = load_file(str(folder / "adapter_model.safetensors"))
    raw = json.loads((folder / "adapter_config.json").read_text())
    if edit is not None:
        edit(tensors, raw)
    save_file(tensors, str(path), metadata={"adapter_config": json.dumps(raw)} if config else None)
    return path


KEY = "base_model.model.model.decoder.layers.0.self_attn.q_proj.lora_A.weight"


def _nan(t, raw):
    t[KEY] = t[KEY].clone()
    t[KEY][0, 0] = float("nan")


def _absent(t, raw):
    for key in (KEY, KEY.replace("lora_A", "lora_B")):
        t[key.replace("layers.0", "layers.7")] = t.pop(key)


def _shape(t, raw):
    t[KEY] = t[KEY][:, :64].contiguous()


@pytest.mark.parametrize("edit, config, message", [
    (_nan, True, "q_proj.lora_A.weight.*NaN"),
    (_absent, True, "layers.7.*does not have"),
    (_shape, True, "q_proj.lora_A.weight.*disagree.*another base"),
    (lambda t, raw: raw.update(r=0), True, "rank 0"),
    (lambda t, raw: raw.update(use_dora=True), True, "DoRA"),
    (None, False, "has no config"),
])
def test_bad_adapters_are_refused_naming_file_and_key(demo_model, loras, tmp_path, edit, config, message):
    path = _single_file(loras / "digits", tmp_path / "bad.safetensors", edit, config)
    with pytest.raises(InputError, match=message) as caught:
        adapt(demo_model, read_adapter(path), 1.0)
    assert "bad.safetensors" in str(caught.value)


def test_a_single_file_with_its_config_in_metadata_equals_the_folder(demo_model, loras, tmp_path):
    single = _single_file(loras / "digits", loras / "digits_single.safetensors")
    try:
        assert "digits_single.safetensors" in lora_choices()
        (from_file,) = DGemmaLoraLoader().load(demo_model, "digits_single.safetensors", 1.0)
        assert torch.equal(logits(from_file), logits(adapt(demo_model, read_adapter(loras / "digits"), 1.0)))
    finally:
        single.unlink()


def test_a_folder_without_its_config_is_refused(demo_model, loras, tmp_path):
    folder = tmp_path / "noconfig"
    shutil.copytree(loras / "digits", folder)
    (folder / "adapter_config.json").unlink()
    with pytest.raises(InputError, match="noconfig.*adapter_config.json"):
        read_adapter(folder)


def test_the_base_weights_are_never_written(demo_model, loras):
    before = {k: v.clone() for k, v in demo_model.model.state_dict().items()}
    answers(adapt(demo_model, read_adapter(loras / "digits"), 2.0), HELD[:1])
    after = demo_model.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_resumed_windows_lists_and_constraints_run_with_the_adapter(demo_model, loras):
    from diffusiongemma.dgemma import Constraint, prepare, run_batch
    from diffusiongemma.dgemma.denoising.resume import Advanced

    adapted = adapt(demo_model, read_adapter(loras / "digits"), 1.0)
    ctx = encode_context(adapted, "a=3, b=4.")
    knobs = Knobs(seed=2, num_inference_steps=12, gen_length=64)
    whole = generate(adapted, "What is a+b?", knobs, context=ctx)
    first = generate(adapted, "What is a+b?", knobs, context=ctx, advanced=Advanced(end_step=1))
    rest = generate(adapted, "What is a+b?", knobs, context=ctx,
                    advanced=Advanced(start_step=first.state.resume.paused.step, resume=first.state.resume))
    assert rest.state.raw_ids == whole.state.raw_ids and rest.trace.entropy.tobytes() == whole.trace.entropy.tobytes()
    prompts = [f"What is {a}+{b}?" for a, b in HELD[:3]]
    batch = run_batch([prepare(adapted, p, DEMO_KNOBS) for p in prompts])
    assert [r.state.raw_ids for r in batch] == [generate(adapted, p, DEMO_KNOBS).state.raw_ids for p in prompts]
    constrained = generate(adapted, "What is 3+4?", DEMO_KNOBS, constraint=Constraint("choice", "7\nseven"))
    assert constrained.text == "7" and constrained.state.constraint["satisfied"]


def test_the_trace_heatmap_summary_and_live_header_name_the_adapters(demo_model, tmp_path):
    """The shipped demo adapter through the node under a fake ComfyUI: the start event, the trace's text, the
    heatmap's summary and a replayed run log name it and its strength; the plain model's show nothing extra."""
    import fakecomfy
    from executor import call

    from diffusiongemma.dgemma.readouts.heatmap import summary
    from diffusiongemma.dgemma.readouts.runlog import records, replay
    from diffusiongemma.nodes.sampler import DGemmaSampler

    knobs = dict(seed=5, num_inference_steps=48, t_min=0.4, t_max=0.8, entropy_bound=0.1, confidence=0.005,
                 gen_length=32, thinking=False)
    (adapted,) = DGemmaLoraLoader().load(demo_model, "diffusiongemma-demo-digits", 1.0)
    named = " + LoRA diffusiongemma-demo-digits @ 1"
    shown = {}
    for dm in (adapted, demo_model):
        with fakecomfy.installed(tmp_path) as comfy:
            (text, state, trace, frames, _, config), _ = call(DGemmaSampler, model=dm, prompt="What is 3+4?", **knobs)
            start = next(data for event, data, _ in comfy.events if event == "dgemma.start")
        log = replay(*(lambda rs: (rs[0], rs[1:-1]))(records(trace, config, state, frames)))
        shown[dm is adapted] = (text, start, str(trace), summary(trace), str(log), str(config))
    text, start, trace_text, heatmap_text, log_text, config_text = shown[True]
    assert text == "7" and start["adapters"] == named
    assert f"model{named}" in trace_text.splitlines() and f"model{named}" in heatmap_text.splitlines()
    assert f"model{named}" in log_text.splitlines() and named in config_text
    text, start, *texts = shown[False]
    assert text == "seven" and "adapters" not in start and not any("LoRA" in t for t in texts)
