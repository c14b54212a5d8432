"""The GGUF real-width slice (testing/gguf_slice.py) measured in fresh children, for benchmarks/gguf.py.

- peak: the Q4_K_M slice loaded on the CPU computing in bfloat16 (what `auto` computes in on a GPU),
  every block touched, then a run of two steps at the 256-token canvas (the second with self-conditioning);
  its peak (VmHWM reset there) over the resident size then. The real model's peak at a step is its
  tensors as held in Q4_K_M (computed from the real geometry, testing/gguf_mix) plus that step peak, as
  benchmarks/fit.py extrapolates (the slice's step holds one layer's experts dense at a time and the whole
  embedding, both at their real sizes).
- ratio: the same slice and its dense twin (every weight dequantized to bfloat16) in one process; one step
  each (a forward with self-conditioning), alternated, the median of `repeats`; Q4_K_M over bf16.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch

MMAP_THRESHOLD = 1 << 20
GIB = 2**30


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


def peak(path: str) -> dict:
    from diffusiongemma.dgemma import Knobs, generate, load_model
    from diffusiongemma.testing.fitcheck import PROMPT

    dm = load_model(path, quant="gguf", device="cpu", dtype="bfloat16")
    with torch.no_grad():
        for t in [*dm.model.parameters(), *dm.model.buffers()]:
            if t.numel():
                t.max()
    Path("/proc/self/clear_refs").write_text("5")
    at = _status("VmRSS")
    generate(dm, PROMPT, Knobs(seed=3, num_inference_steps=2, gen_length=256, confidence=0.0))
    return {"step_peak": _status("VmHWM") - at}


@torch.no_grad()
def _stepper(dm):
    """A step of `dm` on a seeded canvas with the previous step's logits (self-conditioning): a callable."""
    from diffusiongemma.dgemma.denoising.cache import encode_ids, new_cache
    from diffusiongemma.dgemma.denoising.loop import BlockDecoder
    from diffusiongemma.testing.fitcheck import PROMPT

    cache = new_cache(dm.model)
    ids = dm.tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], tokenize=True,
                                           add_generation_prompt=True, return_dict=True)["input_ids"]
    encode_ids(dm.model, cache, ids)
    blocks = BlockDecoder(dm.model, cache)
    canvas = blocks.start_block(torch.Generator(device=blocks.device).manual_seed(3))
    first = blocks.logits(canvas, None)
    return lambda: blocks.logits(canvas, first)


def ratio(path: str, repeats: int) -> dict:
    from diffusiongemma.dgemma import load_model
    from diffusiongemma.testing.gguf_slice import dense_twin

    steps = {"gguf": _stepper(load_model(path, quant="gguf", device="cpu", dtype="bfloat16")),
             "bf16": _stepper(dense_twin(Path(path), torch.bfloat16))}
    times: dict[str, list[float]] = {k: [] for k in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            start = time.perf_counter()
            with torch.no_grad():
                step()
            times[name].append(time.perf_counter() - start)
    return {k: statistics.median(v) for k, v in times.items()} | {"all": times}


def real_held(mix: str = "Q4_K_M") -> tuple[int, object]:
    """The real model's bytes as held in `mix` (bf16 plain tensors, as on a GPU) and the plan's Need."""
    from diffusiongemma.dgemma.loading import gguf_plan
    from diffusiongemma.testing import gguf_mix, realscale

    config = realscale.real_config()
    types = gguf_mix.types(config, mix)
    plan = {n: SimpleNamespace(name=n, shape=s, nbytes=gguf_mix.nbytes(s, types[n]))
            for n, s in gguf_mix.tensors(config) if n != "rope_freqs.weight"}
    return (gguf_plan.held_bytes(plan, torch.bfloat16),
            gguf_plan.need(plan, config.text_config, config.canvas_length, torch.bfloat16))


def child(kind: str, path: Path, threads: int, repeats: int = 3) -> dict:
    # the peak child returns large blocks to the system when freed, so its high-water mark is the step's own;
    # the ratio child allocates as ComfyUI does (that setting makes each large temporary fault its pages in)
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD)} if kind == "peak" else None
    args = [sys.executable, str(Path(__file__).resolve().parent / "gguf.py"), "--measure", kind, str(path),
            "--threads", str(threads), "--repeats", str(repeats)]
    out = subprocess.run(args, capture_output=True, text=True, env=env)
    if out.returncode:
        sys.exit(f"the {kind} child failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])
