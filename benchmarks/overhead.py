"""Engine with full capture vs diffusers' bare DiffusionGemmaPipeline, side by side.

Both run the same checkpoint, seed and knobs, alternating, several repeats, on the tiny random
model (48 steps) and on the real-vocabulary model (262,144 tokens; fewer steps, its sampling
costs seconds per step on a CPU), then one line per scheduler (the Advanced sampler's path against
the pipeline driven by the same scheduler, tiny model). Needs a transformers where the pipeline
works (< 5.24).

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
from diffusiongemma.dgemma.resume import Advanced  # noqa: E402
from diffusiongemma.dgemma.schedulers import Scheduling  # noqa: E402
from diffusiongemma.testing.tiny import build_checkpoint  # noqa: E402

PROMPT = "What is 3+4?"


def diffusers_scheduler(knobs: Knobs, scheduling: Scheduling, canvas_length: int):
    import diffusers

    config = {k: v for k, v in scheduling.config(knobs).items() if k != "temperature"}
    if scheduling.name == "block_refinement":
        config.update(block_length=canvas_length, editing_threshold=config["editing_threshold"] or None)
    return getattr(diffusers, scheduling.diffusers_name)(**config)


def pipeline_seconds(dm, knobs: Knobs, scheduling: Scheduling = Scheduling()) -> float:
    from diffusers import DiffusionGemmaPipeline

    scheduler = diffusers_scheduler(knobs, scheduling, dm.canvas_length)
    pipe = DiffusionGemmaPipeline(model=dm.model, scheduler=scheduler, processor=dm.processor)
    pipe.set_progress_bar_config(disable=True)
    start = time.perf_counter()
    pipe(prompt=PROMPT, gen_length=knobs.gen_length, num_inference_steps=knobs.num_inference_steps,
         confidence_threshold=knobs.confidence or None, generator=torch.Generator().manual_seed(knobs.seed),
         temperature=scheduling.temperature, output_type="seq")
    return time.perf_counter() - start


def engine_seconds(dm, knobs: Knobs, advanced: Advanced | None = None) -> tuple[float, int]:
    start = time.perf_counter()
    result = generate(dm, PROMPT, knobs, advanced=advanced)
    return time.perf_counter() - start, result.trace.nbytes // len(result.trace)


def scheduler_lines(dm, knobs: Knobs, repeats: int = 3) -> None:
    """One line per scheduler: the Advanced path against the pipeline driven by that scheduler."""
    for scheduling in (Scheduling(), Scheduling("block_refinement"), Scheduling("discrete_ddim", corrector_steps=1)):
        adv = Advanced(scheduling)
        engine_seconds(dm, knobs, adv), pipeline_seconds(dm, knobs, scheduling)  # warm-up
        ratios = []
        for _ in range(repeats):
            ours = engine_seconds(dm, knobs, adv)[0]
            ratios.append(ours / pipeline_seconds(dm, knobs, scheduling))
        print(f"scheduler {scheduling.name}: median ratio {statistics.median(ratios):.3f} "
              f"(tiny, {knobs.num_inference_steps} steps, {repeats} repeats)", flush=True)


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
            if name == "tiny":
                scheduler_lines(dm, knobs)
    print(f"overhead_ratio={statistics.median(ratios):.3f} bytes_per_step={max(sizes)}")


if __name__ == "__main__":
    main()
