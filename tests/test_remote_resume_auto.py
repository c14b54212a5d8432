"""A remote Advanced run resumes with start_step on auto exactly as a local one does."""

from __future__ import annotations

import numpy as np
import torch
from executor import call
from remote_server import served

from diffusiongemma import NODE_CLASS_MAPPINGS
from diffusiongemma.dgemma.inputs.knobs import Knobs
from diffusiongemma.remote.connect import connect

Advanced = NODE_CLASS_MAPPINGS["DGemmaSamplerAdvanced"]
BASE = dict(Knobs().asdict(), seed=6, gen_length=64, confidence=0.0, num_inference_steps=12,
            scheduler="entropy_bound", pins="", start_step=-1)


def two_windows(model):
    first, _ = call(Advanced, model=model, prompt="What is 3+4?", end_step=5, **BASE)
    second, _ = call(Advanced, model=model, prompt="What is 3+4?", canvas_state=first[1], end_step=1024, **BASE)
    return first, second


def test_resuming_on_auto_continues_where_the_remote_run_paused(demo_model):
    with served() as (url, _):
        far = two_windows(connect(url))
    near = two_windows(demo_model)
    for local, remote in zip(near, far):
        assert local[0] == remote[0] and local[1] == remote[1] and local[5] == remote[5]
        assert np.array_equal(local[2].ids, remote[2].ids) and torch.equal(local[4], remote[4])
    assert far[0][1].paused and far[1][5].advanced["start_step"] == 5
