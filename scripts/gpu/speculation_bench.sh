#!/usr/bin/env bash
# Run ON THE GPU MACHINE: Llama-2-7B, seq 1024, batch 16, 24 GiB, clipping at max_grad_norm 1.0
# (every step clips on random-init weights) and 1e6 (none), with and without speculative updates,
# then the PyTorch all-on-GPU baseline. OUT receives the JSON results.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export LD_LIBRARY_PATH="$PWD/.gpu-prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
OFFLOADD_GPU_TARGETS="offloadd-train offloadd-worker offloadd-store" scripts/gpu/build_and_test.sh -R '^$' > /tmp/b.log 2>&1 || { tail -30 /tmp/b.log; exit 1; }
# CONFIGS: "max_grad_norm speculate" pairs (default all four); BASELINE=0 skips PyTorch.
IFS=, read -ra configs <<<"${CONFIGS:-1.0 never,1.0 always,1e6 never,1e6 always}"
for cfg in "${configs[@]}"; do
  set -- $cfg
  timeout 150 python3 bench/pipeline/run_bench.py --build build-gpu --shape llama2-7b --batch 16 --gpu-memory-limit 24GiB \
    --steps 3 --warmup 2 --max-grad-norm $1 --speculate $2 --json $OUT/spec-$1-$2.json 2>&1 | grep -E "^\| llama|clip rate|error" 
done
[[ "${BASELINE:-1}" == 1 ]] && timeout 120 python3 bench/pipeline/baseline_torch.py --shape llama2-7b --batch 16 --steps 3 --warmup 2 --json $OUT/baseline.json 2>&1 | grep -v Warning | tail -4
