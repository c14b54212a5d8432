"""The real geometry on the CPU: the load path, memory plans against measured peaks, capture overhead, trace size.

- load_overhead_seconds: CPU seconds of load_model in a fresh process from its call to the first
  weight placed in the model (every check, pattern and per-key step included: the preflight's
  headers, auto-round's conversion, transformers' whole key loop), at the full published AutoRound
  layout (71,494 keys, 23,450 packed modules; narrow widths, testing/fulllayout.py). The first
  tensor read and the whole call's CPU time are printed beside it.
- preflight_step_error: |the device plan's budget for a run - the run's measured peak| / measured, on the
  bf16 slice. The budget is the weights as they end up resident plus one step at the canvas and the real
  vocabulary; the measured peak is a fresh child's resident size after the load (every weight touched, a
  first run done) plus the peak (VmHWM, reset there) of a run of two steps (the second with
  self-conditioning) over its resident size then.
- preflight_int4_error: the same on the slice's AutoRound twin where it was built (2 minutes, 22-24 GB of
  RAM), else on the small AutoRound twin (vocabulary 8,192; seconds to build).
- slice_overhead_ratio: engine with full capture vs diffusers' bare pipeline on the bf16 slice
  (2 real-size text layers, vocabulary 262,144), same seed and knobs, at confidence 0.005 and 0;
  CPU seconds per run, alternating, median (and IQR) of the paired ratios; token parity checked.
- trace_bytes_per_step: the captured trace per executed step at the real canvas and vocabulary.

    python benchmarks/real_geometry.py [--repeats 7] [--steps 3] [--threads 1] [--parts load,memory,overhead]

Builds once (~/.cache/dgemma-real-slice) the 4.6 GB slice and the 74 MB full-layout twin; needs a
transformers where the pipeline works (< 5.24). A 1 % verdict needs a quiet machine.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
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
from diffusiongemma.dgemma import Knobs, generate, load_model  # noqa: E402
from diffusiongemma.dgemma.loading import preflight  # noqa: E402
from diffusiongemma.testing import fulllayout, realslice  # noqa: E402

PROMPT = "What is 3+4?"
STEPS = 2  # the second step carries the first one's self-conditioning
MMAP_THRESHOLD = 1 << 20  # bytes: every larger block is mapped for itself and unmapped when freed


def vm(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def reset_peak() -> None:
    """Start this process's peak resident size (VmHWM) afresh from its resident size now (Linux)."""
    Path("/proc/self/clear_refs").write_text("5")


def measure_load(folder: str, quant: str) -> dict:
    """In this (fresh) process: what the plan budgets, and this process's own sizes: its peak through the load
    (over its resident size before), its resident size after the load and after a first run, and its peak through
    a second run of STEPS real steps at the canvas alone (over its resident size then, the peak reset there;
    every weight touched before either run). Run with a fixed
    malloc mmap threshold, so freed tensors leave the resident size and a peak counts what was live."""
    import transformers  # noqa: F401  (imports are not the model's memory)

    from diffusiongemma.dgemma.loading import deviceplan
    from diffusiongemma.dgemma.loading.quant import shared_copy_bytes
    if quant == "autoround":
        import auto_round  # noqa: F401
    headers = preflight.read_headers(Path(folder))
    stored, per_dtype = preflight.checkpoint_bytes(Path(folder), headers)
    before = vm("VmRSS")
    dm = load_model(folder, quant=quant, device="cpu")
    load_peak = vm("VmHWM") - before
    text = dm.model.config.get_text_config(decoder=True)
    context = len(dm.tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], tokenize=True,
                                                   add_generation_prompt=True, return_dict=True)["input_ids"])
    weights = preflight.loaded_bytes(stored, per_dtype, "auto")
    need = deviceplan.Need(weights, weights - shared_copy_bytes(headers),
                           deviceplan.step_bytes(text, dm.canvas_length, context))
    with torch.no_grad():  # weights are mapped from the files: touch every one, so none is paged in mid-step
        for tensor in [*dm.model.parameters(), *dm.model.buffers()]:
            if tensor.numel():
                tensor.amax()  # reads every element, copies none
    knobs = Knobs(seed=3, num_inference_steps=STEPS, gen_length=dm.canvas_length, confidence=0.0)
    gc.collect()
    at_rest = vm("VmRSS")
    generate(dm, PROMPT, knobs)  # a process's first run also keeps what it sets up once (imports, caches)
    gc.collect()
    once = vm("VmRSS") - at_rest
    reset_peak()
    start = vm("VmRSS")
    generate(dm, PROMPT, knobs)
    return {"predicted_load": need.load, "predicted_run": need.resident + need.step,
            "predicted_step": need.step, "load_peak": load_peak, "resident": at_rest - before, "once": once,
            "step_peak": vm("VmHWM") - start,
            "shared": getattr(dm.model, "_dgemma_shared_layers", None)}


def memory_truth() -> tuple[float, float]:
    """(bf16 error, INT4 error) of the plan's budget for a run (resident weights + a step) against the run's peak.

    bf16: the real-vocabulary slice (where the bytes per logit were calibrated). INT4: the slice's AutoRound
    twin where it was built, else the small AutoRound twin (vocabulary 8,192, built in seconds), with the small
    bf16 twin beside it as the same check away from the calibration point.
    """
    real_int4 = realslice.cache_root() / realslice.REAL.name / "int4"
    runs = [("bf16 slice", realslice.slice_dir(), "none")]
    if (real_int4 / "config.json").is_file():
        runs.append(("INT4 slice twin", real_int4, "autoround"))
    else:
        runs += [("small bf16 twin", realslice.slice_dir(realslice.SMALL), "none"),
                 ("small INT4 twin", realslice.int4_dir(realslice.SMALL), "autoround")]
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD)}
    errors = {}
    for label, folder, quant in runs:
        out = subprocess.run([sys.executable, __file__, "--measure-load", str(folder), quant, "--threads", "1"],
                             capture_output=True, text=True, check=True, env=env)
        m = json.loads(out.stdout.strip().splitlines()[-1])
        run = m["resident"] + m["once"] + m["step_peak"]
        errors[label] = abs(m["predicted_run"] - run) / run
        mib = {k: f"{v / 2**20:.1f} MiB" for k, v in m.items() if k != "shared"}
        print(f"memory, {label}: run: plan {mib['predicted_run']} (weights resident "
              f"{(m['predicted_run'] - m['predicted_step']) / 2**20:.1f} MiB, step {mib['predicted_step']}), "
              f"measured {run / 2**20:.1f} MiB (resident after the load {mib['resident']}, kept by the first run "
              f"{mib['once']}, the step's own peak over a {STEPS}-step run {mib['step_peak']}; error "
              f"{errors[label]:.3f}; the step alone {abs(m['predicted_step'] - m['step_peak']) / m['step_peak']:.3f}); "
              f"load: plan {mib['predicted_load']}, the child's peak through the load {mib['load_peak']}; "
              f"shared packed layers {m['shared']}", flush=True)
    return errors["bf16 slice"], errors.get("INT4 slice twin", errors.get("small INT4 twin"))


def load_overhead() -> float:
    """CPU seconds of a fresh process's load_model, from its call to the first weight placed in the model, at
    the full published AutoRound layout (71,494 keys; narrow widths, testing/fulllayout.py)."""
    folder = realslice.cache_root() / "fulllayout"
    if not (folder / "config.json").is_file():
        fulllayout.build(folder)
    out = subprocess.run([sys.executable, __file__, "--first-weight", str(folder)], capture_output=True, text=True,
                         check=True)
    read, placed, whole = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"load: {placed:.2f} CPU s of load_model before the first weight is placed (the first tensor read "
          f"at {read:.2f} s: transformers' reader threads start with the key loop); {whole:.2f} CPU s for the "
          "whole load_model (71,494 keys, 23,450 packed modules; 74 MB of tensors, so nearly all of it is per-key "
          "and per-module work)", flush=True)
    return placed


def first_weight(folder: str) -> tuple[float, float, float]:
    """CPU s from load_model's call to its first tensor read, to its first weight placed, and to its return."""
    import auto_round  # noqa: F401  (imports are paid once per process, not per load)
    from transformers import core_model_loading as cml

    logging.getLogger("auto_round").setLevel(logging.ERROR)
    first = {}

    def noting(name, original):
        def noted(*args, **kwargs):
            first.setdefault(name, time.process_time())  # all threads' CPU time, as the whole call's
            return original(*args, **kwargs)
        return noted

    cml._materialize_copy = noting("read", cml._materialize_copy)
    cml.set_param_for_module = noting("placed", cml.set_param_for_module)
    start = time.process_time()
    load_model(folder, quant="autoround", device="cpu")
    return first["read"] - start, first["placed"] - start, time.process_time() - start


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
    from diffusiongemma.dgemma.denoising.cache import encode_ids, new_cache
    from diffusiongemma.dgemma.denoising.loop import AdaptiveStop, BlockDecoder, step_entropy
    from diffusiongemma.dgemma.readouts.trace import Recorder
    from diffusiongemma.dgemma.steps.schedulers import Scheduling

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
    parser.add_argument("--parts", default="load,memory,overhead", help="comma list of load, memory, overhead")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--measure-load", nargs=2, metavar=("FOLDER", "QUANT"), help=argparse.SUPPRESS)
    parser.add_argument("--first-weight", metavar="FOLDER", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.measure_load:
        print(json.dumps(measure_load(*args.measure_load)))
        return
    if args.first_weight:
        print(json.dumps(first_weight(args.first_weight)))
        return
    parts = set(args.parts.split(","))
    nan = float("nan")
    load = load_overhead() if "load" in parts else nan
    step_error, int4_error = memory_truth() if "memory" in parts else (nan, nan)
    ratio, per_step = overhead(args.repeats, args.steps) if "overhead" in parts else (nan, 0)
    print(f"load_overhead_seconds={load:.2f} preflight_step_error={step_error:.3f} "
          f"preflight_int4_error={int4_error:.3f} slice_overhead_ratio={ratio:.4f} trace_bytes_per_step={per_step}")


if __name__ == "__main__":
    main()
