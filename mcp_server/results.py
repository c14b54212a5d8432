"""The tools' typed results: each field named, typed and described, published as output schemas."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


def _f(description: str, default=...):
    return Field(default, description=description)


class CanvasStateOut(BaseModel):
    """The honesty readout of a run (the nodes' canvas_state, without ids or resume tensors)."""

    text: str = _f("The answer: outside the thought channel, before the first end-of-turn token.")
    thought: str | None = _f("The thought channel's text, when the model thought; else null.")
    turn_closed: bool = _f("The model emitted end-of-turn (not: the canvas ran out).")
    answer_tokens: int = _f("Tokens in the answer.")
    finished_honestly: bool = _f("The turn closed with an answer that fills every pinned blank and "
                                  "satisfies the constraint, when there is one.")
    converged: bool = _f("Every block stopped adaptively or committed its whole canvas.")
    committed_fraction: float = _f("Share of the last canvas the scheduler had committed at the last step (0..1).")
    steps_used: int = _f("Denoising steps executed, all blocks together.")
    blocks: int = _f("Blocks run.")
    stray_thought_delimiter: bool = _f("A thought-channel delimiter appeared unpaired.")
    paused: bool = _f("The run stopped at end_step with a block unfinished; resume it with paused_handle.")
    pins_applied: list[int] = _f("Answer positions whose pins were held on a canvas that ran.", [])
    pins_skipped: list[int] = _f("Answer positions whose pins never reached a canvas (the answer ended first, or "
                                 "they lie past gen_length).", [])
    warnings: list[str] = _f("Readings that qualify the answer, in words.", [])
    constraint: dict[str, Any] | None = _f("A constrained run's verdict: kind, text, sha256, satisfied, reason (why "
                                           "not) and changed_positions; null when unconstrained.", None)
    run_id: str = _f("Id shared by this run's trace, config and run log.")


class ItemOut(BaseModel):
    """One prompt's result in a generate call with prompts."""

    prompt: str = _f("The turn this item answered.")
    text: str = _f("The answer.")
    canvas_state: CanvasStateOut = _f("The honesty readout.")
    config: dict[str, Any] = _f("Everything needed to repeat this item alone (its seed included).")
    paused_handle: str | None = _f("Handle of this item's paused run, when the window paused it.", None)
    runlog_uri: str = _f("Resource URI of this item's dg-runlog/1 log.")
    runlog: str | None = _f("Path of this item's run log file, when runlog was true.", None)
    gif: str | None = _f("Path of this item's GIF, when gif was true.", None)


class GenerateOut(BaseModel):
    """What generate returns."""

    cancelled: bool = _f("The run was stopped by cancel_run or by the client giving up.")
    steps_done: int = _f("Denoising steps executed.")
    message: str = _f("One line: the answer and its readings, or why the run stopped.")
    text: str | None = _f("The answer; null when cancelled.", None)
    canvas_state: CanvasStateOut | None = _f("The honesty readout; null when cancelled.", None)
    config: dict[str, Any] | None = _f("Everything needed to repeat the run: prompt, knobs, model, context and "
                                       "image provenance, and for advanced runs the scheduler, window, pins and "
                                       "the run resumed.", None)
    paused_handle: str | None = _f("Handle of this paused run, kept by the server: pass it as resume to continue "
                                   "(listed by model_status, freed by free_handle).", None)
    runlog_uri: str | None = _f("Resource URI of this run's dg-runlog/1 log (JSON Lines), readable while the "
                                "server keeps the run.", None)
    runlog: str | None = _f("Path of the run log file written, when runlog was true.", None)
    gif: str | None = _f("Path of the GIF written, when gif was true (the GIF also comes back as image content).",
                         None)
    items: list[ItemOut] | None = _f("With prompts: one result per prompt, in order; null otherwise.", None)


class EncodeOut(BaseModel):
    """What encode returns."""

    handle: str = _f("Handle of the encoded context, for generate's context_handle or encode's onto.")
    length: int = _f("Tokens the context holds.")
    onto: str | None = _f("The handle this context continues, or null.")
    summary: dict[str, Any] = _f("Provenance: model, tokenizer fingerprint, content hash, images.")


class StatusOut(BaseModel):
    """What model_status and load_model return."""

    loaded: bool = _f("A model is loaded.")
    model: str | None = _f("The model asked for (the demo's name, a folder or a hub id).")
    default_model: str = _f("The model loaded on first use.")
    busy: str | None = _f("The tool whose run holds the model now, or null.")
    contexts: dict[str, int] = _f("Context handles held by the server, with their lengths in tokens.")
    paused_runs: dict[str, dict[str, Any]] = _f("Paused runs held by the server by handle: prompt, block, step, "
                                                "bytes held; the oldest is freed past max_paused.")
    max_paused: int = _f("Most paused runs kept at once.")
    model_info: dict[str, Any] = _f("Source, quant, device, dtype, canvas_length, vocab_size and memory of the "
                                    "loaded model; empty when none is loaded.")


class CancelOut(BaseModel):
    """What cancel_run returns."""

    cancelled: bool = _f("A run was asked to stop.")
    message: str = _f("What happened, in words.")
    tool: str | None = _f("The tool whose run was asked to stop.", None)
    steps_done: int | None = _f("Steps done when it was asked.", None)


class FreeOut(BaseModel):
    """What free_handle returns."""

    freed: bool = _f("The handle was held and is now freed.")
    handle: str = _f("The handle asked for.")
    kind: str | None = _f("context or paused run; null when the handle was unknown.", None)
    bytes_freed: int | None = _f("Bytes of resume tensors released (paused runs).", None)
