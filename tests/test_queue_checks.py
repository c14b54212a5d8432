"""Every constant checked when the graph is queued (the on-prompt handler, before any model loads), every list and
string the pack builds bounded by name, and a linked INT range-checked at run time as its widget is."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest
from executor import call
from test_comfy_validation import CUSTOM, KNOB_VALUES, comfy_errors, queued_refusal

from diffusiongemma import NODE_CLASS_MAPPINGS as NODES
from diffusiongemma.dgemma.demo import DEMO_LORA_NAME, DEMO_NAME
from diffusiongemma.dgemma.errors import InputError
from diffusiongemma.nodes import queue_check
from diffusiongemma.nodes.join_texts import MAX_ITEMS, MAX_JOINED, MAX_SEPARATOR
from diffusiongemma.nodes.loader import HUB_IDS
from diffusiongemma.nodes.prompt_list import MAX_CHARS

DECIDE = {"prompt": "What colour?", "options": "red\ngreen", "samples": 8, **{
    n: KNOB_VALUES[n] for n in ("seed", "num_inference_steps", "t_min", "t_max", "entropy_bound", "confidence")}}


@pytest.mark.parametrize("options,says", [
    ("", "options is empty"), ("\n \n", "options is empty"), ("red\ngreen\nred", "'red' is given twice"),
    ("\n".join(f"o{i}" for i in range(300)), "options has 300 entries, over 256"),
    ("x" * 1001, "option 1 is 1001 characters, over 1000")])
def test_decide_options_are_refused_when_queued_before_any_model_loads(options, says):
    cls = NODES["DGemmaDecide"]
    assert comfy_errors(cls, {**DECIDE, "options": options}, linked=("model",)) == [(queue_check.QUEUED_CHECK, CUSTOM)]
    assert says in queued_refusal(cls, {**DECIDE, "options": options}, linked=("model",))
    assert queued_refusal(cls, DECIDE, linked=("model", "options")) is None
    assert queued_refusal(cls, DECIDE, linked=("model",)) is None
    said = queued_refusal(cls, {**DECIDE, "options": "a\nb", "t_min": 0.9, "t_max": 0.5}, linked=("model",))
    assert "t_min must not exceed t_max" in said


def test_decide_option_longer_than_the_canvas_is_refused_before_model_work(demo_model, no_model_work):
    with pytest.raises(InputError, match="tokens"):
        call(NODES["DGemmaDecide"], model=demo_model, **{**DECIDE, "options": "red\n" + "seven " * 40})


@pytest.mark.parametrize("inputs,says", [
    ({"url": "http://127.0.0.1:9/?api_key=abcdef123"}, "query string or fragment"),
    ({"url": "http://me:pw@127.0.0.1:9"}, "carries credentials"),
    ({"url": "ftp://127.0.0.1"}, "must be http://host:port"),
    ({"url": "http://127.0.0.1:9", "token_env": "HF_TOKEN"}, "not a variable this loader may read")])
def test_the_remote_loaders_url_and_token_env_are_refused_when_queued(inputs, says):
    cls = NODES["DGemmaRemoteLoader"]
    said = queued_refusal(cls, {"token_env": "", **inputs})
    assert said is not None and says in said and "abcdef123" not in said and "pw@" not in said
    assert queued_refusal(cls, {"url": "http://127.0.0.1:8190", "token_env": ""}) is None
    assert queued_refusal(cls, {}, linked=("url", "token_env")) is None


def test_encode_text_is_checked_when_queued():
    assert "lone surrogate" in queued_refusal(NODES["DGemmaEncode"], {"text": "a\ud800"}, linked=("model",))
    assert queued_refusal(NODES["DGemmaEncode"], {}, linked=("model", "text")) is None


def test_join_texts_bounds_items_separator_and_the_joined_size_before_building():
    cls, join = NODES["DGemmaJoinTexts"], NODES["DGemmaJoinTexts"]().join
    said = queued_refusal(cls, {"format": "separator", "separator": "x" * 10**6}, linked=("text",))
    assert f"over the limit of {MAX_SEPARATOR}" in said
    assert comfy_errors(cls, {"format": "csv", "separator": "\\n"}, linked=("text",)) == [
        ("format", "value_not_in_list")]  # ComfyUI's own choice check, once
    assert queued_refusal(cls, {"format": "separator"}, linked=("text", "separator")) is None
    assert cls.queue_refusal({"separator": ["x" * 10**6]}) is not None  # a list node's value, as it runs
    with pytest.raises(InputError, match=f"separator is 1000000 characters, over the limit of {MAX_SEPARATOR}"):
        join(["a"] * 10_000, ["separator"], ["x" * 10**6])  # linked: checked at run time, before building
    with pytest.raises(InputError, match=f"over the {MAX_ITEMS} one join takes"):
        join(["a"] * (MAX_ITEMS + 1), ["separator"], ["\\n"])
    with pytest.raises(InputError, match=f"over the limit of {MAX_JOINED}") as caught:
        join(["y" * 2**20] * 20, ["separator"], ["\\n"])
    assert caught.value.name == "text"
    assert join(["a", "b"], ["separator"], [", "]) == ("a, b",)


def test_a_prompt_list_is_bounded_in_characters_before_it_is_split():
    said = queued_refusal(NODES["DGemmaPromptList"], {"prompts": "x" * (MAX_CHARS + 1)})
    assert f"over the limit of {MAX_CHARS}" in said and "prompts" in said


@pytest.mark.parametrize("value", [257, 10**9, -1, 2.0, True])
def test_a_linked_max_batch_is_range_checked_at_run_time(demo_model, no_model_work, value):
    with pytest.raises(InputError, match="max_batch must be a whole number of items from 0 .automatic. to 256"):
        call(NODES["DGemmaSampler"], model=demo_model, prompt="What is 3+4?", **KNOB_VALUES, max_batch=value)


def test_a_json_join_counts_its_escapes_before_building():
    join = NODES["DGemmaJoinTexts"]().join
    with pytest.raises(InputError, match=f"over the limit of {MAX_JOINED}"):
        join(["\0" * 2**20] * 4, ["json"], ["\\n"])  # 4 Mi characters, 24 Mi once escaped
    assert join(["a", "b"], ["json"], ["\\n"]) == ('[\n "a",\n "b"\n]',)


@pytest.mark.parametrize("node", ["DGemmaDenoise", "DGemmaSamplerAdvanced"])
@pytest.mark.parametrize("kind,text,says", [
    ("json_schema", "{not json", "not valid JSON"), ("regex", "a\0b", "NUL character"),
    ("json_schema", '{"$ref": "#"}', "is recursive"), ("choice", " \n ", "choice list is empty"),
    ("grammar", "x", "constraint_type must be one of")])
def test_a_constraint_widget_is_refused_when_queued(node, kind, text, says):
    cls = NODES[node]
    inputs = {"constraint_type": kind, "constraint": text}
    if kind == "grammar":  # not a choice of the widget: ComfyUI's own check refuses it, once
        assert comfy_errors(cls, inputs) == [("constraint_type", "value_not_in_list")]
        assert says in cls.queue_refusal(inputs)
    else:
        said = queued_refusal(cls, inputs)
        assert said is not None and says in said, said
    assert queued_refusal(cls, {"constraint_type": "regex", "constraint": "seven|eight"}) is None
    assert queued_refusal(cls, {"constraint_type": "regex"}, linked=("constraint",)) is None  # checked when it runs
    assert queued_refusal(cls, {"constraint": "{not json"}, linked=("constraint_type",)) is None


def decide_graph(options, model=DEMO_NAME, lora=False) -> dict:
    """An API prompt: DGemmaLoader (-> DGemmaLoraLoader) -> DGemmaDecide."""
    graph = {"1": {"class_type": "DGemmaLoader", "inputs": {"quant": "none", "model": model}}}
    if lora:
        graph["2"] = {"class_type": "DGemmaLoraLoader",
                      "inputs": {"model": ["1", 0], "lora": DEMO_LORA_NAME, "strength": 1.0}}
    graph["3"] = {"class_type": "DGemmaDecide",
                  "inputs": {**DECIDE, "model": ["2" if lora else "1", 0], "options": options}}
    return graph


@pytest.fixture
def no_weights(monkeypatch):
    """Loading any checkpoint's weights fails the test: the queued check reads the tokenizer alone."""
    from diffusiongemma.dgemma.loading import gguf_load
    from diffusiongemma.nodes import loader

    def refuse(*args, **kwargs):
        pytest.fail("weights were loaded while the prompt was checked")

    monkeypatch.setattr(loader, "load_model", refuse)
    monkeypatch.setattr(gguf_load, "load_gguf", refuse)


def queued_errors(graph: dict) -> list[tuple[str, str]]:
    """The Decide node's errors as ComfyUI reports them once the pack's on-prompt handler has run."""
    sent = queue_check.on_prompt(NODES)({"prompt": graph, "client_id": "x"})
    inputs = {n: v for n, v in sent["prompt"]["3"]["inputs"].items() if n != "model"}
    return comfy_errors(NODES["DGemmaDecide"], inputs, linked=("model",), handle=False)


@pytest.mark.parametrize("options,says,lora", [
    ("red\n" + "seven " * 40, "over the canvas of 32 positions", False),
    ("red\n" + "seven " * 40, "over the canvas of 32 positions", True),
    ("red green\nred\u2581green", "are the same tokens for this model", False)])
def test_decide_options_against_the_canvas_are_refused_when_queued(no_weights, options, says, lora):
    graph = decide_graph(options, lora=lora)
    errors = queued_errors(graph)
    said = graph["3"]["inputs"][queue_check.QUEUED_CHECK]
    assert says in said and said.startswith("option")
    assert errors == [(queue_check.QUEUED_CHECK, CUSTOM)]  # listed once
    assert NODES["DGemmaDecide"].VALIDATE_INPUTS(queued_check=said) == said


def test_a_gguf_checkpoint_is_checked_from_its_metadata(no_weights, tmp_path, monkeypatch):
    pytest.importorskip("gguf")
    shutil.copy(Path(__file__).parent / "fixtures" / "gguf" / "demo-Q8_0.gguf", tmp_path / "demo.gguf")
    monkeypatch.setenv("DGEMMA_MODELS_DIR", str(tmp_path))
    graph = decide_graph("red\n" + "seven " * 40, model="demo.gguf")
    queue_check.check_prompt(graph, NODES)
    assert "over the canvas of 32 positions" in graph["3"]["inputs"][queue_check.QUEUED_CHECK]


LONG = "red\n" + "seven " * 40


@pytest.mark.parametrize("options,change", [
    ("red\ngreen", lambda g: None),  # options that fit
    (LONG, lambda g: g["3"]["inputs"].update(options=["9", 0])),  # linked: checked when the node runs
    (LONG, lambda g: g["1"]["inputs"].update(model="no-such-model")),  # the Loader refuses it when it runs
    (LONG, lambda g: g["1"]["inputs"].update(model=HUB_IDS[0])),  # a hub id: not read before it downloads
    (LONG, lambda g: g["1"].update(class_type="DGemmaRemoteLoader", inputs={"url": "http://127.0.0.1:9"})),
    (LONG, lambda g: g["3"]["inputs"].update(model=["3", 0]))])  # a cycle: ComfyUI refuses it itself
def test_a_prompt_that_fits_or_that_the_check_cannot_resolve_is_unchanged(no_weights, options, change):
    graph = decide_graph(options)
    change(graph)
    before = copy.deepcopy(graph)
    queue_check.on_prompt(NODES)({"prompt": graph})
    assert graph == before
