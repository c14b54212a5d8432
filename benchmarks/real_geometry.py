"""The real geometry on the CPU: capture overhead on a real-size slice, memory truth, trace size, prep time.

- slice_overhead_ratio: engine with full capture vs diffusers' bare pipeline on the bf16 slice
  (2 real-size text layers, vocabulary 262,144), same seed and knobs, at confidence 0.005 and 0;
  CPU seconds per run, alternating, median (and IQR) of the paired ratios. Token parity is
  checked on the same runs. Per confidence, the loop's per-step breakdown in CPU seconds (model
  forward, scheduler, stop, capture) and capture as a share of the bare pipeline's step.
- preflight_error: |what preflight budgets - measured resident growth of the load| / measured,
  the worse of bf16 and AutoRound INT4 (each load in a fresh process; peak growth).
- trace_bytes_per_step: the captured trace per executed step at the real canvas and vocabulary.
- prep_seconds: CPU seconds of everything before weights at the full 30-layer AutoRound geometry.

    python benchmarks/real_geometry.py [--repeats 7] [--steps 3] [--threads 2]

Builds (once, ~/.cache/dgemma-real-slice) a 4.9 GB slice and its INT4 twin; needs a
transformers where the pipeline works (< 5.24). A 1 % verdict needs a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import logging
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
from timing import median_iqr, paired_ratios  # noqa: E402

from headless import load_pack  # noqa: E402

load_pack()
from diffusiongemma.dgemma import Knobs, generate, load_model, preflight  # noqa: E402
from diffusiongemma.testing import realscale, realslice  # noqa: E402

PROMPT = "What is 3+4?"


def rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def touch(model) -> None:
    """Read one value per 4 KB page of every weight, so mmapped weights count as resident."""
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            flat = t.detach().reshape(-1)
            step = max(1, 4096 // max(1, flat.element_size()))
            flat[::step].float().sum()


def measure_load(folder: str, quant: str) -> dict:
    """In this (fresh) process: predicted bytes, and resident growth once loaded and every weight touched.

    transformers maps bf16 safetensors lazily, so growth right after the load undercounts; the
    first forward pass reads every weight anyway, which `touch` does without the activations.
    """
    stored, per_dtype = preflight.checkpoint_bytes(Path(folder))
    predicted = preflight.loaded_bytes(stored, per_dtype, "auto")
    import transformers  # noqa: F401  (imports are not the model's memory)
    if quant == "autoround":
        import auto_round  # noqa: F401
    before = rss()
    dm = load_model(folder, quant=quant, device="cpu")
    loaded = rss() - before
    touch(dm.model)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    shared = getattr(dm.model, "_dgemma_shared_layers", None)
    return {"predicted": predicted, "peak_growth": peak, "loaded_growth": loaded, "resident_growth": rss() - before,
            "shared": shared}


def memory_truth() -> float:
    worst = 0.0
    for folder, quant in ((realslice.slice_dir(), "none"), (realslice.int4_dir(), "autoround")):
        out = subprocess.run([sys.executable, __file__, "--measure-load", str(folder), quant],
                             capture_output=True, text=True, check=True)
        m = json.loads(out.stdout.strip().splitlines()[-1])
        error = abs(m["predicted"] - m["resident_growth"]) / m["resident_growth"]
        worst = max(worst, error)
        gib = {k: f"{m[k] / 2**30:.2f} GiB" for k in ("predicted", "loaded_growth", "resident_growth", "peak_growth")}
        print(f"memory {quant}: preflight {gib['predicted']}; resident growth {gib['resident_growth']} with every "
              f"weight touched ({gib['loaded_growth']} right after the load, peak {gib['peak_growth']}; shared "
              f"packed layers {m['shared']}); error {error:.3f}", flush=True)
    return worst


def prep_seconds() -> float:
    logging.getLogger("auto_round").setLevel(logging.ERROR)
    realscale.prepare_autoround(1)  # imports and backend choice, paid once per process
    start = time.process_time()
    model = realscale.prepare_autoround()
    seconds = time.process_time() - start
    del model
    print(f"prep: {seconds:.2f} CPU s before weights (30 layers, 23,450 packed modules)", flush=True)
    return seconds


def run_pipeline(dm, knobs: Knobs) -> list[int]:
    from diffusers import DiffusionGemmaPipeline, EntropyBoundScheduler

    scheduler = EntropyBoundScheduler(entropy_bound=knobs.entropy_bound, t_max=knobs.t_max, t_min=knobs.t_min,
                                      num_inference_steps=knobs.num_inference_steps)
    pipe = DiffusionGemmaPipeline(model=dm.model, scheduler=scheduler, processor=dm.processor)
    pipe.set_progress_bar_config(disable=True)
    out = pipe(prompt=PROMPT, gen_length=knobs.gen_length, num_inference_steps=knobs.num_inference_steps,
               confidence_threshold=knobs.confidence or None, generator=torch.Generator().manual_seed(knobs.seed),
               eos_early_stop=False, output_type="seq")
    return out.sequences[0].tolist()


def step_breakdown(dm, knobs: Knobs) -> dict:
    """CPU seconds per step of the loop's parts: model forward, scheduler step, stop, capture.

    The same calls as `denoise_blocks`; capture is the step's entropy beyond the scheduler's own
    (`step_entropy`) plus the recorder. The stop is the pipeline's too when `confidence` > 0.
    """
    from diffusiongemma.dgemma.cache import encode_ids, new_cache
    from diffusiongemma.dgemma.loop import AdaptiveStop, BlockDecoder, step_entropy
    from diffusiongemma.dgemma.schedulers import Scheduling
    from diffusiongemma.dgemma.trace import Recorder

    cache = new_cache(dm.model)
    encode_ids(dm.model, cache, dm.tokenizer(PROMPT)["input_ids"])
    gen = torch.Generator().manual_seed(knobs.seed)
    blocks, rec = BlockDecoder(dm.model, cache), Recorder(knobs, dm.canvas_length)
    stepper = rec.clock = Scheduling().build(knobs, blocks.L, blocks.device)
    canvas = blocks.start_block(gen)
    stop, self_cond = AdaptiveStop(knobs.confidence, canvas, blocks.device), None
    parts = {"forward": 0.0, "scheduler": 0.0, "stop": 0.0, "capture": 0.0}
    with torch.no_grad():
        for step in range(knobs.num_inference_steps):
            t0 = time.process_time()
            logits = blocks.logits(canvas, self_cond)
            t1 = time.process_time()
            out = stepper.step(logits, step, canvas, gen, blocks.logits)
            canvas, accepted, self_cond, entropy = out.canvas, out.committed, out.pred_logits, out.entropy
            t2 = time.process_time()
            entropy = step_entropy(self_cond, entropy, stop.confidence)
            t3 = time.process_time()
            canvas, committed, _ = stop.apply(canvas, self_cond, entropy)
            t4 = time.process_time()
            rec.add(0, step, canvas, accepted, committed, entropy)
            t5 = time.process_time()
            for k, v in zip(parts, (t1 - t0, t2 - t1, t4 - t3, (t3 - t2) + (t5 - t4))):
                parts[k] += v / knobs.num_inference_steps
    return parts


def reference_entropy_seconds(dm, knobs: Knobs) -> float:
    """CPU seconds of one full-vocabulary float entropy of a canvas: what capture used to add per step."""
    logits = torch.randn(1, dm.canvas_length, dm.vocab_size, generator=torch.Generator().manual_seed(knobs.seed))
    torch.distributions.Categorical(logits=logits).entropy()  # warm-up
    start = time.process_time()
    for _ in range(3):
        torch.distributions.Categorical(logits=logits).entropy()
    return (time.process_time() - start) / 3


def overhead(repeats: int, steps: int) -> tuple[float, int]:
    dm = load_model(str(realslice.slice_dir()), device="cpu")
    all_ratios, per_step = [], 0
    entropy_cost = reference_entropy_seconds(dm, Knobs(seed=3))
    for confidence in (0.005, 0.0):
        knobs = Knobs(seed=3, num_inference_steps=steps, gen_length=256, confidence=confidence)
        result = generate(dm, PROMPT, knobs)
        per_step = max(per_step, result.trace.nbytes // len(result.trace))
        parity = list(result.state.raw_ids) == run_pipeline(dm, knobs)
        parts = step_breakdown(dm, knobs)
        bare = parts["forward"] + parts["scheduler"] + (parts["stop"] if confidence > 0 else 0.0)
        print(f"confidence {confidence}: tokens identical to the pipeline: {parity}; per step (CPU s) "
              + ", ".join(f"{k} {v:.4f}" for k, v in parts.items())
              + f"; capture {parts['capture'] / bare:.2%} of the bare step (one vocabulary entropy would be "
              f"{entropy_cost / bare:.2%})", flush=True)
        ratios = paired_ratios(lambda k=knobs: generate(dm, PROMPT, k), lambda k=knobs: run_pipeline(dm, k),
                               repeats, f"slice confidence {confidence}")
        med, iqr = median_iqr(ratios)
        print(f"slice confidence {confidence}: median ratio {med:.4f} IQR {iqr:.4f}", flush=True)
        all_ratios += ratios
    return median_iqr(all_ratios)[0], per_step


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--parts", default="prep,memory,overhead", help="comma list of prep, memory, overhead")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--measure-load", nargs=2, metavar=("FOLDER", "QUANT"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.measure_load:
        print(json.dumps(measure_load(*args.measure_load)))
        return
    parts = set(args.parts.split(","))
    nan = float("nan")
    prep = prep_seconds() if "prep" in parts else nan
    error = memory_truth() if "memory" in parts else nan
    ratio, per_step = overhead(args.repeats, args.steps) if "overhead" in parts else (nan, 0)
    print(f"slice_overhead_ratio={ratio:.4f} preflight_error={error:.3f} trace_bytes_per_step={per_step} "
          f"prep_seconds={prep:.2f}")


if __name__ == "__main__":
    main()
