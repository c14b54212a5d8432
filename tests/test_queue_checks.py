"""Every constant checked when the graph is queued (VALIDATE_INPUTS, before any model loads), every list and
string the pack builds bounded by name, and a linked INT range-checked at run time as its widget is."""

from __future__ import annotations

import pytest
from executor import call
from test_comfy_validation import KNOB_VALUES, comfy_errors

from diffusiongemma import NODE_CLASS_MAPPINGS as NODES
from diffusiongemma.dgemma.errors import InputError
from diffusiongemma.nodes.join_texts import MAX_ITEMS, MAX_JOINED, MAX_SEPARATOR
from diffusiongemma.nodes.prompt_list import MAX_CHARS

DECIDE = {"prompt": "What colour?", "options": "red\ngreen", "samples": 8, **{
    n: KNOB_VALUES[n] for n in ("seed", "num_inference_steps", "t_min", "t_max", "entropy_bound", "confidence")}}


@pytest.mark.parametrize("options,says", [
    ("", "options is empty"), ("\n \n", "options is empty"), ("red\ngreen\nred", "'red' is given twice"),
    ("\n".join(f"o{i}" for i in range(300)), "options has 300 entries, over 256"),
    ("x" * 1001, "option 1 is 1001 characters, over 1000")])
def test_decide_options_are_refused_when_queued_before_any_model_loads(options, says):
    cls = NODES["DGemmaDecide"]
    assert ("options", "custom_validation_failed") in comfy_errors(cls, {**DECIDE, "options": options})
    assert says in cls.VALIDATE_INPUTS(options=options)
    assert cls.VALIDATE_INPUTS(options=None) is True and cls.VALIDATE_INPUTS(options="red\ngreen") is True
    assert "t_min must not exceed t_max" in cls.VALIDATE_INPUTS(options="a\nb", t_min=0.9, t_max=0.5)


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
    said = cls.VALIDATE_INPUTS(**{"token_env": "", **inputs})
    assert said is not True and says in said and "abcdef123" not in said and "pw@" not in said
    assert cls.VALIDATE_INPUTS(url="http://127.0.0.1:8190", token_env="") is True
    assert cls.VALIDATE_INPUTS(url=None, token_env=None) is True


def test_encode_text_is_checked_when_queued():
    assert "lone surrogate" in NODES["DGemmaEncode"].VALIDATE_INPUTS(text="a\ud800")
    assert NODES["DGemmaEncode"].VALIDATE_INPUTS(text=None) is True


def test_join_texts_bounds_items_separator_and_the_joined_size_before_building():
    cls, join = NODES["DGemmaJoinTexts"], NODES["DGemmaJoinTexts"]().join
    assert f"over the limit of {MAX_SEPARATOR}" in cls.VALIDATE_INPUTS(format=["separator"], separator=["x" * 10**6])
    assert "format must be one of" in cls.VALIDATE_INPUTS(format=["csv"], separator=["\\n"])
    assert cls.VALIDATE_INPUTS(format=["separator"], separator=(None,)) is True
    with pytest.raises(InputError, match=f"separator is 1000000 characters, over the limit of {MAX_SEPARATOR}"):
        join(["a"] * 10_000, ["separator"], ["x" * 10**6])  # linked: checked at run time, before building
    with pytest.raises(InputError, match=f"over the {MAX_ITEMS} one join takes"):
        join(["a"] * (MAX_ITEMS + 1), ["separator"], ["\\n"])
    with pytest.raises(InputError, match=f"over the limit of {MAX_JOINED}") as caught:
        join(["y" * 2**20] * 20, ["separator"], ["\\n"])
    assert caught.value.name == "text"
    assert join(["a", "b"], ["separator"], [", "]) == ("a, b",)


def test_a_prompt_list_is_bounded_in_characters_before_it_is_split():
    said = NODES["DGemmaPromptList"].VALIDATE_INPUTS(prompts="x" * (MAX_CHARS + 1))
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
    check = NODES[node].VALIDATE_INPUTS
    said = check(constraint_type=[kind], constraint=[text])
    assert said is not True and says in said, said
    assert check(constraint_type=["regex"], constraint=["seven|eight"]) is True
    assert check(constraint_type=["regex"], constraint=(None,)) is True  # linked: checked when the node runs
    assert check(constraint_type=(None,), constraint=["{not json"]) is True
