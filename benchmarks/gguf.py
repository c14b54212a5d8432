"""GGUF in-process: exact dequantization, the f32 GGUF identical to the safetensors demo, the quantized
files' agreement with it, and bad files refused.

The questions are the demo's 100 sums ("What is a+b?") and four other text prompts, each run plain and with
thinking at the demo knobs with seed i. gguf_f32_identical needs every run's text, ids, entropy and
committed mask per step equal to the safetensors demo's; a quantized file's accuracy is the share of runs
whose text equals the safetensors demo's.

    python benchmarks/gguf.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
# this file is named gguf.py: its own folder on the path would shadow the gguf package
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(REPO))
from headless import load_pack  # noqa: E402

load_pack()
import gguf  # noqa: E402

from diffusiongemma.dgemma import Knobs, generate, load_model  # noqa: E402
from diffusiongemma.dgemma.demo import DEMO_DIR, DEMO_KNOBS  # noqa: E402
from diffusiongemma.dgemma.loading import gguf_quants  # noqa: E402
from diffusiongemma.testing.gguf_bad import bad_files  # noqa: E402

FIXTURES = REPO / "tests" / "fixtures" / "gguf"
QUESTIONS = [f"What is {a}+{b}?" for a in range(10) for b in range(10)] + [
    "Hi", "Name a colour.", "What is 13+29? Answer with the number only.", "What is 7+8? Say it in words, please."]


def dequant_exact() -> bool:
    def same(ours, ref):
        return np.array_equal(ours.numpy(), np.asarray(ref, np.float32), equal_nan=True)

    ok = True
    for qtype, (_, _, nbytes) in gguf_quants.TYPES.items():
        raw = np.random.default_rng(qtype).integers(0, 256, size=(64, 16 * nbytes), dtype=np.uint8)
        with np.errstate(all="ignore"):
            ref = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(qtype))
        ok &= same(gguf_quants.dequantize(torch.from_numpy(raw), qtype, ref.shape), ref)
    for path in sorted(FIXTURES.glob("*.gguf")):
        for t in gguf.GGUFReader(path).tensors:
            raw = np.ascontiguousarray(t.data).view(np.uint8)
            ref = gguf.quants.dequantize(raw, t.tensor_type)
            ok &= same(gguf_quants.dequantize(torch.from_numpy(raw.copy()), int(t.tensor_type), ref.shape), ref)
    return bool(ok)


def runs(dm) -> list:
    out = []
    for thinking in (False, True):
        for i, question in enumerate(QUESTIONS):
            knobs = Knobs(**{**DEMO_KNOBS.asdict(), "seed": i, "thinking": thinking})
            out.append(generate(dm, question, knobs))
    return out


def identical(a, b) -> bool:
    return a.text == b.text and a.state == b.state and all(
        np.array_equal(getattr(a.trace, f), getattr(b.trace, f)) for f in ("ids", "entropy", "committed"))


def refused() -> tuple[int, int]:
    count = 0
    with tempfile.TemporaryDirectory() as folder:
        bad = bad_files(FIXTURES / "demo-f32.gguf", Path(folder))
        for problem, (path, words) in bad.items():
            try:
                load_model(str(path), quant="gguf")
                print(f"  not refused: {problem}")
            except ValueError as exc:
                named = path.name in str(exc) and words in str(exc)
                count += named
                print(f"  {problem}: {'refused, file named' if named else 'refused without the file'}: {exc}")
    return count, len(bad)


def main() -> None:
    exact = dequant_exact()
    reference = runs(load_model(str(DEMO_DIR)))
    f32 = runs(load_model(str(FIXTURES / "demo-f32.gguf"), quant="gguf"))
    same = sum(identical(a, b) for a, b in zip(f32, reference))
    print(f"f32 runs identical: {same}/{len(reference)}")
    accuracy = {}
    for name in ("Q8_0", "Q4_K_M"):
        ours = runs(load_model(str(FIXTURES / f"demo-{name}.gguf"), quant="gguf"))
        accuracy[name] = sum(a.text == b.text for a, b in zip(ours, reference)) / len(reference)
    done, total = refused()
    print(f"gguf_dequant_exact={int(exact)} gguf_f32_identical={int(same == len(reference))} "
          f"gguf_q8_0_accuracy={accuracy['Q8_0']:.3f} gguf_q4_k_m_accuracy={accuracy['Q4_K_M']:.3f} "
          f"gguf_bad_files_refused={done}/{total}")


if __name__ == "__main__":
    main()
