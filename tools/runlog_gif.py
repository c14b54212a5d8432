"""Turn a `dg-runlog/1` run log into an animated GIF of its frames, without ComfyUI or a model.

    python tools/runlog_gif.py run.jsonl out.gif [--fps 8]

The log is replayed into the trace it records and painted by the pack's frame renderer, so the
GIF's frames are pixel-identical to the run's `images`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from headless import load_pack  # noqa: E402

load_pack()
from diffusiongemma.dgemma.images import render_frames  # noqa: E402
from diffusiongemma.dgemma.runlog import read_log, replay  # noqa: E402


def write_gif(frames, out: Path, fps: float) -> None:
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
        trace = replay(*read_log(args.log))
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"runlog_gif: {args.log}: {e}", file=sys.stderr)
        return 2
    write_gif(render_frames(trace, trace.token_strings), args.out, args.fps)
    print(f"wrote {args.out} ({len(trace)} frames)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
