"""The demo model shipped with the pack: a tiny DiffusionGemma trained by tools/train_demo.py."""

from pathlib import Path

from .knobs import Knobs

DEMO_NAME = "diffusiongemma-demo"
DEMO_DIR = Path(__file__).resolve().parent / "demo_model"
# The Sampler's default knobs with seed 7: the demo was trained to anneal visibly with them.
DEMO_KNOBS = Knobs(seed=7)

# The task it was trained on: "What is a+b?" (a, b in 0..9) answered in words.
WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
         "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen")


def demo_available() -> bool:
    return (DEMO_DIR / "config.json").is_file()
