#!/usr/bin/env bash
# Run ON THE GPU MACHINE: Llama-2-7B, seq 1024, 24 GiB, bf16, with the
# step-time bound of bench/pipeline/run_bench.py (idle-core calibration of the CPU update and host
# memory bandwidth first). RUNS: ";"-separated "batches max_grad_norm speculate [run_bench args]"; BASELINE:
# batches for the PyTorch all-on-GPU baseline in the same session ("" skips it). OUT receives JSON.
# WARMUP (default 3): untimed steps; on CUDA the step planner places states before step 3.
#   RUNS="16 1e6 always;16 1.0 never" BASELINE=16 scripts/gpu/step_bound_bench.sh
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export LD_LIBRARY_PATH="$PWD/.gpu-prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
OFFLOADD_GPU_TARGETS="offloadd-train offloadd-worker offloadd-store offloadd-workers-bench" \
  scripts/gpu/build_and_test.sh -R '^$' > /tmp/b.log 2>&1 || { tail -30 /tmp/b.log; exit 1; }
head -2 /tmp/b.log
OUT="${OUT:-/tmp}"
IFS=';' read -ra runs <<<"${RUNS:-16 1e6 always;16 1.0 never;16 1.0 always;8 1e6 always;4 1e6 always}"
i=0
for r in "${runs[@]}"; do
  set -- $r
  i=$((i + 1))
  timeout "${RUN_TIMEOUT:-240}" python3 bench/pipeline/run_bench.py --build build-gpu --shape llama2-7b --batch "$1" \
    --gpu-memory-limit 24GiB --steps "${STEPS:-3}" --warmup "${WARMUP:-3}" --max-grad-norm "$2" --speculate "$3" "${@:4}" \
    ${CALIBRATION_PARAMS:+--calibration-params $CALIBRATION_PARAMS} --json "$OUT/run$i.json" 2>&1 \
    | grep -E "^\| (llama|shape|---)|clip rate|step/bound per step|calibration:|error|device optimizer \(auto\)|step plan|node profile"
done
for b in ${BASELINE-16}; do
  timeout 150 python3 bench/pipeline/baseline_torch.py --shape llama2-7b --batch "$b" --steps 3 --warmup 2 \
    --json "$OUT/baseline-b$b.json" 2>&1 | grep -v Warning | tail -3
done
