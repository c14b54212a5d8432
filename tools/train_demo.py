"""Train the demo DiffusionGemma from random initialisation on a toy chat task, on the CPU.

Task: "What is a+b?" (a, b in 0..9) -> the sum in words, e.g. "seven". With thinking on, the
model first writes its thought channel: "<|channel>thought\\n3+4=7<channel|>seven". With
context, raw text "a=3, b=4." opens the sequence (as DGemmaEncode encodes it) and the turn asks
"What is a+b?", so the answer has to come from the KV cache. With an image, a solid colour
picture comes before "What colour is this?" in the turn and the answer is the colour's name
("red"); the picture goes through the image processor the checkpoint ships and the engine's own
turn builder, so training sees exactly what a run sees.

Objective: uniform-state corruption (each canvas token replaced by a uniform random token with
probability t ~ U(0, 1)), cross-entropy on every canvas position (answer positions weighted up
over the padding, label smoothing 0.02), self-conditioning on half the batches (logits / T with
T ~ U(0.4, 0.8), as the scheduler shapes them). Deterministic given --seed, --steps, --modes,
--init and --threads.

The shipped model is trained in two stages: the text tasks from scratch, then all four with the
images weighted up, starting from the first stage's weights (about 23 + 15 minutes on one core):

    python tools/train_demo.py --out /tmp/demo_text --modes plain,thinking,context --steps 4000 --threads 1
    python tools/train_demo.py --init /tmp/demo_text --out dgemma/demo_model --steps 800 --lr 1e-3 \
        --modes plain,image,thinking,image,context,image --threads 1
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from headless import load_pack  # noqa: E402

load_pack()
from diffusiongemma.dgemma.demo import COLOURS, IMAGE_QUESTION, IMAGE_SIZES, WORDS, colour_image  # noqa: E402
from diffusiongemma.dgemma.inputs.tokens import prompt_ids  # noqa: E402
from diffusiongemma.dgemma.inputs.vision import prepare_images  # noqa: E402
from diffusiongemma.dgemma.payloads import DGemmaModel  # noqa: E402
from diffusiongemma.testing.objective import demo_loss  # noqa: E402
from diffusiongemma.testing.tiny import build_model, image_processor, save_checkpoint  # noqa: E402

MODES = ("plain", "thinking", "context", "image")
SHADES = 4  # per colour and size: the exact colour and 3 shades of it, so near colours read the same
SHADE_JITTER = 0.15
CONTEXT_QUESTION = "What is a+b?"


def question(a: int, b: int) -> str:
    return f"What is {a}+{b}?"


def answer_text(a: int, b: int, thinking: bool) -> str:
    word = WORDS[a + b]
    return f"<|channel>thought\n{a}+{b}={a + b}<channel|>{word}" if thinking else word


def context_text(a: int, b: int) -> str:
    return f"a={a}, b={b}."


def examples(tok, canvas_length: int, mode: str):
    """All 100 (prompt ids, target canvas) pairs of one mode: plain, thinking or context."""
    pairs = []
    thinking = mode == "thinking"
    for a in range(10):
        for b in range(10):
            turn = CONTEXT_QUESTION if mode == "context" else question(a, b)
            prompt = tok.apply_chat_template([{"role": "user", "content": turn}],
                                             add_generation_prompt=True, tokenize=True,
                                             return_dict=True, enable_thinking=thinking)["input_ids"]
            if mode == "context":  # the context carries the sequence's only BOS
                prompt = [tok.bos_token_id] + tok.encode(context_text(a, b), add_special_tokens=False) + prompt[1:]
            target = target_ids(tok, answer_text(a, b, thinking), canvas_length)
            assert len(target) == canvas_length, len(target)
            pairs.append((list(prompt), target))
    return torch.tensor([p for p, _ in pairs]), torch.tensor([t for _, t in pairs])


def target_ids(tok, text: str, canvas_length: int) -> list[int]:
    target = tok.encode(text, add_special_tokens=False) + [tok.convert_tokens_to_ids("<turn|>"), tok.eos_token_id]
    return target + [tok.pad_token_id] * (canvas_length - len(target))


def image_examples(model, tok, canvas_length: int, seed: int):
    """Per image size: (prompt ids, target canvases, pixel values, position ids) of every colour and shade."""
    dm = DGemmaModel(model=model, tokenizer=tok, processor=tok, source="training", quant="none", device="cpu",
                     dtype="float32", eos_ids=(1, 106), channel_ids=(100, 101), image_processor=image_processor())
    g = torch.Generator().manual_seed(seed + 1)
    groups = []
    for width, height in IMAGE_SIZES:
        prompts, targets, pixels, positions = [], [], [], []
        for name in COLOURS:
            for shade in range(SHADES):
                jitter = torch.zeros(3) if shade == 0 else (torch.rand(3, generator=g) * 2 - 1) * SHADE_JITTER
                images = prepare_images(dm, colour_image(name, width, height, jitter))
                prompts.append(prompt_ids(dm, IMAGE_QUESTION, False, images=images))
                targets.append(target_ids(tok, name, canvas_length))
                pixels.append(images.pixel_values)
                positions.append(images.position_ids)
        groups.append((torch.tensor(prompts), torch.tensor(targets), torch.cat(pixels), torch.cat(positions)))
    return groups


def batch_of(data, mode: str, batch: int, g):
    """A batch of one mode (image batches share one image size, so their prompts have one length)."""
    if mode == "image":
        prompts, targets, pixels, positions = data[mode][torch.randint(0, len(data[mode]), (1,), generator=g).item()]
        pick = torch.randint(0, prompts.shape[0], (batch,), generator=g)
        extra = {"pixel_values": pixels[pick], "image_position_ids": positions[pick]}
        return prompts[pick], targets[pick], extra
    prompts, targets = data[mode]
    pick = torch.randint(0, prompts.shape[0], (batch,), generator=g)
    return prompts[pick], targets[pick], {}


def train(out: Path, steps: int, seed: int, batch: int, lr: float, modes: tuple[str, ...] = MODES,
          init: Path | None = None) -> None:

    torch.manual_seed(seed)
    model, tok = build_model("demo", seed=seed)
    if init is not None:  # continue from a trained checkpoint (its weights; the tokenizer is rebuilt, the same)
        from transformers import DiffusionGemmaForBlockDiffusion

        model = DiffusionGemmaForBlockDiffusion.from_pretrained(init, dtype=torch.float32)
    model.train()
    L = model.config.canvas_length
    data = {mode: examples(tok, L, mode) for mode in dict.fromkeys(modes) if mode != "image"}
    if "image" in modes:
        data["image"] = image_examples(model, tok, L, seed)
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    warmup = 100
    schedule = lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    start = time.time()
    window = {mode: [] for mode in modes}
    for step in range(steps):
        mode = modes[step % len(modes)]
        prompt, clean, extra = batch_of(data, mode, batch, g)
        loss = demo_loss(model, tok, prompt, clean, g, extra)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        window[mode].append(loss.item())
        if step % 50 == 0 or step == steps - 1:
            losses = " ".join(f"{m} {sum(v) / len(v):.4f}" for m, v in window.items() if v)
            print(f"step {step} loss {losses} lr {sched.get_last_lr()[0]:.2e} {time.time() - start:.0f}s", flush=True)
            window = {mode: [] for mode in modes}
    model.eval()
    save_checkpoint(model, tok, out, "demo")
    print(f"saved {out} after {time.time() - start:.0f}s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("dgemma/demo_model"))
    parser.add_argument("--steps", type=int, default=4000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (results depend on it too)")
    parser.add_argument("--modes", default=",".join(MODES),
                        help="comma-separated task modes, cycled step by step; repeat one to train it more often")
    parser.add_argument("--init", type=Path, default=None, help="start from this checkpoint's weights")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    modes = tuple(args.modes.split(","))
    if not modes or set(modes) - set(MODES):
        parser.error(f"--modes takes {','.join(MODES)}, got {args.modes!r}")
    train(args.out, args.steps, args.seed, args.batch, args.lr, modes, args.init)


if __name__ == "__main__":
    main()
