"""Turn a `dg-runlog/1` run log into an animated GIF of its frames, without ComfyUI or a model.

    python tools/runlog_gif.py run.jsonl out.gif [--fps 8]

Each frame record is painted with the pack's frame renderer: from its per-position `tokens`
when the log has them (coloured by the `accepted` mask), else from `decoded_text`, which has no
per-position split and is painted in one colour.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = "dg-runlog/1"


def _images():
    """The pack's renderer, loaded only once there is a log to render (it imports torch)."""
    sys.path.insert(0, str(ROOT))
    from headless import load_pack

    load_pack()
    from diffusiongemma.dgemma import images

    return images


def read_log(path: Path) -> tuple[dict, list[dict]]:
    """The header and the frame records; rejects other schemas with the fix in the message."""
    header, frames = None, []
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n} is not JSON ({e.msg}); is this a run log (.jsonl)?") from None
            kind = record.get("record_type")
            if kind == "header":
                header = record
            elif kind == "frame":
                frames.append(record)
    if header is None or header.get("schema") != SCHEMA:
        got = None if header is None else header.get("schema")
        raise ValueError(f"{path} has no {SCHEMA} header (schema {got!r}); write it with DGemmaRunLogWriter")
    if not frames:
        raise ValueError(f"{path} has no frame records; the run logged no steps")
    return header, frames


def render_log(header: dict, frames: list[dict], images) -> np.ndarray:
    """(B, H, W, 3) uint8 frames of the log, the same layout as the sampler's `images`."""
    length = int(header.get("canvas_length") or len(frames[0].get("canvas_ids") or ()) or 1)
    blocks = np.array([int(f.get("block", 0)) for f in frames])
    per_block = np.bincount(blocks)
    canvases, states, caps = [], [], []
    has_mask = all(isinstance(f.get("tokens"), list) and isinstance(f.get("accepted"), list)
                   and len(f["tokens"]) == len(f["accepted"]) == len(frames[0]["tokens"]) for f in frames)
    accepted = np.array([f["accepted"] for f in frames], bool) if has_mask else None
    mask_states = images.position_states(accepted, blocks) if has_mask else None
    for i, f in enumerate(frames):
        if isinstance(f.get("tokens"), list):
            canvases.append([str(t) for t in f["tokens"]])
            states.append(mask_states[i] if has_mask else np.full(len(f["tokens"]), images.HELD, np.uint8))
        else:
            canvases.append([str(f.get("decoded_text", ""))])
            states.append(np.array([images.HELD], np.uint8))
        committed = f.get("committed_fraction")
        if committed is None and isinstance(f.get("accepted"), list) and f["accepted"]:
            committed = float(np.mean(f["accepted"]))
        caps.append(images.caption(int(blocks[i]), len(per_block), int(f.get("step", 0)),
                                   int(per_block[blocks[i]]), float(f.get("temperature", 0.0)),
                                   float(committed or 0.0)))
    return images.FrameRenderer(length).render(canvases, states, caps, legend=has_mask)


def write_gif(frames: np.ndarray, out: Path, fps: float) -> None:
    from PIL import Image

    pictures = [Image.fromarray(f) for f in frames]
    step_ms = max(20, round(1000 / fps))
    durations = [step_ms] * (len(pictures) - 1) + [max(step_ms, 2000)]  # rest on the answer
    pictures[0].save(out, "GIF", save_all=True, append_images=pictures[1:], duration=durations, loop=0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Render a dg-runlog/1 run log as an animated GIF.")
    parser.add_argument("log", type=Path, help="the run log (.jsonl) written by DGemmaRunLogWriter")
    parser.add_argument("out", type=Path, help="the GIF to write")
    parser.add_argument("--fps", type=float, default=8.0, help="frames per second (default 8)")
    args = parser.parse_args(argv)
    if not 0 < args.fps <= 50:
        parser.error(f"--fps must be above 0 and at most 50, got {args.fps}")
    try:
        header, frames = read_log(args.log)
    except (OSError, ValueError) as e:
        print(f"runlog_gif: {e}", file=sys.stderr)
        return 2
    write_gif(render_log(header, frames, _images()), args.out, args.fps)
    print(f"wrote {args.out} ({len(frames)} frames)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
