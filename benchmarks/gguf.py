"""GGUF in-process: exact dequantization, the f32 GGUF identical to the safetensors demo, the quantized
files' accuracy, bad files refused, and the real-width slice's step peak and speed (benchmarks/gguf_slice.py).

The questions are the demo's 100 sums ("What is a+b?") and four other text prompts, each run plain and with
thinking at the demo knobs with seed i. gguf_f32_identical needs every run's text, ids, entropy and
committed mask per step equal to the safetensors demo's. A file's accuracy is the demo's own measure
(benchmarks/demo.py, tests/test_demo_model.py): the share of the sums, plain and thinking, answered with
the right number in words. The four other prompts have no right answer for the demo model (the safetensors
demo answers them with noise), so they count in the agreement with the safetensors demo only.

    python benchmarks/gguf.py [--threads 2] [--repeats 7]
"""

from __future__ import annotations

import argparse
import json
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
from diffusiongemma.dgemma.demo import DEMO_DIR, DEMO_KNOBS, WORDS  # noqa: E402
from diffusiongemma.dgemma.loading import gguf_quants  # noqa: E402
from diffusiongemma.testing.gguf_bad import bad_files  # noqa: E402


def _sibling(name: str):
    """A module of this folder, loaded without putting the folder on the path (it would shadow gguf)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parent / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gguf_slice = _sibling("gguf_slice")

FIXTURES = REPO / "tests" / "fixtures" / "gguf"
SUMS = [(a, b) for a in range(10) for b in range(10)]
QUESTIONS = [f"What is {a}+{b}?" for a, b in SUMS] + [
    "Hi", "Name a colour.", "What is 13+29? Answer with the number only.", "What is 7+8? Say it in words, please."]
GIB = 2**30


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


def right(results) -> tuple[int, int, list[str]]:
    """(right, asked, wrong) over the sums, plain then thinking: the answer in words, as the demo counts it."""
    asked = [(thinking, a, b) for thinking in (False, True) for a, b in SUMS]
    picked = [r for i, r in enumerate(results) if i % len(QUESTIONS) < len(SUMS)]
    wrong = [f"{'thinking ' if t else ''}{a}+{b} -> {r.text!r}" for (t, a, b), r in zip(asked, picked)
             if r.text != WORDS[a + b]]
    return len(asked) - len(wrong), len(asked), wrong


def accuracies(reference) -> dict[str, float]:
    found = {}
    for name in ("Q8_0", "Q4_K_M"):
        ours = runs(load_model(str(FIXTURES / f"demo-{name}.gguf"), quant="gguf"))
        good, asked, wrong = right(ours)
        agree = sum(a.text == b.text for a, b in zip(ours, reference))
        print(f"{name}: {good}/{asked} sums right (wrong: {', '.join(wrong) or 'none'}); the same text as the "
              f"safetensors demo in {agree}/{len(reference)} runs", flush=True)
        found[name] = good / asked
    return found


def slice_figures(threads: int, repeats: int) -> tuple[float, float]:
    """(the real Q4_K_M peak at a step in GiB, the slice's step time in Q4_K_M over bf16)."""
    path = gguf_slice_path()
    held, need = gguf_slice.real_held("Q4_K_M")
    step = gguf_slice.child("peak", path, threads)["step_peak"]
    real = (held + step) / GIB
    print(f"Q4_K_M real step peak {real:.2f} GiB = {held / GIB:.2f} GiB held (the real geometry's tensors in "
          f"llama-quantize's Q4_K_M types) + {step / GIB:.2f} GiB the slice step's own peak (bf16 compute); plan "
          f"{need.peak / GIB:.2f} GiB (a 4K-token context budgeted)", flush=True)
    times = gguf_slice.child("ratio", path, threads, repeats)
    ratio = times["gguf"] / times["bf16"]
    print(f"slice step (self-conditioning, {threads} threads, median of {repeats}, alternated): Q4_K_M "
          f"{times['gguf']:.2f} s, bf16 {times['bf16']:.2f} s; all {times['all']}", flush=True)
    return real, ratio


def gguf_slice_path() -> Path:
    from diffusiongemma.testing import gguf_slice as builder

    return builder.path("Q4_K_M")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--measure", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.measure:
        kind, path = args.measure
        print(json.dumps(gguf_slice.peak(path) if kind == "peak" else gguf_slice.ratio(path, args.repeats)))
        return
    exact = dequant_exact()
    reference = runs(load_model(str(DEMO_DIR)))
    good, asked, _ = right(reference)
    print(f"safetensors demo: {good}/{asked} sums right", flush=True)
    f32 = runs(load_model(str(FIXTURES / "demo-f32.gguf"), quant="gguf"))
    same = sum(identical(a, b) for a, b in zip(f32, reference))
    print(f"f32 runs identical: {same}/{len(reference)}", flush=True)
    accuracy = accuracies(reference)
    done, total = refused()
    peak, ratio = slice_figures(args.threads, args.repeats)
    print(f"gguf_dequant_exact={int(exact)} gguf_f32_identical={int(same == len(reference))} "
          f"gguf_q8_0_accuracy={accuracy['Q8_0']:.3f} gguf_q4_k_m_accuracy={accuracy['Q4_K_M']:.3f} "
          f"gguf_bad_files_refused={done}/{total} gguf_q4_k_m_real_peak_gib={peak:.2f} "
          f"gguf_step_ratio_slice={ratio:.2f}")


if __name__ == "__main__":
    main()
