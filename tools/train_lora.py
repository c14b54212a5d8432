"""Train the demo's digits LoRA with PEFT (testing/lora_train.py) and save it as PEFT saves it.

    python tools/train_lora.py dgemma/demo_lora     # the adapter shipped with the pack (about 30 s on a core)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from headless import load_pack  # noqa: E402

load_pack()
from diffusiongemma.testing.lora_train import train  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--no-experts", action="store_true", help="adapt the linears only, not the fused experts")
    args = parser.parse_args()
    torch.set_num_threads(1)  # results depend on it; the tests train with one thread too
    print(train(args.out, steps=args.steps, rank=args.rank, experts=not args.no_experts))


if __name__ == "__main__":
    main()
