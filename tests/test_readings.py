"""Every reading tells what happened: the stop frame, one state rule everywhere, replays, one run per log."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
from conftest import REPO

from diffusiongemma.dgemma import Knobs, generate
from diffusiongemma.dgemma.inputs.tokens import frame_texts
from diffusiongemma.dgemma.readouts import heatmap, images
from diffusiongemma.dgemma.readouts.runlog import read_log, records, replay, write_jsonl
from diffusiongemma.dgemma.readouts.states import NOISE, PALETTE
from diffusiongemma.nodes.events import StepStream


@pytest.fixture(scope="module")
def stopped(demo_model):
    """A demo run whose adaptive stop fires, with the live events the node would send."""
    stream = StepStream("7", 1, 48, demo_model.canvas_length, demo_model.token_strings)
    sent = []
    result = generate(demo_model, "What is 3+4?", Knobs(seed=7), on_frame=lambda f: sent.append(stream.step(f)))
    assert result.text == "seven" and result.trace.block_stopped_early == (True,)
    return result, sent


def test_the_stop_frame_shows_what_was_committed(stopped):
    result, _ = stopped
    trace, last = result.trace, result.trace.frame(len(result.trace) - 1)
    assert last.committed.all() and last.committed_fraction == 1.0 and result.state.committed_fraction == 1.0
    froze = ~(trace.committed & ~trace.stop)[-1]
    assert froze.any() and np.array_equal(last.stop, froze)  # the trace says which positions the stop froze
    assert not trace.stop[:-1].any()
    assert NOISE not in trace.states()[-1]


def test_events_frames_heatmap_and_replay_share_one_state_rule(stopped, demo_model, tmp_path):
    result, sent = stopped
    states = result.trace.states()
    assert [e["state"] for e in sent] == ["".join(map(str, row)) for row in states.tolist()]
    cells = np.rint(heatmap.heatmap(result.trace, "commit", 1)[0] * 255).astype(np.uint8)
    palette = np.array([PALETTE[s] for s in range(len(PALETTE))], np.uint8)
    assert np.array_equal(cells, palette[states])
    log = write_jsonl(records(result.trace, result.config, result.state,
                              frame_texts(result.trace, demo_model.token_strings)), tmp_path, "run")
    assert np.array_equal(replay(*read_log(log)).states(), states)


def test_a_run_log_replays_to_the_same_frames(demo_model, tmp_path):
    result = generate(demo_model, "What is 2+5?", Knobs(seed=3, gen_length=96, thinking=True))
    frames = frame_texts(result.trace, demo_model.token_strings)
    log = write_jsonl(records(result.trace, result.config, result.state, frames), tmp_path, "run")
    again = replay(*read_log(log))
    assert np.array_equal(images.render_frames(again, again.token_strings),
                          images.render_frames(result.trace, demo_model.token_strings))
    gif = tmp_path / "run.gif"
    spec = importlib.util.spec_from_file_location("runlog_gif", REPO / "tools" / "runlog_gif.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert tool.main([str(log), str(gif)]) == 0 and gif.stat().st_size > 0


def test_a_run_log_refuses_parts_of_two_runs(stopped, demo_model):
    result, _ = stopped
    other = generate(demo_model, "What is 1+1?", Knobs(seed=1))
    frames = frame_texts(result.trace, demo_model.token_strings)
    with pytest.raises(ValueError, match="come from different runs") as err:
        records(result.trace, other.config, result.state, frames)
    assert result.trace.run_id in str(err.value) and other.config.run_id in str(err.value)


def test_the_browser_fixture_is_what_the_node_sends(tiny_model):
    spec = importlib.util.spec_from_file_location("record_events", REPO / "tests" / "browser" / "record_events.py")
    recorder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recorder)
    fixture = json.loads((REPO / "tests" / "browser" / "events.json").read_text(encoding="utf-8"))
    start = fixture["events"][0]["data"]
    assert fixture["source"] == "random"
    again = recorder.record(tiny_model, fixture["seed"], start["steps"], start["blocks"], cold=True)
    assert json.loads(json.dumps(again, ensure_ascii=False)) == fixture["events"], \
        "the events changed: re-record with python tests/browser/record_events.py"


def test_runlog_replay_as_apng_or_webp_is_pixel_identical(demo_model, tmp_path):
    from PIL import Image, ImageSequence

    result = generate(demo_model, "What is 2+5?", Knobs(seed=3, gen_length=96))
    frames = frame_texts(result.trace, demo_model.token_strings)
    log = write_jsonl(records(result.trace, result.config, result.state, frames), tmp_path, "run")
    spec = importlib.util.spec_from_file_location("runlog_gif", REPO / "tools" / "runlog_gif.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    want = images.render_frames(result.trace, demo_model.token_strings, asked=images.Asked("What is 2+5?"))
    distinct = [f for i, f in enumerate(want) if i == 0 or not np.array_equal(f, want[i - 1])]
    for name in ("run.png", "run.webp"):
        assert tool.main([str(log), str(tmp_path / name)]) == 0
        with Image.open(tmp_path / name) as anim:
            got = [np.asarray(f.convert("RGB")) for f in ImageSequence.Iterator(anim)]
        assert len(got) == len(distinct) and all(np.array_equal(a, b) for a, b in zip(got, distinct)), name


def test_frames_say_what_was_asked_and_a_replayed_log_shows_it_too(demo_model, tmp_path):
    import fakecomfy  # noqa: F401
    from executor import call
    from PIL import Image

    from diffusiongemma import NODE_CLASS_MAPPINGS
    from diffusiongemma.dgemma.demo import IMAGE_QUESTION, colour_image

    knobs = dict(seed=1, num_inference_steps=12, t_min=0.4, t_max=0.8, entropy_bound=0.1, confidence=0.9,
                 gen_length=32, thinking=False)
    out, _ = call(NODE_CLASS_MAPPINGS["DGemmaSampler"], model=demo_model, prompt=IMAGE_QUESTION,
                  image=colour_image("red", 64, 48), **knobs)
    shown = np.rint(out[4].numpy() * 255).astype(np.uint8)
    bare = images.render_frames(out[2], demo_model.token_strings)
    assert shown.shape[1] > bare.shape[1]  # a header band: the prompt and the image's thumbnail
    band = shown[0, 20:44]
    assert ((band[..., 0] > 200) & (band[..., 1] < 60) & (band[..., 2] < 60)).sum() > 24 * 24  # the red thumbnail
    asked_only = images.render_frames(out[2], demo_model.token_strings, asked=images.Asked(IMAGE_QUESTION))
    assert not np.array_equal(asked_only[:, 20:44, 60:], bare[:, 20:44, 60:])  # the prompt's text is painted
    log = write_jsonl(records(out[2], out[5], out[1], out[3]), tmp_path, "run")
    spec = importlib.util.spec_from_file_location("runlog_gif", REPO / "tools" / "runlog_gif.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    assert tool.main([str(log), str(tmp_path / "run.png")]) == 0
    with Image.open(tmp_path / "run.png") as apng:
        replayed = []
        for i in range(apng.n_frames):
            apng.seek(i)
            replayed.append(np.asarray(apng.convert("RGB")))
    distinct = [f for i, f in enumerate(shown) if i == 0 or not np.array_equal(f, shown[i - 1])]
    assert np.array_equal(np.stack(replayed), np.stack(distinct))


def test_live_states_follow_the_rule_across_blocks(tiny_model):
    stream = StepStream("7", 2, 12, tiny_model.canvas_length, tiny_model.token_strings)
    sent = []
    result = generate(tiny_model, "Hi", Knobs(seed=4, num_inference_steps=12, gen_length=2 * tiny_model.canvas_length),
                      on_frame=lambda f: sent.append(stream.step(f)))
    assert len(set(result.trace.blocks.tolist())) == 2
    assert [e["state"] for e in sent] == ["".join(map(str, row)) for row in result.trace.states().tolist()]
