"""A small LoRA trained on the demo with PEFT, by the demo's own objective (tools/train_demo.py): the sums
answered in digits ("7") instead of words ("seven"). Some sums are held out, to test what it learned.
tools/train_lora.py runs it from the command line (the demo's shipped adapter, dgemma/demo_lora, is its output).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..dgemma.demo import DEMO_DIR, WORDS
from .objective import demo_loss

# 14 sums never trained on (every total is still trained through other sums: 0+0 is the only 0)
HELD_OUT = tuple((a, b) for a in range(10) for b in range(10) if (3 * a + b) % 7 == 0 and a + b)
TRAINED = tuple((a, b) for a in range(10) for b in range(10) if (a, b) not in HELD_OUT)
LINEARS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
EXPERTS = ["experts.gate_up_proj", "experts.down_proj"]


def digits_answer(a: int, b: int) -> str:
    return str(a + b)


def words_answer(a: int, b: int) -> str:
    return WORDS[a + b]


def _examples(tok, canvas: int, pairs):
    prompts, targets = [], []
    for a, b in pairs:
        prompts.append(tok.apply_chat_template([{"role": "user", "content": f"What is {a}+{b}?"}],
                                               add_generation_prompt=True, tokenize=True, return_dict=True,
                                               enable_thinking=False)["input_ids"])
        target = tok.encode(digits_answer(a, b), add_special_tokens=False) + [tok.convert_tokens_to_ids("<turn|>"),
                                                                              tok.eos_token_id]
        targets.append(target + [tok.pad_token_id] * (canvas - len(target)))
    width = max(len(p) for p in prompts)  # every prompt of the task has one length; checked
    assert all(len(p) == width for p in prompts)
    return torch.tensor(prompts), torch.tensor(targets)


def train(out: Path, steps: int = 200, rank: int = 8, experts: bool = True, seed: int = 0, lr: float = 1e-2,
          batch: int = 32) -> Path:
    """Train the digits adapter on the demo's weights (float32, CPU) and save it as PEFT saves it."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoTokenizer, DiffusionGemmaForBlockDiffusion

    torch.manual_seed(seed)
    model = DiffusionGemmaForBlockDiffusion.from_pretrained(DEMO_DIR, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(DEMO_DIR)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules=LINEARS,
                        exclude_modules=r".*vision.*", target_parameters=EXPERTS if experts else None)
    model = get_peft_model(model, config)
    model.train()
    prompts, targets = _examples(tok, model.config.canvas_length, TRAINED)
    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.1)
    for _ in range(steps):
        pick = torch.randint(0, prompts.shape[0], (batch,), generator=g)
        loss = demo_loss(model.base_model.model, tok, prompts[pick], targets[pick], g)  # LoRA layers inside
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
    model.eval()
    model.peft_config["default"].base_model_name_or_path = "diffusiongemma-demo"  # not this machine's path
    model.save_pretrained(str(out))
    (Path(out) / "README.md").unlink(missing_ok=True)  # PEFT's blank model card
    (Path(out) / "training.json").write_text(json.dumps({"steps": steps, "final_loss": loss.item(), "rank": rank}))
    return Path(out)


def logits(dm, seed=0):
    """One decoder forward's logits on a fixed noise canvas after the demo prompt, in the payload's view."""
    from ..dgemma.denoising.cache import encode_ids, new_cache
    from ..dgemma.inputs.tokens import prompt_ids
    from ..dgemma.loading.lora import applied

    model = dm.model
    cache = new_cache(model)
    with applied(dm), torch.no_grad():
        encode_ids(model, cache, prompt_ids(dm, "What is 2+5?", False))
        canvas = torch.randint(0, dm.vocab_size, (1, dm.canvas_length), generator=torch.Generator().manual_seed(seed))
        return model(decoder_input_ids=canvas, past_key_values=cache).logits.float()


def untied():
    """The demo in float32 with the encoder's weights its own: PEFT trains each stack's copy apart, and merging
    both into one tied tensor would add each stack's delta to the other."""
    from transformers import DiffusionGemmaForBlockDiffusion

    model = DiffusionGemmaForBlockDiffusion.from_pretrained(DEMO_DIR, dtype=torch.float32)
    for module in model.model.encoder.modules():
        for name, param in list(module._parameters.items()):
            if param is not None:
                setattr(module, name, torch.nn.Parameter(param.detach().clone()))
    return model
