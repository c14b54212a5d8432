"""The first GPU phase: the headline figures of the real geometry in bf16, in one short call (under 4 minutes on
one H200, the model made on the card with random weights: no download, no checkpoint written).

- ms per step at 16 and 48 steps (a 256-token canvas after a 64-token prompt, every step run);
- ours over diffusers' DiffusionGemmaPipeline at 48 steps, the same seed: time per step, and its tokens;
- the most host waits in one step (testing/waits.py);
- a list of 8 run as one batch against each item alone: tokens and every reading, and how far the entropies
  drift (in bf16 the batch's other matmuls may round a last bit otherwise; the tokens must not move);
- the peak memory of a run over the plan's (weights as held + deviceplan's step and KV).

Every identity it prints (tokens equal to the pipeline's, waits per step at most 1, the list equal to its solo
runs) makes the run fail when it is false, after every figure is printed. `--dry-run` runs the same code on the
CPU with the small real-geometry twin's config (vocabulary 8,192) at 2 and 3 steps: CI runs it.

    bash benchmarks/gpu_device.sh phase1          # on a lent GPU (carry .whl from `wheels phase1`)
    python benchmarks/gpu_phase1.py --dry-run

Last line: ms_per_step_16 ms_per_step_48 pipeline_step_ratio pipeline_tokens_identical waits_per_step_max
list8_identical list8_entropy_max_diff peak_vs_plan device.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(REPO))
from headless import load_pack  # noqa: E402

load_pack()
from diffusiongemma.dgemma import Knobs, generate  # noqa: E402
from diffusiongemma.dgemma.denoising.run import prepare, run_batch  # noqa: E402
from diffusiongemma.dgemma.denoising.threads import compute_threads  # noqa: E402
from diffusiongemma.dgemma.loading import deviceplan, machine  # noqa: E402
from diffusiongemma.dgemma.payloads import DGemmaModel  # noqa: E402
from diffusiongemma.testing import realscale, realslice  # noqa: E402
from diffusiongemma.testing.batchcheck import differences  # noqa: E402
from diffusiongemma.testing.tensorpeak import TensorPeak  # noqa: E402
from diffusiongemma.testing.tiny_tokenizer import build_tokenizer  # noqa: E402
from diffusiongemma.testing.waits import step_waits  # noqa: E402

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle. " * 4


def made_model(dry: bool) -> DGemmaModel:
    """The real geometry in bf16 made on the GPU (the small twin's config on the CPU), with a tokenizer of its
    vocabulary, as a loaded model payload."""
    from transformers import DiffusionGemmaForBlockDiffusion

    config = realslice.SMALL.config() if dry else realscale.real_config()
    device = "cpu" if dry else f"cuda:{torch.cuda.current_device()}"
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = DiffusionGemmaForBlockDiffusion(config).eval()
    finally:
        torch.set_default_dtype(torch.float32)
    tok = build_tokenizer(config.get_text_config(decoder=True).vocab_size, seed=0)
    return DGemmaModel(model=model, tokenizer=tok, processor=tok, source="real geometry, made in memory",
                       quant="none", device=device, dtype="bfloat16", eos_ids=(tok.eos_token_id,), channel_ids=None)


def sync(dm) -> None:
    if dm.device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn, dm) -> float:
    sync(dm)
    start = time.perf_counter()
    fn()
    sync(dm)
    return time.perf_counter() - start


def knobs_for(dm, steps: int, seed: int = 1) -> Knobs:
    return Knobs(seed=seed, num_inference_steps=steps, gen_length=dm.canvas_length, confidence=0.0)


def pipeline(dm, knobs: Knobs) -> list[int]:
    from diffusers import DiffusionGemmaPipeline, EntropyBoundScheduler

    scheduler = EntropyBoundScheduler(entropy_bound=knobs.entropy_bound, t_max=knobs.t_max, t_min=knobs.t_min,
                                      num_inference_steps=knobs.num_inference_steps)
    pipe = DiffusionGemmaPipeline(model=dm.model, scheduler=scheduler, processor=dm.processor)
    with compute_threads(dm.model):  # the engine's thread count on the CPU, so both sum in the same order
        out = pipe(prompt=PROMPT, gen_length=knobs.gen_length, num_inference_steps=knobs.num_inference_steps,
                   confidence_threshold=None, generator=torch.Generator(dm.device).manual_seed(knobs.seed),
                   eos_early_stop=False, output_type="seq")
    return out.sequences[0].tolist()


def speed(dm, counts) -> dict:
    figures = {}
    for steps in counts:
        knobs = knobs_for(dm, steps)
        generate(dm, PROMPT, knobs)  # warm-up
        figures[f"ms_per_step_{steps}"] = 1000 * timed(lambda k=knobs: generate(dm, PROMPT, k), dm) / steps
    many = knobs_for(dm, counts[-1])
    ours = generate(dm, PROMPT, many)
    theirs: list = []
    pipe_s = timed(lambda: theirs.extend(pipeline(dm, many)), dm)
    figures["pipeline_step_ratio"] = figures[f"ms_per_step_{counts[-1]}"] / (1000 * pipe_s / counts[-1])
    figures["pipeline_tokens_identical"] = int(list(ours.state.raw_ids) == theirs)
    return figures


def identities(dm, steps: int) -> dict:
    _, most, _ = step_waits(lambda: generate(dm, PROMPT, knobs_for(dm, steps)))
    items = [prepare(dm, PROMPT[:40 * (1 + i)], knobs_for(dm, steps, seed=i)) for i in range(8)]
    alone = [run_batch([r])[0] for r in items]
    together = run_batch(items, max_batch=8)
    same = all(not differences(a, b, dm.token_strings) for a, b in zip(alone, together))
    drift = max(float(np.abs(a.trace.entropy.astype(np.float32) - b.trace.entropy.astype(np.float32)).max())
                for a, b in zip(alone, together))
    return {"waits_per_step_max": most, "list8_identical": int(same), "list8_entropy_max_diff": drift}


def peak_vs_plan(dm, steps: int) -> float:
    text = dm.model.config.get_text_config(decoder=True)
    plan = machine.held_bytes(dm.model) + deviceplan.step_bytes(text, dm.canvas_length, 2 * dm.canvas_length)
    if dm.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
        generate(dm, PROMPT, knobs_for(dm, steps))
        return torch.cuda.max_memory_allocated() / plan
    with TensorPeak() as p:
        generate(dm, PROMPT, knobs_for(dm, steps))
    return (machine.held_bytes(dm.model) + p.peak) / plan


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="the CPU and the small twin's config, 2 and 3 steps")
    args = parser.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        sys.exit("no CUDA device; run with --dry-run to check the script on the CPU")
    counts = (2, 3) if args.dry_run else (16, 48)
    dm = made_model(args.dry_run)
    print(f"{dm.source}: {machine.held_bytes(dm.model) / 2**30:.2f} GiB on {dm.device}", flush=True)
    figures = {**speed(dm, counts), **identities(dm, counts[0]), "peak_vs_plan": peak_vs_plan(dm, counts[0])}
    shown = {k: f"{v:.4g}" if isinstance(v, float) else v for k, v in figures.items()}
    print(" ".join(f"{k}={v}" for k, v in shown.items()) + f" device={dm.device}")
    false = [k for k in ("pipeline_tokens_identical", "list8_identical") if not figures[k]]
    false += ["waits_per_step_max"] if figures["waits_per_step_max"] > 1 else []
    if false:
        print(f"FAILED identities: {', '.join(false)}", file=sys.stderr)
    return 1 if false else 0


if __name__ == "__main__":
    sys.exit(main())
