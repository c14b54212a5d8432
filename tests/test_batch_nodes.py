"""A list of prompts into a sampler node: one batch, per-item outputs exactly as item-by-item calls give them."""

from __future__ import annotations

import json

import fakecomfy
import pytest
import torch
from executor import call
from test_nodes import shown

from diffusiongemma import NODE_CLASS_MAPPINGS
from diffusiongemma.runner.execute import run_graph

Sampler, Denoise, Encode, Advanced, PromptList = (NODE_CLASS_MAPPINGS[n] for n in (
    "DGemmaSampler", "DGemmaDenoise", "DGemmaEncode", "DGemmaSamplerAdvanced", "DGemmaPromptList"))
KNOBS = dict(seed=3, num_inference_steps=12, t_min=0.4, t_max=0.8, entropy_bound=0.1, confidence=0.005,
             gen_length=32, thinking=False)
PROMPTS = ["What is 2+2?", "Name a colour.", "What is 13+29?", "Hi"]


def assert_item(listed, i, one, frames_before):
    """Item i of a list call equals the single call `one`; frames are every item's, in order."""
    text, state, trace, frames, images, config = listed[:6]
    assert text[i] == one[0] and state[i] == one[1] and config[i] == one[5]
    assert (trace[i].ids == one[2].ids).all() and (trace[i].committed_bits == one[2].committed_bits).all()
    assert frames[frames_before:frames_before + len(one[3])] == one[3]
    assert torch.equal(images[i], one[4])


def test_a_prompt_list_runs_as_one_batch_and_each_item_is_its_single_run(tmp_path, demo_model, monkeypatch):
    seeds = [3, 4, 5, 6]
    with fakecomfy.installed(tmp_path) as comfy:
        listed, _ = call(Sampler, model=demo_model, prompt=PROMPTS, **{**KNOBS, "seed": seeds})
        comfy.registry.finish_progress("17")
        events = list(comfy.events)
    singles = [call(Sampler, model=demo_model, prompt=p, **{**KNOBS, "seed": s})[0] for p, s in zip(PROMPTS, seeds)]
    assert all(len(v) == 4 for k, v in enumerate(listed) if k != 3)
    at = 0
    for i, one in enumerate(singles):
        assert_item(listed, i, one, at)
        at += len(one[3])
    assert len(listed[3]) == at
    kinds = [e for e, _, _ in events]
    assert kinds.count("dgemma.start") == 1 and kinds.count("dgemma.done") == 1
    start, steps, done = events[0][1], [d for e, d, _ in events if e == "dgemma.step"], events[-1][1]
    assert start["items"] == 4 and [r["steps"] for r in start["rows"]] == [12] * 4
    assert sorted({s["item"] for s in steps}) == [0, 1, 2, 3] and steps[0]["settled"] == {}
    assert len(steps) == sum(s[1].steps_used for s in singles)
    told = [item for s in steps for item in s["settled"]]  # each settled item told once, with its steps
    assert len(told) == len(set(told)) >= 1
    for s in steps:
        for item, used in s["settled"].items():
            assert used == singles[int(item)][1].steps_used
    assert [d["text"] for d in done["items"]] == [s[0] for s in singles]
    assert {"item", "items", "settled"}.isdisjoint(single_events(tmp_path, demo_model)[1])


def single_events(tmp_path, dm):
    with fakecomfy.installed(tmp_path) as comfy:
        call(Sampler, model=dm, prompt="What is 2+2?", **KNOBS)
    return [d for _, d, _ in comfy.events]


def test_progress_text_counts_the_settled_items(tmp_path, demo_model, monkeypatch):
    from diffusiongemma.nodes import host

    monkeypatch.setattr(host.ProgressText, "every", 0.0)
    with fakecomfy.installed(tmp_path) as comfy:
        call(Sampler, model=demo_model, prompt=PROMPTS[:2], **{**KNOBS, "gen_length": [32, 96]})
        comfy.registry.finish_progress("17")
    texts = [shown(t) for _, t in comfy.text]
    assert texts[0].startswith("0 of 2 items settled · item ")
    assert any(t.startswith("1 of 2 items settled") for t in texts)
    assert texts[-1].startswith("done · 2 items settled")


def test_denoise_and_advanced_lists_on_contexts_and_pins(demo_model):
    (short,), _ = call(Encode, model=demo_model, text="Numbers are words.")
    (longer,), _ = call(Encode, model=demo_model, text="The answer follows. " * 12)
    listed, _ = call(Denoise, model=demo_model, prompt=PROMPTS[:3], kv_cache=[short, longer], **KNOBS)
    at = 0
    for i, (p, c) in enumerate(zip(PROMPTS[:3], [short, longer, longer])):
        one, _ = call(Denoise, model=demo_model, prompt=p, kv_cache=c, **KNOBS)
        assert_item(listed, i, one, at) and listed[6][i].token_ids == one[6].token_ids
        at += len(one[3])
    window = dict(KNOBS, scheduler="entropy_bound", start_step=0, end_step=1024)
    pins = ["The answer is ___.", "", "0: Seven"]
    listed, _ = call(Advanced, model=demo_model, prompt=PROMPTS[:3], pins=pins, **window)
    at = 0
    for i, (p, pin) in enumerate(zip(PROMPTS[:3], pins)):
        one, _ = call(Advanced, model=demo_model, prompt=p, pins=pin, **window)
        assert_item(listed, i, one, at)
        at += len(one[3])


def test_a_bad_item_is_refused_by_its_index_before_any_work(tmp_path, demo_model, no_model_work):
    with fakecomfy.installed(tmp_path) as comfy:
        with pytest.raises(ValueError, match=r"list item 2 of 3: prompt is empty"):
            call(Sampler, model=demo_model, prompt=["Hi", "Hello", "  "], **KNOBS)
        with pytest.raises(ValueError, match=r"list item 1 of 2: .*end_step"):
            call(Advanced, model=demo_model, prompt="Hi", pins="", scheduler="entropy_bound",
                 start_step=[0, 5], end_step=[1024, 5], **KNOBS)
    assert comfy.events == []
    assert Advanced.queue_refusal({"pins": ["ok ___", "1: a\n1: b"]}) is not None


def test_interrupt_stops_the_whole_list_within_one_step(tmp_path, demo_model):
    with fakecomfy.installed(tmp_path) as comfy:
        comfy.interrupt_after_steps = 6  # two batched steps of three items
        with pytest.raises(fakecomfy.InterruptProcessingException):
            call(Sampler, model=demo_model, prompt=PROMPTS[:3], **{**KNOBS, "confidence": 0.0})
    assert len(comfy.steps()) == 6 and comfy.events[-1][1]["status"] == "interrupted"


def test_the_headless_runner_batches_a_prompt_list(demo_model, tmp_path, monkeypatch):
    monkeypatch.setenv("DGEMMA_OUTPUT_DIR", str(tmp_path))
    graph = {"1": {"class_type": "DGemmaLoader", "inputs": {"quant": "none"}},
             "2": {"class_type": "DGemmaPromptList", "inputs": {"prompts": "What is 2+2?\n\nName a colour.\n"}},
             "3": {"class_type": "DGemmaSampler", "inputs": {"model": ["1", 0], "prompt": ["2", 0], **KNOBS}},
             "4": {"class_type": "PreviewAny", "inputs": {"source": ["3", 0]}}}
    seen = run_graph(graph)
    shown = [t for t in seen["4"]["text"]]
    singles = [call(Sampler, model=demo_model, prompt=p, **KNOBS)[0][0] for p in ("What is 2+2?", "Name a colour.")]
    assert shown == singles
    with pytest.raises(ValueError, match="prompts is empty"):
        run_graph({**graph, "2": {"class_type": "DGemmaPromptList", "inputs": {"prompts": " \n"}}})


def test_advanced_lists_chain_windows_item_by_item(demo_model):
    window = dict(KNOBS, scheduler="entropy_bound", pins="", confidence=0.0)
    first, _ = call(Advanced, model=demo_model, prompt=PROMPTS[:3], start_step=0, end_step=4, **window)
    assert all(state.paused for state in first[1])
    second, _ = call(Advanced, model=demo_model, prompt=PROMPTS[:3], canvas_state=first[1], start_step=4,
                     end_step=1024, **window)
    whole, _ = call(Advanced, model=demo_model, prompt=PROMPTS[:3], start_step=0, end_step=1024, **window)
    assert second[0] == whole[0] and [s.raw_ids for s in second[1]] == [s.raw_ids for s in whole[1]]
    assert [len(t) for t in second[2]] == [len(t) for t in whole[2]]


def test_max_batch_bounds_how_many_items_share_a_forward(demo_model, monkeypatch):
    from diffusiongemma.dgemma.denoising import run as engine_run
    from diffusiongemma.dgemma.errors import InputError

    assert Sampler.INPUT_TYPES()["optional"]["max_batch"][1]["forceInput"]  # a socket: no template moves
    assert all("max_batch" in n.INPUT_TYPES()["optional"] for n in (Denoise, Advanced))
    sizes, batch = [], engine_run.run_batch

    def counting(requests, **kw):
        sizes.append((len(requests), kw.get("max_batch")))
        return batch(requests, **kw)

    monkeypatch.setattr("diffusiongemma.dgemma.backend.run_batch", counting)
    two, _ = call(Sampler, model=demo_model, prompt=PROMPTS[:3], max_batch=2, **KNOBS)
    auto, _ = call(Sampler, model=demo_model, prompt=PROMPTS[:3], **KNOBS)
    assert sizes == [(3, 2), (3, None)] and two[0] == auto[0] and two[1] == auto[1]
    with pytest.raises(InputError, match="max_batch"):
        call(Sampler, model=demo_model, prompt=PROMPTS[:3], max_batch=-1, **KNOBS)


@pytest.mark.parametrize("inputs, says", [
    (dict(prompt=["What is 2+2?"] * 10_001), "prompt is a list of 10001 items, over the 10000 one sampler runs"),
    (dict(prompt=["What is 2+2?"], seed=list(range(12_000))), "seed is a list of 12000 items, over the 10000"),
    (dict(prompt=[]), "prompt is an empty list: the node wired to it gave no items"),
    (dict(prompt=PROMPTS[:2], max_batch=[1, 2]), "max_batch is a list of 2 different values ([1, 2])"),
    (dict(prompt=["Hi", "x " * 20_000]), "list item 1 of 2: prompt is 40025 tokens, over the limit of 8192"),
])
def test_hostile_lists_are_refused_before_any_work(tmp_path, demo_model, no_model_work, inputs, says):
    with fakecomfy.installed(tmp_path) as comfy:
        with pytest.raises(ValueError) as err:
            call(Sampler, model=demo_model, **{**KNOBS, **inputs})
    assert says in str(err.value) and len(str(err.value)) < 500
    assert comfy.events == []
    with pytest.raises(ValueError, match="prompts has 10001 lines, over 10000"):
        call(PromptList, prompts="What is 2+2?\n" * 10_001)


def test_one_max_batch_repeated_over_a_list_is_that_value(demo_model):
    listed, _ = call(Sampler, model=demo_model, prompt=PROMPTS[:2], max_batch=[1, 1], **KNOBS)
    assert listed[0] == call(Sampler, model=demo_model, prompt=PROMPTS[:2], **KNOBS)[0][0]


def test_join_texts_shows_every_answer_of_a_list(demo_model):
    from diffusiongemma.dgemma.errors import InputError
    from diffusiongemma.nodes.join_texts import DGemmaJoinTexts, join_texts
    from diffusiongemma.runner.core_nodes import PreviewAny
    from diffusiongemma.runner.execute import call_node

    (texts, *_), _ = call(Sampler, model=demo_model, prompt=PROMPTS, **KNOBS)
    (joined,), _ = call(DGemmaJoinTexts, text=texts, format="json", separator="")
    _, ui = call_node(PreviewAny, {"source": joined})  # what Preview as Text shows
    answers = [call(Sampler, model=demo_model, prompt=p, **KNOBS)[0][0] for p in PROMPTS]
    assert len(ui["text"]) == 1 and json.loads(ui["text"][0]) == answers  # one preview holds them all
    (joined,), _ = call(DGemmaJoinTexts, text=["a", "b\nc"], format="separator", separator=" | ")
    assert joined == "a | b\nc" and join_texts(["a", "b"]) == "a\n\nb"
    assert join_texts(["a", "b\nc"], "numbered") == "1. a\n2. b c"
    with pytest.raises(InputError, match="list item 1 is a int"):
        join_texts(["a", 3])
    with pytest.raises(InputError, match="format must be one of"):
        join_texts(["a"], "yaml")
