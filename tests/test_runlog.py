"""Run logs: the dg-runlog/1 schema, the counter, atomic writes, prefixes that stay inside."""

from __future__ import annotations

import json
import re

import pytest

from diffusiongemma.dgemma import Knobs, generate
from diffusiongemma.dgemma.inputs.tokens import frame_texts
from diffusiongemma.dgemma.readouts.runlog import SCHEMA, records, write_jsonl

HEADER = {"record_type", "schema", "pack_version", "run_id", "timestamp_utc", "prompt", "model_source", "seed",
          "num_inference_steps_requested", "num_inference_steps_effective", "gen_length", "t_min", "t_max",
          "entropy_bound", "confidence", "thinking", "scheduler_name", "scheduler_config", "quant", "device",
          "dtype", "canvas_length", "injection_present", "injected_cache_provenance", "image_present", "image",
          "block_stopped_early", "knob_sets", "advanced", "constraint", "model_defaults"}
FRAME = {"record_type", "block", "step", "t", "temperature", "committed_fraction", "entropy_summary",
         "decoded_text", "canvas_ids", "accepted", "stop_committed", "tokens", "knob_set"}
FINAL = {"record_type", "raw_ids", "steps_used", "text", "converged", "committed_fraction", "turn_closed",
         "answer_tokens", "tokens_per_forward", "thought", "stray_thought_delimiter", "finished_honestly", "paused",
         "pins_applied", "pins_skipped", "blanks_unfilled", "warnings", "constraint"}


@pytest.fixture(scope="module")
def run(demo_model):
    result = generate(demo_model, "What is 2+3?", Knobs(seed=1, thinking=True))
    return result, frame_texts(result.trace, demo_model.token_strings)


def test_schema_fields(run):
    result, frames = run
    rows = records(result.trace, result.config, result.state, frames)
    header, body, final = rows[0], rows[1:-1], rows[-1]
    assert set(header) == HEADER and header["schema"] == SCHEMA == "dg-runlog/1"
    assert header["pack_version"] == "0.1.0" and header["injection_present"] is False
    assert len(body) == len(result.trace) and all(set(r) == FRAME for r in body)
    assert set(final) == FINAL and final["text"] == "five" and re.fullmatch(r"\d\+\d=5", final["thought"])
    assert body[-1]["decoded_text"] == frames[-1] and body[-1]["canvas_ids"] == list(result.trace.ids[-1])
    assert json.loads(json.dumps(rows)) == rows


def test_counter_never_overwrites(run, tmp_path):
    result, frames = run
    rows = records(result.trace, result.config, result.state, frames)
    paths = [write_jsonl(rows, tmp_path, "logs/run") for _ in range(3)]
    assert [p.name for p in paths] == ["run_00001.jsonl", "run_00002.jsonl", "run_00003.jsonl"]
    (tmp_path / "logs" / "run_00002.jsonl").unlink()
    assert write_jsonl(rows, tmp_path, "logs/run").name == "run_00004.jsonl"
    lines = (tmp_path / "logs" / "run_00001.jsonl").read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["record_type"] for line in (lines[0], lines[-1])] == ["header", "final"]


def test_a_failure_midway_leaves_no_file(run, tmp_path):
    result, frames = run
    rows = records(result.trace, result.config, result.state, frames)
    rows.insert(3, {"unserialisable": object()})
    with pytest.raises(TypeError):
        write_jsonl(rows, tmp_path, "run")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("prefix", ["../escape", "/tmp/abs", "a/../../b", "C:\\evil", "", "  "])
def test_prefixes_that_leave_the_output_folder_are_refused(run, tmp_path, prefix):
    result, frames = run
    rows = records(result.trace, result.config, result.state, frames)
    with pytest.raises(ValueError, match="filename_prefix"):
        write_jsonl(rows, tmp_path / "out", prefix)
    assert not (tmp_path / "out").exists()


def test_frames_must_belong_to_the_trace(run):
    result, frames = run
    steps = len(result.trace)
    with pytest.raises(ValueError, match=f"frames has {steps - 1} entries but the trace has {steps} steps; give the"):
        records(result.trace, result.config, result.state, frames[:-1])


def test_tokens_per_forward_is_the_answer_over_the_steps(run):
    """The DiffusionGemma report's headline figure, in the run log, the readout's text and the node's last line."""
    from diffusiongemma.nodes.events import StepStream

    result, frames = run
    state = result.state
    final = records(result.trace, result.config, state, frames)[-1]
    assert final["tokens_per_forward"] == state.answer_tokens / state.steps_used == state.tokens_per_forward
    assert f"{state.tokens_per_forward:.2f} tokens per forward" in str(state)
    done = StepStream("1", 1, 48, 32, ()).done_text(state.steps_used, state.text, per_forward=state.tokens_per_forward)
    assert done.splitlines()[0].endswith(f"{state.tokens_per_forward:.2f} tokens/forward")
