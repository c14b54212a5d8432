"""Engine with full capture vs diffusers' bare DiffusionGemmaPipeline, side by side.

Both run the same checkpoint, seed and knobs, alternating, several repeats, on the tiny random
model (48 steps) and on the real-vocabulary model (262,144 tokens; fewer steps, its sampling
costs seconds per step on a CPU). Needs a transformers where the pipeline works (< 5.24).

    python benchmarks/overhead.py
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from headless import load_pack  # noqa: E402

load_pack()
from diffusiongemma.dgemma import Knobs, generate, load_model  # noqa: E402
from diffusiongemma.testing.tiny import build_checkpoint  # noqa: E402

PROMPT = "What is 3+4?"


def pipeline_seconds(dm, knobs: Knobs) -> float:
    from diffusers import DiffusionGemmaPipeline, EntropyBoundScheduler

    scheduler = EntropyBoundScheduler(entropy_bound=knobs.entropy_bound, t_max=knobs.t_max, t_min=knobs.t_min,
                                      num_inference_steps=knobs.num_inference_steps)
    pipe = DiffusionGemmaPipeline(model=dm.model, scheduler=scheduler, processor=dm.processor)
    pipe.set_progress_bar_config(disable=True)
    start = time.perf_counter()
    pipe(prompt=PROMPT, gen_length=knobs.gen_length, num_inference_steps=knobs.num_inference_steps,
         confidence_threshold=knobs.confidence or None, generator=torch.Generator().manual_seed(knobs.seed),
         output_type="seq")
    return time.perf_counter() - start


def engine_seconds(dm, knobs: Knobs) -> tuple[float, int]:
    start = time.perf_counter()
    result = generate(dm, PROMPT, knobs)
    return time.perf_counter() - start, result.trace.nbytes // len(result.trace)


def compare(name: str, dm, knobs: Knobs, repeats: int) -> tuple[list[float], int]:
    engine_seconds(dm, knobs), pipeline_seconds(dm, knobs)  # warm-up
    ratios, per_step = [], 0
    for i in range(repeats):
        if i % 2:
            base = pipeline_seconds(dm, knobs)
            ours, per_step = engine_seconds(dm, knobs)
        else:
            ours, per_step = engine_seconds(dm, knobs)
            base = pipeline_seconds(dm, knobs)
        ratios.append(ours / base)
        print(f"{name}: engine {ours:.3f}s pipeline {base:.3f}s ratio {ours / base:.3f}", flush=True)
    print(f"{name}: median ratio {statistics.median(ratios):.3f}, trace {per_step} bytes/step "
          f"(canvas {dm.canvas_length}, vocab {dm.vocab_size})", flush=True)
    return ratios, per_step


def main() -> None:
    torch.set_num_threads(2)
    ratios, sizes = [], []
    with tempfile.TemporaryDirectory() as tmp:
        cases = [("tiny", "random", Knobs(seed=3, num_inference_steps=48, gen_length=256), 7),
                 ("real-vocab", "real-vocab", Knobs(seed=3, num_inference_steps=4, gen_length=256), 3)]
        for name, preset, knobs, repeats in cases:
            dm = load_model(str(build_checkpoint(Path(tmp) / preset, preset)))
            r, size = compare(name, dm, knobs, repeats)
            ratios += r
            sizes.append(size)
    print(f"overhead_ratio={statistics.median(ratios):.3f} bytes_per_step={max(sizes)}")


if __name__ == "__main__":
    main()
