"""The engine's payloads as JSON, exactly: a step as the trace stores it, and a run's result.

The pack's server streams `step_json` per step and `result_json` at the end; the remote client
rebuilds the same Frames, CanvasTrace, CanvasState and RunConfig from them. Arrays travel as
base64 of their stored bytes (packed bits, float16 entropy) so nothing is rounded on the way.
"""

from __future__ import annotations

import base64
import dataclasses
from dataclasses import fields

import numpy as np

from .knobs import Knobs
from .payloads import CanvasState, RunConfig
from .trace import Frame, Recorded, Recorder, Row

STATE_FIELDS = tuple(f.name for f in fields(CanvasState) if f.name != "resume")


def _b64(a: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(a).tobytes()).decode("ascii")


def _array(text: str, dtype) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype=dtype).copy()


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


def step_row(data: dict, canvas_length: int) -> Row:
    """The recorder row of a streamed step (knob index filled in by `result_parts`)."""
    packed = lambda key: None if data.get(key) is None else _array(data[key], np.uint8)
    return Row(int(data["block"]), int(data["step"]), np.array(data["ids"], np.int32), packed("committed"),
               _array(data["entropy"], "<f2").astype(np.float16), packed("stop"), packed("pinned"),
               float(data["t"]), float(data["T"]), 0, packed("constrained"))


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


def knobs_of(values: dict) -> Knobs:
    return Knobs(**{f.name: values[f.name] for f in fields(Knobs)})


def result_parts(data: dict, rows: list, canvas_length: int, token_strings):
    """(CanvasState, CanvasTrace, RunConfig, recorded) from `result_json` and every row of the run, in
    order; `recorded` is what resuming the run starts from, as `Recorder.snapshot()` gives it."""
    meta, cfg = data["trace"], data["config"]
    knobs = knobs_of(cfg)
    rows = tuple(dataclasses.replace(r, knob_set=int(k)) for r, k in zip(rows, meta["knob_index"]))
    recorder = Recorder(knobs, canvas_length, token_strings,
                        resumed=Recorded(rows, tuple(meta["block_stopped_early"]), tuple(meta["knob_sets"])))
    trace = recorder.finish(context=meta["context"], run_id=cfg["run_id"],
                            scheduler=(meta["scheduler_name"], meta["scheduler_settings"]))
    values = dict(data["state"])
    for name in ("raw_ids", "answer_ids", "pins_applied", "pins_skipped", "blanks_unfilled"):
        values[name] = tuple(values.get(name, ()))
    state = CanvasState(**values)
    config = RunConfig(prompt=cfg["prompt"], knobs=knobs, model_source=cfg["model_source"], quant=cfg["quant"],
                       device=cfg["device"], dtype=cfg["dtype"], context=cfg["context"], run_id=cfg["run_id"],
                       image=cfg["image"], advanced=cfg.get("advanced"), constraint=cfg.get("constraint"))
    return state, trace, config, recorder.snapshot()
