"""Run logs: `dg-runlog/1` JSON Lines (a header, one frame record per step, a final record).

Files are saved through `outfiles.save_new`: whole or not at all, numbered, inside the output
folder. A log carries what replaying its frames needs (per-position token text, the committed
mask, what the adaptive stop committed), so `replay` rebuilds a trace that paints identically.
A reading or knob the run's engine did not send or honour (readings.py) is null, and the header's
`readings` says why; local runs have no `readings` key and every value.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from ..errors import InputError, require_type
from ..inputs.knobs import KNOBS, Knobs
from ..payloads import CanvasState, RunConfig
from ..readings import Readings, knob_not_sent, known
from .outfiles import save_new
from .trace import CanvasTrace

SCHEMA = "dg-runlog/1"
_ROOT = Path(__file__).resolve().parents[2]


def pack_version() -> str:
    try:
        match = re.search(r'^version\s*=\s*"([^"]+)"', (_ROOT / "pyproject.toml").read_text(), re.M)
    except OSError:
        return "unknown"
    return match.group(1) if match else "unknown"


def check_one_run(trace, config, state, frames_text) -> None:
    """Refuse a trace, config, state and frames that do not come from the same run."""
    require_type("canvas_trace", trace, CanvasTrace, "the trace of a run")
    require_type("run_config", config, RunConfig, "the config of a run")
    require_type("canvas_state", state, CanvasState, "the readout of a run")
    if not all(isinstance(t, str) for t in frames_text):
        raise InputError("frames", "frames must be the list of texts of a run's steps")
    ids = {"canvas_trace": trace.run_id, "run_config": config.run_id, "canvas_state": state.run_id}
    if len(set(ids.values())) != 1:
        raise InputError("run_config", f"the trace, config and state come from different runs (run ids {ids}); "
                                       "give all of them from one run")
    if len(frames_text) != len(trace):
        raise InputError("frames", f"frames has {len(frames_text)} entries but the trace has {len(trace)} steps; "
                                   "give the frames of the same run")


def _frame_record(frame, text: str, token_strings, knob_set: int, trace) -> dict:
    ent = frame.entropy.astype(np.float32)
    pinned = {} if frame.pinned is None else {"pinned": np.flatnonzero(frame.pinned).tolist()}
    if frame.constrained is not None:  # positions a constraint changed, only in constrained runs
        pinned["constrained"] = np.flatnonzero(frame.constrained).tolist()
    is_ = lambda name, value: known(trace, name, value)  # noqa: E731 - null when the engine did not send it
    # "accepted" is dg-runlog/1's name for the committed mask: the format keeps it, so old logs still read
    return {**pinned, "knob_set": knob_set,
        "record_type": "frame", "block": frame.block, "step": is_("steps", frame.step), "t": is_("t", frame.t),
        "temperature": is_("T", frame.temperature), "committed_fraction": is_("committed", frame.committed_fraction),
        "entropy_summary": is_("entropy", {"mean": float(ent.mean()), "min": float(ent.min()),
                                           "max": float(ent.max())}),
        "decoded_text": text, "canvas_ids": is_("ids", frame.ids.tolist()),
        "accepted": is_("committed", frame.committed.astype(int).tolist()),
        "stop_committed": is_("stop", np.flatnonzero(frame.stop).tolist()),
        "tokens": [token_strings[i] for i in frame.ids.tolist()],
    }


def records(trace, config, state, frames_text) -> list[dict]:
    check_one_run(trace, config, state, frames_text)
    k = config.knobs
    knob = lambda name: None if knob_not_sent(config, name) else getattr(k, name)  # noqa: E731 - not the run's
    header = {
        "record_type": "header", "schema": SCHEMA, "pack_version": pack_version(), "run_id": trace.run_id,
        "timestamp_utc": datetime.now(timezone.utc).isoformat(), "prompt": config.prompt,
        "model_source": config.model_source, "model_defaults": config.model_defaults, "seed": knob("seed"),
        "num_inference_steps_requested": knob("num_inference_steps"),
        "num_inference_steps_effective": known(trace, "steps", trace.steps_per_block),
        "gen_length": knob("gen_length"), "t_min": knob("t_min"), "t_max": knob("t_max"),
        "entropy_bound": knob("entropy_bound"), "confidence": knob("confidence"), "thinking": knob("thinking"),
        "scheduler_name": trace.scheduler_name,
        "scheduler_config": trace.scheduler_config, "quant": config.quant, "device": config.device,
        "dtype": config.dtype, "canvas_length": _canvas_length(trace),
        "injection_present": config.context is not None, "injected_cache_provenance": config.context,
        "image_present": config.image is not None, "image": config.image,
        "constraint": config.constraint,  # kind, text, sha256; None when unconstrained
        "block_stopped_early": known(trace, "stopped_early", list(trace.block_stopped_early)),
        "knob_sets": list(trace.knob_sets),  # the knobs in force; each frame names its set
        "advanced": config.advanced,
        **({"adapters": [dict(a) for a in config.adapters]} if config.adapters else {}),  # LoRAs: name, strength
    }
    if trace.readings is not None:  # a remote engine's: what it did not send, the knobs it fixed, its numbers
        header["readings"] = trace.readings.asdict()
    out = [header]
    sets = trace.knob_index.tolist() if trace.knob_index is not None else [0] * len(trace)
    out += [_frame_record(f, text, trace.token_strings, k, trace)
            for f, text, k in zip(trace.frames(), frames_text, sets)]
    if config.decision is not None:
        _add_decision(out, config.decision)
    out.append({"record_type": "final", "raw_ids": known(state, "ids", list(state.raw_ids)),
                "steps_used": state.steps_used,
                "text": state.text, "converged": state.converged, "committed_fraction": state.committed_fraction,
                "turn_closed": state.turn_closed, "answer_tokens": state.answer_tokens,
                "tokens_per_forward": state.tokens_per_forward, "thought": state.thought,
                "stray_thought_delimiter": state.stray_thought_delimiter,
                "finished_honestly": state.finished_honestly, "paused": state.paused,
                "pins_applied": list(state.pins_applied), "pins_skipped": list(state.pins_skipped),
                "blanks_unfilled": list(state.blanks_unfilled), "warnings": list(state.warnings),
                "constraint": state.constraint})
    return out


def _canvas_length(trace):
    """The canvas size: a text-only engine's frames are word pieces, so only its own report counts."""
    if trace.readings is None:
        return trace.canvas_length
    return known(trace, "canvas_length", trace.readings.reported.get("canvas_length"))


def _add_decision(rows: list[dict], decision: dict) -> None:
    """A decision's reading: in the header, and per frame the options' probabilities before that step."""
    rows[0]["decision"] = {k: v for k, v in decision.items() if k != "trace"}
    for row, probabilities in zip(rows[1:], decision.get("trace") or ()):
        row["option_probabilities"] = dict(zip(decision["options"], probabilities))


def write_jsonl(rows: list[dict], output_dir: Path, prefix: str) -> Path:
    """Write `rows` to <output>/<prefix>_<counter>.jsonl with the next free counter."""
    def write(fh):
        for row in rows:
            fh.write((json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8"))

    return save_new(output_dir, prefix, ".jsonl", write)


def read_log(path: Path) -> tuple[dict, list[dict]]:
    """The header and the frame records of a run log; other schemas are refused with the fix."""
    header, frames = None, []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n} is not JSON ({e.msg}); is this a run log (.jsonl)?") from None
            kind = record.get("record_type") if isinstance(record, dict) else None
            if kind == "header":
                header = record
            elif kind == "frame":
                frames.append(record)
    if header is None or header.get("schema") != SCHEMA:
        got = None if header is None else header.get("schema")
        raise ValueError(f"{path} has no {SCHEMA} header (schema {got!r}); write it with the run log writer")
    if not frames or not all(isinstance(f.get("tokens"), list) for f in frames):
        raise ValueError(f"{path} has no frame records with per-position tokens; it logged no steps, or was "
                         "written by an older version of the pack")
    return header, frames


def replay(header: dict, frames: list[dict]) -> CanvasTrace:
    """The trace a run log records, enough to paint its frames exactly as the run did."""
    readings = Readings.of(header.get("readings"))
    if readings is not None:  # a remote engine's log: word pieces for ids, nulls for what it did not send
        frames = _filled(frames)
    L = int(header["canvas_length"]) if readings is None else len(frames[0]["tokens"])  # word pieces shown
    strings: dict[int, str] = {}
    for f in frames:
        strings.update(zip(f["canvas_ids"], f["tokens"]))
    stop, pinned, changed = (np.zeros((len(frames), L), bool) for _ in range(3))
    for row, pin, change, f in zip(stop, pinned, changed, frames):
        row[f.get("stop_committed", [])] = True
        pin[f.get("pinned", [])] = True
        change[f.get("constrained", [])] = True
    values = {**header, "num_inference_steps": header["num_inference_steps_requested"]}
    knobs = Knobs(**{name: values[name] for name in KNOBS if values[name] is not None})
    column = lambda key, dtype: np.array([f[key] for f in frames], dtype)
    return CanvasTrace(
        knobs=knobs, canvas_length=L, blocks=column("block", np.int16), steps=column("step", np.int16),
        ids=column("canvas_ids", np.int32), committed_bits=np.packbits(column("accepted", bool), axis=1),
        entropy=np.zeros((len(frames), L), np.float16), scheduler_name=header.get("scheduler_name", ""),
        context=header.get("injected_cache_provenance"),
        block_stopped_early=tuple(header.get("block_stopped_early") or ()),
        stop_bits=np.packbits(stop, axis=1), run_id=header.get("run_id", ""), token_strings=strings,
        pinned_bits=np.packbits(pinned, axis=1) if any("pinned" in f for f in frames) else None,
        times=np.array([(f["t"], f["temperature"]) for f in frames], np.float32),
        scheduler_settings=header.get("scheduler_config"),
        constrained_bits=np.packbits(changed, axis=1) if header.get("constraint") else None, readings=readings,
        adapters=_adapters(header))


def _adapters(header: dict) -> tuple:
    """(name, strength) of each LoRA the header names: a replayed trace names them as the run's did."""
    return tuple((a["name"], a["strength"]) for a in header.get("adapters") or ())


def _filled(frames: list[dict]) -> list[dict]:
    """A text-only engine's frames with ids numbered by word piece, and nulls as what the trace stores
    for an unknown (no committed mask, NaN t and T, step numbers in order)."""
    ids: dict[str, int] = {}
    out, step, block = [], 0, None
    for f in frames:
        step = 0 if f["block"] != block else step + 1
        block = f["block"]
        tokens = f["tokens"]
        pieces = [ids.setdefault(t, len(ids)) for t in tokens]
        nan = float("nan")
        out.append({**f, "canvas_ids": f["canvas_ids"] if f.get("canvas_ids") is not None else pieces,
                    "accepted": f["accepted"] if f.get("accepted") is not None else [0] * len(tokens),
                    "stop_committed": f.get("stop_committed") or [],
                    "step": f["step"] if f.get("step") is not None else step,
                    "t": nan if f.get("t") is None else f["t"],
                    "temperature": nan if f.get("temperature") is None else f["temperature"]})
    return out
