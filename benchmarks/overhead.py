"""Engine with full capture vs diffusers' bare DiffusionGemmaPipeline, side by side.

Both run the same checkpoint, seed and knobs on the tiny random model (48 steps) and on the
real-vocabulary model (262,144 tokens; fewer steps, its sampling costs seconds per step on a CPU),
then one line per scheduler (the Advanced sampler's path against the pipeline driven by the same
scheduler, tiny model). Timing as in timing.py: CPU seconds per run, contenders alternating,
median and interquartile range of the paired ratios. Needs a transformers where the pipeline
works (< 5.24).

    python benchmarks/overhead.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
from timing import median_iqr, paired_ratios  # noqa: E402

from headless import load_pack  # noqa: E402

load_pack()
from diffusiongemma.dgemma import Knobs, generate, load_model  # noqa: E402
from diffusiongemma.dgemma.denoising.resume import Advanced  # noqa: E402
from diffusiongemma.dgemma.steps.schedulers import Scheduling  # noqa: E402
from diffusiongemma.testing.tiny import build_checkpoint  # noqa: E402

PROMPT = "What is 3+4?"


def diffusers_scheduler(knobs: Knobs, scheduling: Scheduling, canvas_length: int):
    """A fresh diffusers scheduler with the config of the one the engine builds."""
    impl = scheduling.build(knobs, canvas_length, "cpu").impl
    return type(impl).from_config(impl.config)


def run_pipeline(dm, knobs: Knobs, scheduling: Scheduling = Scheduling()) -> None:
    from diffusers import DiffusionGemmaPipeline

    scheduler = diffusers_scheduler(knobs, scheduling, dm.canvas_length)
    pipe = DiffusionGemmaPipeline(model=dm.model, scheduler=scheduler, processor=dm.processor)
    pipe.set_progress_bar_config(disable=True)
    pipe(prompt=PROMPT, gen_length=knobs.gen_length, num_inference_steps=knobs.num_inference_steps,
         confidence_threshold=knobs.confidence or None, generator=torch.Generator().manual_seed(knobs.seed),
         temperature=dict(scheduling.settings).get("temperature", 0.0), output_type="seq")


def scheduler_lines(dm, knobs: Knobs, repeats: int = 5) -> None:
    """One line per scheduler: the Advanced path against the pipeline driven by that scheduler."""
    for scheduling in (Scheduling(), Scheduling("block_refinement"), Scheduling("discrete_ddim", corrector_steps=1)):
        adv = Advanced(scheduling)
        ratios = paired_ratios(lambda a=adv: generate(dm, PROMPT, knobs, advanced=a),
                               lambda s=scheduling: run_pipeline(dm, knobs, s), repeats)
        med, iqr = median_iqr(ratios)
        print(f"scheduler {scheduling.name}: median ratio {med:.3f} IQR {iqr:.3f} "
              f"(tiny, {knobs.num_inference_steps} steps, {repeats} pairs, CPU s)", flush=True)


def compare(name: str, dm, knobs: Knobs, repeats: int) -> tuple[list[float], int]:
    result = generate(dm, PROMPT, knobs)
    per_step = result.trace.nbytes // len(result.trace)
    ratios = paired_ratios(lambda: generate(dm, PROMPT, knobs), lambda: run_pipeline(dm, knobs), repeats, name)
    med, iqr = median_iqr(ratios)
    print(f"{name}: median ratio {med:.3f} IQR {iqr:.3f}, trace {per_step} bytes/step "
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
    med, iqr = median_iqr(ratios)
    print(f"overhead_ratio={med:.3f} overhead_iqr={iqr:.3f} bytes_per_step={max(sizes)}")


if __name__ == "__main__":
    main()
