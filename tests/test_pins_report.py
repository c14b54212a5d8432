"""Readings that never overstate: pins that could not apply and blanks left empty are reported, and
an advanced run's config holds what repeating it needs. On the trained demo model."""

from __future__ import annotations

from diffusiongemma.dgemma import generate
from diffusiongemma.dgemma.denoising.resume import Advanced
from diffusiongemma.dgemma.inputs.knobs import Knobs
from diffusiongemma.dgemma.inputs.tokens import frame_texts
from diffusiongemma.dgemma.readouts.runlog import records
from diffusiongemma.dgemma.steps.schedulers import SCHEDULER_KNOBS, Scheduling

ASK = "What is 3+4?"


def final(dm, result) -> dict:
    return records(result.trace, result.config, result.state, frame_texts(result.trace, dm.token_strings))[-1]


def test_a_blank_filled_with_padding_is_not_finished_honestly(demo_model):
    result = generate(demo_model, ASK, advanced=Advanced(pins="The answer is ___."))
    state = result.state
    assert state.turn_closed and state.answer_tokens > 0  # what used to read as an honest finish
    assert state.blanks_unfilled == (14, 15, 16) and not state.finished_honestly
    assert "3 blank position(s) left unfilled (14..16)" in str(state)
    row = final(demo_model, result)
    assert row["blanks_unfilled"] == [14, 15, 16] and row["finished_honestly"] is False and row["warnings"]


def test_pins_past_where_the_answer_ended_are_reported_skipped(demo_model):
    result = generate(demo_model, ASK, advanced=Advanced(pins="40: seven"))
    state = result.state
    assert state.text == "seven" and state.blocks == 1  # the answer ended in block 1; the pins sit in block 2
    assert state.pins_applied == () and state.pins_skipped == (40, 41, 42, 43, 44)
    assert not state.finished_honestly and "never reached the answer (positions 40..44)" in str(state)
    assert state.asdict()["pins_skipped"] == (40, 41, 42, 43, 44)
    assert final(demo_model, result)["pins_skipped"] == [40, 41, 42, 43, 44]


def test_pins_the_answer_holds_are_applied_and_honest(demo_model):
    state = generate(demo_model, ASK, advanced=Advanced(pins="0: seven")).state
    assert state.text == "seven" and state.pins_applied == (0, 1, 2, 3, 4) and state.pins_skipped == ()
    assert state.finished_honestly and state.warnings == ()


def test_an_advanced_run_config_repeats_the_run(demo_model):
    advanced = Advanced(Scheduling("block_refinement", threshold=0.7), 0, 1024, "0: seven")
    knobs = Knobs(num_inference_steps=12, seed=3)
    first = generate(demo_model, ASK, knobs, advanced=advanced)
    a = first.config.advanced
    assert a["scheduler"] == "block_refinement" and a["threshold"] == 0.7 and a["pins"] == "0: seven"
    assert (a["start_step"], a["end_step"], a["resumed_from"]) == (0, 1024, None)
    assert "scheduler block_refinement · window [0, 1024)" in str(first.config)
    again = generate(demo_model, first.config.prompt, first.config.knobs, advanced=Advanced(
        Scheduling(a["scheduler"], **{k: a[k] for k in SCHEDULER_KNOBS if k in a}), a["start_step"], a["end_step"],
        a["pins"]))
    assert again.state.raw_ids == first.state.raw_ids
    paused = generate(demo_model, ASK, knobs, advanced=Advanced(end_step=2))
    resumed = generate(demo_model, ASK, knobs, advanced=Advanced(start_step=2, resume=paused.state.resume))
    assert resumed.config.advanced["resumed_from"] == {"block": 0, "step": 2}
    assert final(demo_model, resumed)["text"] == resumed.text
    header = records(resumed.trace, resumed.config, resumed.state, frame_texts(resumed.trace,
                                                                                demo_model.token_strings))[0]
    assert header["advanced"]["resumed_from"] == {"block": 0, "step": 2}


def test_the_window_start_applies_to_the_first_block_and_later_blocks_start_at_zero(demo_model):
    from diffusiongemma.dgemma.denoising.resume import WINDOW_KNOBS

    trace = generate(demo_model, ASK, advanced=Advanced(start_step=5, pins="The answer is ___.")).trace
    firsts = {int(b): int(trace.steps[trace.blocks == b][0]) for b in sorted(set(trace.blocks.tolist()))}
    assert len(firsts) > 1 and firsts[0] == 5 and all(s == 0 for b, s in firsts.items() if b > 0)
    assert "first block; later blocks start at 0" in WINDOW_KNOBS["start_step"].tooltip
