"""Structured reads: each option's probability as the answer, read at the answer slot (decision 0026).

Per noise draw (seeds seed, seed+1, ...: the first canvas a run with that seed starts from) each
option is scored as the chain of the model's conditionals at the answer slot: the end of the turn
right after the option, then the option's tokens left to right, each read with the earlier ones
pinned on the canvas. The scores are normalized over the options. Options of one length share the
end's factor, which then cancels: single-token options take one decoder forward per draw.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import Cancelled, InputError
from ..inputs.knobs import Knobs
from ..inputs.seeding import make_generator
from ..inputs.tokens import check_text, literal_ids
from ..loading.lora import applied
from ..payloads import check_model
from .cache import fork_cache
from .loop import BlockDecoder
from .run import RunResult, fresh_start, prepare, run_watched
from .threads import compute_threads

MAX_SAMPLES = 64
MAX_OPTIONS = 256
MAX_OPTION_CHARS = 1000
ROWS = 16  # most canvases per decoder forward
LOGITS_BYTES = 2**30  # and no more than this many bytes of float32 logits: 4 canvases at the real vocabulary
# The knobs a decision takes: the first draw's seed, and the schedule of the answer block's run (the trace).
KNOB_NAMES = ("seed", "num_inference_steps", "t_min", "t_max", "entropy_bound", "confidence")


def options_from_text(text) -> list[str]:
    """The options of a one-per-line text: each line stripped, blank lines skipped."""
    check_text("options", text)
    return [line.strip() for line in text.split("\n") if line.strip()]


def check_options(options) -> tuple[str, ...]:
    """The options, refused when empty, blank, repeated, too many or too long (no tokenizer needed)."""
    if not isinstance(options, (list, tuple)) or not all(isinstance(o, str) for o in options):
        raise InputError("options", f"options must be a list of texts, got {type(options).__name__}; give one "
                                    "option per line")
    if not options:
        raise InputError("options", "options is empty; give the answers to choose among, e.g. red, green, blue")
    if len(options) > MAX_OPTIONS:
        raise InputError("options", f"options has {len(options)} entries, over {MAX_OPTIONS}; give fewer")
    seen: dict[str, int] = {}
    for i, option in enumerate(options):
        check_text("options", option)
        if not option.strip():
            raise InputError("options", f"option {i + 1} is blank; remove it or write the option")
        if len(option) > MAX_OPTION_CHARS:
            raise InputError("options", f"option {i + 1} is {len(option)} characters, over {MAX_OPTION_CHARS}; "
                                        "shorten it")
        if option in seen:
            raise InputError("options", f"option {option[:80]!r} is given twice (options {seen[option] + 1} and "
                                        f"{i + 1}); list each option once")
        seen[option] = i
    return tuple(options)


def check_samples(samples) -> int:
    if isinstance(samples, bool) or not isinstance(samples, int) or not 1 <= samples <= MAX_SAMPLES:
        raise InputError("samples", f"samples must be a whole number of noise draws from 1 to {MAX_SAMPLES}, got "
                                    f"{samples!r}; use e.g. 8 (more draws: a smaller standard error)")
    return samples


def end_id(dm) -> int:
    """The token that ends an answer: the end of the turn when the model has one, else its first EOS."""
    turn = dm.tokenizer.convert_tokens_to_ids("<turn|>")
    return turn if turn in dm.eos_ids else dm.eos_ids[0]


def option_ids(dm, options) -> list[tuple[int, ...]]:
    """Each option's tokens, refused when it and the end of the turn do not fit on one canvas. `dm` needs only
    `tokenizer` and `canvas_length`: a loaded model, or a checkpoint's TokenCanvas when the graph is queued."""
    out: dict[tuple[int, ...], str] = {}
    for option in options:
        ids = tuple(literal_ids(dm.tokenizer, option))
        if len(ids) + 1 > dm.canvas_length:
            raise InputError("options", f"option {option[:80]!r} is {len(ids)} tokens; with the end of the turn "
                                        f"after it that is over the canvas of {dm.canvas_length} positions; "
                                        "shorten it")
        if ids in out:
            raise InputError("options", f"options {out[ids][:80]!r} and {option[:80]!r} are the same tokens for "
                                        "this model, so they cannot differ; keep one")
        out[ids] = option
    return list(out)


@dataclass(frozen=True)
class ReadPlan:
    """The canvases one read takes and what each option multiplies from them.

    `rows[r]` pins (position, token) pairs on the base canvas; `terms[k]` lists option k's factors
    as (row, position, token): the log-probability of `token` at `position` of row r's forward.
    """

    rows: tuple[tuple[tuple[int, int], ...], ...]
    terms: tuple[tuple[tuple[int, int, int], ...], ...]


def read_plan(ids: list[tuple[int, ...]], end: int) -> ReadPlan:
    """The chain of every option: the end at its length, then its tokens; rows shared where the pins agree."""
    rows: dict[tuple, int] = {}
    row = lambda pins: rows.setdefault(pins, len(rows))
    mixed = len({len(t) for t in ids}) > 1
    terms = []
    for tokens in ids:
        n = len(tokens)
        factors = [(row(()), n, end)] if mixed else []  # one length for all: the end's factor cancels
        for j in range(n):
            pins = ((n, end),) + tuple(enumerate(tokens[:j]))
            factors.append((row(pins), j, tokens[j]))
        terms.append(tuple(factors))
    return ReadPlan(tuple(rows), tuple(terms))


class Reader:
    """Decoder forwards of many canvases over one prefilled cache, several at a time, read where the plan asks."""

    def __init__(self, decoder: BlockDecoder, should_cancel=None, on_read=None):
        self.decoder, self.should_cancel, self.on_read = decoder, should_cancel, on_read
        # From the model alone, so the same canvases share a forward (and round alike) on every caller.
        self.rows = max(1, min(ROWS, LOGITS_BYTES // (decoder.L * decoder.vocab * 4)))
        self._views: dict[int, tuple] = {}
        self.canvases = 0  # canvases the model read

    def _view(self, batch: int):
        """(cache, mask, positions) of `batch` rows sharing the cache (expanded, never copied)."""
        if batch not in self._views:
            d = self.decoder
            cache = fork_cache(d.cache)
            for layer in cache.layers:
                layer.keys = layer.keys.expand(batch, -1, -1, -1)
                layer.values = layer.values.expand(batch, -1, -1, -1)
            start = d.cache.get_seq_length()
            mask = d.decoder.create_diffusion_decoder_attention_mask(
                config=d.config, inputs_embeds=torch.empty((batch, d.L, 0), device=d.device),
                decoder_attention_mask=torch.ones((batch, start + d.L), dtype=torch.bool, device=d.device),
                **{d.mask_kw: cache})
            self._views[batch] = (cache, mask, d.positions.expand(batch, -1))
        return self._views[batch]

    def logits(self, canvases, self_cond):
        if self.should_cancel is not None and self.should_cancel():
            raise Cancelled(0)
        self.canvases += canvases.shape[0]
        d = self.decoder
        if canvases.shape[0] == 1:
            return d.logits(canvases, self_cond)
        cache, mask, positions = self._view(canvases.shape[0])
        cond = None if self_cond is None else self_cond.expand(canvases.shape[0], -1, -1)
        return d.model(decoder_input_ids=canvases, self_conditioning_logits=cond, decoder_attention_mask=mask,
                       decoder_position_ids=positions, **{d.model_kw: cache}).logits

    @torch.no_grad()
    def probabilities(self, plan: ReadPlan, bases, self_cond=None) -> np.ndarray:
        """(D, K) float64: each option's probability on each of D base canvases (1, L)."""
        wanted: dict[tuple[int, int], set] = {}
        for factors in plan.terms:
            for r, pos, token in factors:
                wanted.setdefault((r, pos), set()).add(token)
        values: dict[tuple[int, int, int, int], float] = {}
        jobs = [(d, r) for d in range(len(bases)) for r in range(len(plan.rows))]
        for lo in range(0, len(jobs), self.rows):
            values.update(self._read(plan, bases, jobs[lo:lo + self.rows], wanted, self_cond))
            if self.on_read is not None:
                self.on_read(min(lo + self.rows, len(jobs)), len(jobs))
        scores = np.array([[sum(values[(d, r, pos, t)] for r, pos, t in factors) for factors in plan.terms]
                           for d in range(len(bases))], np.float64)
        scores -= scores.max(axis=1, keepdims=True)
        p = np.exp(scores)
        return p / p.sum(axis=1, keepdims=True)

    def _read(self, plan: ReadPlan, bases, chunk, wanted: dict, self_cond) -> dict:
        """Log-probabilities of the wanted tokens, one forward for a chunk of (base, row) canvases."""
        canvases = torch.cat([bases[d] for d, _ in chunk]).clone()
        for i, (_, r) in enumerate(chunk):
            for pos, token in plan.rows[r]:
                canvases[i, pos] = token
        logits = self.logits(canvases, self_cond)
        values = {}
        for i, (d, r) in enumerate(chunk):
            for (row, pos), tokens in wanted.items():
                if row == r:
                    logp = torch.log_softmax(logits[i, pos].double(), -1)
                    values.update({(d, r, pos, t): float(logp[t]) for t in tokens})
        return values


@dataclass(frozen=True)
class Decision:
    """What a decision read: the options' probabilities per draw, per step of the answer block, and its run."""

    options: tuple[str, ...]
    per_sample: np.ndarray       # (N, K) probabilities per noise draw
    seed: int
    forwards_per_sample: int     # canvases the model read per draw
    trace: np.ndarray | None = None  # (S, K) probabilities before each step of the answer block's run
    run: RunResult | None = None     # that run (its config carries this decision, for the run log)

    @property
    def mean(self) -> np.ndarray:
        return self.per_sample.mean(axis=0)

    @property
    def standard_error(self) -> np.ndarray:
        n = self.per_sample.shape[0]
        return self.per_sample.std(axis=0, ddof=1) / math.sqrt(n) if n > 1 else np.zeros(len(self.options))

    @property
    def choice(self) -> str:
        return self.options[int(np.argmax(self.mean))]  # a tie goes to the option listed first

    def asdict(self, with_trace: bool = True) -> dict:
        out = {"choice": self.choice,
               "probabilities": {o: {"mean": float(m), "standard_error": float(s)}
                                 for o, m, s in zip(self.options, self.mean, self.standard_error)},
               "options": list(self.options), "samples": int(self.per_sample.shape[0]), "seed": self.seed,
               "forwards_per_sample": self.forwards_per_sample, "per_sample": self.per_sample.tolist()}
        if with_trace:
            out["trace"] = None if self.trace is None else self.trace.tolist()
        return out


@dataclass(frozen=True, eq=False)
class DecideRequest:
    """A decision checked once, before any model work: the answer block's run request and the read plan."""

    request: object   # run.Request of the answer block (one canvas, thinking off)
    options: tuple[str, ...]
    samples: int
    plan: ReadPlan


def prepare_decision(dm, prompt: str, options, samples: int = 8, knobs: Knobs = Knobs(), *, context=None,
                     image=None) -> DecideRequest:
    """Check every input (model, prompt, options, samples, knobs, context, image) before any model work.

    The answer block runs with thinking off and gen_length one canvas: the slot is the answer's start.
    """
    if getattr(dm, "backend", None) is not None:
        raise InputError("model", f"{dm} is a remote model, and decide runs only in this process for now; load "
                                  "the model with DGemmaLoader")
    check_model(dm)
    options = check_options(options)
    samples = check_samples(samples)
    if not isinstance(knobs, Knobs):
        raise InputError("knobs", f"knobs must be a Knobs, got {type(knobs).__name__}")
    knobs = dataclasses.replace(knobs, gen_length=dm.canvas_length, thinking=False)
    request = prepare(dm, prompt, knobs, context=context, image=image)
    ids = option_ids(dm, options)
    return DecideRequest(request, options, samples, read_plan(ids, end_id(dm)))


def draw(dm, seed: int, device):
    """The first canvas a run with `seed` starts from: the noise of one draw."""
    generator = make_generator(seed % 2**64, device)
    return torch.randint(0, dm.vocab_size, (1, dm.canvas_length), device=device, generator=generator)


def decide(dm, prompt: str, options, samples: int = 8, knobs: Knobs = Knobs(), *, context=None, image=None,
           trace: bool = True, should_cancel=None, on_progress=None) -> Decision:
    """Each option's probability as the answer to `prompt`, over `samples` noise draws from `knobs.seed`.

    With `trace`, the answer block also runs as a normal denoising run with these knobs, reading the
    options' probabilities before every step; that run comes back in `Decision.run`.
    """
    req = prepare_decision(dm, prompt, options, samples, knobs, context=context, image=image)
    return run_decision(req, trace=trace, should_cancel=should_cancel, on_progress=on_progress)


def run_decision(req: DecideRequest, *, trace: bool = True, should_cancel=None, on_progress=None) -> Decision:
    """Read the draws, then (with `trace`) run the answer block reading before each step.

    `on_progress(done, total, frame)` reports each chunk of the draws' canvases (frame None) and each step
    of the answer block's run (its frame). The units are canvases read, then steps; the total counts the
    step budget until the block ends, then the steps it took, so a bar ends full.
    """
    dm, seed = req.request.dm, req.request.knobs.seed
    reads = req.samples * len(req.plan.rows)
    steps = req.request.knobs.num_inference_steps if trace else 0
    report = (lambda done, _total: on_progress(done, reads + steps, None)) if on_progress is not None else None
    with compute_threads(dm.model), applied(dm):
        decoder = BlockDecoder(dm.model, fresh_start(req.request).cache)
        decoder.enter_block()
        reader = Reader(decoder, should_cancel, report)
        bases = [draw(dm, seed + i, decoder.device) for i in range(req.samples)]
        per_sample = reader.probabilities(req.plan, bases)
    decision = Decision(req.options, per_sample, seed, reader.canvases // req.samples)
    if not trace:
        return decision
    rows: list[np.ndarray] = []

    def read(lane) -> None:
        step = Reader(lane.decoder, should_cancel)
        rows.append(step.probabilities(req.plan, [lane.canvas], lane.self_cond)[0])

    def on_frame(frame) -> None:
        ended = bool(frame.stop.any()) or frame.step + 1 >= steps
        on_progress(reads + frame.step + 1, reads + (frame.step + 1 if ended else steps), frame)

    result = run_watched(req.request, read, on_frame=on_frame if on_progress is not None else None)
    decision = dataclasses.replace(decision, trace=np.array(rows, np.float64).reshape(-1, len(req.options)))
    config = dataclasses.replace(result.config, decision=decision.asdict())
    return dataclasses.replace(decision, run=dataclasses.replace(result, config=config))
