"""Run logs: `dg-runlog/1` JSON Lines (a header, one frame record per step, a final record).

Files are saved through `outfiles.save_new`: whole or not at all, numbered, inside the output folder.
"""

from __future__ import annotations

import json
import re
import uuid
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from .outfiles import save_new

SCHEMA = "dg-runlog/1"
_ROOT = Path(__file__).resolve().parents[1]


def pack_version() -> str:
    try:
        match = re.search(r'^version\s*=\s*"([^"]+)"', (_ROOT / "pyproject.toml").read_text(), re.M)
    except OSError:
        return "unknown"
    return match.group(1) if match else "unknown"


def records(trace, config, state, frames_text) -> list[dict]:
    if len(frames_text) != len(trace):
        raise ValueError(f"frames has {len(frames_text)} entries but canvas_trace has {len(trace)} steps; "
                         "wire frames and canvas_trace from the same sampler node")
    k = config.knobs
    header = {
        "record_type": "header", "schema": SCHEMA, "pack_version": pack_version(), "run_id": uuid.uuid4().hex,
        "timestamp_utc": datetime.now(timezone.utc).isoformat(), "prompt": config.prompt,
        "model_source": config.model_source, "seed": k.seed,
        "num_inference_steps_requested": k.num_inference_steps,
        "num_inference_steps_effective": [int((trace.blocks == b).sum()) for b in range(trace.num_blocks)],
        "gen_length": k.gen_length, "t_min": k.t_min, "t_max": k.t_max, "entropy_bound": k.entropy_bound,
        "confidence": k.confidence, "thinking": k.thinking, "scheduler_name": trace.scheduler_name,
        "scheduler_config": trace.scheduler_config, "quant": config.quant, "device": config.device,
        "dtype": config.dtype, "canvas_length": trace.canvas_length,
        "injection_present": config.context is not None, "injected_cache_provenance": config.context,
    }
    out = [header]
    for frame, text in zip(trace.frames(), frames_text):
        ent = frame.entropy.astype(np.float32)
        out.append({
            "record_type": "frame", "block": frame.block, "step": frame.step, "t": frame.t,
            "temperature": frame.temperature, "committed_fraction": frame.committed_fraction,
            "entropy_summary": {"mean": float(ent.mean()), "min": float(ent.min()), "max": float(ent.max())},
            "decoded_text": text, "canvas_ids": frame.ids.tolist(), "accepted": frame.accepted.astype(int).tolist(),
        })
    out.append({"record_type": "final", "raw_ids": list(state.raw_ids), "steps_used": state.steps_used,
                "text": state.text, "converged": state.converged, "committed_fraction": state.committed_fraction,
                "turn_closed": state.turn_closed, "answer_tokens": state.answer_tokens, "thought": state.thought,
                "stray_thought_delimiter": state.stray_thought_delimiter,
                "finished_honestly": state.finished_honestly})
    return out


def write_jsonl(rows: list[dict], output_dir: Path, prefix: str) -> Path:
    """Write `rows` to <output>/<prefix>_<counter>.jsonl with the next free counter."""
    def write(fh):
        for row in rows:
            fh.write((json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8"))

    return save_new(output_dir, prefix, ".jsonl", write)
