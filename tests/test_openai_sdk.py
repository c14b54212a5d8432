"""The real `openai` SDK against a real `python -m serve` on the demo: every field the server honours does
what it says, and every field it does not implement is refused by name (or, with --lenient, warned about)."""

from __future__ import annotations

import json
from typing import Literal

import jsonschema
import openai
import pytest
from pydantic import BaseModel
from remote_server import served
from serve_client import health

from diffusiongemma.dgemma.demo import WORDS
from diffusiongemma.dgemma.inputs.tokens import prompt_ids
from diffusiongemma.testing.schemas import SUM

MODEL = "diffusiongemma-demo"
ASK = [{"role": "user", "content": "What is 3+4?"}]


class Sum(BaseModel):
    sum: Literal[WORDS]  # type: ignore[valid-type]


@pytest.fixture(scope="module")
def server():
    with served() as (url, _):
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)


def ask(client, **fields):
    return client.chat.completions.create(model=fields.pop("model", MODEL), messages=fields.pop("messages", ASK),
                                          **fields)


def test_a_plain_answer_counts_its_tokens_and_the_prompts(client, demo_model):
    answer = ask(client)
    assert answer.choices[0].message.content == "seven" and answer.choices[0].finish_reason == "stop"
    assert answer.usage.completion_tokens == 5 <= 8 and answer.model == MODEL
    assert answer.usage.prompt_tokens == len(prompt_ids(demo_model, "What is 3+4?", False))
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + 5
    assert answer.model_extra["timings"]["diffusion_canvas"] == 32  # the canvas stays in the pack's fields


def test_response_format_json_schema_gives_schema_valid_json(client):
    for seed in (0, 1):
        answer = ask(client, seed=seed, max_tokens=64, response_format={
            "type": "json_schema", "json_schema": {"name": "sum", "schema": SUM, "strict": True}})
        jsonschema.validate(json.loads(answer.choices[0].message.content), SUM)
        assert answer.choices[0].finish_reason == "stop"
    anything = ask(client, max_tokens=64, response_format={"type": "json_object"})
    assert isinstance(json.loads(anything.choices[0].message.content), dict)


def test_parse_fills_a_pydantic_model(client):
    parsed = client.chat.completions.parse(model=MODEL, messages=ASK, response_format=Sum, max_tokens=64)
    assert isinstance(parsed.choices[0].message.parsed, Sum) and parsed.choices[0].message.parsed.sum in WORDS


def test_vllm_structured_outputs_and_guided_fields(client):
    for seed in (0, 1, 2):
        content = ask(client, seed=seed, extra_body={"structured_outputs": {"choice": ["yes", "no"]}})
        assert content.choices[0].message.content in ("yes", "no")
    assert ask(client, extra_body={"guided_choice": ["six", "seven"]}).choices[0].message.content in ("six", "seven")
    regex = ask(client, extra_body={"structured_outputs": {"regex": "[0-9]{2}"}}).choices[0].message.content
    assert len(regex) == 2 and regex.isdigit()
    for body in ({"structured_outputs": {"json": SUM}}, {"guided_json": SUM}):
        jsonschema.validate(json.loads(ask(client, max_tokens=64, extra_body=body).choices[0].message.content), SUM)


def test_a_system_message_and_earlier_turns_are_answered(client):
    plain = ask(client)
    for messages in ([{"role": "system", "content": "Answer in words."}, *ASK],
                     [{"role": "developer", "content": "Answer in words."}, *ASK],
                     [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "four"}, *ASK]):
        answer = ask(client, messages=messages)
        assert isinstance(answer.choices[0].message.content, str) and answer.choices[0].finish_reason
        assert answer.usage.prompt_tokens > plain.usage.prompt_tokens
        assert answer.model_extra["dgemma"]["config"]["context"]["length"] == answer.usage.prompt_tokens


def test_n_choices_are_one_batch_with_seeds_seed_plus_i(client):
    many = ask(client, n=3, seed=5)
    assert [c.index for c in many.choices] == [0, 1, 2]
    for i, choice in enumerate(many.choices):
        solo = ask(client, seed=5 + i)
        assert choice.message.content == solo.choices[0].message.content
        assert choice.model_extra["dgemma"]["state"] == solo.model_extra["dgemma"]["state"] | {
            "run_id": choice.model_extra["dgemma"]["state"]["run_id"]}
    assert many.usage.completion_tokens == sum(ask(client, seed=5 + i).usage.completion_tokens for i in range(3))


def test_logprobs_give_each_answer_token_its_log_probability(client):
    answer = ask(client, logprobs=True, top_logprobs=3)
    content = answer.choices[0].logprobs.content
    assert "".join(t.token for t in content) == "seven" and len(content) == answer.usage.completion_tokens
    for token in content:
        assert token.logprob <= 0 and bytes(token.bytes).decode() == token.token and len(token.top_logprobs) == 3
        assert token.top_logprobs[0].logprob >= token.logprob
    assert ask(client).choices[0].logprobs is None


def test_stop_cuts_the_answer(client):
    answer = ask(client, stop=["ve", "zzz"])
    assert answer.choices[0].message.content == "se" and answer.choices[0].finish_reason == "stop"
    assert answer.usage.completion_tokens == 2
    assert ask(client, stop="x").choices[0].message.content == "seven"


def test_streaming_two_choices_each_with_its_frames(client):
    stream = ask(client, n=2, seed=3, stream=True, logprobs=True)
    text, frames, finish, usage = {0: "", 1: ""}, {0: 0, 1: 0}, {}, None
    for chunk in stream:  # the diffusion_frame chunks are ordinary chunks with an empty delta to the SDK
        extra = chunk.model_extra or {}
        for choice in chunk.choices:
            if extra.get("type") == "diffusion_frame":
                frames[choice.index] += 1
            text[choice.index] += choice.delta.content or ""
            if choice.finish_reason:
                finish[choice.index] = choice.finish_reason
        usage = chunk.usage or usage
    solo = [ask(client, seed=3 + i) for i in range(2)]
    assert text == {i: solo[i].choices[0].message.content for i in range(2)} and finish == {0: "stop", 1: "stop"}
    assert frames == {i: solo[i].model_extra["dgemma"]["state"]["steps_used"] for i in range(2)}
    assert usage.completion_tokens == sum(s.usage.completion_tokens for s in solo)
    with client.chat.completions.stream(model=MODEL, messages=ASK, n=2, seed=3, logprobs=True) as helper:
        final = helper.get_final_completion()  # the SDK's own accumulator: choices, logprobs and usage
    assert [c.message.content for c in final.choices] == [text[0], text[1]]
    assert final.usage.completion_tokens == usage.completion_tokens
    assert all(len(c.logprobs.content) == s.usage.completion_tokens for c, s in zip(final.choices, solo))


REFUSALS = [  # (fields, the field named, words of the message)
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools", "tool calling"),
    ({"tool_choice": "auto"}, "tool_choice", "tool calling"),
    ({"logit_bias": {"5": 10}}, "logit_bias", "token biases"),
    ({"presence_penalty": 0.5}, "presence_penalty", "penalties"),
    ({"frequency_penalty": 1.0}, "frequency_penalty", "penalties"),
    ({"temperature": 0.7}, "temperature", "dgemma.knobs.t_max"),
    ({"top_p": 0.9}, "top_p", "nucleus"),
    ({"reasoning_effort": "low"}, "reasoning_effort", "enable_thinking"),
    ({"extra_body": {"repetition_penalty": 1.1}}, "repetition_penalty", "not a chat completion field"),
    ({"top_logprobs": 2}, "top_logprobs", "needs logprobs"),
    ({"logprobs": True, "top_logprobs": 6}, "top_logprobs", "from 0 to 5"),
    ({"n": 17}, "n", "from 1 to 16"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "array", "uniqueItems": True}}}}, "response_format", "'uniqueItems'"),
    ({"extra_body": {"structured_outputs": {"grammar": "root ::= 'a'"}}}, "structured_outputs", "grammar"),
    ({"extra_body": {"guided_choice": ["a\nb"]}}, "guided_choice", "line break"),
    ({"extra_body": {"guided_choice": ["a"], "guided_regex": "b"}}, "guided_regex", "one constraint"),
    ({"messages": [*ASK, {"role": "tool", "content": "x", "tool_call_id": "1"}]}, "messages", "role 'tool'"),
    ({"messages": [{"role": "user", "content": "hi", "name": "ann"}]}, "messages", "participant's name"),
    ({"messages": [*ASK, {"role": "system", "content": "late"}]}, "messages", "messages[1] (role 'system')"),
]


def test_each_unimplemented_field_is_refused_by_name(client, server):
    before = health(server)["started"]
    for fields, name, words in REFUSALS:
        with pytest.raises(openai.BadRequestError) as err:
            ask(client, **fields)
        body = err.value.body
        assert err.value.status_code == 400 and body["param"] == name and words in body["message"], (fields, body)
        assert len(body["message"]) <= 600
    assert health(server)["started"] == before  # every refusal came before the queue
    with pytest.raises(openai.BadRequestError) as err:  # found when the run is prepared: still the field's name
        ask(client, max_tokens=8, extra_body={"guided_choice": ["a" * 40]})
    assert err.value.body["param"] == "guided_choice" and "41 tokens with its EOS" in err.value.body["message"]
    with pytest.raises(openai.NotFoundError) as err:
        ask(client, model="gpt-4o")
    assert err.value.body["code"] == "model_not_found" and MODEL in err.value.body["message"]


def test_no_op_values_and_meaningless_fields_are_accepted(client):
    answer = ask(client, presence_penalty=0, frequency_penalty=0.0, tools=[], tool_choice="none", top_p=1,
                 logit_bias={}, user="ann", metadata={"k": "v"}, store=False, parallel_tool_calls=False,
                 modalities=["text"], service_tier="auto", stream_options=None, seed=0)
    assert answer.choices[0].message.content == "seven"


def test_lenient_turns_the_refusals_into_a_warning_header():
    with served("--lenient") as (url, _):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=ASK, temperature=0.2, tools=[{"type": "function", "function": {"name": "f"}}])
        warning = raw.headers["x-dgemma-warning"]
        assert "temperature" in warning and "tools" in warning and raw.parse().choices[0].message.content == "seven"
        with pytest.raises(openai.BadRequestError):  # a bad value of an honoured field is still refused
            client.chat.completions.create(model=MODEL, messages=ASK, n=0)
