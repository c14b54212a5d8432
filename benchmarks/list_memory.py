"""Peak memory of one process running a list of prompts on the demo model through the Sampler node.

The node is called as ComfyUI calls it in a prompt whose only reader is a text preview: its frames and
images unread (nodes/wiring.py), unless --images wires a Save Image to them. Prints, last line,
`peak_rss_gib= items= seconds=` (peak resident memory of this whole process, read from the kernel).

    python benchmarks/list_memory.py 1024 [--steps 48] [--gen-length 64] [--images]
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from headless import load_pack  # noqa: E402

load_pack()
from diffusiongemma.dgemma import load_model  # noqa: E402
from diffusiongemma.dgemma.demo import DEMO_DIR  # noqa: E402
from diffusiongemma.nodes import ON_DEMAND_CLASSES, wiring  # noqa: E402
from diffusiongemma.nodes.sampler import DGemmaSampler  # noqa: E402


def prompts(count: int) -> list[str]:
    """Short arithmetic questions of varied length, as a list from DGemmaPromptList would hold."""
    return [f"What is {i % 97}+{i % 13}?" + " Answer briefly." * (i % 3) for i in range(count)]


def graph(images: bool) -> dict:
    """The prompt as queued: the Sampler, a text preview, and a Save Image when its images are read."""
    nodes = {"2": {"class_type": "DGemmaSampler", "inputs": {}},
             "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 0]}}}
    if images:
        nodes["4"] = {"class_type": "SaveImage", "inputs": {"images": ["2", 4], "filename_prefix": "list"}}
    wiring.stamp(nodes, ON_DEMAND_CLASSES)
    return nodes


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("count", type=int)
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--gen-length", type=int, default=64)
    parser.add_argument("--images", action="store_true", help="a Save Image reads the images")
    args = parser.parse_args(argv)
    dm = load_model(str(DEMO_DIR), device="cpu")
    knobs = {"seed": [3], "num_inference_steps": [args.steps], "t_min": [0.4], "t_max": [0.8],
             "entropy_bound": [0.1], "confidence": [0.005], "gen_length": [args.gen_length], "thinking": [False]}
    start = time.perf_counter()
    out = DGemmaSampler().sample(unique_id=["2"], graph=[graph(args.images)], model=[dm],
                                 prompt=prompts(args.count), **knobs)
    seconds = time.perf_counter() - start
    assert len(out[0]) == args.count
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # kilobytes on Linux
    print(f"peak_rss_gib={peak / 2**30:.3f} items={args.count} seconds={seconds:.1f}")


if __name__ == "__main__":
    main()
