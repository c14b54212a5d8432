"""Every reading tells what happened: the stop frame, one state rule everywhere, replays, one run per log."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest
from conftest import REPO

from diffusiongemma.dgemma import Knobs, generate, heatmap, images
from diffusiongemma.dgemma.runlog import read_log, records, replay, write_jsonl
from diffusiongemma.dgemma.states import NOISE, PALETTE
from diffusiongemma.dgemma.tokens import frame_texts
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
    froze = ~trace.scheduler_committed[-1]
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
    want = images.render_frames(result.trace, demo_model.token_strings)
    distinct = [f for i, f in enumerate(want) if i == 0 or not np.array_equal(f, want[i - 1])]
    for name in ("run.png", "run.webp"):
        assert tool.main([str(log), str(tmp_path / name)]) == 0
        with Image.open(tmp_path / name) as anim:
            got = [np.asarray(f.convert("RGB")) for f in ImageSequence.Iterator(anim)]
        assert len(got) == len(distinct) and all(np.array_equal(a, b) for a, b in zip(got, distinct)), name
