#!/usr/bin/env bash
# Run ON THE GPU MACHINE from the repository root: builds offloadd-train and
# the worker and store binaries (CUDA flavour, scripts/gpu/build_and_test.sh), then runs
# bench/pipeline/plan_accuracy.py on the cases given (see its doc for the CASE syntax).
# Environment: OFFLOADD_BUILD_DIR (default build-gpu); DATA, a directory with alpaca_5000.json and
# the Llama-2 tokenizer.json (default .gpu-data); OUT, where the logs and the JSON go.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$here"
out="${OUT:-/tmp}"
build="${OFFLOADD_BUILD_DIR:-$here/build-gpu}"
t0=$(date +%s)
OFFLOADD_GPU_TARGETS="offloadd-train offloadd-worker offloadd-store" scripts/gpu/build_and_test.sh -R '^$' \
  >"$out/build.log" 2>&1 || { tail -60 "$out/build.log"; exit 1; }
echo "== built in $(($(date +%s) - t0)) s: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader)"
export LD_LIBRARY_PATH="$here/.gpu-prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
PYTHONUNBUFFERED=1 python3 bench/pipeline/plan_accuracy.py --build "$build" --data-dir "${DATA:-$here/.gpu-data}" \
  --json "$out/plan-accuracy.json" "$@"
