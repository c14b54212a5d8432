"""What a run leaves behind, beside the generation itself: frames strings, images, trace.

Runs the engine on the tiny random checkpoint (canvas 256, 48 steps, every step executed) for
one and two blocks, then times building the sampler's `frames` strings plus its `images` batch
(float32 IMAGE) from the trace, side by side with the generation, several repeats; the ratio
is the median of per-repeat ratios, the worse of the two cases.

    python benchmarks/emission.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import dataclasses
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
from diffusiongemma.dgemma.inputs.tokens import frame_texts  # noqa: E402
from diffusiongemma.dgemma.readouts.images import render_images  # noqa: E402
from diffusiongemma.testing.tiny import build_checkpoint  # noqa: E402

PROMPT = "What is 3+4?"


def build(trace, token_strings):
    """What the sampler node builds after a run: its `frames` and `images` outputs."""
    return frame_texts(trace, token_strings), render_images(trace, token_strings)


def measure(dm, knobs: Knobs, repeats: int) -> dict:
    gens, builds, cpus, ratios = [], [], [], []
    for _ in range(repeats):
        start = time.perf_counter()
        result = generate(dm, PROMPT, knobs)
        gens.append(time.perf_counter() - start)
        start, cpu = time.perf_counter(), time.process_time()
        frames, images = build(result.trace, dm.token_strings)
        builds.append(time.perf_counter() - start)
        cpus.append(time.process_time() - cpu)
        # Paired per repeat: on a shared machine both sides of one pair see the same load.
        ratios.append(builds[-1] / gens[-1])
        assert len(frames) == images.shape[0] == len(result.trace)
    trace = result.trace
    return {"gen": statistics.median(gens), "build": statistics.median(builds), "cpu": statistics.median(cpus),
            "ratio": statistics.median(ratios), "steps": len(trace),
            "blocks": trace.num_blocks, "image_bytes": images[0].numel() * images.element_size(),
            "shape": tuple(images.shape), "trace_bytes": trace.nbytes / len(trace)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        dm = load_model(str(build_checkpoint(Path(tmp) / "random", "random")))
    # No EOS ids, so the first block never ends the run and two blocks really execute.
    dm = dataclasses.replace(dm, eos_ids=())
    cases = {"1 block": Knobs(seed=3, num_inference_steps=48, confidence=0.0, gen_length=256),
             "2 blocks": Knobs(seed=3, num_inference_steps=48, confidence=0.0, gen_length=512)}
    build(generate(dm, PROMPT, cases["1 block"]).trace, dm.token_strings)  # warm-up: glyphs, caches
    results = {}
    for name, knobs in cases.items():
        r = results[name] = measure(dm, knobs, args.repeats)
        print(f"{name}: {r['steps']} steps in {r['blocks']} block(s); generation {r['gen']:.3f}s, "
              f"frames+images {r['build']:.3f}s ({r['cpu']:.3f}s CPU; median paired ratio {r['ratio']:.3f}); "
              f"images {r['shape']} "
              f"float32, {r['image_bytes']} bytes/frame; trace {r['trace_bytes']:.0f} bytes/step", flush=True)
    ratio = max(r["ratio"] for r in results.values())
    image_bytes = max(r["image_bytes"] for r in results.values())
    trace_bytes = max(r["trace_bytes"] for r in results.values())
    print(f"emission_ratio={ratio:.3f} image_bytes_per_frame={image_bytes} trace_bytes_per_step={trace_bytes:.0f}")


if __name__ == "__main__":
    main()
