"""The demo model shipped with the pack: a tiny DiffusionGemma trained by tools/train_demo.py."""

from pathlib import Path

from .knobs import Knobs

DEMO_NAME = "diffusiongemma-demo"
DEMO_DIR = Path(__file__).resolve().parent / "demo_model"
# A low entropy budget accepts a few positions per step, so the answer visibly anneals over
# several steps instead of appearing at once.
DEMO_KNOBS = Knobs(seed=7, entropy_bound=0.001)

# The task it was trained on: "What is a+b?" (a, b in 0..9) answered in words.
WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
         "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen")


def demo_available() -> bool:
    return (DEMO_DIR / "config.json").is_file()
