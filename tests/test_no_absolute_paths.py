"""No absolute path reaches anyone: run configs, run logs, errors and events show paths relative to
ComfyUI's output or models folder (or the pack's own), or just the file name."""

from __future__ import annotations

import json
from pathlib import Path

import fakecomfy
import pytest
from executor import call

from diffusiongemma import NODE_CLASS_MAPPINGS as NODES
from diffusiongemma.dgemma import Knobs
from diffusiongemma.dgemma.errors import InputError
from diffusiongemma.dgemma.paths import scrub, shown_path

REPO = Path(__file__).resolve().parents[1]


def absolute(text: str) -> list[str]:
    return [root for root in (str(REPO), str(Path.home()), "/tmp/") if root in text]


def test_a_run_config_run_log_and_events_hold_no_absolute_path(tmp_path, demo_model):
    knobs = Knobs(gen_length=32).asdict()
    with fakecomfy.installed(tmp_path) as comfy:
        (_, state, trace, frames, _, config), _ = call(NODES["DGemmaSampler"], model=demo_model,
                                                       prompt="What is 3+4?", **knobs)
        (kv,), _ = call(NODES["DGemmaEncode"], model=demo_model, text="Numbers are words.")
        (path,), ui = call(NODES["DGemmaRunLogWriter"], canvas_trace=trace, run_config=config, frames=frames,
                           canvas_state=state, filename_prefix="paths/check")
        log = Path(path).read_text(encoding="utf-8")
        events = json.dumps([e[:2] for e in comfy.events], default=str)
    assert config.model_source == "dgemma/demo_model" and demo_model.shown == "dgemma/demo_model"
    shown = [repr(demo_model), str(config), json.dumps(config.asdict(), default=str), log, events, repr(kv),
             json.dumps(kv.summary()), json.dumps(ui, default=str)]
    assert not [s for s in shown if absolute(s)], [s[:200] for s in shown if absolute(s)]
    assert "output/paths/check" in json.dumps(ui)


def test_errors_show_paths_relative_or_by_name(tmp_path):
    (tmp_path / "ckpt").mkdir()
    with pytest.raises(ValueError) as caught:
        call(NODES["DGemmaLoader"], quant="none", model=str(tmp_path / "ckpt"))
    assert str(tmp_path) not in str(caught.value)
    err = InputError("model", f"cannot read {tmp_path}/ckpt/config.json; fix it")
    assert str(err) == "cannot read config.json; fix it"
    assert shown_path(REPO / "dgemma" / "demo_model") == "dgemma/demo_model"
    assert scrub("see http://host:1/v1/models and the server's /v1/models") == \
        "see http://host:1/v1/models and the server's /v1/models"
