"""A small CPU model computes on one thread; the caller's thread count is restored after."""

from __future__ import annotations

import threading

import torch

from diffusiongemma.dgemma import Knobs, generate
from diffusiongemma.dgemma.denoising.threads import compute_threads


def test_small_model_runs_on_one_thread_and_restores(tiny_model):
    before = torch.get_num_threads()
    seen = []
    generate(tiny_model, "hi", Knobs(gen_length=8, num_inference_steps=2),
             on_frame=lambda f: seen.append(torch.get_num_threads()))
    assert seen and set(seen) == {1}
    assert torch.get_num_threads() == before


def test_overlapping_runs_restore_the_count_once_the_last_leaves(tiny_model):
    before = torch.get_num_threads()
    inside, go, counts = threading.Barrier(2), threading.Barrier(2), []

    def run():
        with compute_threads(tiny_model.model):
            inside.wait()
            counts.append(torch.get_num_threads())
            go.wait()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counts == [1, 1]
    assert torch.get_num_threads() == before


def test_a_model_on_the_meta_device_keeps_the_count():
    model = torch.nn.Linear(4, 4, device="meta")
    before = torch.get_num_threads()
    with compute_threads(model):
        assert torch.get_num_threads() == before
