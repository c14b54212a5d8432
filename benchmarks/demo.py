"""The demo end to end: the README's smoke graph on the shipped demo model, then its accuracy.

demo_seconds is the wall time from loading the model to the last output file written (the
graph's Loader, Sampler, Trace, GIF, heatmap and run log); the accuracy covers all 100 prompts,
and accuracy_image the whole visual task (every colour at every size, "What colour is this?").

    python benchmarks/demo.py
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from headless import load_pack  # noqa: E402

load_pack()
from diffusiongemma.dgemma import Knobs, generate, load_model  # noqa: E402
from diffusiongemma.dgemma.demo import (  # noqa: E402
    DEMO_DIR,
    DEMO_KNOBS,
    IMAGE_QUESTION,
    WORDS,
    colour_image,
    image_cases,
)
from diffusiongemma.runner.cli import DEFAULT_GRAPH  # noqa: E402
from diffusiongemma.runner.execute import run_graph  # noqa: E402


def accuracy(dm, thinking: bool) -> float:
    right = 0
    for i in range(100):
        a, b = divmod(i, 10)
        knobs = Knobs(**{**DEMO_KNOBS.asdict(), "seed": i, "thinking": thinking})
        right += generate(dm, f"What is {a}+{b}?", knobs).text == WORDS[a + b]
    return right / 100


def accuracy_image(dm) -> float:
    cases = image_cases()
    right = 0
    for i, (name, width, height) in enumerate(cases):
        knobs = Knobs(**{**DEMO_KNOBS.asdict(), "seed": i})
        right += generate(dm, IMAGE_QUESTION, knobs, image=colour_image(name, width, height)).text == name
    return right / len(cases)


def main() -> None:
    graph = json.loads(DEFAULT_GRAPH.read_text())
    with tempfile.TemporaryDirectory() as out:
        os.environ["DGEMMA_OUTPUT_DIR"] = out
        start = time.perf_counter()
        run_graph(graph)
        seconds = time.perf_counter() - start
        print("outputs:", ", ".join(sorted(p.name for p in Path(out).iterdir())))
    dm = load_model(str(DEMO_DIR))
    print(f"demo_seconds={seconds:.2f} accuracy_plain={accuracy(dm, False):.2f} "
          f"accuracy_thinking={accuracy(dm, True):.2f} accuracy_image={accuracy_image(dm):.2f}")


if __name__ == "__main__":
    main()
