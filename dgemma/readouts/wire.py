"""The engine's payloads as JSON, exactly: a step as the trace stores it, and a run's result.

The pack's server streams `step_json` per step and `result_json` at the end; the remote client
rebuilds the same Frames, CanvasTrace, CanvasState and RunConfig from them. Arrays travel as
base64 of their stored bytes (packed bits, float16 entropy) so nothing is rounded on the way.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
from dataclasses import fields

import numpy as np

from ..errors import InputError, short
from ..inputs.knobs import Knobs
from ..payloads import CanvasState, RunConfig
from .trace import Frame, Recorded, Recorder, Row

STATE_FIELDS = tuple(f.name for f in fields(CanvasState) if f.name != "resume")
TEXT_LIMIT = 2**20   # characters of a text the server sends (an answer, a thought, a prompt)
NAME_LIMIT = 1024    # characters of a name (model source, device, dtype, scheduler)
MAX_TEMPERATURE = 1e4  # a step's T: the knobs and schedulers stay within a few units
_MISSING = object()

# The field names of the stream's extensions, as this pack's server writes them and the remote dialects
# read them (the Unsloth shim's frames and timings, vLLM's extra arguments among them).
EXTENSION = "dgemma"          # the pack's object in a card, a request, a step chunk and the result chunk
FRAME = "diffusion_frame"     # a step chunk's `type`: the shim's, and the pack's server's (with EXTENSION)
OWNER = "owned_by"            # a card's owner: vLLM, SGLang and the shim sign it
CARD_CANVAS = ("diffusion_canvas", "canvas_length")  # a text dialect card's canvas size, the first given
MAX_LEN = "max_model_len"     # a card's context window
TIMINGS = "timings"           # the llama.cpp-style numbers the last chunk carries, among them:
STEPS_RUN, BLOCKS_RUN, CANVAS_RUN = "diffusion_steps", "diffusion_blocks", "diffusion_canvas"
VLLM_ARGS, VLLM_MAX_STEPS = "vllm_xargs", "diffusion_max_steps"  # vLLM's per-request arguments, a step bound


class WireError(ValueError):
    """A field a peer sent that is missing, of the wrong kind or out of range; `field` names it."""

    def __init__(self, field: str, want: str, value=_MISSING):
        super().__init__(f"{field} must be {want}, got {'nothing' if value is _MISSING else short(value)}")
        self.field = field


def value(data, name: str, where: str = ""):
    if not isinstance(data, dict) or name not in data:
        raise WireError(where + name, "present")
    return data[name]


def integer(data, name: str, lo: int, hi: int, where: str = "") -> int:
    v = value(data, name, where)
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise WireError(where + name, f"an integer in {lo}..{hi}", v)
    return v


def real(data, name: str, lo: float, hi: float, where: str = "") -> float:
    v = value(data, name, where)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:  # NaN fails too
        raise WireError(where + name, f"a number in [{lo:g}, {hi:g}]", v)
    return float(v)


def flag(data, name: str, where: str = "") -> bool:
    v = value(data, name, where)
    if not isinstance(v, bool):
        raise WireError(where + name, "true or false", v)
    return v


def text(data, name: str, limit: int = NAME_LIMIT, where: str = "", none: bool = False) -> str | None:
    v = value(data, name, where)
    if not (isinstance(v, str) and len(v) <= limit) and not (none and v is None):
        raise WireError(where + name, f"a text of at most {limit} characters" + (" or null" if none else ""), v)
    return v


def obj(data, name: str, where: str = "", none: bool = False) -> dict | None:
    v = value(data, name, where)
    if not isinstance(v, dict) and not (none and v is None):
        raise WireError(where + name, "an object" + (" or null" if none else ""), v)
    return v


def int_list(data, name: str, hi: int, count: int | None = None, most: int = 2**20, where: str = "") -> list:
    """A list of integers in 0..hi-1, of exactly `count` items (or at most `most`)."""
    v = value(data, name, where)
    if not isinstance(v, list) or (len(v) != count if count is not None else len(v) > most):
        size = f"{count}" if count is not None else f"at most {most}"
        raise WireError(where + name, f"a list of {size} integers", v if not isinstance(v, list) else len(v))
    for item in v:
        if type(item) is not int or not 0 <= item < hi:
            raise WireError(where + name, f"integers in 0..{hi - 1}", item)
    return v


def _packed(data, name: str, nbytes: int, none: bool = False) -> np.ndarray | None:
    """`nbytes` bytes sent as base64."""
    v = value(data, name)
    if v is None and none:
        return None
    if not isinstance(v, str) or len(v) > 4 * (nbytes // 3 + 1):
        raise WireError(name, f"base64 of {nbytes} bytes", v)
    try:
        raw = base64.b64decode(v, validate=True)
    except (binascii.Error, ValueError):
        raise WireError(name, f"base64 of {nbytes} bytes", v) from None
    if len(raw) != nbytes:
        raise WireError(name, f"base64 of {nbytes} bytes", f"{len(raw)} bytes")
    return np.frombuffer(raw, np.uint8).copy()


def _b64(a: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(a).tobytes()).decode("ascii")


def _bits(mask) -> str | None:
    return None if mask is None else _b64(np.packbits(mask))


def step_json(frame: Frame) -> dict:
    """One step: what the trace stores of it (ids, committed/stop/pinned masks, entropy, t, T, and what a
    constraint changed, only when the run has one)."""
    out = {"block": frame.block, "step": frame.step, "t": frame.t, "T": frame.temperature,
           "ids": frame.ids.tolist(), "committed": _bits(frame.committed), "stop": _bits(frame.stop),
           "pinned": _bits(frame.pinned), "entropy": _b64(frame.entropy.astype("<f2"))}
    if frame.constrained is not None:
        out["constrained"] = _bits(frame.constrained)
    return out


def step_row(data: dict, canvas_length: int, vocab_size: int) -> Row:
    """The recorder row of a streamed step, every field checked (knob index filled in by `result_parts`)."""
    L, nbytes = canvas_length, (canvas_length + 7) // 8
    ids = np.array(int_list(data, "ids", vocab_size, count=L), np.int32)
    entropy = _packed(data, "entropy", 2 * L).view("<f2").astype(np.float16)
    if not (np.isfinite(entropy) & (entropy >= 0)).all():
        bad = entropy[~(np.isfinite(entropy) & (entropy >= 0))][0]
        raise WireError("entropy", "finite and >= 0 at every position", float(bad))
    masks = [_packed(data, name, nbytes, none=name != "committed") for name in ("committed", "stop", "pinned")]
    masks.append(_packed(data, "constrained", nbytes, none=True) if "constrained" in data else None)  # only if asked
    return Row(integer(data, "block", 0, 2**15 - 1), integer(data, "step", 0, 2**15 - 1), ids, masks[0], entropy,
               masks[1], masks[2], real(data, "t", 0.0, 1.0), real(data, "T", 0.0, MAX_TEMPERATURE), 0, masks[3])


def row_frame(row: Row, canvas_length: int) -> Frame:
    """The Frame a local run hands its on_frame for this row."""
    frame = row.frame(canvas_length)
    for a in (frame.ids, frame.committed, frame.entropy, frame.stop, frame.pinned):
        if a is not None:
            a.setflags(write=False)
    return frame


def result_json(result, resume_handle: str | None = None, context: dict | None = None) -> dict:
    """The end of a run: readout, config and the trace's run-level fields (the steps were streamed)."""
    trace = result.trace
    return {"state": {name: getattr(result.state, name) for name in STATE_FIELDS},
            "config": result.config.asdict(),
            "trace": {"scheduler_name": trace.scheduler_name, "scheduler_settings": trace.scheduler_settings,
                      "block_stopped_early": list(trace.block_stopped_early), "knob_sets": list(trace.knob_sets),
                      "knob_index": trace.knob_index.tolist(), "steps": len(trace), "context": trace.context},
            "resume": resume_handle, "context": context}


def knobs_of(values, where: str = "") -> Knobs:
    try:
        return Knobs(**{f.name: value(values, f.name, where) for f in fields(Knobs)})
    except InputError as err:
        raise WireError(where + err.name, "a knob value the engine takes", values.get(err.name)) from None


def _flat(data, name: str, where: str, none: bool = True) -> dict | None:
    """An object of at most 64 scalar values (a knob set, scheduler settings)."""
    v = obj(data, name, where, none)
    if v is not None and (len(v) > 64 or not all(isinstance(x, (str, int, float, bool, type(None))) and
                                                 (not isinstance(x, str) or len(x) <= NAME_LIMIT)
                                                 for x in v.values())):
        raise WireError(where + name, "an object of at most 64 plain values", v)
    return v


def trace_parts(meta: dict, n: int) -> tuple:
    """(knob sets, knob index, block stops, scheduler) of a run of `n` steps, checked."""
    sets = value(meta, "knob_sets", "trace.")
    if not isinstance(sets, list) or not 1 <= len(sets) <= 255:
        raise WireError("trace.knob_sets", "a list of 1..255 knob sets", sets)
    sets = [_flat({"knob_set": s}, "knob_set", "trace.", none=False) for s in sets]
    index = int_list(meta, "knob_index", len(sets), count=n, where="trace.")
    stopped = value(meta, "block_stopped_early", "trace.")
    if not isinstance(stopped, list) or len(stopped) > 2**15 or not all(isinstance(b, bool) for b in stopped):
        raise WireError("trace.block_stopped_early", "a list of true/false, one per block", stopped)
    integer(meta, "steps", n, n, "trace.")
    scheduler = (text(meta, "scheduler_name", 128, "trace."), _flat(meta, "scheduler_settings", "trace."))
    return sets, index, stopped, scheduler


def state_values(data: dict, vocab_size: int) -> dict:
    """The CanvasState fields of a result, each of its kind and range (consistency is the caller's)."""
    st, w = obj(data, "state"), "state."
    raw = int_list(st, "raw_ids", vocab_size, where=w)
    out = {"text": text(st, "text", TEXT_LIMIT, w), "raw_ids": tuple(raw),
           "thought": text(st, "thought", TEXT_LIMIT, w, True),
           "answer_ids": tuple(int_list(st, "answer_ids", vocab_size, most=len(raw), where=w)),
           "answer_tokens": integer(st, "answer_tokens", 0, len(raw), w),
           "committed_fraction": real(st, "committed_fraction", 0.0, 1.0, w),
           "steps_used": integer(st, "steps_used", 0, 2**31, w), "blocks": integer(st, "blocks", 0, 2**15, w),
           "run_id": text(st, "run_id", 64, w), "constraint": obj(st, "constraint", w, none=True)}
    for name in ("turn_closed", "stray_thought_delimiter", "converged", "paused"):
        out[name] = flag(st, name, w)
    for name in ("pins_applied", "pins_skipped", "blanks_unfilled"):
        out[name] = tuple(int_list(st, name, 2**20, where=w))
    return out


def config_of(cfg: dict, knobs: Knobs) -> RunConfig:
    w = "config."
    names = {name: text(cfg, name, NAME_LIMIT, w) for name in ("model_source", "quant", "device", "dtype")}
    return RunConfig(prompt=text(cfg, "prompt", TEXT_LIMIT, w), knobs=knobs, **names, run_id=text(cfg, "run_id", 64, w),
                     context=obj(cfg, "context", w, True), image=obj(cfg, "image", w, True),
                     advanced=obj(cfg, "advanced", w, True), constraint=obj(cfg, "constraint", w, True),
                     model_defaults=_flat(cfg, "model_defaults", w))


def result_parts(data: dict, rows: list, canvas_length: int, token_strings, vocab_size: int):
    """(CanvasState, CanvasTrace, RunConfig, recorded) from `result_json` and every row of the run, in
    order, each field checked; `recorded` is what resuming the run starts from (`Recorder.snapshot()`).
    What the trace says of itself (steps, blocks, committed fraction) must agree with the rows."""
    meta, cfg = obj(data, "trace"), obj(data, "config")
    knobs = knobs_of(cfg, "config.")
    sets, index, stopped, scheduler = trace_parts(meta, len(rows))
    rows = tuple(dataclasses.replace(r, knob_set=k) for r, k in zip(rows, index))
    recorder = Recorder(knobs, canvas_length, token_strings, resumed=Recorded(rows, tuple(stopped), tuple(sets)))
    config = config_of(cfg, knobs)
    trace = recorder.finish(context=obj(meta, "context", "trace.", True), run_id=config.run_id, scheduler=scheduler)
    values = state_values(data, vocab_size)
    state = CanvasState(**values)
    fraction = float(trace.committed[-1].mean()) if len(trace) else 0.0
    for name, sent, want in (("state.steps_used", state.steps_used, len(trace)),
                             ("state.blocks", state.blocks, trace.num_blocks),
                             ("state.answer_tokens", state.answer_tokens, len(state.answer_ids)),
                             ("state.committed_fraction", state.committed_fraction, fraction),
                             ("state.run_id", state.run_id, config.run_id),
                             ("trace.context", trace.context, config.context)):
        if sent != want:
            raise WireError(name, f"{short(want)}, as the steps and the config say", sent)
    return state, trace, config, recorder.snapshot()
