"""llama-quantize's per-tensor types, as testing/gguf_mix.py states them, against the shipped demo files."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("gguf")
from diffusiongemma.dgemma.loading import gguf_config, gguf_file  # noqa: E402
from diffusiongemma.testing import gguf_mix, realscale  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "gguf"


@pytest.mark.parametrize("mix", ["Q8_0", "Q4_K_M"])
def test_the_rules_give_the_demo_files_types(mix):
    g = gguf_file.read(FIXTURES / f"demo-{mix}.gguf")
    stated = gguf_mix.types(gguf_config.model_config(g), mix)
    assert stated == {name: t.qtype for name, t in g.tensors.items()}
    assert all(gguf_mix.nbytes(t.shape, t.qtype) == t.nbytes for t in g.tensors.values())


def test_the_real_model_in_q4_k_m():
    types = gguf_mix.types(realscale.real_config(), "Q4_K_M")
    names = {t: [n for n, q in types.items() if q == gguf_mix.BY_NAME[t]] for t in ("Q6_K", "Q8_0", "Q5_0", "Q4_K")}
    assert "token_embd.weight" in names["Q6_K"]
    downs = [n for n in names["Q8_0"] if n.endswith("ffn_down_exps.weight")]
    assert len(downs) == 14 and len([n for n in names["Q5_0"] if n.endswith("ffn_down_exps.weight")]) == 16
    assert len([n for n in names["Q6_K"] if n.endswith("attn_v.weight")]) == 13  # of 25 sliding layers
    falls = ("ffn_down_exps.weight", "ffn_down.weight", "self_cond_down.weight")  # rows of 704 and 2112
    assert all(n.endswith(falls) for n in names["Q8_0"] + names["Q5_0"])
    assert all(types[f"blk.{i}.ffn_gate_up_exps.weight"] == gguf_mix.BY_NAME["Q4_K"] for i in range(30))
