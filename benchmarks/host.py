"""The engine's host work per step at the real canvas, the calls that would make a CUDA device wait, and
whether the fast path's tokens are the eager path's. CPU only, float32, one torch thread.

    python benchmarks/host.py            # about two minutes on two cores (real-vocabulary steps take seconds)

The run measured is the Sampler node's whole run (benchmarks/samplerwork.py: live events, progress text,
frames made) with every step run (confidence 0), after a warm-up run, timed in this thread's CPU seconds.

What counts as host work: what the calling thread does for a step besides the model's forward and the
device's kernels. On a GPU the kernels run on the device while the host goes on; on the CPU they run on the
host thread, and at the real vocabulary they take seconds a step, so host work is not found by subtracting
them (a 0.5 ms budget inside 4 s of kernels is below the noise). It is measured in two parts, each timed
directly:
- the host-only code on the steps of a run on the tiny model with the real vocabulary (canvas 256, vocabulary
  262,144): reading the step's copy on the host, the recorder, the frame callback (step event, progress text
  and bar) and the step's share of the frame texts the node makes after the run. It is timed where the
  stand-in run below reads the real run's steps in its place (real ids, real texts), since inside the real
  run this CPU's vocabulary-wide kernels (hundreds of MB a step) evict the host's caches between steps, which
  a GPU's kernels do not; that in-run figure is printed too. The events' JSON encoding is shown apart:
  ComfyUI's server does it on its own thread.
- the code that launches the device work (the scheduler's step, the stop, pins, constraint, the packing and
  the copy: Python and each torch call's dispatch) and the block loop's own Python, in the same run with
  a stand-in forward that returns logits of the real canvas one token wide: the same calls, each with the
  smallest kernel this CPU can run (at 4 tokens wide the softmaxes and the noise draw alone cost 80 µs a step
  of arithmetic that a GPU does on the device; one wide, about 30 µs). Of five such runs the one with the least
  block-loop time is kept (the others were disturbed).
The forward (the decoder's, and the encoder's at a block's end) is timed by wrappers and left out; the run's
start (checks, prefill) and readout happen once per run and are left out too. Device work per step is the
time inside the torch calls outside the forward at the real vocabulary (this CPU's kernels).

Waits: the calls of the block loop (forward included, the run's start and readout not) that would make a CUDA
device wait, counted by a TorchFunctionMode (testing/waits.py) in the real-vocabulary run.

fast_path_identical is 1 when the fast path's tokens and trace equal the eager path's (DGEMMA_FAST=0: diffusers'
own scheduler step) for the same seeds on the tiny checkpoint and on the small real-geometry slice. On the CPU
the fast path is the fused entropy-bound step; the CUDA graph of the decoder is compared by benchmarks/gpu.py.

Last line: host_ms_per_step= device_waits_per_step= fast_path_identical=
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from samplerwork import Events, sampler_call  # noqa: E402

from diffusiongemma.dgemma import Knobs, generate, load_model  # noqa: E402
from diffusiongemma.dgemma.denoising import loop, run, stepcopy  # noqa: E402
from diffusiongemma.dgemma.readouts import trace  # noqa: E402
from diffusiongemma.dgemma.steps import fastpath  # noqa: E402
from diffusiongemma.nodes import sampler  # noqa: E402
from diffusiongemma.testing import realslice  # noqa: E402
from diffusiongemma.testing.tiny import build_checkpoint  # noqa: E402
from diffusiongemma.testing.waits import DeviceCalls  # noqa: E402

PROMPT = "Why is the sky blue?"
STEPS = 8
STANDIN_WIDTH = 1  # tokens per position of the stand-in forward's logits: the smallest kernels
STANDIN_RUNS = 5
TRACE = ("ids", "committed_bits", "stop_bits", "entropy", "blocks", "steps")


class Clocks:
    """Wrappers that add each call's thread CPU seconds to a named clock (and set the wait counter's phase)."""

    def __init__(self, calls: DeviceCalls | None = None):
        self.calls, self.seconds, self.undo = calls, {}, []

    def wrap(self, owner, name: str, clock: str, phase: str | None = None) -> None:
        inner, calls, seconds = getattr(owner, name), self.calls, self.seconds

        def wrapped(*args, **kwargs):
            before = calls.phase if calls is not None else None
            if calls is not None and phase is not None:
                calls.phase = phase
            start = time.thread_time()
            try:
                return inner(*args, **kwargs)
            finally:
                seconds[clock] = seconds.get(clock, 0.0) + time.thread_time() - start
                if calls is not None:
                    calls.phase = before

        setattr(owner, name, wrapped)
        self.undo.append(lambda: setattr(owner, name, inner))

    def __getitem__(self, clock: str) -> float:
        return self.seconds.get(clock, 0.0)

    def restore(self) -> None:
        for undo in reversed(self.undo):
            undo()


def timed_run(dm, calls: DeviceCalls | None) -> tuple[Clocks, Events, int]:
    """One measured Sampler run after a warm-up: its clocks, events and steps."""
    with Events():  # warm-up: the fused step's one check of the draw, the model's string tables for the events
        sampler_call(dm, [PROMPT], [3], STEPS, dm.canvas_length)
    clocks = Clocks(calls)
    for owner, name, clock, phase in (
            (run, "drive", "loop", "loop"), (run, "_launch", "once", "once"), (run, "_result", "once", "once"),
            (loop.BlockDecoder, "logits", "forward", "forward"), (loop, "encode_ids", "forward", "forward"),
            (loop.Lane, "advance", "advance", None), (trace.Recorder, "add_host", "record", None),
            (stepcopy, "_read", "record", None), (sampler.LiveRun, "frame", "frame", None),
            (Events, "__call__", "json", None), (sampler, "frame_texts", "texts", None)):
        clocks.wrap(owner, name, clock, phase)
    try:
        with Events() as events:
            if calls is None:
                out = sampler_call(dm, [PROMPT], [3], STEPS, dm.canvas_length)
            else:
                with calls:
                    out = sampler_call(dm, [PROMPT], [3], STEPS, dm.canvas_length)
    finally:
        clocks.restore()
    return clocks, events, len(out[2][0])


class Replay:
    """Keeps the host steps a run reads, and hands them back in order to a later run (each read still done)."""

    def __init__(self):
        self.steps, self.replaying, self.read = [], False, stepcopy._read

    def __call__(self, *args):
        step = self.read(*args)
        if not self.replaying:
            self.steps.append(step)
            return step
        return self.steps[self.at % len(self.steps)]

    def __enter__(self):
        self.at = 0
        stepcopy._read = self
        return self

    def __exit__(self, *exc):
        stepcopy._read = self.read


def standin_run(dm, replay: Replay) -> tuple[Clocks, int]:
    """The run with a forward that returns fixed logits 1 wide (what launching the step's device work costs),
    its host code fed the real-vocabulary run's steps (what the host code costs with its caches its own)."""
    logits = torch.randn(1, dm.canvas_length, STANDIN_WIDTH, generator=torch.Generator().manual_seed(0))
    real, advance = loop.BlockDecoder.logits, loop.Lane.advance
    loop.BlockDecoder.logits = lambda self, canvas, self_cond: logits

    def counted(lane, *args, **kwargs):
        try:
            return advance(lane, *args, **kwargs)
        finally:
            replay.at += 1

    loop.Lane.advance = counted
    replay.replaying = True
    try:
        with replay:
            clocks, _, steps = timed_run(dm, None)
    finally:
        loop.BlockDecoder.logits, loop.Lane.advance = real, advance
    return clocks, steps


def host_line(real_dm) -> tuple[float, float, str]:
    """(host ms per step, waits per step, the lines that explain them)."""
    calls = DeviceCalls(timed=True)
    with Replay() as replay:
        real, events, steps = timed_run(real_dm, calls)
    in_run = (real["record"] + real["frame"] - real["json"] + real["texts"]) / steps
    # the least disturbed of a few stand-in runs: each is 8 steps of a millisecond, this machine's noise is more
    standin, s_steps = min((standin_run(real_dm, replay) for _ in range(STANDIN_RUNS)), key=lambda r: r[0]["loop"])
    host_only = (standin["record"] + standin["frame"] - standin["json"] + standin["texts"]) / s_steps
    launch = (standin["advance"] - standin["record"] - standin["frame"]) / s_steps
    glue = (standin["loop"] - standin["advance"] - standin["forward"] - standin["once"]) / s_steps
    waits = calls.waits["loop"] + calls.waits["forward"]
    ms = lambda seconds: f"{1e3 * seconds:.3f} ms"
    lines = [
        f"real vocabulary ({real_dm.vocab_size:,}), canvas {real_dm.canvas_length}, {steps} steps: forward "
        f"{ms(real['forward'] / steps)}/step (left out); device work {ms(calls.seconds['loop'] / steps)}/step on "
        f"this CPU (kernels of {calls.calls['loop'] / steps:.0f} torch calls/step outside the forward)",
        f"host-only code {ms(host_only)}/step on the real run's steps: copy read + recorder "
        f"{ms(standin['record'] / s_steps)}, frame callback {ms((standin['frame'] - standin['json']) / s_steps)}, "
        f"frame texts {ms(standin['texts'] / s_steps)}; inside the real-vocabulary run {ms(in_run)}/step (this "
        f"CPU's vocabulary-wide kernels evict the host's caches between steps; a GPU's do not)",
        f"launching the step (stand-in forward, logits {STANDIN_WIDTH} wide) {ms(launch)}/step; block loop "
        f"{ms(glue)}/step",
        f"events {events.count} of {events.bytes / max(events.count, 1):.0f} B, JSON-encoded in "
        f"{ms(real['json'] / steps)}/step (ComfyUI's server thread: not counted)",
        f"waits in the block loop: {dict(calls.names['loop'])}, in the forward: {dict(calls.names['forward'])}; "
        f"the run's start and readout: {dict(calls.names['once'])} (once per run, not counted)"]
    return 1e3 * (host_only + launch + glue), waits / steps, "\n".join(lines)


def same_run(dm, knobs: Knobs) -> bool:
    fast = generate(dm, PROMPT, knobs)
    with fastpath.eager():
        eager = generate(dm, PROMPT, knobs)
    return fast.state.raw_ids == eager.state.raw_ids and all(
        np.array_equal(getattr(fast.trace, k), getattr(eager.trace, k)) for k in TRACE)


def identical(tiny, slice_dm) -> bool:
    cases = [(tiny, Knobs(seed=4, num_inference_steps=12, gen_length=512)),
             (tiny, Knobs(seed=5, num_inference_steps=48, gen_length=256, confidence=0.5)),
             (slice_dm, Knobs(seed=6, num_inference_steps=4, gen_length=256))]
    results = [same_run(dm, knobs) for dm, knobs in cases]
    print(f"fast path = eager path (tokens and trace): {results} (tiny 2 blocks, tiny adaptive stop, slice)",
          flush=True)
    return all(results)


def main() -> None:
    torch.set_num_threads(1)  # the host thread alone: its CPU time is what is measured
    with tempfile.TemporaryDirectory() as tmp:
        real = load_model(str(build_checkpoint(Path(tmp) / "real-vocab", "real-vocab")))
        host_ms, waits, explained = host_line(real)
        print(explained, flush=True)
        del real
        tiny = load_model(str(build_checkpoint(Path(tmp) / "random", "random")))
        base = Path(os.environ.get("DGEMMA_TEST_CACHE", Path.home() / ".cache" / "dgemma-tests"))
        slice_dm = load_model(str(realslice.slice_dir(realslice.SMALL, base)), dtype="float32")
        same = identical(tiny, slice_dm)
    print(f"host_ms_per_step={host_ms:.3f} device_waits_per_step={waits:.2f} fast_path_identical={int(same)}")


if __name__ == "__main__":
    main()
