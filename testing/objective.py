"""The demo's training objective, the one tools/train_demo.py trains the demo with and testing/lora_train.py an
adapter: uniform corruption at t ~ U(0, 1), self-conditioning on half the batches (logits / T, T ~ U(0.4, 0.8)),
cross-entropy on every position, the answer's positions weighted up."""

from __future__ import annotations

import torch

ANSWER_WEIGHT = 3.0
# A little label smoothing keeps the model from being certain of every position at once: the
# entropy per position then falls with the temperature, so the canvas fills in over several steps.
SMOOTHING = 0.02


def demo_loss(model, tok, prompt, clean, g, extra=None):
    """The loss of one batch: `prompt` (B, P) ids for the encoder (with `extra`, its image inputs), `clean`
    (B, L) the answer's canvas; every draw from `g`, in one order."""
    from transformers import DynamicCache

    batch, vocab = clean.shape[0], model.config.get_text_config().vocab_size
    t = torch.rand(batch, 1, generator=g)
    noise = torch.randint(0, vocab, clean.shape, generator=g)
    noisy = torch.where(torch.rand(clean.shape, generator=g) < t, noise, clean)
    cache = DynamicCache(config=model.config.get_text_config(decoder=True))
    model.model.encoder(input_ids=prompt, past_key_values=cache, **(extra or {}))
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
    return (token_loss * weight.reshape(-1)).sum() / weight.sum()
