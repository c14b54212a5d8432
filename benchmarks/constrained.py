"""Constrained decoding end to end: validity, the demo's accuracy under a constraint, and the step cost.

- valid_demo: share of runs on the demo model whose answer satisfies its constraint (several JSON
  Schemas, a regex, a choice), one seed per run; checked with `jsonschema` / `re` / the list.
- valid_random: the same on the random-weight tiny checkpoint (canvas 256), where only the
  constraint can make the output valid (5 schemas, a regex, a choice).
- accuracy_demo: the demo's 100 sums answered under a choice of the number words (printed beside
  its unconstrained accuracy, which it must not fall below).
- step_ratio: CPU seconds per step constrained / unconstrained on the tiny checkpoint with the
  real vocabulary (262,144), same seed and steps, alternating pairs, median of the ratios.

    python benchmarks/constrained.py [--runs 100] [--pairs 5]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))
from timing import median_iqr, paired_ratios  # noqa: E402

from headless import load_pack  # noqa: E402

load_pack()
from diffusiongemma.dgemma import Constraint, Knobs, generate, load_model  # noqa: E402
from diffusiongemma.dgemma.demo import DEMO_DIR, DEMO_KNOBS, WORDS  # noqa: E402
from diffusiongemma.testing import tiny  # noqa: E402
from diffusiongemma.testing.schemas import SCHEMAS, SUM  # noqa: E402

REGEX = r"[0-9]{3}-[a-z]{2,4}"
CHOICE = ["yes", "no", "maybe later"]


def cases(demo: bool) -> list[tuple[Constraint, object]]:
    """(constraint, checker) pairs; a checker takes the answer text and says whether it is valid."""
    import jsonschema

    def schema_check(schema):
        return lambda text: _valid_json(text, schema, jsonschema)

    schemas = {"sum": SUM, **SCHEMAS} if demo else SCHEMAS
    out = [(Constraint("json_schema", json.dumps(s)), schema_check(s)) for s in schemas.values()]
    out.append((Constraint("regex", REGEX), lambda text: re.fullmatch(REGEX, text) is not None))
    options = list(WORDS) if demo else CHOICE
    out.append((Constraint("choice", "\n".join(options)), lambda text: text in options))
    return out


def _valid_json(text, schema, jsonschema) -> bool:
    try:
        jsonschema.validate(json.loads(text), schema)
    except (ValueError, jsonschema.ValidationError):
        return False
    return True


def validity(dm, demo: bool, runs: int, knobs: dict) -> float:
    todo, good = cases(demo), 0
    for i in range(runs):
        constraint, check = todo[i % len(todo)]
        a, b = divmod(i % 100, 10)
        result = generate(dm, f"What is {a}+{b}?", Knobs(**{**knobs, "seed": i}), constraint=constraint)
        good += bool(check(result.text) and result.state.finished_honestly)
    return good / runs


def accuracy(dm, constraint) -> float:
    right = 0
    for i in range(100):
        a, b = divmod(i, 10)
        knobs = Knobs(**{**DEMO_KNOBS.asdict(), "seed": i})
        right += generate(dm, f"What is {a}+{b}?", knobs, constraint=constraint).text == WORDS[a + b]
    return right / 100


def tiny_model(folder: Path, preset: str):
    """A tiny checkpoint built into `folder` (seconds), loaded through the real loader."""
    return load_model(str(tiny.build_checkpoint(folder / preset, preset)))


def step_ratio(dm, pairs: int) -> float:
    knobs = Knobs(seed=3, num_inference_steps=4, confidence=0.0)
    constraint = Constraint("json_schema", json.dumps(SCHEMAS["nested"]))
    generate(dm, "hello", Knobs(num_inference_steps=1), constraint=constraint)  # compiles once, outside the timing
    ratios = paired_ratios(lambda: generate(dm, "hello", knobs, constraint=constraint),
                           lambda: generate(dm, "hello", knobs), pairs, label="step")
    median, iqr = median_iqr(ratios)
    print(f"step_ratio median {median:.3f} IQR {iqr:.3f} over {pairs} pairs (paired CPU time)")
    return median


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--pairs", type=int, default=5)
    args = parser.parse_args()
    demo = load_model(str(DEMO_DIR))
    valid_demo = validity(demo, True, args.runs, DEMO_KNOBS.asdict())
    print(f"valid_demo={valid_demo:.3f} over {args.runs} runs", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        rand = tiny_model(Path(folder), "random")
        valid_random = validity(rand, False, args.runs, {"num_inference_steps": 8})
        print(f"valid_random={valid_random:.3f} over {args.runs} runs", flush=True)
        plain = accuracy(demo, None)
        constrained = accuracy(demo, Constraint("choice", "\n".join(WORDS)))
        print(f"accuracy_plain={plain:.2f} (unconstrained, same seeds)", flush=True)
        ratio = step_ratio(tiny_model(Path(folder), "real-vocab"), args.pairs)
    print(f"valid_demo={valid_demo:.3f} valid_random={valid_random:.3f} accuracy_demo={constrained:.2f} "
          f"step_ratio={ratio:.3f}")


if __name__ == "__main__":
    main()
