"""A list of prompts as one batch vs one by one: throughput, and how many items stay their solo run.

- batch_speedup_demo: 8 prompts on the demo model, sequential CPU seconds / batched CPU seconds,
  the median of pairs timed alternately (benchmarks/timing.py), with its IQR; wall-clock too. The
  ceiling beside it is what no batch can beat: all items' steps over the longest item's (the batch
  takes at least that many forwards), were a batched step to cost a solo one.
  batch_efficiency_demo is the speedup over that ceiling. Beside it, the most any host-side work could
  give: the sequential run's CPU time over the batched run's decoder forwards alone (the batch's
  rows' arithmetic, each item's own experts and attention included) and each item's own noise draws
  (which keep it its solo run), over the ceiling.
- list1024_peak_rss_gib: peak resident memory of a child process running 1,024 prompts on the demo
  through the Sampler node, its pictures unread (benchmarks/list_memory.py).
- batch_speedup_slice: the same on the real-geometry slice (every tensor at the released shape, two
  text layers; 2 steps per item, one block), when its cached build exists; never built here (4.6 GB).
- identical_items: share of items whose tokens, masks, text, canvas_state, run_config and frames
  equal their solo run at float32 (the demo and the random tiny checkpoint, mixed lengths, thinking
  on and off), and whose every entropy reading is its solo one within float16 rounding;
  entropy_exact says how many kept every entropy reading to the bit.

Speed figures are CPU time on whatever else the machine runs: compare them only on a quiet machine.

    python benchmarks/batch.py [--repeats 5] [--items 104] [--no-slice] [--no-list] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from headless import load_pack  # noqa: E402

load_pack()
from timing import cpu_seconds, median_iqr, paired_ratios  # noqa: E402

from diffusiongemma.dgemma import Knobs, load_model  # noqa: E402
from diffusiongemma.dgemma.demo import DEMO_DIR  # noqa: E402
from diffusiongemma.dgemma.denoising.run import prepare, run, run_batch  # noqa: E402
from diffusiongemma.testing import tiny as tiny_builder  # noqa: E402
from diffusiongemma.testing.batchcheck import differences, entropy_exact, entropy_within_half  # noqa: E402

PROMPTS = ("What is 2+2?", "What is 3+4?", "Hi", "What is 13+29? Answer with the number only.", "What is 5+6?",
           "Name a colour.", "What is 9+1?", "What is 7+8? Say it in words, please.")


def requests(dm, knobs: Knobs) -> list:
    return [prepare(dm, p, knobs) for p in PROMPTS]


def speedup(dm, knobs: Knobs, repeats: int, label: str, warmup: bool = True) -> tuple[float, float, float, float]:
    """(median sequential/batched CPU ratio, its IQR, wall-clock ratio of one more pair, the ceiling) for
    8 prompts."""
    batched = lambda: run_batch(requests(dm, knobs), max_batch=len(PROMPTS))  # noqa: E731
    sequential = lambda: [run(r) for r in requests(dm, knobs)]  # noqa: E731
    ratios = paired_ratios(sequential, batched, repeats, label, warmup=warmup)
    t0 = time.perf_counter()
    sequential()
    t1 = time.perf_counter()
    steps = [len(result.trace) for result in batched()]
    wall = (t1 - t0) / (time.perf_counter() - t1)
    med, iqr = median_iqr(ratios)
    ceiling = sum(steps) / max(steps)
    print(f"{label}: sequential/batched CPU median {med:.3f} IQR {iqr:.3f}; wall {wall:.3f}; ceiling "
          f"{ceiling:.2f} ({sum(steps)} item steps, the longest item {max(steps)})", flush=True)
    return med, iqr, wall, ceiling


class ForwardClock:
    """CPU seconds spent inside a module's forward calls, through its hooks."""

    def __init__(self, module):
        self.seconds, self._start = 0.0, 0.0
        self._hooks = (module.register_forward_pre_hook(self._begin), module.register_forward_hook(self._end))

    def _begin(self, *_):
        self._start = time.process_time()

    def _end(self, *_):
        self.seconds += time.process_time() - self._start

    def close(self):
        for hook in self._hooks:
            hook.remove()


def draw_seconds(dm, draws: int = 200) -> float:
    """CPU seconds of one item's noise for one step, drawn from its own generator as the sampler does."""
    L, V = dm.canvas_length, dm.model.get_output_embeddings().weight.shape[0]
    generator = torch.Generator().manual_seed(0)
    start = time.process_time()
    for _ in range(draws):
        torch.empty((1, L, V)).exponential_(1, generator=generator)
        torch.randint(0, V, (1, L), generator=generator)
    return (time.process_time() - start) / draws


def forward_bound(dm, knobs: Knobs, repeats: int = 3) -> float:
    """The efficiency a batch would reach were it nothing but its decoder forwards and each item's own noise
    draws (what keeps it its solo run): the median sequential run's CPU seconds over those, over the ceiling."""
    sequential, batched, forwards, results = [], [], [], []
    clock = ForwardClock(dm.model)
    try:
        for _ in range(repeats):
            sequential.append(cpu_seconds(lambda: [run(r) for r in requests(dm, knobs)]))
            clock.seconds = 0.0
            batched.append(cpu_seconds(lambda: results.append(run_batch(requests(dm, knobs), max_batch=len(PROMPTS)))))
            forwards.append(clock.seconds)
    finally:
        clock.close()
    steps = [len(result.trace) for result in results[-1]]
    ceiling = sum(steps) / max(steps)
    seq, fwd, draws = statistics.median(sequential), statistics.median(forwards), sum(steps) * draw_seconds(dm)
    bound = seq / (fwd + draws) / ceiling
    print(f"demo: of the batched run's {statistics.median(batched):.3f}s CPU its forwards take {fwd:.3f}s and the "
          f"items' noise draws {draws:.3f}s; the sequential run {seq:.3f}s: a batch of nothing else would reach an "
          f"efficiency of {bound:.3f} (of its forwards alone {seq / fwd / ceiling:.3f})", flush=True)
    return bound


def identical(dm, count: int, steps: int) -> tuple[int, int]:
    """(items identical to solo, entropy within float16 rounding included; items whose entropy is identical
    to the bit) over `count` mixed items."""
    L = dm.canvas_length
    specs = [(PROMPTS[i % 8] + " " * (i // 8 % 3), Knobs(seed=i, thinking=bool(i % 2), gen_length=L * (1 + i % 2),
                                                         num_inference_steps=steps + i % 4)) for i in range(count)]
    solo = [run(prepare(dm, p, k)) for p, k in specs]
    batched = run_batch([prepare(dm, p, k) for p, k in specs], max_batch=8)
    same = sum(not differences(a, b, dm.token_strings) and entropy_within_half(a, b) for a, b in zip(solo, batched))
    return same, sum(entropy_exact(a, b) for a, b in zip(solo, batched))


def projection_headroom(dm, items: int = len(PROMPTS)) -> None:
    """Print what batching can gain on a step's largest product, the vocabulary projection: `items`
    one-item products' time over one `items`-item product's (1.0: the device was already busy)."""
    weight = dm.model.get_output_embeddings().weight
    one = torch.randn(dm.canvas_length, weight.shape[1], dtype=weight.dtype, device=weight.device)
    many = torch.cat([one] * items)
    seconds = []
    for x in (one, many):
        torch.nn.functional.linear(x, weight)
        start = time.perf_counter()
        for _ in range(3):
            torch.nn.functional.linear(x, weight)
        seconds.append((time.perf_counter() - start) / 3)
    flops = 2 * one.shape[0] * weight.shape[0] * weight.shape[1]
    gain = items * seconds[0] / seconds[1]
    print(f"slice: vocabulary projection {flops / seconds[0] / 1e9:.0f} GFLOP/s for one item, "
          f"{items * flops / seconds[1] / 1e9:.0f} for {items}: batching can gain {gain:.2f}x there", flush=True)


def slice_speedup(repeats: int) -> str:
    from diffusiongemma.testing import realslice

    folder = realslice.cache_root() / realslice.REAL.name / "bf16"
    if not (folder / "config.json").is_file():
        return "not measured (the real-geometry slice is not cached; benchmarks/real_geometry.py builds it)"
    dm = load_model(str(folder), device="cpu")
    med, iqr, wall, _ = speedup(dm, Knobs(seed=3, num_inference_steps=2, gen_length=dm.canvas_length,
                                          confidence=0.0), repeats, "slice", warmup=False)
    projection_headroom(dm)
    return f"{med:.3f} (IQR {iqr:.3f}, CPU time, 2 steps per item; wall {wall:.3f})"


def list_peak_rss(count: int = 1024) -> str:
    """Peak resident memory (GiB) of a child process running `count` prompts through the Sampler node."""
    done = subprocess.run([sys.executable, str(Path(__file__).with_name("list_memory.py")), str(count)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        return f"failed ({done.stderr.strip().splitlines()[-1][:200] if done.stderr.strip() else done.returncode})"
    line = done.stdout.strip().splitlines()[-1]
    print(f"list of {count}: {line}", flush=True)
    return line.split()[0].split("=")[1]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--items", type=int, default=104)
    parser.add_argument("--no-slice", action="store_true", help="skip the real-geometry slice")
    parser.add_argument("--no-list", action="store_true", help="skip the 1,024-prompt list's memory")
    parser.add_argument("--only-slice", action="store_true", help="measure the slice alone")
    parser.add_argument("--dtype", default="auto", help="weights' dtype for the demo and tiny models (auto: float32)")
    args = parser.parse_args(argv)
    if args.only_slice:
        print(f"batch_speedup_slice={slice_speedup(2)}")
        return
    demo = load_model(str(DEMO_DIR), device="cpu", dtype=args.dtype)
    print("speed figures are CPU time on a machine others may share: not quotable unless it was quiet", flush=True)
    knobs = Knobs(seed=3, num_inference_steps=48, gen_length=64)
    med, iqr, wall, ceiling = speedup(demo, knobs, args.repeats, "demo")
    bound = forward_bound(demo, knobs)
    same_demo, exact_demo = identical(demo, args.items, 12)
    with tempfile.TemporaryDirectory() as folder:  # the random tiny checkpoint, built in seconds
        tiny = load_model(str(tiny_builder.build_checkpoint(Path(folder) / "random", "random")), device="cpu",
                          dtype=args.dtype)
        same_tiny, exact_tiny = identical(tiny, max(args.items // 4, 8), 4)
    total = args.items + max(args.items // 4, 8)
    print(f"identical: demo {same_demo}/{args.items} (entropy to the bit {exact_demo}), tiny "
          f"{same_tiny}/{total - args.items} (entropy to the bit {exact_tiny})", flush=True)
    sliced = "not measured (--no-slice)" if args.no_slice else slice_speedup(2)
    rss = "not measured (--no-list)" if args.no_list else list_peak_rss()
    print(f"batch_efficiency_demo={med / ceiling:.3f} list1024_peak_rss_gib={rss} "
          f"identical_items={(same_demo + same_tiny) / total:.4f} "
          f"batch_speedup_demo={med:.3f} (IQR {iqr:.3f}, CPU time; wall {wall:.3f}; ceiling {ceiling:.2f}) "
          f"batch_efficiency_bound={bound:.3f} batch_speedup_slice={sliced} "
          f"entropy_exact={(exact_demo + exact_tiny) / total:.4f}")


if __name__ == "__main__":
    main()
