#!/usr/bin/env bash
# Run ON THE GPU MACHINE: builds the pipeline binaries (CUDA flavour), runs the GPU pipeline tests
# and the pipeline benchmark. Arguments are passed to bench/pipeline/run_bench.py runs as
# "SHAPE:BATCHES:LIMIT" triples, e.g.  tinyllama-1.1b:8,32:6GiB llama2-7b:4:24GiB
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$here"
OFFLOADD_GPU_TARGETS="offloadd-train offloadd-worker offloadd-store offloadd-workers-bench" \
  scripts/gpu/build_and_test.sh -R '^$' > build-gpu.log 2>&1 || { tail -60 build-gpu.log; exit 1; }
tail -3 build-gpu.log
export LD_LIBRARY_PATH="$here/.gpu-prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [[ "${SKIP_TESTS:-0}" != 1 ]]; then
  OFFLOADD_BINARY_DIR="$here/build-gpu" python3 -m pytest -q tests/python/trainer/test_pipeline_gpu.py 2>&1 | tail -30
fi
for spec in "$@"; do
  IFS=: read -r shape batches limit extra <<<"$spec"
  python3 bench/pipeline/run_bench.py --build build-gpu --shape "$shape" --batch "$batches" \
    --gpu-memory-limit "$limit" --json "${OUT:-/tmp}/bench-$shape.json" ${extra:+$extra} 2>&1 | tail -40
  [[ -n "${OUT:-}" ]] && cp /tmp/offloadd-bench-*/trace-*.json "$OUT/" 2>/dev/null
done
# BASELINE="llama2-7b:4,16 tinyllama-1.1b:8,32": the PyTorch eager baseline in the same session.
for spec in ${BASELINE:-}; do
  IFS=: read -r shape batches <<<"$spec"
  python3 bench/pipeline/baseline_torch.py --shape "$shape" --batch "$batches" --steps 4 --warmup 2 \
    --json "${OUT:-/tmp}/baseline-$shape.json" 2>&1 | grep -v Warning | tail -12
done
exit 0
