"""Train the demo DiffusionGemma from random initialisation on a toy chat task, on the CPU.

Task: "What is a+b?" (a, b in 0..9) -> the sum in words, e.g. "seven". With thinking on, the
model first writes its thought channel: "<|channel>thought\\n3+4=7<channel|>seven". With
context, raw text "a=3, b=4." opens the sequence (as DGemmaEncode encodes it) and the turn asks
"What is a+b?", so the answer has to come from the KV cache.

Objective: uniform-state corruption (each canvas token replaced by a uniform random token with
probability t ~ U(0, 1)), cross-entropy on every canvas position (answer positions weighted up
over the padding, label smoothing 0.02), self-conditioning on half the batches (logits / T with
T ~ U(0.4, 0.8), as the scheduler shapes them). Deterministic given --seed, --steps, --threads.

    python tools/train_demo.py --out dgemma/demo_model --steps 4000 --threads 1
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
from diffusiongemma.dgemma.demo import WORDS  # noqa: E402
from diffusiongemma.testing.tiny import build_model, save_checkpoint  # noqa: E402

ANSWER_WEIGHT = 3.0
# A little label smoothing keeps the model from being certain of every position at once: the
# entropy per position then falls with the temperature, so the canvas fills in over several steps.
SMOOTHING = 0.02
MODES = ("plain", "thinking", "context")
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
            target = tok.encode(answer_text(a, b, thinking), add_special_tokens=False)
            target += [tok.convert_tokens_to_ids("<turn|>"), tok.eos_token_id]
            target += [tok.pad_token_id] * (canvas_length - len(target))
            assert len(target) == canvas_length, len(target)
            pairs.append((list(prompt), target))
    return torch.tensor([p for p, _ in pairs]), torch.tensor([t for _, t in pairs])


def train(out: Path, steps: int, seed: int, batch: int, lr: float) -> None:
    from transformers import DynamicCache

    torch.manual_seed(seed)
    model, tok = build_model("demo", seed=seed)
    model.train()
    L = model.config.canvas_length
    vocab = model.config.get_text_config().vocab_size
    data = {mode: examples(tok, L, mode) for mode in MODES}
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    warmup = 100
    schedule = lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    start = time.time()
    for step in range(steps):
        prompts, targets = data[MODES[step % len(MODES)]]
        pick = torch.randint(0, prompts.shape[0], (batch,), generator=g)
        prompt, clean = prompts[pick], targets[pick]
        t = torch.rand(batch, 1, generator=g)
        noise = torch.randint(0, vocab, clean.shape, generator=g)
        noisy = torch.where(torch.rand(clean.shape, generator=g) < t, noise, clean)
        cache = DynamicCache(config=model.config.get_text_config(decoder=True))
        model.model.encoder(input_ids=prompt, past_key_values=cache)
        self_cond = None
        if torch.rand(1, generator=g).item() < 0.5:
            with torch.no_grad():
                logits = model(decoder_input_ids=noisy, past_key_values=cache).logits
            self_cond = logits / (0.4 + 0.4 * torch.rand(batch, 1, 1, generator=g))
        logits = model(decoder_input_ids=noisy, past_key_values=cache, self_conditioning_logits=self_cond).logits
        # Pads fill most of the canvas and are easy; weight the answer's positions up.
        weight = 1.0 + ANSWER_WEIGHT * (clean != tok.pad_token_id)
        token_loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), clean.reshape(-1), reduction="none",
                                                       label_smoothing=SMOOTHING)
        loss = (token_loss * weight.reshape(-1)).sum() / weight.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 50 == 0 or step == steps - 1:
            print(f"step {step} loss {loss.item():.4f} lr {sched.get_last_lr()[0]:.2e} "
                  f"{time.time() - start:.0f}s", flush=True)
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
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    train(args.out, args.steps, args.seed, args.batch, args.lr)


if __name__ == "__main__":
    main()
