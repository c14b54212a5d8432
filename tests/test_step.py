"""The step on its own: one wait for the device per step, its host copy exactly the recorder's old reading,
the fused step exactly diffusers', and a NaN in the logits refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import quantized

from diffusiongemma.dgemma import Knobs, generate
from diffusiongemma.dgemma.demo import DEMO_DIR
from diffusiongemma.dgemma.denoising import loop
from diffusiongemma.dgemma.denoising.stepcopy import StepCopy, pack
from diffusiongemma.dgemma.readouts.trace import Recorder
from diffusiongemma.dgemma.steps import fastpath
from diffusiongemma.testing.waits import MODES, DeviceCalls, mode_run, step_waits

TRACE = ("blocks", "steps", "ids", "committed_bits", "stop_bits", "pinned_bits", "constrained_bits", "entropy", "times")


def test_the_counter_counts_what_would_wait_and_not_what_stays_on_the_device():
    x = torch.arange(6.0)
    with DeviceCalls() as calls:
        x.sum().item()  # a read of a device value: the host waits
        y = (x * 2).softmax(-1)
        y.to(x.device)  # a move to the model's own device: no wait
    assert calls.waits["engine"] == 1 and calls.names["engine"] == {"item": 1}
    with DeviceCalls() as calls:
        bool(x.any()), x[x > 2], x.tolist(), x.to("cpu"), torch.nonzero(x)
    assert calls.waits["engine"] == 5


def phased(calls, monkeypatch, *targets):
    """Each (class, method, phase) counted under its phase while it runs."""
    for cls, name, phase in targets:
        def wrapped(self, *args, _inner=getattr(cls, name), _phase=phase, **kwargs):
            before, calls.phase = calls.phase, _phase
            try:
                return _inner(self, *args, **kwargs)
            finally:
                calls.phase = before
        monkeypatch.setattr(cls, name, wrapped)


def test_a_step_waits_once_and_its_forward_never(tiny_model, monkeypatch):
    knobs = Knobs(seed=1, num_inference_steps=6, gen_length=512, confidence=0.5)
    generate(tiny_model, "hello", knobs)  # the fused step's one check of torch's draw, once per process
    calls = DeviceCalls()
    calls.phase = "run"
    phased(calls, monkeypatch, (loop.Lane, "advance", "step"), (loop.BlockDecoder, "logits", "forward"))
    with calls:
        result = generate(tiny_model, "hello", knobs)
    assert len(result.trace) == 12 and result.state.blocks == 2
    assert calls.waits["forward"] == 0 and calls.names["step"] == {"copy_": len(result.trace)}


def test_a_batched_step_waits_once_for_all_its_lanes(tiny_model, monkeypatch):
    from diffusiongemma.dgemma.denoising.run import prepare, run_batch

    knobs = Knobs(seed=2, num_inference_steps=5, gen_length=512, confidence=0.5)
    requests = [prepare(tiny_model, prompt, knobs) for prompt in ("hello", "a longer prompt here", "hi")]
    run_batch(requests, max_batch=3)  # the batched experts' one probe of each layer, once per process
    calls, steps = DeviceCalls(), []
    calls.phase = "run"
    inner = loop._step

    def counted(working, *args):
        steps.append(len(working))
        before, calls.phase = calls.phase, "step"
        try:
            return inner(working, *args)
        finally:
            calls.phase = before

    monkeypatch.setattr(loop, "_step", counted)
    with calls:
        results = run_batch(requests, max_batch=3)
    assert max(steps) == 3 and sum(steps) == sum(len(r.trace) for r in results)
    assert calls.names["step"] == {"copy_": len(steps)}  # one copy per step of the batch, whatever its lanes


@pytest.mark.parametrize("extras", [False, True])
def test_the_host_copy_is_what_the_recorder_read_tensor_by_tensor(extras):
    L, gen = 40, torch.Generator().manual_seed(0)
    canvas = torch.randint(0, 262_144, (1, L), generator=gen)
    masks = [torch.rand(1, L, generator=gen) < 0.4 for _ in range(4)]
    entropy = torch.rand(1, L, generator=gen) * 12
    pinned, constrained = (masks[2], masks[3]) if extras else (None, None)
    old, new = Recorder(Knobs(), L), Recorder(Knobs(), L)
    old.add(0, 0, canvas, masks[0], masks[1], entropy, pinned, constrained)
    copy = StepCopy("cpu")
    for stopped in (torch.tensor(True), torch.tensor(False), None):
        host = copy.take_all([pack(canvas, masks[0], masks[1], entropy, pinned, constrained, stopped)])[0]
        assert host.stopped is (stopped is not None and bool(stopped))
        new.add_host(0, 0, host.ids, host.committed, host.stop, host.entropy, host.pinned, host.constrained)
    a, b = old.finish(), new.finish()
    for name in TRACE:
        x, y = getattr(a, name), getattr(b, name)
        assert (x is None) == (y is None) and (x is None or np.array_equal(x, y[:1])), name
    assert len(copy.buffers) == 2  # one host buffer per size (the stop flag is one byte more), reused


def test_the_fused_step_is_diffusers_step(tiny_model, demo_model):
    for dm, knobs in ((tiny_model, Knobs(seed=4, num_inference_steps=8, gen_length=512)),
                      (demo_model, Knobs(seed=5, gen_length=96))):
        fast = generate(dm, "What is 2+5?", knobs)
        with fastpath.eager():
            eager = generate(dm, "What is 2+5?", knobs)
        assert fast.state.raw_ids == eager.state.raw_ids
        for name in TRACE:
            x, y = getattr(fast.trace, name), getattr(eager.trace, name)
            assert (x is None and y is None) or np.array_equal(x, y), name


def test_logits_holding_nan_are_refused(tiny_model, monkeypatch):
    forward = loop.BlockDecoder.logits

    def broken(self, canvas, self_cond):
        logits = forward(self, canvas, self_cond).clone()
        logits[0, 3, 7] = float("nan")
        return logits

    monkeypatch.setattr(loop.BlockDecoder, "logits", broken)
    with pytest.raises(FloatingPointError, match="NaN or infinity"):
        generate(tiny_model, "hello", Knobs(seed=1, num_inference_steps=4, gen_length=256))


@pytest.mark.parametrize("mode", MODES)
def test_every_mode_waits_once_per_step(mode, demo_model):
    """Quantized weights, a capture, a constraint, a batch: each step's record reaches the host in one copy and
    nothing else waits (the constraint's choice runs on the host after that copy)."""
    run = mode_run(mode, demo_model, lambda: quantized(DEMO_DIR, "demo"))
    run()  # one-time probes (the fused step's check of torch's draw, the experts' probe)
    steps, most, names = step_waits(run)
    assert steps >= 6 and most == 1 and set(names) == {"copy_"}, (mode, names)
