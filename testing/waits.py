"""The calls of a run that would make the host wait for a CUDA device, counted on any device, and the time
spent inside torch calls (a TorchFunctionMode sees every torch call made from Python).

A call waits when the host needs its result: a tensor read as a Python value (`item`, `tolist`, `bool`,
`int`, `float`, `numpy`, `equal`), a copy to the host that blocks, an op whose output size depends on
the data (`nonzero`, boolean-mask indexing, `unique`...), or host data made into a device tensor
(`tensor`/`as_tensor` given the model's device: a copy from pageable memory waits for the stream). On the
CPU nothing waits, so every tensor counts as the device's except the engine's host buffers
(dgemma/denoising/stepcopy.py), where a step's one wait ends.
Waits inside torch (a kernel's own synchronisation) are not seen: only what Python asks for.
"""

from __future__ import annotations

import collections
import time

import torch
from torch.overrides import TorchFunctionMode

from ..dgemma.denoising.stepcopy import is_host

READS = {"item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__", "__array__", "equal",
         "allclose", "nonzero", "argwhere", "masked_select", "unique", "unique_consecutive", "bincount"}
INDEXING = {"__getitem__", "__setitem__", "index_put_", "index_put"}
UPLOADS = {"tensor", "as_tensor"}


def _device(t) -> bool:
    return isinstance(t, torch.Tensor) and not is_host(t)


def _bool_index(index) -> bool:
    parts = index if isinstance(index, (tuple, list)) else (index,)
    return any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts)


def _to_host(args, kwargs) -> bool:
    """Whether a `to(...)` moves a device tensor to the host, blocking. On the CPU a move to the model's device
    (a `torch.device`, as code that follows a tensor's device passes) is told from one meant for the host
    (the string "cpu")."""
    if kwargs.get("non_blocking") or (len(args) > 2 and isinstance(args[2], bool) and args[2]):
        return False
    on_cpu = args[0].device.type == "cpu"
    targets = [t for t in (kwargs.get("device"), *args[1:2]) if isinstance(t, (str, torch.device))]
    return any(isinstance(t, str) and t == "cpu" if on_cpu else torch.device(t).type == "cpu" for t in targets)


def waits(func, args, kwargs) -> bool:
    """Whether this torch call would make the host wait for the device."""
    name = getattr(func, "__name__", "")
    this = args[0] if args else None
    if name in UPLOADS:  # on the CPU a device given as a torch.device is the model's; the string "cpu" the host's
        device = kwargs.get("device")
        return device is not None and not (isinstance(device, str) and device == "cpu")
    if name == "copy_":
        return is_host(this) and _device(args[1]) and not (kwargs.get("non_blocking") or args[2:3] == (True,))
    if not _device(this):
        return False
    if name in READS or name == "cpu":
        return True
    if name == "to" and args:
        return _to_host(args, kwargs)
    if name in INDEXING:
        return len(args) > 1 and _bool_index(args[1])
    return False


class DeviceCalls(TorchFunctionMode):
    """Counts waits, calls and (`timed`) the seconds of this thread inside torch calls, per phase (`phase` names
    where the run is: a benchmark's wrappers set it). `names[phase]` counts which calls waited."""

    def __init__(self, timed: bool = False):
        super().__init__()
        self.timed, self.phase = timed, "engine"
        self.waits: collections.Counter = collections.Counter()
        self.calls: collections.Counter = collections.Counter()
        self.seconds: collections.Counter = collections.Counter()
        self.names: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if waits(func, args, kwargs):
            self.waits[self.phase] += 1
            self.names[self.phase][getattr(func, "__name__", str(func))] += 1
        self.calls[self.phase] += 1
        if not self.timed:
            return func(*args, **kwargs)
        start = time.thread_time()
        try:
            return func(*args, **kwargs)
        finally:
            self.seconds[self.phase] += time.thread_time() - start


def step_waits(run) -> tuple[int, int, collections.Counter]:
    """(steps, the most waits in one step, the calls that waited in steps) while `run()` runs; a step is one
    call of the loop's `_step` (every working lane's forward and scheduler step, and their copy to the host)."""
    from ..dgemma.denoising import loop

    calls, per_step = DeviceCalls(), []
    inner = loop._step

    def counted(*args):
        before = calls.waits["step"]
        calls.phase = "step"
        try:
            return inner(*args)
        finally:
            calls.phase = "engine"
            per_step.append(calls.waits["step"] - before)

    loop._step = counted
    try:
        with calls:
            run()
    finally:
        loop._step = inner
    return len(per_step), max(per_step, default=0), calls.names["step"]


MODES = ("bf16", "8bit", "4bit", "autoround", "gguf", "logprobs", "constraint", "logprobs, constrained",
         "batch of 8")


def mode_run(mode: str, demo, int4=None):
    """A run of the demo in one of MODES, every step run (confidence 0): what the wait counts are taken over.
    `int4()` gives the demo's AutoRound INT4 folder (tools/quantize_tiny.py)."""
    from pathlib import Path

    from ..dgemma import Constraint, Knobs, load_model
    from ..dgemma.demo import DEMO_DIR
    from ..dgemma.denoising.run import prepare, run, run_batch

    knobs = Knobs(seed=1, num_inference_steps=6, gen_length=64, confidence=0.0)
    gguf = Path(__file__).resolve().parents[1] / "tests/fixtures/gguf/demo-Q4_K_M.gguf"
    dm = {"8bit": lambda: load_model(str(DEMO_DIR), quant="8bit"),
          "4bit": lambda: load_model(str(DEMO_DIR), quant="4bit"),
          "gguf": lambda: load_model(str(gguf), quant="gguf"),
          "autoround": lambda: load_model(str(int4()), quant="autoround")}.get(mode, lambda: demo)()
    if mode == "batch of 8":
        requests = [prepare(dm, f"What is {i}+{i + 2}?", knobs) for i in range(8)]
        return lambda: run_batch(requests, max_batch=8)
    choice = Constraint("choice", "seven\nfour")
    options = {"logprobs": {"logprobs": 5}, "constraint": {"constraint": choice},
               "logprobs, constrained": {"logprobs": 5, "constraint": choice}}
    request = prepare(dm, "What is 3+4?", knobs, **options.get(mode, {}))
    return (lambda: _torch_kernels(run, request)) if mode == "gguf" else lambda: run(request)


def _torch_kernels(work, *args):
    """`work(*args)` with GGUF blocks made dense by torch's kernels, as on an accelerator (numba's kernels are
    the CPU's own path, and hand torch's tensors to numpy, which here would count as waits)."""
    from ..dgemma.loading import gguf_numba

    saved = dict(gguf_numba.KERNELS)
    gguf_numba.KERNELS.clear()
    try:
        return work(*args)
    finally:
        gguf_numba.KERNELS.update(saved)
