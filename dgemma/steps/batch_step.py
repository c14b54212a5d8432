"""The entropy-bound scheduler's step fused on the device, for one lane or many at once, each lane's exactly as
its own step.

diffusers' EntropyBoundScheduler.step takes two identical softmaxes over the vocabulary, the probability of
each drawn token (unused here) and a validated Categorical, whose check reads a tensor on the host: a wait
for the device every step. Here the vocabulary-wide work (softmax, draw, entropy, sort) runs once, and,
for a group of lanes, once for the group; only what must stay per lane does: the temperature and bound it
divides and compares by (one op per distinct value), and the random draws from its own generator, in the
order its step draws them (`multinomial`'s exponential noise, then the renoising tokens). It applies only
where the scheduler's code, and torch's `multinomial` and Categorical entropy on the device, are the ones
this was checked against; anything else takes diffusers' own step. A NaN in the logits, which the
validation refused, shows in the entropy: the step's copy refuses it (dgemma/denoising/stepcopy.py).
"""

from __future__ import annotations

import hashlib
import inspect
import threading

import torch

from ..inputs.knobs import anneal, schedule_position
from ..loading.patches import _installed

# sha256 (16 hex) of EntropyBoundScheduler.step and _sample_from_logits source, as in diffusers 0.42
CHECKED_STEP = "1285ea587eeee5f3"
_checked: dict[str, bool] = {}
_lock = threading.Lock()


def _source_key(scheduler_class) -> str:
    text = inspect.getsource(scheduler_class.step) + inspect.getsource(scheduler_class._sample_from_logits)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _multinomial_is_exponential_argmax(device) -> bool:
    """Whether torch's one-sample multinomial on `device` is argmax(p / q), q ~ Exp(1) from the generator (torch
    2.x): the draw replayed here per lane."""
    p = torch.softmax(torch.arange(24, dtype=torch.float32, device=device).reshape(3, 8).sin() * 4, dim=-1)
    a, b = torch.Generator(device).manual_seed(7), torch.Generator(device).manual_seed(7)
    drawn = torch.multinomial(p, 1, generator=a)
    replayed = torch.argmax(p / torch.empty_like(p).exponential_(1, generator=b), dim=-1, keepdim=True)
    return torch.equal(drawn, replayed) and torch.equal(a.get_state(), b.get_state())


def entropy_of(logits):
    """torch.distributions.Categorical(logits=logits).entropy(): its very ops, without building the object (whose
    argument check reads a tensor on the host). `applies` checks the two agree to the bit."""
    normalized = logits - logits.logsumexp(dim=-1, keepdim=True)
    probs = normalized.softmax(dim=-1)
    # the same clamp and product in place: two vocabulary-wide tensors fewer at the step's peak
    return -normalized.clamp_(min=torch.finfo(normalized.dtype).min).mul_(probs).sum(-1)


def _entropy_is_categoricals(device) -> bool:
    probe = torch.randn(2, 3, 50, generator=torch.Generator().manual_seed(3)).to(device) * 5
    probe[0, 0, :7] = -torch.inf
    return torch.equal(entropy_of(probe), torch.distributions.Categorical(logits=probe).entropy())


def applies(scheduler, device) -> bool:
    """True where this scheduler's step on `device` is the code replayed here (checked once per class and kind
    of device)."""
    key = f"{type(scheduler).__name__} {torch.device(device).type}"
    with _lock:
        if key not in _checked:
            try:
                same = (_source_key(type(scheduler)) == CHECKED_STEP and _multinomial_is_exponential_argmax(device)
                        and _entropy_is_categoricals(device))
            except (OSError, TypeError, AttributeError, RuntimeError):
                same = False
            _checked[key] = same
        return _checked[key] and _installed(scheduler)


def _per_value(values, x, op):
    """op(x rows, value) with each row's own Python scalar, as one op per distinct value."""
    if all(v == values[0] for v in values):
        return op(x, values[0])
    return torch.cat([op(x[r:r + 1], v) for r, v in enumerate(values)])


def entropy_bound_rows(impls, steps, generators, logits) -> list[tuple]:
    """Row r of `logits` (B, L, V) stepped by scheduler `impls[r]` at step `steps[r]`, drawing from `generators[r]`:
    per row (canvas, accepted, scaled logits, entropy), the fields of a scheduler's StepOutput."""
    temperatures, bounds = [], []
    for impl, step in zip(impls, steps):
        c = impl.config
        temperatures.append(anneal(c.t_min, c.t_max, schedule_position(impl.num_inference_steps, int(step))))
        bounds.append(float(c.entropy_bound))
    device = logits.device
    scaled = _per_value(temperatures, logits, lambda x, t: x / t)
    B, L, V = scaled.shape
    probs = torch.softmax(_float(scaled), dim=-1)  # row by row over the vocabulary: as diffusers' (B*L, V) view
    noise, renoise = torch.empty((B, L, V), dtype=probs.dtype, device=device), []
    for r, generator in enumerate(generators):  # each row's draws from its own generator, in its step's order
        noise[r:r + 1].exponential_(1, generator=generator)
        renoise.append(torch.randint(0, V, (1, L), device=device, generator=generator))
    sampled = torch.argmax(probs.div_(noise), dim=-1)  # in place: the probabilities are not read again
    del probs, noise  # freed before the entropy's tensors are made: the step's peak holds neither
    entropy = entropy_of(scaled)
    ordered, order = torch.sort(entropy, dim=-1, descending=False)
    within = _per_value(bounds, torch.cumsum(ordered, dim=-1) - ordered, lambda x, b: x <= b)
    accepted = within.scatter(-1, order, within)  # `order` permutes each row: every position is written
    canvas = torch.where(accepted, sampled, renoise[0] if B == 1 else torch.cat(renoise))
    entropy = _float(entropy)
    if B == 1:
        return [(canvas, accepted, scaled, entropy)]
    return [(canvas[r:r + 1], accepted[r:r + 1], scaled[r:r + 1], entropy[r:r + 1]) for r in range(B)]


def _float(x):
    """`x.float()` without the call where it is float32 already (each torch call is host time on a GPU)."""
    return x if x.dtype == torch.float32 else x.float()
