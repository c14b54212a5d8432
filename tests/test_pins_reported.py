"""A pin past the answer's end is never dropped without a word: canvas_state, its preview text, and the
progress text under the node all say which pins never reached the answer."""

from __future__ import annotations

import fakecomfy
from executor import call
from test_nodes import shown

from diffusiongemma import NODE_CLASS_MAPPINGS
from diffusiongemma.dgemma import Knobs
from diffusiongemma.nodes import host

Advanced = NODE_CLASS_MAPPINGS["DGemmaSamplerAdvanced"]


def test_a_pin_past_the_answers_end_is_reported_in_outputs_and_progress_text(tmp_path, demo_model, monkeypatch):
    monkeypatch.setattr(host.ProgressText, "every", 0.0)
    knobs = dict(Knobs(gen_length=32).asdict(), scheduler="entropy_bound", start_step=0, end_step=1024)
    with fakecomfy.installed(tmp_path) as comfy:
        (text, state, *_), _ = call(Advanced, model=demo_model, prompt="What is 3+4?", pins="28: hi", **knobs)
        comfy.registry.finish_progress("17")
        lines = [shown(t) for node, t in comfy.text if node == "17"]
    assert text == "seven" and state.pins_skipped and not state.pins_applied and not state.finished_honestly
    said = "pin(s) never reached the answer"
    assert said in str(state) and any(said in w for w in state.warnings)
    rate = f"{state.tokens_per_forward:.2f} tokens/forward"
    assert lines[-1].startswith(f"done · {state.steps_used} steps · {rate}\n⚠ ") and said in lines[-1]
