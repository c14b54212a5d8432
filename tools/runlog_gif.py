"""Turn a `dg-runlog/1` run log into an animation of its frames, without ComfyUI or a model.

    python tools/runlog_gif.py run.jsonl out.png|out.webp|out.gif [--fps 8]

The log is replayed into the trace it records and painted by the pack's frame renderer. An APNG
(.png) or a lossless WebP (.webp) holds the run's `images` pixel for pixel (a step that repeats the
one before is shown for both steps' time); a GIF holds 256 colours, so its frames are close, not
identical.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from headless import load_pack  # noqa: E402

load_pack()
from diffusiongemma.dgemma.readouts.images import Asked, render_frames  # noqa: E402
from diffusiongemma.dgemma.readouts.runlog import read_log, replay  # noqa: E402

FORMATS = {".png": ("PNG", {}), ".webp": ("WEBP", {"lossless": True}), ".gif": ("GIF", {})}


def write_gif(frames, out: Path, fps: float) -> None:
    """Write the frames as an animation in the format the suffix names (.png, .webp lossless, .gif)."""
    from PIL import Image

    fmt, options = FORMATS.get(out.suffix.lower(), FORMATS[".gif"])
    pictures = [Image.fromarray(f) for f in frames]
    step_ms = max(20, round(1000 / fps))
    durations = [step_ms] * (len(pictures) - 1) + [max(step_ms, 2000)]  # rest on the answer
    pictures[0].save(out, fmt, save_all=True, append_images=pictures[1:], duration=durations, loop=0, **options)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Render a dg-runlog/1 run log as an animation.")
    parser.add_argument("log", type=Path, help="the run log (.jsonl) written by DGemmaRunLogWriter")
    parser.add_argument("out", type=Path, help="the file to write: .png (APNG) or .webp are lossless, "
                        ".gif has 256 colours")
    parser.add_argument("--fps", type=float, default=8.0, help="frames per second (default 8)")
    args = parser.parse_args(argv)
    if not 0 < args.fps <= 50:
        parser.error(f"--fps must be above 0 and at most 50, got {args.fps}")
    try:
        header, steps = read_log(args.log)
        trace = replay(header, steps)
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"runlog_gif: {args.log}: {e}", file=sys.stderr)
        return 2
    asked = Asked.of(header.get("prompt", ""), header.get("image"))
    write_gif(render_frames(trace, trace.token_strings, asked=asked), args.out, args.fps)
    print(f"wrote {args.out} ({len(trace)} frames)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
