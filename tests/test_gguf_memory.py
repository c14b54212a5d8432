"""A GGUF model's memory: each weight dequantized once per use, its size as held, its plan, after_run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from diffusiongemma.dgemma import Knobs, generate
from diffusiongemma.dgemma.demo import DEMO_KNOBS

pytest.importorskip("gguf")
from diffusiongemma.dgemma.loading import gguf_load, gguf_modules  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "gguf"
F32, Q8, Q4 = (FIXTURES / f"demo-{k}.gguf" for k in ("f32", "Q8_0", "Q4_K_M"))


def _counting(monkeypatch):
    """GGUF tensor shape -> dense dequantizations of the whole tensor."""
    counts: dict[tuple, int] = {}
    real = gguf_modules.dequantize

    def counted(raw, qtype, shape, *args, **kwargs):
        counts[tuple(shape)] = counts.get(tuple(shape), 0) + 1
        return real(raw, qtype, shape, *args, **kwargs)

    monkeypatch.setattr(gguf_modules, "dequantize", counted)
    return counts


def test_the_embedding_is_dequantized_once_per_step_and_each_layers_experts_once_per_forward(monkeypatch):
    dm = gguf_load.load_gguf(Q4)
    forwards = []
    dm.model.register_forward_hook(lambda *a: forwards.append(1))
    expert_calls = []
    every = [m for m in dm.model.modules() if isinstance(m, gguf_modules.GGUFExperts)]  # encoder's and decoder's
    for module in every:
        module.register_forward_hook(lambda *a: expert_calls.append(1))
    counts = _counting(monkeypatch)
    out = generate(dm, "What is 3+4?", DEMO_KNOBS)
    assert out.text == "seven" and len(forwards) >= 2
    embedding = tuple(dm.model.model.decoder.embed_tokens.gguf.shape)
    assert counts[embedding] == len(forwards)  # self-conditioning's two reads and the head share one
    assert counts[tuple(every[0].gguf_gate_up.shape)] == len(expert_calls)  # every layer's are of one shape
    assert all(w.held is None and w.scopes == 0 for w in dm.model.modules() if isinstance(w, gguf_modules.GGUFWeight))


def test_a_forward_that_raises_drops_what_it_held():
    dm = gguf_load.load_gguf(Q8)
    weight = dm.model.model.decoder.embed_tokens.gguf
    calls = []

    def fail_in_second_step(*_):
        calls.append(1)
        if len(calls) == 2:  # after the self-conditioning read the embedding, before the head
            assert weight.held is not None
            raise RuntimeError("stopped")

    dm.model.model.decoder.norm.register_forward_hook(fail_in_second_step)
    with pytest.raises(RuntimeError, match="stopped"):
        generate(dm, "What is 3+4?", DEMO_KNOBS)
    assert weight.held is None and weight.scopes == 0


def test_steps_read_the_same_as_before_holding(monkeypatch):
    """Holding changes no value: the f32 GGUF still matches a run whose every read dequantizes anew."""
    dm = gguf_load.load_gguf(F32)
    knobs = Knobs(**{**DEMO_KNOBS.asdict(), "seed": 4})
    held = generate(dm, "What is 5+8?", knobs)
    monkeypatch.setattr(gguf_modules.GGUFWeight, "open_scope", lambda self: None)
    fresh = generate(dm, "What is 5+8?", knobs)
    assert held.text == fresh.text
    for field in ("ids", "entropy", "committed"):
        assert np.array_equal(getattr(held.trace, field), getattr(fresh.trace, field))
