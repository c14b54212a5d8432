"""LoRA adapters as a view over the loaded weights, measured on the demo.

A digits adapter ("What is a+b?" answered "7", not "seven") is trained here with PEFT by the demo's own
objective (testing/lora_train.py, rank 8 on attention, dense MLP, self-conditioning and the fused experts),
saved as PEFT saves it and read back through dgemma/loading/lora.py.

- lora_task_accuracy: the 14 held-out sums (never trained on) answered in digits, with the adapter.
- lora_base_accuracy: the same loaded model without it, afterwards, on all 100 sums in words.
- lora_zero_identical: strength 0 gives the base's ids, entropies and committed masks on the 14 sums.
- lora_base_untouched: every base weight bit-equal after the adapted runs, and the base's runs equal to
  its runs before any adapter was made.
- lora_merged_max_logit_diff: the view's logits against a PEFT-merged float32 copy (encoder weights untied
  first: PEFT trains each stack's copy apart), over 8 noise canvases.
- lora_modes: how many of bf16, 8bit, 4bit and GGUF (Q8_0) answer the held-out sums with >= 0.85 accuracy.
- lora_step_ratio: CPU time of a demo step with one rank-16 adapter over one without (paired, alternating;
  the median of 9 ratios), 16 steps with the adaptive stop off.

    python benchmarks/lora.py
"""

from __future__ import annotations

import dataclasses
import sys
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
from timing import median_iqr, paired_ratios  # noqa: E402

# benchmarks/gguf.py would shadow the gguf package the GGUF mode loads with
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]
sys.path.insert(0, str(REPO))
from headless import load_pack  # noqa: E402

load_pack()

from diffusiongemma.dgemma import Knobs, generate, load_model  # noqa: E402
from diffusiongemma.dgemma.demo import DEMO_DIR, DEMO_KNOBS  # noqa: E402
from diffusiongemma.dgemma.loading.lora import adapt, read_adapter  # noqa: E402
from diffusiongemma.testing import lora_train  # noqa: E402
from diffusiongemma.testing.lora_train import logits, untied  # noqa: E402

GGUF = REPO / "tests" / "fixtures" / "gguf" / "demo-Q8_0.gguf"
ALL = tuple((a, b) for a in range(10) for b in range(10))


def runs(dm, pairs):
    return [generate(dm, f"What is {a}+{b}?", Knobs(**{**DEMO_KNOBS.asdict(), "seed": i}))
            for i, (a, b) in enumerate(pairs)]


def accuracy(results, pairs, answer) -> float:
    return sum(r.text == answer(a, b) for r, (a, b) in zip(results, pairs)) / len(pairs)


def bits(r):
    return r.state.raw_ids, r.trace.ids.tobytes(), r.trace.entropy.tobytes(), r.trace.committed_bits.tobytes()


def merged_diff(dm, folder: Path) -> float:
    from peft import PeftModel

    merged = dataclasses.replace(dm, model=PeftModel.from_pretrained(untied(), str(folder)).merge_and_unload())
    view = adapt(dm, read_adapter(folder), 1.0)
    return max((logits(view, seed) - logits(merged, seed)).abs().max().item() for seed in range(8))


def modes(folder: Path) -> dict[str, float]:
    out = {}
    for name, source, quant, dtype in (("bf16", DEMO_DIR, "none", "bfloat16"), ("8bit", DEMO_DIR, "8bit", "auto"),
                                       ("4bit", DEMO_DIR, "4bit", "auto"), ("gguf", GGUF, "gguf", "auto")):
        dm = load_model(str(source), quant=quant, dtype=dtype)
        out[name] = accuracy(runs(adapt(dm, read_adapter(folder), 1.0), lora_train.HELD_OUT), lora_train.HELD_OUT,
                             lora_train.digits_answer)
        print(f"{name}: held-out digits accuracy {out[name]:.3f}", flush=True)
    return out


def rank16(folder: Path) -> Path:
    """A rank-16 adapter on every target the digits adapter has, random (PEFT's init with B non-zero)."""
    from peft import LoraConfig, get_peft_model
    from transformers import DiffusionGemmaForBlockDiffusion

    torch.manual_seed(0)
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(DEMO_DIR, dtype=torch.float32)
    config = LoraConfig(r=16, lora_alpha=16, target_modules=lora_train.LINEARS, exclude_modules=r".*vision.*",
                        target_parameters=lora_train.EXPERTS, init_lora_weights=False)
    get_peft_model(model, config).save_pretrained(str(folder))
    return folder


def step_ratio(dm, folder: Path) -> float:
    adapted = adapt(dm, read_adapter(folder), 0.05)  # small: the run's path, not its answer, is timed
    knobs = Knobs(seed=7, num_inference_steps=16, confidence=0.0)
    steps = {}

    def timed(d, key):
        def go():
            steps[key] = len(generate(d, "What is 2+5?", knobs).trace)
        return go

    ratios = paired_ratios(timed(adapted, "lora"), timed(dm, "base"), 9)
    per_step = [r * steps["base"] / steps["lora"] for r in ratios]  # per step, should their step counts differ
    return median_iqr(per_step)[0]


def main() -> None:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        folder = lora_train.train(Path(tmp) / "digits")
        dm = load_model(str(DEMO_DIR))
        weights = {k: v.clone() for k, v in dm.model.state_dict().items()}
        before = [bits(r) for r in runs(dm, lora_train.HELD_OUT)]
        adapted = adapt(dm, read_adapter(folder), 1.0)
        task = accuracy(runs(adapted, lora_train.HELD_OUT), lora_train.HELD_OUT, lora_train.digits_answer)
        zero = [bits(r) for r in runs(adapt(dm, read_adapter(folder), 0.0), lora_train.HELD_OUT)] == before
        diff = merged_diff(dm, folder)
        base_runs = runs(dm, ALL)
        base = accuracy(base_runs, ALL, lora_train.words_answer)
        untouched = all(torch.equal(weights[k], v) for k, v in dm.model.state_dict().items()) and \
            [bits(r) for r in runs(dm, lora_train.HELD_OUT)] == before
        print(f"task {task:.3f} base {base:.3f} zero {zero} untouched {untouched} merged diff {diff:.2e}", flush=True)
        accuracies = modes(folder)
        ratio = step_ratio(dm, rank16(Path(tmp) / "rank16"))
    print(f"lora_task_accuracy={task:.3f} lora_base_accuracy={base:.3f} lora_zero_identical={int(zero)} "
          f"lora_base_untouched={int(untouched)} lora_merged_max_logit_diff={diff:.2e} "
          f"lora_modes={sum(a >= 0.85 for a in accuracies.values())} lora_step_ratio={ratio:.3f}")


if __name__ == "__main__":
    main()
