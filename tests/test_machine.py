"""The machine a load plans on: ComfyUI's device by name (never index 0 by assumption), its free memory and its
freeing of room before a load; the model's size as ComfyUI counts it, each stored byte once."""

from __future__ import annotations

import fakecomfy
import pytest
import torch
from transformers import AutoConfig

from diffusiongemma.dgemma.loading import deviceplan, load, machine
from diffusiongemma.nodes import memory

GIB = 1 << 30


def plan_on(rec, folder, device: str = "auto", quant: str = "none"):
    """The tiny checkpoint's placement on the host ComfyUI names (nothing is loaded)."""
    config = AutoConfig.from_pretrained(folder)
    stored, per_dtype, shared, _ = load.stored_bytes(folder, str(folder), True, config)
    host, mode = machine.on_device(device) if device.startswith("cuda:") else (memory.host_machine(), device)
    return load.place(config, stored, per_dtype, shared, torch.float32, mode, quant, host)


def test_a_host_that_names_cuda_1_has_every_plan_on_cuda_1(tiny_dir, tmp_path):
    with fakecomfy.installed(tmp_path) as rec:
        rec.device, rec.vram = "cuda:1", (20 * GIB, 24 * GIB)
        host = memory.host_machine()
        assert host.accelerator == "cuda:1" and host.figures()["vram"] == 20 * GIB
        whole = plan_on(rec, tiny_dir)
        assert (whole.device, whole.device_map, whole.max_memory) == ("cuda:1", {"": 1}, None)
        assert rec.memory[-1][0] == "free" and rec.memory[-1][1].endswith("on cuda:1")  # room made there first
        config = AutoConfig.from_pretrained(tiny_dir)
        text = config.get_text_config(decoder=True)
        step = deviceplan.step_bytes(text, config.canvas_length, deviceplan.LOAD_CONTEXT)
        kept = deviceplan.kept_bytes(text, config.canvas_length)
        rec.vram = (deviceplan.CUDA_RESERVE + step + kept + whole.weight_bytes // 2, 24 * GIB)  # half fits: a split
        split = plan_on(rec, tiny_dir)
        assert split.device == "cuda:1" and split.device_map == "sequential" and set(split.max_memory) == {1, "cpu"}


def test_without_a_gpu_the_host_plans_on_the_cpu_and_frees_nothing(tiny_dir, tmp_path):
    with fakecomfy.installed(tmp_path) as rec:
        assert memory.host_machine().accelerator is None
        assert plan_on(rec, tiny_dir).device == "cpu" and not [m for m in rec.memory if m[0] == "free"]


def test_a_device_named_by_index_is_checked_and_planned_there(tiny_dir, monkeypatch):
    with pytest.raises(ValueError, match="cuda:3"):
        machine.on_device("cuda:3")  # this torch sees no such GPU
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    host, mode = machine.on_device("cuda:3")
    assert (host.accelerator, mode) == ("cuda:3", "cuda")
    plan = deviceplan.Plan("cuda", {"": 0}, None, 1)
    assert machine.bind(plan, host.accelerator).device_map == {"": 3}


def test_comfyui_counts_the_model_at_its_stored_bytes(tmp_path):
    """Tied encoder and decoder weights share storage: ComfyUI's own sum of the state dict counts them twice."""
    from diffusiongemma.dgemma import load_model
    from diffusiongemma.dgemma.demo import DEMO_DIR

    demo_model = load_model(str(DEMO_DIR))  # its own: the session's demo stays out of ComfyUI's stand-in
    model = demo_model.model
    state = model.state_dict()
    summed = sum(t.numel() * t.element_size() for t in state.values())
    unique = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in state.values()}
    unsaved = sum(b.nbytes for name, b in model.named_buffers() if name not in state)  # rotary tables: held too
    assert machine.held_bytes(model) == sum(unique.values()) + unsaved and summed > 1.5 * sum(unique.values())
    with fakecomfy.installed(tmp_path):
        memory.manage(demo_model)
        patcher = memory._held[demo_model].patcher
        assert patcher.size == machine.held_bytes(demo_model.model)


def test_outside_comfyui_memory_torch_keeps_cached_counts_as_free(monkeypatch):
    asked = []
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d: asked.append(d) or (5 * GIB, 24 * GIB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda d: 3 * GIB)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda d: 1 * GIB)
    gpu = torch.device("cuda:1")
    assert machine._torch_free(gpu) == 7 * GIB and machine._torch_total(gpu) == 24 * GIB
    assert asked == [gpu, gpu]  # the device asked about, never the current one by default


def test_what_a_graph_keeps_between_runs_is_in_the_plan(demo_model):
    """A KV context's payload and a paused run's Resume stay on the device between runs: the plan's kept bytes
    hold both, measured on real payloads of the demo."""
    from diffusiongemma.dgemma import Knobs, generate
    from diffusiongemma.dgemma.denoising.context import encode_context
    from diffusiongemma.dgemma.denoising.resume import Advanced

    context = encode_context(demo_model, "Remember: the answer is a number word. " * 8)
    paused = generate(demo_model, "What is 3+4?", Knobs(seed=1), context=context, advanced=Advanced(end_step=2))
    resume = paused.state.resume
    assert resume.paused is not None
    cache = context.cache
    kv = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    text = demo_model.model.config.get_text_config(decoder=True)
    element = next(demo_model.model.parameters()).element_size()  # the demo runs in float32 on the CPU
    kept = deviceplan.kept_bytes(text, demo_model.canvas_length, context.length, element)
    assert kv + resume.nbytes <= kept <= 1.1 * (kv + resume.nbytes), (kv, resume.nbytes, kept)
