"""Paired CPU-time measurement for ratio benchmarks on a shared machine.

Each run is timed in CPU seconds of this process (all its threads), which other people's work
on the machine disturbs far less than wall time; contenders alternate (A B, B A, ...) so drift
hits both, and the result is the median and interquartile range of the per-pair ratios.
"""

from __future__ import annotations

import statistics
import time


def cpu_seconds(fn) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def paired_ratios(ours, base, repeats: int, label: str = "", warmup: bool = True) -> list[float]:
    """`repeats` ratios ours/base in CPU seconds, order alternating within each pair."""
    if warmup:
        ours(), base()
    ratios = []
    for i in range(repeats):
        if i % 2:
            b = cpu_seconds(base)
            a = cpu_seconds(ours)
        else:
            a = cpu_seconds(ours)
            b = cpu_seconds(base)
        ratios.append(a / b)
        if label:
            print(f"{label}: ours {a:.3f}s base {b:.3f}s (CPU) ratio {a / b:.4f}", flush=True)
    return ratios


def median_iqr(values: list[float]) -> tuple[float, float]:
    """(median, interquartile range)."""
    if len(values) < 2:
        return (values[0] if values else float("nan")), 0.0
    q = statistics.quantiles(values, n=4, method="inclusive")
    return statistics.median(values), q[2] - q[0]
