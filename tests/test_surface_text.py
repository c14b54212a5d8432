"""Text a newcomer reads: paths in the model card exist, and headless labels each answer it prints."""

from __future__ import annotations

import json
import re
from pathlib import Path

from diffusiongemma.runner import cli

REPO = Path(__file__).resolve().parents[1]


def test_every_path_the_model_card_names_exists():
    card = (REPO / "dgemma" / "demo_model" / "README.md").read_text()
    paths = re.findall(r"`([\w/]+\.py)`", card)
    assert paths and all((REPO / p).is_file() for p in paths), paths


def test_headless_labels_the_three_scheduler_answers(capsys):
    graph = json.loads((REPO / "example_workflows" / "api" / "advanced_schedulers.json").read_text())
    cli._report(graph, {"5": {"text": ["seven"]}, "6": {"text": ["seven"]}, "7": {"text": ["seven"]}})
    out = capsys.readouterr().out
    for name in ("entropy_bound", "block_refinement", "discrete_ddim"):
        assert f"({name} answer)" in out
