#!/usr/bin/env bash
# The compact optimizer modes' GPU checks and runs in one call on the GPU machine (an x4 host for
# part c), from the repository root, with the CUDA flavour already built (nothing is built here):
#
#   OFFLOADD_BUILD_DIR=/tmp/gpu-build bench/optimizer_modes/gpu_call.sh
#
# Parts (PARTS, default "a b c d"), in order of priority; results under OUT_DIR (/tmp/modes-gpu):
#   a  compact_adamw_test: the CUDA kernel against the CPU workers, bit for bit, every mode (~5 s)
#   b  test_optimizer_modes.py -k cuda: device blocks stepping compact states on the GPU inside
#      offloadd-train, and the bf16 master as the device's weights (~1 min)
#   c  convergence_gpu.py all: TinyLlama-1.1B's shape from random init on Alpaca, 300 steps, one
#      mode per GPU on four GPUs at once, then convergence_gpu.json/.png (~3 min)
#   d  run_modes_bench.sh: Llama-2-7B at batch 8 in 24 GiB, exact and int8 states and PyTorch
#      (MODES/BATCHES widen it: run_modes_bench.sh's header) (~4 min)
# Minimum useful subset: PARTS="a c" (about 3 minutes).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
BUILD="${OFFLOADD_BUILD_DIR:-/tmp/gpu-build}"
OUT_DIR="${OUT_DIR:-/tmp/modes-gpu}"
PARTS="${PARTS:-a b c d}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$OUT_DIR"
if [[ -d "$PWD/.gpu-prefix/usr/lib/x86_64-linux-gnu" ]]; then
  export LD_LIBRARY_PATH="$PWD/.gpu-prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
has() { [[ " $PARTS " == *" $1 "* ]]; }
status=0
step() {  # name, command...: runs it, timed, and keeps going on failure
  local name="$1"
  shift
  echo "== $name: $*"
  local t0=$SECONDS
  "$@" || { echo "== $name FAILED"; status=1; }
  echo "== $name took $((SECONDS - t0)) s"
}
has a && step kernel "$BUILD/tests/trainer/compact_adamw_test"
has b && step trainer env OFFLOADD_BINARY_DIR="$BUILD" PYTHONPATH=client/python \
  "$PYTHON" -m pytest tests/python/trainer/test_optimizer_modes.py -k cuda -q
has c && step convergence "$PYTHON" bench/optimizer_modes/convergence_gpu.py all \
  --build "$BUILD" --out "$OUT_DIR/convergence" --gpus "$(nvidia-smi -L | wc -l)"
has d && step modes env OFFLOADD_BUILD_DIR="$BUILD" OUT_DIR="$OUT_DIR/modes" \
  MODES="${MODES:-fp32/fp32 int8/fp32}" BATCHES="${BATCHES:-8}" bench/optimizer_modes/run_modes_bench.sh
exit $status
