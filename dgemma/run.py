"""One run, start to end: validate, prefill the cache, run the block loop, read the result."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from .cache import encode_ids, input_device, new_cache
from .context import mint
from .excision import excise, thought_text
from .knobs import Knobs
from .loop import denoise_blocks
from .payloads import CanvasState, DGemmaModel, RunConfig
from .tokens import prompt_ids
from .trace import CanvasTrace, Frame, Recorder


@dataclass(frozen=True)
class RunResult:
    text: str
    state: CanvasState
    trace: CanvasTrace
    config: RunConfig
    context: object | None = None  # the KVCache advanced by this run, when asked for


def check_inputs(dm, prompt, knobs, context) -> None:
    if not isinstance(dm, DGemmaModel):
        raise ValueError(f"model must be a loaded DiffusionGemma model (from DGemmaLoader), got {type(dm).__name__}")
    if not isinstance(prompt, str):
        raise ValueError(f"prompt must be text, got {type(prompt).__name__}")
    if not isinstance(knobs, Knobs):
        raise ValueError(f"knobs must be a Knobs, got {type(knobs).__name__}")
    if context is None and not prompt.strip():
        raise ValueError("prompt is empty; type a prompt, or wire a kv_cache from DGemmaEncode for a "
                         "pure-injection run")
    if context is not None:
        context.check_model(dm)


def generate(dm: DGemmaModel, prompt: str, knobs: Knobs = Knobs(), *, context=None,
             on_frame: Callable[[Frame], None] | None = None,
             should_cancel: Callable[[], bool] | None = None, advance_context: bool = False) -> RunResult:
    """Generate an answer to `prompt` (the turn), optionally on top of a KV `context`.

    The context is never modified: the run works on a fork. With `advance_context` the result
    carries a new context holding context + turn + every generated block.
    """
    check_inputs(dm, prompt, knobs, context)
    model = dm.model
    cache = context.fork_for(dm) if context is not None else new_cache(model)
    turn = prompt_ids(dm, prompt, knobs.thinking, with_bos=context is None) if prompt.strip() else []
    if turn:
        encode_ids(model, cache, turn)
    generator = torch.Generator(device=input_device(model)).manual_seed(knobs.seed)
    recorder = Recorder(knobs, dm.canvas_length)
    sequence = denoise_blocks(model, cache, knobs, generator, dm.eos_ids, recorder, on_frame=on_frame,
                              should_cancel=should_cancel, encode_last=advance_context)
    summary = context.summary() if context is not None else None
    trace = recorder.finish(context=summary)
    state = read_state(dm, sequence[0].tolist(), trace)
    config = RunConfig(prompt=prompt, knobs=knobs, context=summary, **dm.describe())
    advanced = None
    if advance_context:
        held = turn + list(state.raw_ids)
        advanced = context.advanced(cache, held) if context is not None else mint(dm, cache, held)
    return RunResult(state.text, state, trace, config, advanced)


def read_state(dm: DGemmaModel, raw_ids: list[int], trace: CanvasTrace) -> CanvasState:
    opened, closed = dm.channel_ids or (-1, -1)
    cut = excise(raw_ids, opened, closed, dm.eos_ids)
    text = dm.tokenizer.decode(list(cut.answer), skip_special_tokens=True).strip()
    accepted = trace.accepted
    last_of_block = np.flatnonzero(np.diff(np.append(trace.blocks, -1)) != 0)
    converged = all(stopped or bool(accepted[i].all())
                    for stopped, i in zip(trace.block_stopped_early, last_of_block))
    return CanvasState(
        text=text, raw_ids=tuple(raw_ids), answer_ids=cut.answer, thought=thought_text(dm.tokenizer, cut.thoughts),
        turn_closed=cut.turn_closed, answer_tokens=len(cut.answer), stray_thought_delimiter=cut.stray_delimiter,
        converged=converged, committed_fraction=float(accepted[-1].mean()) if len(trace) else 0.0,
        steps_used=len(trace), blocks=trace.num_blocks)
