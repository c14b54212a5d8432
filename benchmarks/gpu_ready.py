"""Is the engine right by construction for a GPU inside ComfyUI? Checked on the CPU, where every reading is true.

- patcher_size_ratio: what ComfyUI is told a loaded model holds (the ModelPatcher's size: its storages, each once)
  over its unique stored bytes as the checkpoint's headers give them (the device plan's resident bytes: tied
  and shared tensors once, quantized experts at their packed size), for bf16, 8bit and 4bit; the worst.
  At the real geometry: measured on the real-width slice (two text layers and one vision layer at their
  real sizes, the real vocabulary; 4.6 GB, built once and cached outside the repository), each part
  extrapolated to the real layer counts as benchmarks/fit.py does. `--small` takes the small twin (narrower
  widths: every tensor, tie and quantized module of the real model) instead.
- waits_per_step_max: the most host waits in one step (testing/waits.py: every read of a device value, every
  blocking copy, every upload of host data) over bf16, 8bit, 4bit, AutoRound, GGUF, logprobs, a constraint,
  both, and a batch of 8 on the demo.
- batch_size_invariant: 16 requests in batches of 1, 3, 8 and 16 give the same tokens and readings.
- plan_vs_measured_step: the plan's working memory of a step (deviceplan.STEP_TENSORS) over the measured
  peak of the step's own tensors plus the self-conditioning it keeps (testing/tensorpeak.py), at the real
  vocabulary (262,144) on a 256-token canvas; the worst of float32 and bfloat16 weights.
- device_named_ok: with a host that names cuda:1, every plan (whole, split) says cuda:1, and every free-memory
  reading and freeing of room is asked of cuda:1.

    python benchmarks/gpu_ready.py [--small]

Last line: patcher_size_ratio waits_per_step_max batch_size_invariant plan_vs_measured_step device_named_ok.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
# this folder's gguf.py would stand for the gguf package
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
from headless import load_pack  # noqa: E402

load_pack()
from conftest import cache_base, checkpoint, quantized  # noqa: E402
from transformers import AutoConfig  # noqa: E402

from diffusiongemma.dgemma import Knobs, load_model  # noqa: E402
from diffusiongemma.dgemma.demo import DEMO_DIR  # noqa: E402
from diffusiongemma.dgemma.denoising import loop  # noqa: E402
from diffusiongemma.dgemma.denoising.run import prepare, run, run_batch  # noqa: E402
from diffusiongemma.dgemma.loading import deviceplan, load, machine  # noqa: E402
from diffusiongemma.testing import realscale, realslice  # noqa: E402
from diffusiongemma.testing.batchcheck import differences, entropy_exact  # noqa: E402
from diffusiongemma.testing.tensorpeak import TensorPeak  # noqa: E402
from diffusiongemma.testing.waits import MODES, mode_run, step_waits  # noqa: E402

GIB = 1 << 30
PROMPTS = ["What is 3+4?", "What is 1+1?", "What is 2+5?", "Say hi.", "What is 6+2?", "Name a colour.",
           "What is 4+4?", "What is 0+9?"]


TEXT_LAYER = re.compile(r"(?:language_model|decoder)\.layers\.\d+\.")
VISION_LAYER = re.compile(r"vision_tower\.encoder\.layers\.\d+\.")


def part(name: str) -> str:
    return "text" if TEXT_LAYER.search(name) else "vision" if VISION_LAYER.search(name) else "rest"


def held_parts(model) -> dict[str, int]:
    """What ComfyUI is told (machine.held_bytes: each storage once), split into text layers, vision layers and
    the rest by the first name that holds each storage."""
    out, seen = dict.fromkeys(("text", "vision", "rest"), 0), set()
    for name, t in (*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)):
        key = (t.device, t.untyped_storage().data_ptr())
        if not t.is_meta and key not in seen:
            seen.add(key)
            out[part(name)] += t.untyped_storage().nbytes()
    assert sum(out.values()) == machine.held_bytes(model)
    return out


def stored_parts(folder: Path, quant: str) -> dict[str, int]:
    """The device plan's resident bytes, split as held_parts: the headers' tensors (tied copies once), the
    quantized experts at their packed size."""
    from diffusiongemma.dgemma.loading import preflight, quant_at_load

    out = dict.fromkeys(("text", "vision", "rest"), 0)
    for header in preflight.read_headers(folder).values():
        for name, info in header.items():
            if name != "__metadata__":
                out[part(name)] += info["data_offsets"][1] - info["data_offsets"][0]
    if quant != "none":  # every tensor a mode quantizes is in a text layer
        shape = quant_at_load.geometry(AutoConfig.from_pretrained(folder))
        out["text"] += shape.packed_bytes(quant) - 2 * sum(shape.quantized)
    return out


def at_real(parts: dict[str, int], text_layers: int, vision_layers: int) -> int:
    """Bytes at the real geometry, extrapolated from the slice's layers as benchmarks/fit.py does."""
    return (parts["rest"] + parts["text"] * realscale.REAL_LAYERS // text_layers
            + parts["vision"] * realscale.REAL_VISION["num_hidden_layers"] // vision_layers)


def patcher_size_ratio(small: bool) -> float:
    folder = realslice.slice_dir(realslice.SMALL if small else realslice.REAL, cache_base())
    config = AutoConfig.from_pretrained(folder)
    text_layers, vision_layers = config.text_config.num_hidden_layers, config.vision_config.num_hidden_layers
    worst = 1.0
    for quant in ("none", "8bit", "4bit"):
        dm = load_model(str(folder), quant=quant, device="cpu", dtype="bfloat16")
        held, stored = held_parts(dm.model), stored_parts(folder, quant)
        del dm
        whole, _, shared, _ = load.stored_bytes(folder, str(folder), True, config)
        assert shared == 0 and sum(stored.values()) == whole + stored["text"] - stored_parts(folder, "none")["text"]
        real_held, real_stored = at_real(held, text_layers, vision_layers), at_real(stored, text_layers, vision_layers)
        ratio = real_held / real_stored
        print(f"{quant}: at the real geometry ComfyUI is told {real_held / GIB:.2f} GiB, stored uniquely "
              f"{real_stored / GIB:.2f} GiB, ratio {ratio:.4f} (the slice itself: "
              f"{sum(held.values()) / sum(stored.values()):.4f}; per part {held} / {stored})", flush=True)
        worst = max(worst, ratio, key=lambda r: abs(r - 1))
    return worst


def waits_per_step_max(demo) -> int:
    most = 0
    for name in MODES:
        go = mode_run(name, demo, lambda: quantized(DEMO_DIR, "demo"))
        go()  # one-time probes
        steps, worst, names = step_waits(go)
        print(f"{name}: {steps} steps, at most {worst} wait(s) in a step: {dict(names)}", flush=True)
        most = max(most, worst)
    return most


def batch_size_invariant(demo) -> int:
    requests = [prepare(demo, PROMPTS[i % 8] + " " * (i % 3),
                        Knobs(seed=i, thinking=bool(i % 2), gen_length=32 * (1 + i % 2), num_inference_steps=6 + i % 4))
                for i in range(16)]
    runs = {size: run_batch(requests, max_batch=size) for size in (1, 3, 8, 16)}
    same = all(not differences(a, b, demo.token_strings) and entropy_exact(a, b)
               for size in (3, 8, 16) for a, b in zip(runs[1], runs[size]))
    print(f"16 requests in batches of 1, 3, 8, 16: {'identical' if same else 'DIFFERENT'}", flush=True)
    return int(same)


def step_peak(dm) -> int:
    """The most bytes one step's own tensors, with the self-conditioning it keeps, hold at once."""
    peaks, inner = [], loop._step

    def measured(working, *rest):
        kept = sum(lane.self_cond.nbytes for lane in working if lane.self_cond is not None)
        with TensorPeak() as p:
            out = inner(working, *rest)
        peaks.append(p.peak + kept)
        return out

    loop._step = measured
    try:
        run(prepare(dm, "hi", Knobs(seed=1, num_inference_steps=3, gen_length=256, confidence=0.0)))
    finally:
        loop._step = inner
    return max(peaks)


def plan_vs_measured_step() -> float:
    worst = 1.0
    for dtype in ("float32", "bfloat16"):
        dm = load_model(str(checkpoint("real-vocab")), dtype=dtype)
        plan, measured = deviceplan.logit_bytes(dm.model.config.get_text_config(decoder=True), dm.canvas_length), \
            step_peak(dm)
        print(f"{dtype}: plan {plan / 2**20:.0f} MiB, measured step {measured / 2**20:.0f} MiB, "
              f"ratio {plan / measured:.3f}", flush=True)
        worst = max(worst, plan / measured, key=lambda r: abs(r - 1))
    return worst


def device_named_ok() -> int:
    """The small twin planned on a host that names cuda:1: whole, then split (room made there first each time)."""
    folder = realslice.slice_dir(realslice.SMALL, cache_base())
    asked, free = [], {"vram": 1 << 40}
    host = machine.Machine("cuda:1", lambda d: asked.append(str(d)) or free["vram"], lambda d: 1 << 40,
                           lambda need, d: asked.append(f"room {d}"))
    machine.use(lambda: host)
    try:
        whole = planned_on(folder)
        text = AutoConfig.from_pretrained(folder).get_text_config(decoder=True)
        step = deviceplan.step_bytes(text, 256, deviceplan.LOAD_CONTEXT)
        free["vram"] = deviceplan.CUDA_RESERVE + step + whole.weight_bytes // 2  # half the weights fit: a split
        split = planned_on(folder)
    finally:
        machine.use(None)
    ok = (whole.device == split.device == "cuda:1" and whole.device_map == {"": 1}
          and set(split.max_memory) == {1, "cpu"} and asked and all("cuda:1" in a for a in asked))
    print(f"whole {whole.device} {whole.device_map}; split {split.device} {sorted(map(str, split.max_memory))}; "
          f"asked about {sorted(set(asked))}", flush=True)
    return int(ok)


def planned_on(folder: Path):
    config = AutoConfig.from_pretrained(folder)
    stored, per_dtype, shared, _ = load.stored_bytes(folder, str(folder), True, config)
    host, mode = machine.on_device("auto")
    return load.place(config, stored, per_dtype, shared, torch.bfloat16, mode, "none", host)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", action="store_true", help="the patcher's size from the small real-geometry twin "
                        "instead of the real-width slice")
    args = parser.parse_args(argv)
    demo = load_model(str(DEMO_DIR))
    figures = {"patcher_size_ratio": f"{patcher_size_ratio(args.small):.4f}",
               "waits_per_step_max": waits_per_step_max(demo),
               "batch_size_invariant": batch_size_invariant(demo),
               "plan_vs_measured_step": f"{plan_vs_measured_step():.3f}",
               "device_named_ok": device_named_ok()}
    print(" ".join(f"{k}={v}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
