"""Does the real model fit a 24 GB card in 4bit and a 32 GB one in 8bit? Measured on the real-geometry slice.

The slice (testing/realslice.py: every tensor at the released widths, two text layers, random weights)
is loaded in a fresh child per mode (bf16, 4bit, 8bit) on the CPU, under a fixed malloc mmap threshold
so that freed tensors leave the resident size. Each child reports:
- the bytes of one text layer's tensors as loaded (the encoder's layers share the decoder's) and of
  everything outside the layers (embedding = head, vision tower, self-conditioning, norms);
- the peak of a run of two steps at the 256-token canvas (the second with self-conditioning; every
  weight touched and a first step done before; the peak, VmHWM reset there, over the resident size
  then): logit temporaries, the scheduler, the KV cache and, quantized, one layer's experts dequantized;
- one step's logits on the same prompt and canvas (the bf16 child's are the reference), as built and
  with each attention's q/k norm weights scaled by head_dim^-1/4 (random norm weights of 1 with
  DiffusionGemma's attention scale of 1 make every attention a near argmax that any noise flips;
  the scaled one has the usual 1/sqrt(head_dim) temperature);
- the peak anonymous memory (RssAnon, sampled every 5 ms) through the load over the process before it.

The real model's peak at a step = 30 x the layer's bytes + the rest + the step's peak (the sum is
printed). The load's RAM: a GPU load reads each tensor into RAM once on its way to the card, so its
RAM peak is the process before the load plus the slice load's transient (the load's anonymous peak
over what stays resident after it: the tensor in flight, the quantizer's temporaries, bookkeeping;
the slice's tensors have the real sizes, and the real checkpoint's ~1,100 keys add little). The
4-bit demo accuracy is the shipped demo model's 100
sums in 4bit; split_meta_params counts parameters left on meta with no offload hook to serve them
after the device plan's split of the slice (accelerate's sequential map; here CPU and disk tiers).

    python benchmarks/fit.py [--threads 2]

Last line: q4_real_peak_gib q8_real_peak_gib q4_logit_cosine q8_logit_cosine load_peak_ram_gib_real
q4_demo_accuracy split_meta_params.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from headless import load_pack  # noqa: E402

load_pack()
from diffusiongemma.dgemma import Knobs, generate, load_model  # noqa: E402
from diffusiongemma.dgemma.loading import deviceplan  # noqa: E402
from diffusiongemma.dgemma.loading import quant_at_load as qal  # noqa: E402
from diffusiongemma.dgemma.loading.load import mode_needs  # noqa: E402
from diffusiongemma.testing import fitcheck, realscale, realslice  # noqa: E402

GIB = 2**30
MMAP_THRESHOLD = 1 << 20
REAL_LAYERS = realscale.REAL_LAYERS
VISION_LAYERS = realscale.REAL_VISION["num_hidden_layers"]


def status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    return 0


class AnonPeak:
    """The most anonymous resident memory (RssAnon) seen, sampled every 5 ms on a thread."""

    def __enter__(self):
        self.peak, self._stop = status("RssAnon"), threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, status("RssAnon"))

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def tensor_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total


def measure(quant: str, reference: str | None, out_logits: str | None) -> dict:
    """In this fresh child: load the slice in `quant`, and what the module docstring lists."""
    import transformers  # noqa: F401  (imports are not the load's memory)
    if quant != "none":
        import bitsandbytes  # noqa: F401
    folder = realslice.slice_dir()
    before = status("RssAnon")
    start = time.perf_counter()
    with AnonPeak() as load:
        dm = load_model(str(folder), quant=quant, device="cpu")
    seconds = time.perf_counter() - start
    after = status("RssAnon")
    model = dm.model
    layer = tensor_bytes([*model.model.decoder.layers[0].parameters(), *model.model.decoder.layers[0].buffers()])
    everything = tensor_bytes([*model.parameters(), *model.buffers()])
    layers = tensor_bytes([t for stack in (model.model.decoder.layers, model.model.encoder.language_model.layers)
                           for t in [*stack.parameters(), *stack.buffers()]])
    vision = model.model.encoder.vision_tower.encoder.layers[0]
    vision_layer = tensor_bytes([*vision.parameters(), *vision.buffers()])
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            if t.numel():
                t.amax()  # weights mapped from the files are paged in before any measured step
    logits = fitcheck.step_logits(dm)
    cosine = fitcheck.cosine(logits, torch.load(reference)) if reference else 1.0
    if out_logits:
        torch.save(logits, out_logits)
    fitcheck.trained_attention_scale(dm.model)
    logits = fitcheck.step_logits(dm)
    tamed = fitcheck.cosine(logits, torch.load(reference + ".tamed")) if reference else 1.0
    if out_logits:
        torch.save(logits, out_logits + ".tamed")
    fitcheck.trained_attention_scale(dm.model, undo=True)
    del logits
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")
    at = status("VmRSS")
    generate(dm, fitcheck.PROMPT, Knobs(seed=3, num_inference_steps=2, gen_length=256, confidence=0.0))
    step_peak = status("VmHWM") - at
    return {"quant": quant, "layer": layer, "rest": everything - layers, "vision_layer": vision_layer,
            "step_peak": step_peak, "cosine": cosine, "tamed": tamed, "load_seconds": seconds,
            "load_transient": load.peak - after, "before_load": before, "resident": after - before}


def child(quant: str, reference: str | None, out_logits: str | None, threads: int) -> dict:
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD)}
    args = [sys.executable, __file__, "--measure", quant, "--threads", str(threads)]
    args += ["--reference", reference] if reference else []
    args += ["--out-logits", out_logits] if out_logits else []
    out = subprocess.run(args, capture_output=True, text=True, env=env)
    if out.returncode:
        sys.exit(f"the {quant} child failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def planned(quant: str) -> deviceplan.Need:
    """The device plan's Need for the real model in `quant` (bf16 checkpoint), as the loader works it out."""
    config = realscale.real_config()
    return mode_needs(config, qal.geometry(config).total_numel * 2, "none")[quant]


def report(m: dict) -> float:
    """Print the real model's peak at a step in this mode, its parts and the plan's figure; return it in GiB."""
    # the slice has 1 of the vision tower's 27 layers
    weights = REAL_LAYERS * m["layer"] + m["rest"] + (VISION_LAYERS - realslice.VISION_LAYERS) * m["vision_layer"]
    real = weights + m["step_peak"]
    need = planned(m["quant"])
    print(f"{m['quant']}: real step peak {real / GIB:.2f} GiB = {REAL_LAYERS} x {m['layer'] / GIB:.3f} GiB per layer "
          f"+ {m['rest'] / GIB:.3f} GiB outside the layers + {VISION_LAYERS - realslice.VISION_LAYERS} x "
          f"{m['vision_layer'] / GIB:.3f} GiB more vision layers + {m['step_peak'] / GIB:.3f} GiB the step's own peak; "
          f"plan {need.resident / GIB:.2f} + {need.step / GIB:.2f} = {(need.resident + need.step) / GIB:.2f} GiB "
          f"(error {abs(need.resident + need.step - real) / real:.3f}; the plan budgets a 4K-token context), "
          f"and {need.kept / GIB:.2f} GiB more that a graph keeps between runs (deviceplan.kept_bytes); "
          f"logit cosine vs bf16 {m['cosine']:.4f} (attention at a trained model's temperature: {m['tamed']:.4f}); "
          f"slice load {m['load_seconds']:.0f} s, its transient "
          f"{m['load_transient'] / GIB:.2f} GiB over {m['resident'] / GIB:.2f} GiB resident after", flush=True)
    return real / GIB


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--measure", help=argparse.SUPPRESS)
    parser.add_argument("--reference", help=argparse.SUPPRESS)
    parser.add_argument("--out-logits", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.measure:
        print(json.dumps(measure(args.measure, args.reference, args.out_logits)))
        return
    realslice.slice_dir()  # built once (~5 GB, a few minutes), then reused
    with tempfile.TemporaryDirectory() as tmp:
        ref = str(Path(tmp) / "bf16.pt")
        runs = {q: child(q, None if q == "none" else ref, ref if q == "none" else None, args.threads)
                for q in ("none", "8bit", "4bit")}
    peaks = {q: report(m) for q, m in runs.items()}
    q4 = runs["4bit"]
    ram = q4["before_load"] + q4["load_transient"]
    print(f"load RAM (4bit, onto a GPU): {ram / GIB:.2f} GiB anonymous = the process before the load "
          f"{q4['before_load'] / GIB:.2f} GiB + the slice load's transient {q4['load_transient'] / GIB:.2f} GiB "
          "(the largest tensors have the real size; the checkpoint's pages read through the page cache are "
          f"reclaimable and not counted; a CPU load also keeps the quantized model, {peaks['4bit'] - 2:.0f}+ GiB)",
          flush=True)
    right, asked, wrong = demo()
    print(f"demo in 4bit: {right}/{asked}; wrong: {', '.join(wrong) or 'none'}", flush=True)
    unserved = split_check(args.threads)
    print(f"q4_real_peak_gib={peaks['4bit']:.2f} q8_real_peak_gib={peaks['8bit']:.2f} "
          f"q4_logit_cosine={runs['4bit']['cosine']:.4f} q8_logit_cosine={runs['8bit']['cosine']:.4f} "
          f"load_peak_ram_gib_real={ram / GIB:.2f} q4_demo_accuracy={right / asked:.2f} "
          f"split_meta_params={unserved}")


def demo() -> tuple[int, int, list[str]]:
    from diffusiongemma.dgemma.demo import DEMO_DIR

    return fitcheck.demo_accuracy(load_model(str(DEMO_DIR), quant="4bit", device="cpu"))


def split_check(threads: int) -> int:
    """Parameters left on meta with no hook to serve them after the plan's split of the slice."""
    with tempfile.TemporaryDirectory() as tmp:
        model = fitcheck.forced_split(realslice.slice_dir(), 4 * GIB, tmp)
        tiers = sorted(set(map(str, model.hf_device_map.values())))
        unserved = fitcheck.unserved_meta(model)
        print(f"split: the slice over {tiers} (the plan's sequential map, a 4 GiB fast tier): "
              f"{len(unserved)} parameters on meta with no hook {unserved[:3]}", flush=True)
        del model
    return len(unserved)


if __name__ == "__main__":
    main()
