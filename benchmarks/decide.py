"""Structured reads and JSON answers on the demo: right, exact, and what they cost.

- decide_accuracy_demo: share of decisions whose choice is right: the demo's colour pictures (8 colours
  at 4 sizes, the 8 colour words as options) and its 100 sums (the 19 number words as options), N = 8
  draws from seed i, trace off.
- json_accuracy_demo: the 100 sums answered under the demo's JSON Schema ({"sum": <number word>}), seed
  i, the Sampler's knobs, parsed and compared; json_free_accuracy (the same runs unconstrained) beside it.
- prob_sum_error: the largest |sum of p - 1| over every draw's and every mean's probabilities.
- exact_error: the largest difference to the brute-force scoring of the same definition
  (testing/brute_decide.py: each option on its own, one forward per factor) over every 10th sum and
  every colour at one size, N = 2.
- forwards_per_sample: canvases the decoder reads per draw for single-token options, counted by a hook
  on the decoder (the options "0".."9": the demo's tokens are characters).
- decide_ms_demo: milliseconds per decision (N = 8, trace off), median over the 100 sums.

    python benchmarks/decide.py
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from headless import load_pack  # noqa: E402

load_pack()
import numpy as np  # noqa: E402

from diffusiongemma.dgemma import Constraint, Knobs, generate, load_model  # noqa: E402
from diffusiongemma.dgemma.demo import (  # noqa: E402
    COLOURS,
    DEMO_DIR,
    DEMO_KNOBS,
    IMAGE_QUESTION,
    WORDS,
    colour_image,
    image_cases,
)
from diffusiongemma.dgemma.denoising.decide import decide  # noqa: E402
from diffusiongemma.testing.brute_decide import brute_probabilities  # noqa: E402
from diffusiongemma.testing.schemas import SUM  # noqa: E402

SAMPLES = 8


def sums():
    return [(f"What is {a}+{b}?", WORDS[a + b]) for a in range(10) for b in range(10)]


def decisions(dm):
    """(right share, largest |sum p - 1|, ms per sum decision) over the pictures and the sums."""
    right, sum_error, ms = 0, 0.0, []
    cases = [(IMAGE_QUESTION, name, list(COLOURS), colour_image(name, w, h)) for name, w, h in image_cases()]
    cases += [(prompt, word, list(WORDS), None) for prompt, word in sums()]
    for i, (prompt, answer, options, image) in enumerate(cases):
        start = time.perf_counter()
        found = decide(dm, prompt, options, SAMPLES, Knobs(seed=i), image=image, trace=False)
        if image is None:
            ms.append(1000 * (time.perf_counter() - start))
        right += found.choice == answer
        sums_of = np.concatenate([found.per_sample.sum(axis=1), [found.mean.sum()]])
        sum_error = max(sum_error, float(np.abs(sums_of - 1).max()))
    return right / len(cases), sum_error, statistics.median(ms)


def exact_error(dm) -> float:
    worst = 0.0
    cases = [(p, list(WORDS), None) for p, _ in sums()[::10]]
    cases += [(IMAGE_QUESTION, list(COLOURS), colour_image(name, 64, 64)) for name in COLOURS]
    for i, (prompt, options, image) in enumerate(cases):
        found = decide(dm, prompt, options, 2, Knobs(seed=i), image=image, trace=False)
        brute = brute_probabilities(dm, prompt, options, 2, i, image=image)
        worst = max(worst, float(np.abs(found.per_sample - brute).max()))
    return worst


def forwards_per_sample(dm) -> float:
    seen = []

    def count(module, args, kwargs, out):
        seen.append(kwargs["decoder_input_ids"].shape[0])

    handle = dm.model.model.decoder.register_forward_hook(count, with_kwargs=True)
    try:
        decide(dm, "What is 3+4?", [str(d) for d in range(10)], SAMPLES, Knobs(seed=0), trace=False)
    finally:
        handle.remove()
    return sum(seen) / SAMPLES


def json_accuracy(dm, constraint) -> float:
    right = 0
    for i, (prompt, word) in enumerate(sums()):
        text = generate(dm, prompt, Knobs(**{**DEMO_KNOBS.asdict(), "seed": i}), constraint=constraint).text
        try:
            right += (json.loads(text)["sum"] if constraint is not None else text) == word
        except (ValueError, KeyError, TypeError):
            pass
    return right / 100


def main() -> None:
    dm = load_model(str(DEMO_DIR))
    forwards = forwards_per_sample(dm)
    print(f"forwards_per_sample={forwards:g} (options 0..9, N={SAMPLES})", flush=True)
    accuracy, sum_error, ms = decisions(dm)
    print(f"decide_accuracy_demo={accuracy:.3f} prob_sum_error={sum_error:.2e} decide_ms_demo={ms:.0f}", flush=True)
    exact = exact_error(dm)
    print(f"exact_error={exact:.2e} (every 10th sum and every colour, N=2)", flush=True)
    json_right = json_accuracy(dm, Constraint("json_schema", json.dumps(SUM)))
    free_right = json_accuracy(dm, None)
    print(f"json_accuracy_demo={json_right:.2f} json_free_accuracy={free_right:.2f} (same seeds)", flush=True)
    print(f"decide_accuracy_demo={accuracy:.3f} json_accuracy_demo={json_right:.2f} prob_sum_error={sum_error:.1e} "
          f"exact_error={exact:.1e} forwards_per_sample={forwards:g} decide_ms_demo={ms:.0f}")


if __name__ == "__main__":
    main()
