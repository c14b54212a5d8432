"""Immutable payloads passed between nodes: the loaded model, the honesty readout, the run config."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from functools import cached_property

from .errors import InputError
from .inputs.knobs import Knobs
from .paths import shown_path
from .readings import knob_not_sent, percent, why_unknown


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
    identity: str = ""                   # loading/identity.py: which files were loaded; reloads and caches match it
    placement_note: str = ""             # a GPU/CPU split's cost per step, said wherever the model runs
    # LoRA adapters (loading/lora.py): ((adapter, strength), ...) over `base`'s very weights; `view` holds
    # their deltas, added to the forwards only while this payload runs
    adapters: tuple = ()
    base: object = field(default=None, repr=False)
    view: object = field(default=None, repr=False)

    def __repr__(self) -> str:
        """A line, never the network's printout: ComfyUI puts str() of every input into its error report."""
        return f"DGemmaModel({self.shown!r}, quant {self.quant}, {self.device}, {self.dtype}{self.lora_text})"

    @property
    def shown(self) -> str:
        """The source as anyone is shown it: a hub id, or the folder relative to a known one (never absolute)."""
        return shown_path(self.source)

    @property
    def lora_text(self) -> str:
        """' + LoRA name @ strength, ...' (empty without adapters): how logs and headers name them."""
        return "".join(f" + LoRA {a.name} @ {s:g}" for a, s in self.adapters)

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
        from .inputs.tokens import display_strings

        return display_strings(self.tokenizer, self.vocab_size)

    @cached_property
    def tokenizer_fingerprint(self) -> str:
        from .inputs.tokens import tokenizer_fingerprint

        return tokenizer_fingerprint(self.tokenizer)

    @cached_property
    def sampler_defaults(self) -> dict | None:
        """The sampler defaults the checkpoint ships (its generation_config.json, or a GGUF's `diffusion.*`
        metadata), under the knobs' names; None when it ships none."""
        gen = getattr(self.model, "generation_config", None)
        bound = getattr(gen, "sampler_config", None) or {}
        found = {"num_inference_steps": getattr(gen, "max_denoising_steps", None),
                 "t_max": getattr(gen, "t_max", None), "t_min": getattr(gen, "t_min", None),
                 "entropy_bound": bound.get("entropy_bound") if isinstance(bound, dict)
                 else getattr(bound, "entropy_bound", None),  # a loaded checkpoint's is a config object
                 "confidence": getattr(gen, "confidence_threshold", None),
                 "stability_threshold": getattr(gen, "stability_threshold", None)}
        found = {k: v for k, v in found.items() if v is not None}
        return {**found, "canvas_length": self.canvas_length} if found else None

    def describe(self) -> dict:
        return {"model_source": self.shown, "quant": self.quant, "device": self.device, "dtype": self.dtype,
                "adapters": tuple({"name": a.name, "strength": s, "digest": a.digest} for a, s in self.adapters)}


def check_model(dm) -> None:
    if not isinstance(dm, DGemmaModel):
        raise InputError("model", f"model must be a loaded DiffusionGemma model, got {type(dm).__name__}; "
                                  "load one with load_model")


@dataclass(frozen=True)
class CanvasState:
    """The honesty readout of a run. `committed_fraction` reads the last step of the last block. A reading
    its engine did not send is None, and `readings` says why (readings.py)."""

    text: str
    raw_ids: tuple[int, ...]       # every generated id, thought channel included
    answer_ids: tuple[int, ...]    # ids of `text`: outside the channel, before the first EOS
    thought: str | None
    turn_closed: bool              # the model emitted EOS (not: the canvas ran out)
    answer_tokens: int | None
    stray_thought_delimiter: bool
    converged: bool | None         # every block stopped adaptively or committed its whole canvas
    committed_fraction: float | None
    steps_used: int | None         # steps executed, all blocks together
    blocks: int
    run_id: str = field(default="", compare=False)  # the same id as the run's trace and config
    paused: bool = False           # an advanced run stopped at its end_step with a block unfinished
    pins_applied: tuple[int, ...] = ()     # pinned answer positions held on a canvas before the answer ended
    pins_skipped: tuple[int, ...] = ()     # pinned positions the answer never reached: not in the text
    blanks_unfilled: tuple[int, ...] = ()  # template blank positions left empty (answer ended, or padding/EOS)
    # What an advanced run needs to be continued exactly (dgemma/denoising/resume.py): tensors, memory only.
    resume: object = field(default=None, compare=False, repr=False)
    # A constrained run's verdict: kind, text, sha256, satisfied, reason (why not), changed_positions.
    constraint: dict | None = None
    readings: object = None        # readings.Readings of a remote engine that sends less; None: all exact

    @property
    def finished_honestly(self) -> bool:
        """The turn closed with a non-empty answer that holds every pin, fills every blank and satisfies
        the constraint, when there is one."""
        satisfied = self.constraint is None or self.constraint["satisfied"]
        answered = bool(self.text.strip()) if self.answer_tokens is None else self.answer_tokens > 0
        return self.turn_closed and answered and not self.pins_skipped and not self.blanks_unfilled and satisfied

    @property
    def tokens_per_forward(self) -> float | None:
        """Answer tokens per decoder forward (one per executed step): the DiffusionGemma report's headline
        figure, about 20 on the real model; None when the answer's tokens are unknown or no step ran."""
        if self.answer_tokens is None or not self.steps_used:
            return None
        return self.answer_tokens / self.steps_used

    @property
    def warnings(self) -> tuple[str, ...]:
        """Readings that qualify the answer, in words."""
        out = []
        if self.pins_skipped:
            out.append(f"{len(self.pins_skipped)} pin(s) never reached the answer (positions "
                       f"{_span(self.pins_skipped)}): the answer ended before them")
        if self.blanks_unfilled:
            out.append(f"{len(self.blanks_unfilled)} blank position(s) left unfilled ({_span(self.blanks_unfilled)}):"
                       " the answer ended there or the model put padding/end tokens in them")
        return tuple(out) + (self.readings.warnings if self.readings is not None else ())

    def asdict(self) -> dict:
        """The readout as plain values; the resume data is never part of it."""
        values = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("resume", "readings")}
        if self.readings is not None:
            values["readings"] = self.readings.asdict()
        return {**values, "finished_honestly": self.finished_honestly, "warnings": list(self.warnings)}

    def __str__(self) -> str:
        """What a text preview shows: the answer and the readings that qualify it."""
        closed = ("turn closed by EOS" if self.turn_closed and not why_unknown(self, "ids") else
                  "turn closed: the engine said it stopped (no EOS token seen)" if self.turn_closed else
                  "turn NOT closed: the canvas ran out")
        tokens = "answer tokens unknown" if self.answer_tokens is None else f"{self.answer_tokens} tokens"
        committed = "unknown" if self.committed_fraction is None else f"{self.committed_fraction:.0%}"
        lines = [f"answer: {_quote(self.text)} ({tokens}, {closed})",
                 f"finished honestly: {_yes(self.finished_honestly)} · converged: {_yes(self.converged)} · "
                 f"committed at the last step: {committed}",
                 f"{'unknown' if self.steps_used is None else self.steps_used} steps in {self.blocks} block(s) · "
                 f"{per_forward(self.tokens_per_forward)}",
                 f"thought: {_quote(self.thought) if self.thought is not None else 'none'}"]
        if self.readings is not None:
            lines += self.readings.lines()
        if self.constraint is not None:
            c = self.constraint
            verdict = "satisfied" if c["satisfied"] else f"NOT satisfied: {c['reason']}"
            lines.append(f"constraint ({c['kind']}): {verdict} · {c['changed_positions']} position changes")
        return "\n".join(lines + [f"warning: {w}" for w in self.warnings])


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
    advanced: dict | None = field(default=None)  # scheduler and its knobs, window, pins, the run resumed
    constraint: dict | None = field(default=None)  # kind, text and sha256 of the answer's constraint
    readings: object = None  # readings.Readings: the knobs a remote engine was sent and those it fixes itself
    decision: dict | None = field(default=None)    # a decision's reading (denoising/decide.py), on its answer block
    model_defaults: dict | None = field(default=None)  # the checkpoint's own sampler defaults (DGemmaModel)
    adapters: tuple = ()  # the model's LoRA adapters: name, strength, content digest each

    def __str__(self) -> str:
        k = self.knobs
        context = f"KV cache of {self.context['length']} tokens" if self.context else "none"
        images = f" · images: {self.image['count']}" if self.image else ""
        a = self.advanced
        extra = [] if a is None else [
            f"scheduler {a['scheduler']} · window [{a['start_step']}, {a['end_step']}) · pins "
            f"{_quote(a['pins']) if a['pins'] else 'none'}"
            + (f" · resumed at block {a['resumed_from']['block'] + 1} step {a['resumed_from']['step']}"
               if a["resumed_from"] and a["resumed_from"]["step"] is not None else "")]
        knobs = (f"seed {k.seed} · {k.num_inference_steps} steps · T {k.t_max:g} → {k.t_min:g} · entropy_bound "
                 f"{k.entropy_bound:g} · confidence {k.confidence:g} · gen_length {k.gen_length} · thinking "
                 f"{'on' if k.thinking else 'off'}")
        if self.readings is not None:
            knobs = self._sent_knobs()
        return "\n".join([
            f"prompt: {_quote(self.prompt)}", knobs,
            f"model: {self.model_source} (quant {self.quant}, {self.device}, {self.dtype})"
            + "".join(f" + LoRA {a['name']} @ {a['strength']:g}" for a in self.adapters),
            *_defaults(self.model_defaults),
            f"context: {context}{images}", *extra, *_decided(self.decision),
            *(f"warning: {w}" for w in (self.image or {}).get("warnings", ()))])

    def _sent_knobs(self) -> str:
        """A remote engine's knobs: those sent (and how), then those it never got or ignored, and why."""
        r, values = self.readings, self.knobs.asdict()
        sent = " · ".join(f"{name} {values[name]} (as {how})" for name, how in r.knobs_sent.items())
        other = "; ".join(f"{name} {values[name]}: {why}" for name, why in r.knobs_not_sent.items())
        return f"sent to the engine: {sent or 'none'}\nasked but not the run's setting: {other or 'none'}"

    def asdict(self) -> dict:
        knobs = {name: None if knob_not_sent(self, name) else v for name, v in self.knobs.asdict().items()}
        out = {"prompt": self.prompt, **knobs, "model_source": self.model_source,
               "quant": self.quant, "device": self.device, "dtype": self.dtype,
               "context": self.context, "image": self.image, "advanced": self.advanced,
               "constraint": self.constraint, "run_id": self.run_id,
               **({"decision": self.decision} if self.decision is not None else {}),
               **({"model_defaults": self.model_defaults} if self.model_defaults is not None else {}),
               **({"adapters": [dict(a) for a in self.adapters]} if self.adapters else {})}
        return out if self.readings is None else {**out, "readings": self.readings.asdict()}


def per_forward(value: float | None) -> str:
    return "tokens per forward unknown" if value is None else f"{value:.2f} tokens per forward"


def _decided(decision: dict | None) -> list[str]:
    if decision is None:
        return []
    read = " · ".join(f"{o} {percent(v['mean'])}" for o, v in decision["probabilities"].items())
    return [f"decision: {_quote(decision['choice'])} over {decision['samples']} noise draw(s): {read}"]


def _quote(text: str, limit: int = 200) -> str:
    text = text if len(text) <= limit else text[:limit - 1] + "…"
    return '"' + text.replace("\n", "⏎") + '"'


def _span(positions) -> str:
    return f"{positions[0]}" if len(positions) == 1 else f"{positions[0]}..{positions[-1]}"


def _yes(flag: bool | None) -> str:
    return "unknown" if flag is None else "yes" if flag else "no"


def _defaults(found: dict | None) -> list[str]:
    """The line naming the checkpoint's own sampler defaults, when it ships them."""
    if not found:
        return []
    words = {"num_inference_steps": "{} steps", "t_max": "T_max {:g}", "t_min": "T_min {:g}",
             "entropy_bound": "entropy_bound {:g}", "confidence": "confidence {:g}",
             "stability_threshold": "stability {}", "canvas_length": "canvas {}"}
    return ["model defaults: " + " · ".join(words[k].format(v) for k, v in found.items() if k in words)]
