#!/usr/bin/env bash
# Run ON THE GPU MACHINE (the 125 GiB H200 host), from the repository root, .debs carried: 8B-class
# shapes at batch 16, seq 1024, 24 GiB, max_grad_norm 1.0 with 14 host bytes per parameter (no
# 16-bit weight copy beside the fp32 masters; trainer/README.md), and the 7B row with and without
# the copy in the same lease; then the CUDA cast and layout tests (tests/python/trainer/
# test_host_weight_copy.py). RUNS: ";"-separated "shape [offloadd-train flags]"; OUT receives JSON.
#   OFFLOADD_BUILD_DIR=/tmp/b scripts/gpu/host_ram_bench.sh
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
build="${OFFLOADD_BUILD_DIR:-$PWD/build-gpu}"
export LD_LIBRARY_PATH="$PWD/.gpu-prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
t0=$(date +%s)
OFFLOADD_GPU_TARGETS="offloadd-train offloadd-worker offloadd-store offloadd-workers-bench" \
  scripts/gpu/build_and_test.sh -R '^$' > /tmp/b.log 2>&1 || { tail -30 /tmp/b.log; exit 1; }
head -2 /tmp/b.log
echo "build: $(( $(date +%s) - t0 )) s"
OUT="${OUT:-/tmp}"
free -g | head -2
IFS=';' read -ra runs <<<"${RUNS:-llama3-8b;qwen3-8b;llama2-7b;llama2-7b --host-weight-copy}"
i=0
for r in "${runs[@]}"; do
  set -- $r
  shape=$1
  shift
  i=$((i + 1))
  timeout "${RUN_TIMEOUT:-200}" python3 bench/pipeline/run_bench.py --build "$build" --shape "$shape" --batch 16 \
    --gpu-memory-limit 24GiB --steps "${STEPS:-3}" --warmup "${WARMUP:-3}" --max-grad-norm 1.0 --speculate default \
    ${1:+"--train-args=$*"} --json "$OUT/run$i-$shape.json" 2>&1 \
    | grep -E "^\| (llama|qwen|shape|---)|clip rate|step/bound per step|calibration:|rror|plan:|Killed|^\\$"
  python3 - "$OUT/run$i-$shape.json" <<'PY' 2>/dev/null
import json, sys
d = json.load(open(sys.argv[1]))
r = d[0] if isinstance(d, list) else d
print({k: r.get(k) for k in ("batch", "tokens_per_second", "step_seconds", "step_over_bound", "step_over_held_bound",
                             "host_peak_gib", "arena_gib", "pinned_host_gib", "gpu_peak_gib",
                             "time_to_first_step_seconds", "error")})
PY
done
if [[ "${SKIP_TESTS:-0}" != 1 ]]; then
  OFFLOADD_BINARY_DIR="$build" timeout "${TEST_TIMEOUT:-120}" python3 -m pytest -q -x \
    tests/python/trainer/test_host_weight_copy.py -k "cuda" 2>&1 | tail -5
fi
exit 0
