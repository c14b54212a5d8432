"""Seconds per step of the full real geometry on one CUDA device, random weights.

Builds the 30-layer DiffusionGemma (26 B parameters, bf16, about 52 GB) directly on the GPU with
random weights, then times the engine's block loop on a 256-token canvas at 16 and 48 steps
(confidence 0, so every step runs): seconds per step, tokens per second, peak VRAM.

Fast path: a transformers StaticCache for the context (the encoder fills it; the decoder reads it
read-only, copying the canvas keys into a fixed-size buffer, so every step and block has the same
shapes) and the model's decoder forward under torch.compile. Each variant (static cache alone, then
static + compiled) counts only when its tokens are identical to the plain path's for the same seed:
the longer, zero-padded attention rows round differently in bf16 (logits within ~0.005 of the
plain path's on the tiny model). It stays a benchmark path, not the engine's: once the context
reaches the sliding window (1,024 tokens in the real model) transformers' static sliding-window
layers keep other context than the dynamic ones (`sliding_window` tokens, not `sliding_window - 1`,
and the canvas copied at a position that stops advancing), and the decoder's logits diverge (on the
tiny model, window 512: off by 0.1 at 512 context tokens, 0.7 at 700). It also needs the whole
length up front. The benchmark's context (64 prompt tokens, one block) stays inside the window.

    python benchmarks/gpu.py                 # needs a GPU with ~60 GB free
    python benchmarks/gpu.py --dry-run       # the same code on the CPU at a tiny slice (CI), compile
                                             # with the "eager" backend (traced, no code generation)

Last line: gpu_s_per_step=<48 steps> gpu_s_per_step_fast16=<16 steps, fast path or plain>
tok_per_s_16=<> tok_per_s_48=<> peak_vram_gib=<>
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from headless import load_pack  # noqa: E402

load_pack()
from diffusiongemma.dgemma import Knobs  # noqa: E402
from diffusiongemma.dgemma.cache import encode_ids, new_cache  # noqa: E402
from diffusiongemma.dgemma.loop import denoise_blocks  # noqa: E402
from diffusiongemma.dgemma.seeding import make_generator  # noqa: E402
from diffusiongemma.dgemma.trace import Recorder  # noqa: E402
from diffusiongemma.testing import realscale  # noqa: E402

PROMPT_TOKENS = 64


def build(config, device: str):
    """The model with random weights (its own init), built on `device` in bf16 without a CPU copy."""
    from transformers import DiffusionGemmaForBlockDiffusion

    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = DiffusionGemmaForBlockDiffusion(config)
    finally:
        torch.set_default_dtype(torch.float32)
    return model.eval()


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def static_cache(model, length: int):
    """A StaticCache for `length` context tokens: fixed shapes for every step and block."""
    from transformers import StaticCache

    return StaticCache(config=model.config.get_text_config(decoder=True), max_cache_len=length)


def run(model, steps: int, device: str, static: bool = False) -> tuple[list[int], float, int]:
    """(committed ids, seconds per step, steps executed) for one block after a fixed random prompt."""
    knobs = Knobs(seed=1, num_inference_steps=steps, gen_length=model.config.canvas_length, confidence=0.0)
    vocab = model.config.get_text_config(decoder=True).vocab_size
    prompt = torch.randint(3, min(1000, vocab), (PROMPT_TOKENS,), generator=torch.Generator().manual_seed(0)).tolist()
    cache = static_cache(model, PROMPT_TOKENS + model.config.canvas_length) if static else new_cache(model)
    encode_ids(model, cache, prompt)
    recorder = Recorder(knobs, model.config.canvas_length)
    sync(device)
    start = time.perf_counter()
    ids = denoise_blocks(model, cache, knobs, make_generator(knobs.seed, torch.device(device)), (), recorder)
    sync(device)
    seconds = time.perf_counter() - start
    return ids[0].tolist(), seconds / len(recorder), len(recorder)


def compile_decoder(model, backend: str):
    """The model's forward (in the loop: decoder, head and softcap) compiled; undone by `plain_path`."""
    model._plain_forward = model.forward
    model.forward = torch.compile(model.forward, dynamic=False, backend=backend)


def plain_path(model):
    model.forward = model._plain_forward


def variants(model, device: str, backend: str, step_counts, plain: dict) -> dict:
    """{steps: s/step} of the fastest variant whose tokens equal the plain path's."""
    best = {}
    for name, compiled in (("static", False), ("static+compiled", True)):
        if compiled:
            compile_decoder(model, backend)
        try:
            for steps in step_counts:
                run(model, steps, device, static=True)  # compile + warm-up
                ids, per_step, _ = run(model, steps, device, static=True)
                same = ids == plain[steps][0]
                print(f"{name} {steps} steps: {per_step:.4f} s/step, tokens identical to plain: {same}", flush=True)
                if same:
                    best[steps] = min(best.get(steps, per_step), per_step)
        finally:
            if compiled:
                plain_path(model)
    return best


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true",
                        help="CPU, the tiny test geometry, the fast path traced without code generation")
    parser.add_argument("--no-fast", action="store_true", help="skip the static-cache and compiled paths")
    args = parser.parse_args(argv)
    if args.dry_run:
        from diffusiongemma.testing.tiny import build_model

        device, config, backend = "cpu", build_model("random")[0].config, "eager"
        step_counts = (2, 3)
    else:
        if not torch.cuda.is_available():
            sys.exit("no CUDA device; run with --dry-run to check the script on the CPU")
        device, config, backend = "cuda", realscale.real_config(), "inductor"
        step_counts = (16, 48)
    model = build(config, device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    results = {}
    for steps in step_counts:
        run(model, steps, device)  # warm-up
        ids, per_step, done = run(model, steps, device)
        results[steps] = (ids, per_step)
        print(f"plain {steps} steps: {per_step:.4f} s/step, {done} steps, "
              f"{config.canvas_length / (per_step * done):.1f} tok/s", flush=True)
    fast = {} if args.no_fast else variants(model, device, backend, step_counts, results)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else 0.0
    few, many = step_counts
    best_few = min(fast.get(few, results[few][1]), results[few][1])
    tok = {s: config.canvas_length / (min(fast.get(s, r[1]), r[1]) * s) for s, r in results.items()}
    print(f"gpu_s_per_step={results[many][1]:.4f} gpu_s_per_step_fast{few}={best_few:.4f} "
          f"tok_per_s_{few}={tok[few]:.1f} tok_per_s_{many}={tok[many]:.1f} peak_vram_gib={peak:.1f} "
          f"device={device}")


if __name__ == "__main__":
    main()
