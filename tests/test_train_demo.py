"""The demo model's training script is deterministic given its seed, steps and threads."""

from __future__ import annotations

import hashlib
import subprocess
import sys

from conftest import REPO


def test_training_twice_gives_the_same_weights(tmp_path):
    digests = []
    for run in ("a", "b"):
        out = tmp_path / run
        done = subprocess.run([sys.executable, str(REPO / "tools" / "train_demo.py"), "--out", str(out),
                               "--steps", "6", "--batch", "8"], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        digests.append(hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest())
    assert digests[0] == digests[1]
