"""The decision's definition computed the slow, plain way, for tests and the benchmark to compare against.

Per draw and option, one batch-1 forward per factor, nothing shared: the end of the turn read at
the option's length on the bare noise canvas (always, even where every option has one length and it
cancels), then each token of the option read with the end and the earlier tokens pinned; the
products normalized over the options.
"""

from __future__ import annotations

import numpy as np
import torch

from ..dgemma.denoising.decide import draw, end_id
from ..dgemma.denoising.loop import BlockDecoder
from ..dgemma.denoising.run import fresh_start, prepare
from ..dgemma.inputs.knobs import Knobs
from ..dgemma.inputs.tokens import literal_ids


def _log_prob(decoder, canvas, position: int, token: int) -> float:
    logits = decoder.logits(canvas, None)
    return float(torch.log_softmax(logits[0, position].double(), -1)[token])


@torch.no_grad()
def brute_probabilities(dm, prompt: str, options, samples: int, seed: int, *, context=None,
                        image=None) -> np.ndarray:
    """(samples, options) probabilities by scoring each option on its own, pinned token by token."""
    knobs = Knobs(seed=seed, gen_length=dm.canvas_length)
    decoder = BlockDecoder(dm.model, fresh_start(prepare(dm, prompt, knobs, context=context, image=image)).cache)
    decoder.enter_block()
    end = end_id(dm)
    out = []
    for i in range(samples):
        base = draw(dm, seed + i, decoder.device)
        scores = []
        for option in options:
            ids = literal_ids(dm.tokenizer, option)
            n = len(ids)
            total = _log_prob(decoder, base, n, end)
            canvas = base.clone()
            canvas[0, n] = end
            for j, token in enumerate(ids):
                total += _log_prob(decoder, canvas, j, token)
                canvas[0, j] = token
            scores.append(total)
        scores = np.array(scores) - max(scores)
        out.append(np.exp(scores) / np.exp(scores).sum())
    return np.array(out)
