"""The quantization libraries on one real-width layer of fused MoE experts: evidence for decision 0029.

16 of a layer's 128 experts' fused gate/up tensor ([16, 1408, 2816], bf16, random normal weights
of std 0.02) quantized by each candidate that can take a 3-D parameter; then each expert's output
on 64 random tokens compared with the unquantized one (cosine over all outputs). Times are wall
seconds on this machine scaled to the whole layer (x 128/16). A library that is not installed, or
cannot run its format on the CPU, says so.

    python benchmarks/quant_libraries.py
"""

from __future__ import annotations

import time

import torch

E = 16


def main() -> None:
    torch.manual_seed(0)
    weights = torch.randn(E, 1408, 2816, dtype=torch.bfloat16) * 0.02
    x = torch.randn(64, 2816, dtype=torch.bfloat16)
    ref = torch.stack([torch.nn.functional.linear(x, weights[e]) for e in range(E)]).float()

    def row(name, quantize_s, nbytes, use_s, out):
        cos = torch.nn.functional.cosine_similarity(out.float().flatten(), ref.flatten(), dim=0).item()
        print(f"{name}: quantize {quantize_s * 128 / E:.2f} s per layer's gate/up, {nbytes * 8 / weights.numel():.3f} "
              f"bits per weight, dequantize/use {use_s * 128 / E:.3f} s per layer's gate/up, output cosine {cos:.5f}")

    bitsandbytes(weights, x, row)
    torchao(weights, x, row)
    print("HQQ: quantizes nn.Linear layers (HQQLinear) only; the fused 3-D experts would need the same glue as "
          "bitsandbytes' functions, without a CPU-tested packed format for them (not measured)")


def bitsandbytes(weights, x, row) -> None:
    try:
        import bitsandbytes.functional as F
    except ImportError:
        print("bitsandbytes: not installed")
        return
    for name, quantize, dequantize in (
            ("bitsandbytes NF4, blocks of 64", lambda w: F.quantize_4bit(w, blocksize=64, quant_type="nf4"),
             F.dequantize_4bit),
            ("bitsandbytes FP4, blocks of 64", lambda w: F.quantize_4bit(w, blocksize=64, quant_type="fp4"),
             F.dequantize_4bit),
            ("bitsandbytes 8-bit blockwise, blocks of 256", lambda w: F.quantize_blockwise(w, blocksize=256),
             F.dequantize_blockwise)):
        start = time.perf_counter()
        packed, state = quantize(weights)
        quantize_s = time.perf_counter() - start
        start = time.perf_counter()
        dense = dequantize(packed, state)
        use_s = time.perf_counter() - start
        out = torch.stack([torch.nn.functional.linear(x, dense[e]) for e in range(E)])
        row(name, quantize_s, packed.numel() * packed.element_size() + state.absmax.numel() * 4, use_s, out)


def torchao(weights, x, row) -> None:
    try:
        from torchao.quantization import FqnToConfig, Int4WeightOnlyConfig, Int8WeightOnlyConfig, quantize_
    except ImportError:
        print("torchao: not installed")
        return
    for name, config in (("torchao int8 weight-only", Int8WeightOnlyConfig()),
                         ("torchao int4 weight-only, groups of 64", Int4WeightOnlyConfig(group_size=64))):
        module = torch.nn.Module()
        module.w = torch.nn.Parameter(weights.clone(), requires_grad=False)
        try:
            start = time.perf_counter()
            quantize_(module, FqnToConfig({"w": config}), filter_fn=None)
            quantize_s = time.perf_counter() - start
        except Exception as exc:  # a format without a CPU kernel raises its own type
            print(f"{name}: cannot run on the CPU ({type(exc).__name__}: {str(exc)[:100]})")
            continue
        start = time.perf_counter()
        out = torch.stack([torch.nn.functional.linear(x, module.w[e]) for e in range(E)])
        use_s = time.perf_counter() - start
        data = module.w.data
        nbytes = sum(getattr(data, a).numel() * getattr(data, a).element_size() for a in data.__tensor_flatten__()[0])
        row(name + " (per-expert select and linear)", quantize_s, nbytes, use_s, out)


if __name__ == "__main__":
    main()
