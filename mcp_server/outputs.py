"""A run's optional files: the dg-runlog/1 log and the GIF of its frames, written whole or not at all."""

from __future__ import annotations

import json
from pathlib import Path

from ..dgemma.inputs.tokens import frame_texts
from ..dgemma.readouts.images import Asked, render_frames
from ..dgemma.readouts.outfiles import save_new
from ..dgemma.readouts.runlog import records, write_jsonl

RUNLOG_PREFIX = "dgemma_run_log"
GIF_PREFIX = "dgemma_frames"
FRAME_MS = 125     # 8 frames per second
LAST_FRAME_MS = 2000  # rest on the answer


def runlog_rows(dm, result) -> list[dict]:
    return records(result.trace, result.config, result.state, frame_texts(result.trace, dm.token_strings))


def runlog_text(dm, result) -> str:
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in runlog_rows(dm, result))


def write_runlog(dm, result, output_dir: Path) -> Path:
    return write_jsonl(runlog_rows(dm, result), output_dir, RUNLOG_PREFIX)


def write_gif(dm, result, output_dir: Path) -> Path:
    from PIL import Image

    frames = render_frames(result.trace, dm.token_strings, asked=Asked.of(result.config.prompt, result.config.image))
    if not len(frames):
        raise ValueError("the run executed no steps, so there is no frame to put in a GIF")
    pictures = [Image.fromarray(f) for f in frames]
    durations = [FRAME_MS] * (len(pictures) - 1) + [LAST_FRAME_MS]

    def write(fh):
        pictures[0].save(fh, "GIF", save_all=True, append_images=pictures[1:], duration=durations, loop=0)

    return save_new(output_dir, GIF_PREFIX, ".gif", write)


def write_outputs(dm, result, folder: Path, runlog: bool, gif: bool) -> dict:
    """Paths of the files asked for (None for the others), in `folder` (checked by inputs.folder)."""
    return {"runlog": str(write_runlog(dm, result, folder)) if runlog else None,
            "gif": str(write_gif(dm, result, folder)) if gif else None}
