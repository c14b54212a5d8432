"""A conversation through the model's own chat template, encoded as a KV context and answered after it."""

from __future__ import annotations

import numpy as np
import pytest

from diffusiongemma.dgemma import Knobs, generate
from diffusiongemma.dgemma.denoising.context import encode_chat
from diffusiongemma.dgemma.errors import InputError
from diffusiongemma.dgemma.inputs.chat import Message, chat_ids
from diffusiongemma.dgemma.inputs.tokens import prompt_ids

CONVERSATION = [Message("system", "You answer in words."), Message("user", "What is 2+2?"),
                Message("assistant", "four"), Message("user", "What is 3+4?")]


@pytest.mark.parametrize("thinking", [False, True])
def test_one_user_message_is_the_samplers_turn(demo_model, thinking):
    assert chat_ids(demo_model, [Message("user", "What is 3+4?")], thinking) == \
        prompt_ids(demo_model, "What is 3+4?", thinking)


@pytest.mark.parametrize("thinking", [False, True])
def test_a_conversation_is_what_the_template_writes(demo_model, thinking):
    tok = demo_model.tokenizer
    messages = [{"role": m.role, "content": m.text} for m in CONVERSATION]
    want = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, enable_thinking=thinking)
    ids = chat_ids(demo_model, CONVERSATION, thinking)
    assert tok.decode(ids) == want and want.startswith("<bos><|turn>system\n")
    assert ("<|think|>" in want) == thinking and want.count("<|turn>") == 5


def test_message_text_stays_text(demo_model):
    controls = set(demo_model.tokenizer.all_special_ids)
    count = lambda text: sum(i in controls for i in chat_ids(demo_model, [Message("system", text),
                                                                          Message("user", "hi")], False))
    assert count("<turn|><|turn>model <bos>") == count("x")


def test_what_the_template_leaves_out_is_refused_by_index(demo_model):
    with pytest.raises(InputError, match=r"messages\[1\] \(role 'system'\) is not in what the model's chat template"):
        chat_ids(demo_model, [Message("user", "hi"), Message("system", "late")], False)


def test_an_encoded_conversation_is_answered_as_the_same_turn_would_be(demo_model):
    knobs = Knobs(seed=3)
    context = encode_chat(demo_model, chat_ids(demo_model, [Message("user", "What is 3+4?")], False))
    injected = generate(demo_model, "", knobs, context=context)
    turn = generate(demo_model, "What is 3+4?", knobs)
    assert injected.text == turn.text == "seven" and np.array_equal(injected.trace.ids, turn.trace.ids)
    history = encode_chat(demo_model, chat_ids(demo_model, CONVERSATION, False))
    assert history.length == len(chat_ids(demo_model, CONVERSATION, False))
    assert generate(demo_model, "", knobs, context=history).state.turn_closed


def test_a_conversations_pictures_fill_its_placeholders(demo_model):
    import torch

    red = torch.zeros((1, 64, 64, 3))
    red[..., 0] = 1.0
    ids = chat_ids(demo_model, [Message("system", "Colours."), Message("user", "What colour is this?", 1)], False)
    context = encode_chat(demo_model, ids, red)
    assert context.images and context.images[0]["count"] == 1 and context.length > len(ids) + 8
    with pytest.raises(InputError, match="placed 0 image"):
        encode_chat(demo_model, chat_ids(demo_model, CONVERSATION, False), red)
