"""The headless runner's runtime errors are one or two lines with the fix, `--server` imports no torch, and a
server's refusal prints as text, each line once."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_queue_checks import decide_graph

from diffusiongemma.runner.cli import DONE, START, STEP
from diffusiongemma.runner.client import refusal_text
from diffusiongemma.runner.execute import run_graph

REPO = Path(__file__).resolve().parents[1]
API = REPO / "example_workflows" / "api"


def _headless(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "headless", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def test_no_server_is_one_line_that_says_how_to_start_one(tmp_path):
    done = _headless(str(API / "remote.json"), "--out", str(tmp_path), "--quiet")
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and 1 <= len(lines) <= 2 and "Traceback" not in done.stderr, done.stderr
    assert "node 1 (DGemmaRemoteLoader)" in lines[0] and "python -m serve" in lines[-1]


def test_server_mode_imports_no_torch():
    code = ("import runpy, sys\n"
            f"sys.path.insert(0, {str(REPO)!r})\n"
            f"sys.argv = ['headless', {str(API / 'knobs.json')!r}, '--server', 'http://127.0.0.1:9']\n"
            "try:\n    runpy.run_module('headless', run_name='__main__')\n"
            "except SystemExit as e:\n    print('exit', e.code, 'torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["exit", "3", "False"], done.stdout + done.stderr
    assert "cannot reach ComfyUI at http://127.0.0.1:9" in done.stderr and "Traceback" not in done.stderr


def test_the_event_names_are_the_live_views():
    from diffusiongemma.nodes import events

    assert (START, STEP, DONE) == (events.START, events.STEP, events.DONE)


def test_a_refusal_prints_as_text_each_line_once():
    error = {"type": "custom_validation_failed", "message": "Custom validation failed for node",
             "details": "t_min - t_min 0.9 is above t_max 0.5", "extra_info": {"input_name": "t_min"}}
    reply = {"error": {"type": "prompt_outputs_failed_validation", "message": "Prompt outputs failed validation",
                       "details": "", "extra_info": {}},
             "node_errors": {"2": {"errors": [error, error,
                                              {"type": "value_bigger_than_max", "message": "Value 999 bigger than "
                                               "max of 1024", "details": "num_inference_steps",
                                               "extra_info": {"input_name": "num_inference_steps"}}],
                                   "dependent_outputs": ["3"], "class_type": "DGemmaSampler"}}}
    text = refusal_text(json.dumps(reply))
    assert text.splitlines() == [
        "refused: Prompt outputs failed validation",
        "  node 2 (DGemmaSampler) t_min: Custom validation failed for node: t_min - t_min 0.9 is above t_max 0.5",
        "  node 2 (DGemmaSampler) num_inference_steps: Value 999 bigger than max of 1024"]
    assert refusal_text("Bad gateway") == "refused: Bad gateway"


def _shown(graph: dict) -> dict:
    return {**graph, "9": {"class_type": "PreviewAny", "inputs": {"source": ["3", 0]}}}


def test_options_over_the_canvas_are_refused_before_the_loader_runs(tmp_path, monkeypatch):
    graph = _shown(decide_graph("red\n" + "seven " * 40))
    (tmp_path / "decide.json").write_text(json.dumps(graph))
    done = _headless(str(tmp_path / "decide.json"), "--out", str(tmp_path), "--quiet")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "does not validate" in done.stderr and "over the canvas of 32 positions" in done.stderr
    from diffusiongemma.nodes import loader

    monkeypatch.setattr(loader, "load_model", lambda *a, **k: pytest.fail("the Loader ran before the refusal"))
    with pytest.raises(ValueError, match=r"node 3 \(DGemmaDecide\): option 'seven seven.* over the canvas"):
        run_graph(graph)


def test_options_that_fit_run_through_the_same_check():
    graph = _shown(decide_graph("red\ngreen"))
    graph["3"]["inputs"].update(samples=1, num_inference_steps=2)
    assert run_graph(graph)["9"]["text"][0] in ("red", "green")
