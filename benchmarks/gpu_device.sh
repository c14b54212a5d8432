#!/usr/bin/env bash
# benchmarks/gpu.py on a lent GPU machine, which has torch, transformers (5.17), accelerate and
# safetensors but no diffusers or auto-round, and no registry to fetch them from.
#
#   bash benchmarks/gpu_device.sh wheels PHASE      # here: what that phase lacks, as Python 3.12 wheels in .whl/
#   bash benchmarks/gpu_device.sh run [gpu.py args] # there (carry .whl): install them, run one phase
# PHASE: phase1 or run (diffusers, 6 MB), autoround (with auto-round and its imports, 12 MB), fit (with
# bitsandbytes, 47 MiB): each carry stays under 48 MiB.
#
# A lease is 15 minutes with the machine's start, so run one phase per call and keep each under
# GPU_SECONDS (default 230 s), which leaves time for a second call. The first phase gives the headline:
#   phase1                                    benchmarks/gpu_phase1.py: bf16 made on the GPU, ms/step at 16 and
#                                             48, ours / diffusers' pipeline, waits per step, a list of 8 = its
#                                             solo runs, peak VRAM / plan; exits 1 when an identity is false
# then, one per call:
#   run --in-memory --quants none --no-fast   the bf16 geometry made on the GPU: s/step, batches 1/4/8
#   run --quants none --no-fast               the same written as a checkpoint and loaded by the pack
#   run --quants autoround --no-fast          the INT4 layout, loaded through auto-round
#   fit                                       benchmarks/gpu_fit.py: the 4bit and 8bit geometry built and
#                                             quantized on the GPU (peak VRAM at a step, s/step at 16 and 48)
# Each phase runs here on the CPU with --dry-run (CI does): `bash benchmarks/gpu_device.sh phase1 --dry-run`.
# The log is also written to $OUT/gpu.log (the device tool brings $OUT back).
set -uo pipefail
cd "$(dirname "$0")/.."

# The versions the tests run with; auto-round imports datasets and pydantic at import. bitsandbytes
# (43 MB: its CUDA kernels) for quant 4bit / 8bit.
WHEELS=(diffusers==0.42.1)
AUTOROUND=(auto-round==0.16.1 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 pydantic==2.14.4
           pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5)

case "${1:-}" in
  wheels)
    case "${2:-}" in
      phase1|run) ;;
      autoround) WHEELS+=("${AUTOROUND[@]}") ;;
      fit) WHEELS+=(bitsandbytes==0.50.2) ;;
      *) echo "usage: bash benchmarks/gpu_device.sh wheels phase1|run|autoround|fit" >&2; exit 2 ;;
    esac
    rm -rf .whl && mkdir .whl
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version "${PYVER:-3.12}" \
      --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
      --platform manylinux2014_x86_64 --platform manylinux_2_24_x86_64 -d .whl "${WHEELS[@]}" || exit
    du -sh .whl
    ;;
  run|fit|phase1)
    script=benchmarks/gpu.py
    [ "$1" = fit ] && script=benchmarks/gpu_fit.py
    [ "$1" = phase1 ] && script=benchmarks/gpu_phase1.py
    shift
    if compgen -G ".whl/*.whl" >/dev/null; then
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/dgemma-site .whl/*.whl || exit
      export PYTHONPATH=/tmp/dgemma-site${PYTHONPATH:+:$PYTHONPATH}
    fi
    out="${OUT:-/tmp/dgemma-gpu-out}"
    mkdir -p "$out"
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv 2>&1 | tee "$out/gpu.log"
    PYTHONUNBUFFERED=1 timeout "${GPU_SECONDS:-230}" "${PYTHON:-python3}" "$script" "$@" 2>&1 | tee -a "$out/gpu.log"
    exit "${PIPESTATUS[0]}"  # a false identity or a timeout fails the call
    ;;
  *)
    echo "usage: bash benchmarks/gpu_device.sh wheels PHASE | phase1 [--dry-run] | run [gpu.py arguments] | fit [gpu_fit.py arguments]" >&2
    exit 2
    ;;
esac
