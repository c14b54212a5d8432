"""The loaded model in ComfyUI's model management, and the Loader's after_run policy (fake host)."""

from __future__ import annotations

import fakecomfy
import pytest
import torch
from executor import call

from diffusiongemma import NODE_CLASS_MAPPINGS
from diffusiongemma.nodes import memory
from diffusiongemma.runner.execute import run_graph

Loader, Sampler, Encode, Advanced = (NODE_CLASS_MAPPINGS[n] for n in ("DGemmaLoader", "DGemmaSampler",
                                                                       "DGemmaEncode", "DGemmaSamplerAdvanced"))
KNOBS = dict(seed=5, num_inference_steps=48, t_min=0.4, t_max=0.8, entropy_bound=0.1, confidence=0.005,
             gen_length=32, thinking=False)
ASK = "What is 3+4?"


def _load(after_run):
    (dm,), _ = call(Loader, quant="none", model="diffusiongemma-demo", after_run=after_run)
    return dm


def _managed(comfy):
    import sys

    return [p.model.inner for p in sys.modules["comfy.model_management"].loaded_models()]


def test_the_loaded_model_is_one_of_comfyuis_loaded_models_and_comes_back_after_being_pushed_off(tmp_path):
    with fakecomfy.installed(tmp_path) as comfy:
        dm = _load("keep")
        assert _managed(comfy) == [dm.model] and comfy.memory == [("load", "DiffusionGemmaWeights")]
        (first, *_), _ = call(Sampler, model=dm, prompt=ASK, **KNOBS)
        assert comfy.memory == [("load", "DiffusionGemmaWeights")]  # keep: nothing moves after the run
        import sys

        sys.modules["comfy.model_management"].free_memory(1e30, dm.model.device)  # an image model needs VRAM
        assert _managed(comfy) == [] and comfy.memory[-1] == ("unload", "DiffusionGemmaWeights")
        (again, *_), _ = call(Sampler, model=dm, prompt=ASK, **KNOBS)
        assert _managed(comfy) == [dm.model] and comfy.memory[-1] == ("load", "DiffusionGemmaWeights")
        assert again == first == "seven"


@pytest.mark.parametrize("after_run", ["offload to CPU", "unload"])
def test_after_run_waits_for_the_last_item_of_a_list_run(tmp_path, after_run):
    with fakecomfy.installed(tmp_path) as comfy:
        dm = _load(after_run)
        texts = []
        for _item in range(3):  # ComfyUI calls the node once per list item, then finishes the node
            (text, *_), _ = call(Sampler, model=dm, prompt=ASK, **KNOBS)
            texts.append(text)
            assert _managed(comfy) == [dm.model] and comfy.memory == [("load", "DiffusionGemmaWeights")]
            assert all(p.device.type == "cpu" for p in dm.model.parameters())
        comfy.registry.finish_progress("16")  # another node finishing changes nothing
        assert _managed(comfy) == [dm.model]
        comfy.registry.finish_progress("17")  # the Sampler (UNIQUE_ID 17) finished its list
        assert _managed(comfy) == [] and comfy.memory[-1] == ("unload", "DiffusionGemmaWeights")
        on_meta = all(p.device.type == "meta" for p in dm.model.parameters())
        assert on_meta == (after_run == "unload")  # unload frees RAM too; offload keeps the weights in RAM
        (text, *_), _ = call(Sampler, model=dm, prompt=ASK, **KNOBS)  # the next run brings them back
        assert _managed(comfy) == [dm.model] and comfy.memory[-1] == ("load", "DiffusionGemmaWeights")
        assert texts == [text] * 3 == ["seven"] * 3
        assert not any(p.device.type == "meta" for p in dm.model.parameters())


@pytest.mark.parametrize("after_run", ["offload to CPU", "unload"])
def test_a_lora_view_runs_again_with_the_same_tokens_after_the_policy(tmp_path, after_run):
    """The shipped demo adapter over a model the policy offloaded or unloaded: its hooks stay on the same
    modules, which get their weights back, so the adapted payload and the plain one answer as before."""
    with fakecomfy.installed(tmp_path) as comfy:
        dm = _load(after_run)
        (adapted,), _ = call(NODE_CLASS_MAPPINGS["DGemmaLoraLoader"], model=dm, lora="diffusiongemma-demo-digits",
                             strength=1.0)
        runs = []
        for _ in range(2):
            (text, state, *_), _ = call(Sampler, model=adapted, prompt=ASK, **KNOBS)
            (plain, *_), _ = call(Sampler, model=dm, prompt=ASK, **KNOBS)
            comfy.registry.finish_progress("17")  # the node ends: the policy applies
            assert _managed(comfy) == [] and comfy.memory[-1] == ("unload", "DiffusionGemmaWeights")
            on_meta = all(p.device.type == "meta" for p in dm.model.parameters())
            assert on_meta == (after_run == "unload")
            runs.append((text, state.raw_ids, plain))
        assert runs[0] == runs[1] and runs[0][0] == "7" and runs[0][2] == "seven"


def test_a_failed_run_applies_the_policy_at_once(tmp_path):
    with fakecomfy.installed(tmp_path) as comfy:
        dm = _load("offload to CPU")
        comfy.interrupt_after_steps = 2
        with pytest.raises(fakecomfy.InterruptProcessingException):
            call(Sampler, model=dm, prompt=ASK, **KNOBS)
        assert _managed(comfy) == []
        (text, *_), _ = call(Sampler, model=dm, prompt=ASK, **KNOBS)
        assert text == "seven" and _managed(comfy) == [dm.model]


def test_a_paused_window_keeps_the_model_for_the_window_that_resumes_it(tmp_path):
    with fakecomfy.installed(tmp_path) as comfy:
        dm = _load("offload to CPU")
        window = dict(KNOBS, scheduler="entropy_bound", pins="", confidence=0.0)
        (_, state, *_), _ = call(Advanced, model=dm, prompt=ASK, start_step=0, end_step=6, **window)
        comfy.registry.finish_progress("17")
        assert state.paused and _managed(comfy) == [dm.model]
        (text, state, *_), _ = call(Advanced, model=dm, prompt=ASK, start_step=6, end_step=1024, canvas_state=state,
                                    **window)
        comfy.registry.finish_progress("17")
        assert not state.paused and text == "seven" and _managed(comfy) == []


def test_encode_takes_part_too(tmp_path):
    with fakecomfy.installed(tmp_path) as comfy:
        dm = _load("offload to CPU")
        call(Encode, model=dm, text="a=3, b=4.")
        comfy.registry.finish_progress("17")
        assert _managed(comfy) == []


def test_unload_without_comfyui_reloads_the_same_weights(demo_model):
    dm = _load("unload")
    before = {n: t.clone() for n, t in dm.model.state_dict().items()}
    (text, *_), _ = call(Sampler, model=dm, prompt=ASK, **KNOBS)  # no executor: the call is the node
    assert all(p.device.type == "meta" for p in dm.model.parameters())
    memory.model_ready(dm)  # what the next run does first
    after = dm.model.state_dict()
    assert all(torch.equal(before[n], after[n]) for n in before)
    (again, *_), _ = call(Sampler, model=dm, prompt=ASK, **KNOBS)
    assert text == again == "seven"


def test_headless_runner_applies_the_policy_after_the_node_not_per_item(tmp_path, monkeypatch):
    monkeypatch.setenv("DGEMMA_OUTPUT_DIR", str(tmp_path))
    graph = {"1": {"class_type": "DGemmaLoader", "inputs": {"quant": "none", "after_run": "unload"}},
             "2": {"class_type": "DGemmaSampler", "inputs": {"model": ["1", 0], "prompt": ASK, **KNOBS}},
             "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 0]}}}
    seen = []
    monkeypatch.setattr(memory, "_after_run", lambda dm, held: seen.append(held.after_run))
    assert run_graph(graph)["3"]["text"] == ["seven"] and seen == ["unload"]


def test_after_run_is_refused_by_name():
    with pytest.raises(ValueError, match="after_run"):
        call(Loader, quant="none", model="diffusiongemma-demo", after_run="sometimes")
