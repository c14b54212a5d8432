"""Engine with full capture vs diffusers' bare DiffusionGemmaPipeline, side by side.

Both run the same checkpoint, seed and knobs, alternating, several repeats, on the tiny random
model (48 steps) and on the real-vocabulary model (262,144 tokens; fewer steps, its sampling
costs seconds per step on a CPU). Runs are timed in CPU seconds and reported as the median and
interquartile range of the paired ratios (benchmarks/timing.py). Needs a transformers where the
pipeline works (< 5.24).

    python benchmarks/overhead.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import median_iqr, paired_ratios  # noqa: E402

from headless import load_pack  # noqa: E402

load_pack()
from diffusiongemma.dgemma import Knobs, generate, load_model  # noqa: E402
from diffusiongemma.testing.tiny import build_checkpoint  # noqa: E402

PROMPT = "What is 3+4?"


def run_pipeline(dm, knobs: Knobs) -> None:
    from diffusers import DiffusionGemmaPipeline, EntropyBoundScheduler

    scheduler = EntropyBoundScheduler(entropy_bound=knobs.entropy_bound, t_max=knobs.t_max, t_min=knobs.t_min,
                                      num_inference_steps=knobs.num_inference_steps)
    pipe = DiffusionGemmaPipeline(model=dm.model, scheduler=scheduler, processor=dm.processor)
    pipe.set_progress_bar_config(disable=True)
    pipe(prompt=PROMPT, gen_length=knobs.gen_length, num_inference_steps=knobs.num_inference_steps,
         confidence_threshold=knobs.confidence or None, generator=torch.Generator().manual_seed(knobs.seed),
         output_type="seq")


def compare(name: str, dm, knobs: Knobs, repeats: int) -> tuple[list[float], int]:
    result = generate(dm, PROMPT, knobs)
    per_step = result.trace.nbytes // len(result.trace)
    ratios = paired_ratios(lambda: generate(dm, PROMPT, knobs), lambda: run_pipeline(dm, knobs), repeats, name)
    med, iqr = median_iqr(ratios)
    print(f"{name}: median ratio {med:.4f} IQR {iqr:.4f}, trace {per_step} bytes/step "
          f"(canvas {dm.canvas_length}, vocab {dm.vocab_size})", flush=True)
    return ratios, per_step


def main() -> None:
    torch.set_num_threads(2)
    ratios, sizes = [], []
    with tempfile.TemporaryDirectory() as tmp:
        cases = [("tiny", "random", Knobs(seed=3, num_inference_steps=48, gen_length=256), 15),
                 ("real-vocab", "real-vocab", Knobs(seed=3, num_inference_steps=4, gen_length=256), 7)]
        for name, preset, knobs, repeats in cases:
            dm = load_model(str(build_checkpoint(Path(tmp) / preset, preset)))
            r, size = compare(name, dm, knobs, repeats)
            ratios += r
            sizes.append(size)
    med, iqr = median_iqr(ratios)
    print(f"overhead_ratio={med:.4f} iqr={iqr:.4f} bytes_per_step={max(sizes)}")


if __name__ == "__main__":
    main()
