"""A GGUF model's memory: each weight dequantized once per use, its size as held, its plan, after_run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from diffusiongemma.dgemma import Knobs, generate
from diffusiongemma.dgemma.demo import DEMO_KNOBS

pytest.importorskip("gguf")
from diffusiongemma.dgemma.loading import gguf_load, gguf_modules  # noqa: E402
from diffusiongemma.dgemma.loading.held import DenseExperts  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "gguf"
F32, Q8, Q4 = (FIXTURES / f"demo-{k}.gguf" for k in ("f32", "Q8_0", "Q4_K_M"))


def _counting(monkeypatch):
    """GGUF tensor shape -> dense dequantizations of the whole tensor."""
    counts: dict[tuple, int] = {}
    real = gguf_modules.dequantize

    def counted(raw, qtype, shape, *args, **kwargs):
        counts[tuple(shape)] = counts.get(tuple(shape), 0) + 1
        return real(raw, qtype, shape, *args, **kwargs)

    monkeypatch.setattr(gguf_modules, "dequantize", counted)
    return counts


def test_the_embedding_is_held_dense_and_each_layers_experts_dequantized_once_per_forward(monkeypatch):
    dm = gguf_load.load_gguf(Q4)
    embedding = dm.model.model.decoder.embed_tokens.weight
    assert embedding is dm.model.lm_head.weight and embedding.dtype == torch.float32  # dense, tied, held once
    expert_calls = []
    every = [m for m in dm.model.modules() if isinstance(m, DenseExperts)]  # encoder's and decoder's
    for module in every:
        module.register_forward_hook(lambda *a: expert_calls.append(1))
    counts = _counting(monkeypatch)
    out = generate(dm, "What is 3+4?", DEMO_KNOBS)
    assert out.text == "seven" and expert_calls
    assert tuple(embedding.shape) not in counts  # never dequantized in a step
    assert counts[tuple(every[0].held_gate_up.shape)] == len(expert_calls)  # every layer's are of one shape
    assert all(w.held is None and w.scopes == 0 for w in dm.model.modules() if isinstance(w, gguf_modules.GGUFWeight))


def test_every_layers_experts_are_dequantized_into_one_scratch():
    dm = gguf_load.load_gguf(Q4)
    scratch = dict(dm.model.gguf_scratch.named_buffers())
    seen = []
    for module in dm.model.modules():
        if isinstance(module, DenseExperts):  # read inside the experts' forward, from what it holds
            module.act_fn.register_forward_hook(lambda *a, m=module: seen.append(m.held_gate_up.held.data_ptr()))
    generate(dm, "What is 3+4?", DEMO_KNOBS)
    assert len(seen) > 2 and set(seen) <= {b.data_ptr() for b in scratch.values()}
    assert dict(dm.model.gguf_scratch.named_buffers()) == scratch  # made at the load, never again


def test_a_forward_that_raises_drops_what_it_held():
    import threading

    dm = gguf_load.load_gguf(Q8)
    experts = dm.model.model.decoder.layers[0].experts
    weight = experts.held_gate_up

    def fail(*_):
        assert weight.held is not None  # raised inside the experts' forward, its weights held
        raise RuntimeError("stopped")

    experts.act_fn.register_forward_hook(fail)
    with pytest.raises(RuntimeError, match="stopped"):
        generate(dm, "What is 3+4?", DEMO_KNOBS)
    assert weight.held is None and weight.scopes == 0
    free = []
    other = threading.Thread(target=lambda: free.append(dm.model.gguf_scratch.lock.acquire(blocking=False)))
    other.start()
    other.join()
    assert free == [True]  # the scratch's lock was let go


def test_steps_read_the_same_as_before_holding(monkeypatch):
    """Holding changes no value: the f32 GGUF still matches a run whose every read dequantizes anew."""
    dm = gguf_load.load_gguf(F32)
    knobs = Knobs(**{**DEMO_KNOBS.asdict(), "seed": 4})
    held = generate(dm, "What is 5+8?", knobs)
    monkeypatch.setattr(gguf_modules.GGUFWeight, "open_scope", lambda self: None)
    fresh = generate(dm, "What is 5+8?", knobs)
    assert held.text == fresh.text
    for field in ("ids", "entropy", "committed"):
        assert np.array_equal(getattr(held.trace, field), getattr(fresh.trace, field))


def test_held_bytes_count_each_tie_once_and_blocks_as_stored():
    from diffusiongemma.dgemma.loading import gguf_file, gguf_plan
    from diffusiongemma.dgemma.loading.machine import held_bytes

    for path in (F32, Q4):
        dm = gguf_load.load_gguf(path)
        blocks = sum({id(m.blocks): m.blocks.nbytes for m in dm.model.modules()
                      if isinstance(m, gguf_modules.GGUFWeight)}.values())  # each block tensor once
        plain = sum(p.nbytes for p in dm.model.parameters()) + sum(
            b.nbytes for n, b in dm.model.named_buffers() if n.endswith("layer_scalar"))
        computed = {n: b for n, b in dm.model.named_buffers() if not n.endswith(("blocks", "layer_scalar"))}
        assert held_bytes(dm.model) == blocks + plain + sum(b.untyped_storage().nbytes() for b in computed.values())
        g = gguf_file.read(path)
        plan = gguf_load.tensor_plan(g, gguf_load.skeleton(dm.model.config))
        scratch = sum(b.nbytes for b in dm.model.gguf_scratch.buffers())
        assert gguf_plan.held_bytes(plan, torch.float32) == blocks + plain + scratch  # the plan's figure is the load's
        state = sum(t.nbytes for t in dm.model.state_dict().values())
        assert held_bytes(dm.model) < state  # the state dict lists each tie again


def test_a_gguf_that_does_not_fit_is_refused_with_the_routes_before_allocation(monkeypatch):
    from diffusiongemma.dgemma import load_model
    from diffusiongemma.dgemma.loading import deviceplan, preflight

    monkeypatch.setattr(preflight, "free_ram", lambda: 64 * 2**20)
    monkeypatch.setattr(gguf_load, "_blocks", lambda *a: pytest.fail("allocated"))
    with pytest.raises(deviceplan.Refusal) as refused:
        load_model(str(Q4), quant="gguf", device="cpu")
    assert "the GGUF model needs" in str(refused.value) and "what works on this machine" in str(refused.value)
    assert [r.quant for r in refused.value.routes] == ["remote"]


def test_a_gguf_that_fits_a_card_goes_there_and_is_told_it_cannot_be_split(monkeypatch):
    from diffusiongemma.dgemma.loading import deviceplan, gguf_config, gguf_file, gguf_plan, machine, preflight

    g = gguf_file.read(Q4)
    config = gguf_config.model_config(g)
    plan = gguf_load.tensor_plan(g, gguf_load.skeleton(config))
    need = gguf_plan.need(plan, config.text_config, config.canvas_length, torch.bfloat16)
    card = need.peak + deviceplan.CUDA_RESERVE
    monkeypatch.setattr(preflight, "free_ram", lambda: 64 * 2**30)
    host = machine.Machine("cuda:1", lambda d: card, lambda d: card)  # a second card: nothing assumes the first
    assert gguf_plan.place(plan, config, "auto", "auto", host) == ("cuda:1", torch.bfloat16)
    assert gguf_plan.place(plan, config, "cpu", "auto", host) == ("cpu", torch.float32)
    host = machine.Machine("cuda:1", lambda d: card - 1, lambda d: card)
    with pytest.raises(deviceplan.Refusal) as refused:
        gguf_plan.place(plan, config, "auto", "auto", host)
    text = str(refused.value)
    assert "GGUF model cannot be split between GPU and CPU" in text and "quant gguf with device cpu" in text


def _in_models_folder(comfy, name):
    import shutil

    from diffusiongemma.nodes import host

    folder = comfy.models_dir / host.MODEL_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy(FIXTURES / name, folder / name)
    host.register_model_folder()


@pytest.mark.parametrize("after_run", ["keep", "offload to CPU", "unload"])
def test_comfyui_holds_a_gguf_model_at_its_held_size_and_after_run_applies(tmp_path, after_run):
    import sys

    import fakecomfy
    from executor import call

    from diffusiongemma import NODE_CLASS_MAPPINGS
    from diffusiongemma.dgemma.loading.machine import held_bytes

    loader, sampler = NODE_CLASS_MAPPINGS["DGemmaLoader"], NODE_CLASS_MAPPINGS["DGemmaSampler"]
    knobs = dict(seed=5, num_inference_steps=48, t_min=0.4, t_max=0.8, entropy_bound=0.1, confidence=0.005,
                 gen_length=32, thinking=False)
    with fakecomfy.installed(tmp_path) as comfy:
        _in_models_folder(comfy, "demo-Q4_K_M.gguf")
        (dm,), _ = call(loader, quant="auto", model="demo-Q4_K_M.gguf", after_run=after_run)
        mm = sys.modules["comfy.model_management"]
        (patcher,) = [loaded.model for loaded in mm.current_loaded_models]
        assert dm.quant == "gguf" and patcher.model.inner is dm.model
        assert patcher.model_size() == held_bytes(dm.model) < Q4.stat().st_size * 2
        (first, *_), _ = call(sampler, model=dm, prompt="What is 3+4?", **knobs)
        comfy.registry.finish_progress("17")
        left = [loaded.model for loaded in mm.current_loaded_models]
        assert left == ([patcher] if after_run == "keep" else [])
        on_meta = all(b.device.type == "meta" for b in dm.model.buffers() if b.dtype == torch.uint8)
        assert on_meta == (after_run == "unload")  # unload frees the blocks; offload keeps them in RAM
        (again, *_), _ = call(sampler, model=dm, prompt="What is 3+4?", **knobs)
        assert first == again == "seven" and [loaded.model for loaded in mm.current_loaded_models] == [patcher]
        assert not any(t.is_meta for t in [*dm.model.parameters(), *dm.model.buffers()])


def test_the_run_log_shows_the_gguf_sampler_defaults_as_the_checkpoints(demo_model):
    from diffusiongemma.dgemma.readouts import runlog

    dm = gguf_load.load_gguf(Q8)
    ours, theirs = (generate(m, "What is 3+4?", DEMO_KNOBS) for m in (dm, demo_model))
    expected = {"num_inference_steps": 48, "t_max": 0.8, "t_min": 0.4, "entropy_bound": 0.1, "confidence": 0.005,
                "stability_threshold": 1, "canvas_length": 32}
    assert ours.config.model_defaults == theirs.config.model_defaults == expected
    header = runlog.records(ours.trace, ours.config, ours.state, [""] * len(ours.trace))[0]
    assert header["model_defaults"] == expected
    assert ("model defaults: 48 steps · T_max 0.8 · T_min 0.4 · entropy_bound 0.1 · confidence 0.005 · "
            "stability 1 · canvas 32") in str(ours.config)
