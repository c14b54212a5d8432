"""Immutable payloads passed between nodes: the loaded model, the honesty readout, the run config."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from functools import cached_property

from .errors import InputError
from .knobs import Knobs


@dataclass(frozen=True, eq=False)
class DGemmaModel:
    """A loaded DiffusionGemma: the transformers model, its tokenizer/processor and where it runs."""

    model: object
    tokenizer: object
    processor: object
    source: str
    quant: str
    device: str
    dtype: str
    eos_ids: tuple[int, ...]
    channel_ids: tuple[int, int] | None  # (<|channel>, <channel|>)
    image_processor: object = None       # the processor's image half; None: the model takes no images

    @property
    def canvas_length(self) -> int:
        return int(self.model.config.canvas_length)

    @property
    def max_positions(self) -> int:
        """Positions the model can attend over: context, turn and every generated block."""
        return int(self.model.config.get_text_config(decoder=True).max_position_embeddings)

    @property
    def vocab_size(self) -> int:
        return int(self.model.config.get_text_config(decoder=True).vocab_size)

    @cached_property
    def token_strings(self) -> tuple[str, ...]:
        """Display string of every id, computed once: frames join these instead of decoding."""
        from .tokens import display_strings

        return display_strings(self.tokenizer, self.vocab_size)

    @cached_property
    def tokenizer_fingerprint(self) -> str:
        from .tokens import tokenizer_fingerprint

        return tokenizer_fingerprint(self.tokenizer)

    def describe(self) -> dict:
        return {"model_source": self.source, "quant": self.quant, "device": self.device, "dtype": self.dtype}


def check_model(dm) -> None:
    if not isinstance(dm, DGemmaModel):
        raise InputError("model", f"model must be a loaded DiffusionGemma model, got {type(dm).__name__}; "
                                  "load one with load_model")


@dataclass(frozen=True)
class CanvasState:
    """The honesty readout of a run. `committed_fraction` reads the last step of the last block."""

    text: str
    raw_ids: tuple[int, ...]       # every generated id, thought channel included
    answer_ids: tuple[int, ...]    # ids of `text`: outside the channel, before the first EOS
    thought: str | None
    turn_closed: bool              # the model emitted EOS (not: the canvas ran out)
    answer_tokens: int
    stray_thought_delimiter: bool
    converged: bool                # every block stopped adaptively or accepted its whole canvas
    committed_fraction: float
    steps_used: int                # steps executed, all blocks together
    blocks: int
    run_id: str = field(default="", compare=False)  # the same id as the run's trace and config
    paused: bool = False           # an advanced run stopped at its end_step with a block unfinished
    # What an advanced run needs to be continued exactly (dgemma/resume.py): tensors, memory only.
    resume: object = field(default=None, compare=False, repr=False)

    @property
    def finished_honestly(self) -> bool:
        """The turn closed with a non-empty answer."""
        return self.turn_closed and self.answer_tokens > 0

    def asdict(self) -> dict:
        """The readout as plain values; the resume data is never part of it."""
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "resume"}
        return {**values, "finished_honestly": self.finished_honestly}

    def __str__(self) -> str:
        """What a text preview shows: the answer and the readings that qualify it."""
        closed = "turn closed by EOS" if self.turn_closed else "turn NOT closed: the canvas ran out"
        lines = [f"answer: {_quote(self.text)} ({self.answer_tokens} tokens, {closed})",
                 f"finished honestly: {_yes(self.finished_honestly)} · converged: {_yes(self.converged)} · "
                 f"committed at the last step: {self.committed_fraction:.0%}",
                 f"{self.steps_used} steps in {self.blocks} block(s)",
                 f"thought: {_quote(self.thought) if self.thought is not None else 'none'}"]
        return "\n".join(lines)


@dataclass(frozen=True)
class RunConfig:
    """What a run was asked to do and on which model: enough to repeat it."""

    prompt: str
    knobs: Knobs
    model_source: str
    quant: str
    device: str
    dtype: str
    context: dict | None = field(default=None)  # provenance summary of an injected KV cache
    run_id: str = field(default="", compare=False)
    image: dict | None = field(default=None)    # the turn's images: count, sizes, content hash (no pixels)

    def __str__(self) -> str:
        k = self.knobs
        context = f"KV cache of {self.context['length']} tokens" if self.context else "none"
        images = f" · images: {self.image['count']}" if self.image else ""
        return "\n".join([
            f"prompt: {_quote(self.prompt)}",
            f"seed {k.seed} · {k.num_inference_steps} steps · T {k.t_max:g} → {k.t_min:g} · entropy_bound "
            f"{k.entropy_bound:g} · confidence {k.confidence:g} · gen_length {k.gen_length} · thinking "
            f"{'on' if k.thinking else 'off'}",
            f"model: {self.model_source} (quant {self.quant}, {self.device}, {self.dtype})",
            f"context: {context}{images}"])

    def asdict(self) -> dict:
        return {"prompt": self.prompt, **self.knobs.asdict(), "model_source": self.model_source,
                "quant": self.quant, "device": self.device, "dtype": self.dtype,
                "context": self.context, "image": self.image, "run_id": self.run_id}


def _quote(text: str, limit: int = 200) -> str:
    text = text if len(text) <= limit else text[:limit - 1] + "…"
    return '"' + text.replace("\n", "⏎") + '"'


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"
