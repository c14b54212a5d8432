"""The pack's server against a local run of the same checkpoint, on loopback (the demo model).

remote_identical: share of runs (20 seeds) whose text, state, and every trace array equal the local
run's; frames_per_step: frames the client received / steps the trace holds; stream_overhead:
remote / local wall seconds per run, median of interleaved pairs (the server runs in its own
process on the same machine; wall time, since the work is in another process); cancel_ms: from
the cancel flag to the client's stop, worst of 5; concurrent_ok: 8 clients at once, all identical.

    python benchmarks/remote.py
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent / "tests"))
from headless import load_pack  # noqa: E402

load_pack()
from remote_server import served  # noqa: E402

from diffusiongemma.dgemma import Knobs, generate, load_model  # noqa: E402
from diffusiongemma.dgemma.demo import DEMO_DIR  # noqa: E402
from diffusiongemma.dgemma.errors import Cancelled  # noqa: E402
from diffusiongemma.remote.connect import connect  # noqa: E402

PROMPT = "What is 3+4?"
ARRAYS = ("ids", "committed_bits", "entropy", "stop_bits", "blocks", "steps", "times")


def identical(a, b) -> bool:
    return a.text == b.text and a.state == b.state and a.config == b.config and all(
        np.array_equal(getattr(a.trace, n), getattr(b.trace, n)) for n in ARRAYS)


def timed(run):
    start = time.perf_counter()
    out = run()
    return out, time.perf_counter() - start


def cancel_ms(model) -> float:
    flag, marks = threading.Event(), []

    def on_frame(_):
        if len(marks) == 0 and not flag.is_set():
            flag.set()
            marks.append(time.perf_counter())

    try:
        model.backend.run(model, PROMPT, Knobs(confidence=0.0, num_inference_steps=1000), on_frame=on_frame,
                          should_cancel=flag.is_set)
    except Cancelled:
        return (time.perf_counter() - marks[0]) * 1000
    raise RuntimeError("the run was not cancelled")


def concurrent(dm, model) -> int:
    seeds = range(100, 108)
    want = {s: generate(dm, PROMPT, Knobs(seed=s)) for s in seeds}
    got = {}
    threads = [threading.Thread(target=lambda s=s: got.__setitem__(s, model.backend.run(model, PROMPT, Knobs(seed=s))))
               for s in seeds]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    return int(len(got) == 8 and all(identical(want[s], got[s]) for s in seeds))


def main() -> None:
    dm = load_model(str(DEMO_DIR))
    with served() as (url, _):
        model = connect(url)
        same, frames, steps, ratios = 0, 0, 0, []
        for seed in range(20):
            knobs = Knobs(seed=seed, thinking=seed % 2 == 1)
            seen = []
            local, t_local = timed(lambda k=knobs: generate(dm, PROMPT, k))
            far, t_far = timed(lambda k=knobs, s=seen: model.backend.run(model, PROMPT, k, on_frame=s.append))
            same += identical(local, far)
            frames, steps = frames + len(seen), steps + len(far.trace)
            ratios.append(t_far / t_local)
            print(f"seed {seed}: identical={identical(local, far)} local {t_local:.2f} s remote {t_far:.2f} s",
                  file=sys.stderr, flush=True)
        cancels = [cancel_ms(model) for _ in range(5)]
        print(f"cancel ms {cancels}", file=sys.stderr, flush=True)
        ok = concurrent(dm, model)
    print(f"20 seeds, demo model, loopback; per-run wall local median "
          f"{statistics.median(r for r in ratios):.3f}x; cancel ms {[round(c, 1) for c in cancels]}")
    print(f"remote_identical={same / 20:.3f} frames_per_step={frames / steps:.3f} "
          f"stream_overhead={statistics.median(ratios):.3f} cancel_ms={max(cancels):.0f} concurrent_ok={ok}")


if __name__ == "__main__":
    main()
