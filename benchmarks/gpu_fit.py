"""The real geometry quantized (4bit, 8bit) whole on one CUDA device: peak VRAM at a step and s/step at 16 and 48.

The model is built on the GPU module by module with random weights (transformers' own init, bf16),
each text layer's fused experts quantized the moment they exist by the loader's own
code (quant_at_load.prepare marks them and shares the encoder's with the decoder's, weightquant
quantizes), so the bf16 model is never whole on the card. Then the engine's block loop runs one
256-token block after a 64-token prompt at 16 and 48 steps (confidence 0: every step runs), a
warm-up first. Peak VRAM: torch's peak allocated over the steps (reset after the build) and the
card's used memory sampled every 20 ms (all processes: CUDA context included).

    python benchmarks/gpu_fit.py                   # a GPU with ~25 GB free; prints one line per mode
    python benchmarks/gpu_fit.py --dry-run         # the same path on the CPU at the small slice geometry

On a lent GPU machine: `bash benchmarks/gpu_device.sh fit` (one call, both modes, under 8 minutes).

Last line: per mode q{4,8}_peak_alloc_gib, q{4,8}_peak_used_gib, q{4,8}_s_per_step_16, q{4,8}_s_per_step_48.
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import gpu  # noqa: E402  (loads the pack)

from diffusiongemma.dgemma.loading import quant_at_load as qal  # noqa: E402
from diffusiongemma.dgemma.loading import weightquant as wq  # noqa: E402
from diffusiongemma.testing import realscale, realslice  # noqa: E402


def random_quantized_model(config, quant: str, device: str):
    """`config`'s model on `device` with random bf16 weights, the loader's targets quantized as they are made."""
    from accelerate import init_empty_weights
    from transformers import DiffusionGemmaForBlockDiffusion

    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with init_empty_weights(include_buffers=False):  # buffers (rotary tables, scalars) computed as usual
            model = DiffusionGemmaForBlockDiffusion(config)
    finally:
        torch.set_default_dtype(previous)
    qal.prepare(model, quant)
    done = set()
    with torch.no_grad():
        for _, module in model.named_modules():
            if id(module) in done:
                continue  # an encoder module shared with the decoder's
            done.add(id(module))
            for name, b in module.named_buffers(recurse=False):
                module._buffers[name] = b.to(device)
            own = list(module.named_parameters(recurse=False))
            if not own:
                continue
            for name, p in own:
                module._parameters[name] = torch.nn.Parameter(torch.empty_like(p, device=device), requires_grad=False)
            model._init_weights(module)
            for name in wq.quantized_names(module):
                packed = wq.quantize(getattr(module, name).data, wq.MODES[quant])
                setattr(module, name, torch.nn.Parameter(packed, requires_grad=False))
    model.tie_weights()  # the embeddings, norms and router scales the encoder takes from the decoder
    qal.check_loaded(model)
    return model.eval()


def bench(config, quant: str, device: str, step_counts) -> str:
    start = time.perf_counter()
    model = random_quantized_model(config, quant, device)
    gpu.sync(device)
    built = time.perf_counter() - start
    name = f"q{wq.MODES[quant].bits}"
    weights = sum(t.numel() * t.element_size() for t in {id(t): t for t in [*model.parameters(), *model.buffers()]}
                  .values())
    print(f"{quant}: built on {device} in {built:.1f} s, {weights / 2**30:.2f} GiB of weights", flush=True)
    if device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    out = []
    with gpu.PeakSampler(device) as used:
        for steps in step_counts:
            gpu.run(model, steps, device)  # warm-up
            _, per_step, done = gpu.run(model, steps, device)
            print(f"{quant} {steps} steps: {per_step:.4f} s/step ({done} steps)", flush=True)
            out.append(f"{name}_s_per_step_{steps}={per_step:.4f}")
    alloc = torch.cuda.max_memory_allocated() if device == "cuda" else used.peak
    print(f"{quant}: peak allocated {alloc / 2**30:.2f} GiB, peak used on the device {used.peak / 2**30:.2f} GiB",
          flush=True)
    del model
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return f"{name}_peak_alloc_gib={alloc / 2**30:.2f} {name}_peak_used_gib={used.peak / 2**30:.2f} " + " ".join(out)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dry-run", action="store_true", help="CPU, the small slice geometry, 2 and 3 steps")
    parser.add_argument("--quants", default="4bit,8bit")
    args = parser.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        sys.exit("no CUDA device; run with --dry-run to check the script on the CPU")
    if args.dry_run:
        torch.set_num_threads(1)
        config, device, step_counts = realslice.SMALL.config(), "cpu", (2, 3)
    else:
        config, device, step_counts = realscale.real_config(), "cuda", (16, 48)
    print(gpu.versions(), flush=True)
    lines = [bench(config, quant, device, step_counts) for quant in args.quants.split(",")]
    print(" ".join(lines) + f" device={device}")


if __name__ == "__main__":
    main()
