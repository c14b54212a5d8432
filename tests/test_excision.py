"""The thought channel is cut on ids; the answer ends at the first EOS outside it."""

from __future__ import annotations

from diffusiongemma.dgemma.readouts.excision import excise, thought_text

OPEN, CLOSE, EOS, TURN, PAD = 100, 101, 1, 106, 0
T, A = [455, 443], [454, 440]  # some thought ids, some answer ids


def cut(ids):
    return excise(ids, OPEN, CLOSE, (EOS, TURN))


def test_closed_channel_becomes_the_thought():
    c = cut([OPEN, *T, CLOSE, *A, TURN, EOS, PAD])
    assert c.answer == tuple(A) and c.thoughts == (tuple(T),) and c.turn_closed and not c.stray_delimiter


def test_unclosed_channel_makes_the_rest_thought_and_the_turn_open():
    c = cut([OPEN, *T, *A, TURN, EOS])
    assert c.answer == () and c.thoughts == ((*T, *A, TURN, EOS),) and not c.turn_closed


def test_stray_close_is_dropped_and_flagged():
    c = cut([*A, CLOSE, *A, EOS])
    assert c.answer == (*A, *A) and c.stray_delimiter and c.turn_closed


def test_no_channel_and_no_eos():
    c = cut([*A, *A])
    assert c.answer == (*A, *A) and c.thoughts == () and not c.turn_closed


def test_either_eos_id_ends_the_answer_and_ids_after_it_are_ignored():
    assert cut([*A, EOS, OPEN, *T]).answer == tuple(A)
    assert cut([*A, TURN, *T]).answer == tuple(A) and cut([*A, TURN]).turn_closed


def test_thought_text_drops_the_label(demo_model):
    tok = demo_model.tokenizer
    span = tok.encode("thought\n3+4=7", add_special_tokens=False)
    assert thought_text(tok, [span]) == "3+4=7"
    assert thought_text(tok, [tok.encode("thought\n", add_special_tokens=False)]) is None
